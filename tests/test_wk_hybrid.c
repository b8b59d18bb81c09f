/* The two-level exchange of several devices per host (CPU replicas as threads): hybrid
 * (reduce-scatter inside the host, each device's shard across hosts on its own connection,
 * all-gather in shared memory) and flat (every device a ring member) train the same parameters
 * as one worker with the global batch; hybrid sends fewer bytes across hosts (every rank has
 * its own loopback address here, 127.0.0.<r+1>, so bytes to other hosts are told apart); top-k
 * over the hybrid legs learns; hosts with different device counts are refused at start. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <flodl/coordinator.h>

#include "fl_wk.h"
#include "train_int.h"
#include "testutil.h"
#include "wkdata.h"

#define N 512
#define MAX_RANKS 4

static char dir[64];

static void base_opts(fl_wk_train_opts_t *o, const char *layers, const char *save)
{
    fl_wk_train_opts_init(o);
    fl_mlp_parse(layers, &o->shape);
    o->epochs = 2;
    o->shuffle = false;
    o->seed = 5;
    o->lr.lr = 0.1;
    o->quiet = true;
    o->save_path = save;
    o->bucket_bytes = 256; /* several buckets per shard */
}

/* One worker with the global batch, against W hosts x L devices of batch b, hybrid and flat. */
static void check_equivalence(int W, int L, size_t b, fl_opt_kind_t kind, double lr)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    const char *layers = "6,16,3";
    char one[128], hyb[128], flat[128], what[128];
    snprintf(one, sizeof one, "%s/one.safetensors", dir);
    snprintf(hyb, sizeof hyb, "%s/hybrid.safetensors", dir);
    snprintf(flat, sizeof flat, "%s/flat.safetensors", dir);
    fl_wk_train_opts_t o;
    base_opts(&o, layers, one);
    o.batch = (size_t)W * (size_t)L * b;
    o.opt.kind = kind;
    if (kind != FL_OPT_SGD)
        o.opt.momentum = 0;
    o.lr.lr = lr;
    fl_wk_train_result_t res;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());

    o.mode = FL_WK_MODE_RING;
    o.batch = b;
    o.replicas = L;
    char err[1200] = "";
    fl_wk_train_result_t rr[MAX_RANKS];
    for (int h = 0; h < 2; h++) {
        o.hierarchy = h == 0 ? FL_WK_HIER_HYBRID : FL_WK_HIER_FLAT;
        o.save_path = h == 0 ? hyb : flat;
        int rc = fl_test_run_hosts(W, &o, NULL, &d, rr, err, sizeof err);
        ck_assert_msg(rc == FL_OK, "%s: %s", fl_strerror(rc), err);
        ck_assert_int_eq(rr[0].steps, res.steps);
        ck_assert_msg(rr[0].bytes_sent > 0, "nothing exchanged");
    }
    snprintf(what, sizeof what, "hybrid %d hosts x %d devices x batch %zu vs 1 x %zu", W, L, b,
             (size_t)W * L * b);
    fl_test_params_close(layers, one, hyb, what);
    snprintf(what, sizeof what, "flat %d hosts x %d devices x batch %zu vs 1 x %zu", W, L, b,
             (size_t)W * L * b);
    fl_test_params_close(layers, one, flat, what);
    unlink(one);
    unlink(hyb);
    unlink(flat);
    fl_dataset_free(&d);
}

START_TEST(test_two_hosts_two_devices_equal_one_worker)
{
    check_equivalence(2, 2, 8, FL_OPT_SGD, 0.1);
}
END_TEST

START_TEST(test_three_hosts_two_devices_equal_one_worker)
{
    check_equivalence(3, 2, 8, FL_OPT_ADAM, 0.01);
}
END_TEST

/* Bytes to other hosts per step, per host: hybrid's columns carry 2 (W-1)/W of the model
 * together; a flat ring ordered by host crosses hosts on one link per host, carrying
 * 2 (WL-1)/(WL) of it; top-k 1% over the hybrid legs a small fraction. */
START_TEST(test_hybrid_sends_fewer_bytes_across_hosts)
{
    enum { W = 2, L = 2 };
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    const char *layers = "6,512,512,3"; /* ~1 MiB: ring-sized shards */
    fl_wk_train_opts_t o;
    base_opts(&o, layers, NULL);
    o.mode = FL_WK_MODE_RING;
    o.epochs = 1;
    o.batch = 8;
    o.replicas = L;
    o.bucket_bytes = (size_t)4 << 20; /* one bucket per shard */
    double np = (double)fl_mlp_nparams(&o.shape);
    char err[1200] = "";
    fl_wk_train_result_t rr[MAX_RANKS];
    double per_step[3];
    for (int c = 0; c < 3; c++) {
        o.hierarchy = c == 1 ? FL_WK_HIER_FLAT : FL_WK_HIER_HYBRID;
        o.topk = c == 2 ? 0.01 : 0.0;
        int rc = fl_test_run_hosts(W, &o, NULL, &d, rr, err, sizeof err);
        ck_assert_msg(rc == FL_OK, "%s: %s", fl_strerror(rc), err);
        per_step[c] = (double)rr[0].remote_bytes / (double)rr[0].steps;
        /* A hybrid column's members are on different hosts: all its bytes cross; the flat
         * ring's links inside a host do not. */
        if (c == 1)
            ck_assert_msg(rr[0].remote_bytes < rr[0].bytes_sent, "every byte counted remote");
        else
            ck_assert_uint_eq(rr[0].remote_bytes, rr[0].bytes_sent);
    }
    double hybrid_want = 2.0 * (W - 1) / W * np * 4;
    double flat_want = 2.0 * (W * L - 1) / (W * L) * np * 4;
    ck_assert_msg(fabs(per_step[0] - hybrid_want) < 0.02 * hybrid_want,
                  "hybrid sent %.0f bytes per step across hosts, expected %.0f", per_step[0],
                  hybrid_want);
    ck_assert_msg(fabs(per_step[1] - flat_want) < 0.02 * flat_want,
                  "flat sent %.0f bytes per step across hosts, expected %.0f", per_step[1],
                  flat_want);
    ck_assert_msg(per_step[2] * 20 < per_step[1],
                  "hybrid top-k 1%% sent %.0f bytes per step across hosts, flat dense %.0f",
                  per_step[2], per_step[1]);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_topk_over_hybrid_legs_learns)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    fl_wk_train_opts_t o;
    base_opts(&o, "6,16,3", NULL);
    o.mode = FL_WK_MODE_RING;
    o.batch = 8;
    o.replicas = 2;
    o.epochs = 8;
    o.shuffle = true;
    o.topk = 0.1;
    char err[1200] = "";
    fl_wk_train_result_t rr[MAX_RANKS];
    int rc = fl_test_run_hosts(3, &o, NULL, &d, rr, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s: %s", fl_strerror(rc), err);
    ck_assert_msg(rr[0].test_acc > 0.9, "top-k hybrid reached only %.1f%%", 100 * rr[0].test_acc);
    ck_assert_msg(rr[0].bytes_sent < rr[0].raw_bytes, "sent %llu of %llu dense bytes",
                  (unsigned long long)rr[0].bytes_sent, (unsigned long long)rr[0].raw_bytes);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_hosts_with_different_device_counts_refused)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    fl_wk_train_opts_t o;
    base_opts(&o, "6,16,3", NULL);
    o.mode = FL_WK_MODE_RING;
    o.batch = 8;
    int replicas[2] = {2, 3};
    char err[1200] = "";
    int rc = fl_test_run_hosts(2, &o, replicas, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EINVAL, "%s: %s", fl_strerror(rc), err);
    ck_assert_msg(strstr(err, "127.0.0.") != NULL && strstr(err, "asks for 3") != NULL &&
                      strstr(err, "2 members") != NULL,
                  "%s", err);
    /* El Che weighs a host's devices before its exchange: not with a flat ring. */
    o.replicas = 2;
    o.max_anchor = 2;
    o.hierarchy = FL_WK_HIER_FLAT;
    rc = fl_test_run_hosts(2, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EINVAL && strstr(err, "--hierarchy hybrid") != NULL, "%s: %s",
                  fl_strerror(rc), err);
    fl_dataset_free(&d);
}
END_TEST

/* --shard none, hybrid and grad on 2 hosts x 2 devices: the same parameters (the optimizer is
 * elementwise; clipping by the global norm from the pieces), optimizer state per device 1,
 * 1/L and 1/(W L) of it. */
static void check_shards(fl_opt_kind_t kind, double lr, double max_norm)
{
    enum { W = 2, L = 2 };
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    const char *layers = "6,16,3";
    fl_wk_train_opts_t o;
    base_opts(&o, layers, NULL);
    o.mode = FL_WK_MODE_RING;
    o.batch = 8;
    o.replicas = L;
    o.opt.kind = kind;
    if (kind != FL_OPT_SGD)
        o.opt.momentum = 0;
    o.lr.lr = lr;
    o.max_norm = max_norm;
    size_t np = fl_mlp_nparams(&o.shape);
    size_t per_param = kind == FL_OPT_SGD ? 1 : 2; /* momentum; Adam's two moments */
    const fl_wk_shard_t modes[3] = {FL_WK_SHARD_NONE, FL_WK_SHARD_HYBRID, FL_WK_SHARD_GRAD};
    const size_t owned[3] = {np, (np + 1) / 2, ((np + 1) / 2 + 1) / 2};
    char path[3][128];
    char err[1200] = "";
    fl_wk_train_result_t rr[MAX_RANKS];
    for (int m = 0; m < 3; m++) {
        snprintf(path[m], sizeof path[m], "%s/shard-%s.safetensors", dir,
                 fl_wk_shard_name(modes[m]));
        o.shard = modes[m];
        o.save_path = path[m];
        int rc = fl_test_run_hosts(W, &o, NULL, &d, rr, err, sizeof err);
        ck_assert_msg(rc == FL_OK, "--shard %s: %s: %s", fl_wk_shard_name(modes[m]),
                      fl_strerror(rc), err);
        ck_assert_uint_eq(rr[0].mem_opt_state, per_param * owned[m] * sizeof(float));
        ck_assert_uint_eq(rr[1].mem_opt_state, per_param * owned[m] * sizeof(float));
        ck_assert_uint_eq(rr[0].mem_params, np * sizeof(float));
    }
    fl_test_params_close(layers, path[0], path[1], "--shard hybrid vs none");
    fl_test_params_close(layers, path[0], path[2], "--shard grad vs none");
    for (int m = 0; m < 3; m++)
        unlink(path[m]);
    fl_dataset_free(&d);
}

START_TEST(test_sharded_state_trains_the_same_parameters)
{
    check_shards(FL_OPT_SGD, 0.1, 0.0);
    check_shards(FL_OPT_ADAM, 0.01, 0.5); /* clipped by the global norm */
}
END_TEST

/* Memory per device as the device counts it (sim: its allocations): --shard hybrid with Adam
 * holds half the optimizer state of --shard none on 2 devices, and the device's own count
 * drops by that much (the summary's two figures agree); on cpu there is no device count. */
START_TEST(test_device_memory_measured)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    fl_wk_train_opts_t o;
    base_opts(&o, "6,64,64,3", NULL);
    o.mode = FL_WK_MODE_RING;
    o.batch = 8;
    o.replicas = 2;
    o.opt.kind = FL_OPT_ADAM;
    char err[1200] = "";
    fl_wk_train_result_t none[2];
    fl_wk_train_result_t hyb[2];
    int rc = fl_test_run_hosts(2, &o, NULL, &d, none, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "--shard none: %s", err);
    o.shard = FL_WK_SHARD_HYBRID;
    rc = fl_test_run_hosts(2, &o, NULL, &d, hyb, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "--shard hybrid: %s", err);
    if (o.device != FL_DEV_SIM) {
        ck_assert_msg(none[0].mem_device_total == 0 && none[0].mem_device_used == 0,
                      "cpu replicas report device memory: %llu of %llu",
                      (unsigned long long)none[0].mem_device_used,
                      (unsigned long long)none[0].mem_device_total);
        fl_dataset_free(&d);
        return;
    }
    for (int r = 0; r < 2; r++) {
        uint64_t need = none[r].mem_params + none[r].mem_grads + none[r].mem_opt_state;
        ck_assert_msg(none[r].mem_device_total > 0 && none[r].mem_device_used >= need &&
                          none[r].mem_device_used <= none[r].mem_device_total,
                      "rank %d: %llu bytes in use of %llu, the model's state alone takes %llu", r,
                      (unsigned long long)none[r].mem_device_used,
                      (unsigned long long)none[r].mem_device_total, (unsigned long long)need);
        /* Half, rounded up to the widest device's range (4803 parameters on 2 devices). */
        ck_assert_msg(hyb[r].mem_opt_state * 2 >= none[r].mem_opt_state &&
                          hyb[r].mem_opt_state * 2 <= none[r].mem_opt_state + 16,
                      "rank %d: optimizer state %llu (hybrid) against %llu (none)", r,
                      (unsigned long long)hyb[r].mem_opt_state,
                      (unsigned long long)none[r].mem_opt_state);
        int64_t saved = (int64_t)none[r].mem_device_used - (int64_t)hyb[r].mem_device_used;
        int64_t want = (int64_t)(none[r].mem_opt_state - hyb[r].mem_opt_state);
        ck_assert_msg(saved > want - 4096 && saved < want + 4096,
                      "rank %d: the device counts %lld bytes fewer with --shard hybrid, the "
                      "optimizer state is %lld fewer",
                      r, (long long)saved, (long long)want);
    }
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_shard_combinations_refused)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    fl_wk_train_opts_t o;
    base_opts(&o, "6,16,3", NULL);
    o.mode = FL_WK_MODE_RING;
    o.batch = 8;
    o.replicas = 2;
    char err[1200] = "";
    o.shard = FL_WK_SHARD_GRAD;
    o.topk = 0.1;
    int rc = fl_test_run_hosts(2, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EINVAL && strstr(err, "--topk") != NULL, "%s", err);
    o.topk = 0;
    o.shard = FL_WK_SHARD_HYBRID;
    o.hierarchy = FL_WK_HIER_FLAT;
    rc = fl_test_run_hosts(2, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EINVAL && strstr(err, "--hierarchy hybrid") != NULL, "%s", err);
    fl_dataset_free(&d);
}
END_TEST

static void setup_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/flodl-wk-hybrid-XXXXXX");
    ck_assert(mkdtemp(dir) != NULL);
}

static void teardown_dir(void)
{
    rmdir(dir);
}

/* A poll slice that times out while its event completes is no failure: on sim with
 * sim_late_done, every bucket's event still pending when the exchange waits for it completes
 * just after the 10 ms slice has timed out, so each wait meets that race. The overlapped leg
 * still trains the bits of the leg after the pass (it once failed the job with "an event did
 * not complete in 10 ms"). The jitter keeps the events pending when the waits start. */
START_TEST(test_overlap_slice_timeout_as_event_completes)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    char a[128], b[128], err[1200] = "";
    snprintf(a, sizeof a, "%s/late.safetensors", dir);
    snprintf(b, sizeof b, "%s/late_barrier.safetensors", dir);
    const char *layers = "6,16,16,3";
    fl_wk_train_opts_t o;
    base_opts(&o, layers, a);
    o.epochs = 1;
    o.mode = FL_WK_MODE_RING;
    o.batch = 4;
    o.replicas = 2;
    o.device = FL_DEV_SIM;
    o.sim_jitter_us = 3000;
    o.sim_late_done = true;
    o.overlap = true;
    fl_wk_train_result_t res[2];
    int rc = fl_test_run_hosts(2, &o, NULL, &d, res, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "overlapped, every slice late: %s", err);
    ck_assert_msg(strcmp(res[0].first_leg, "copy") == 0 && res[0].first_leg_overlapped,
                  "rank 0's first leg is '%s' (overlapped %d), expected 'copy' overlapped",
                  res[0].first_leg, res[0].first_leg_overlapped);
    o.overlap = false;
    o.sim_late_done = false;
    o.sim_jitter_us = 20;
    o.save_path = b;
    rc = fl_test_run_hosts(2, &o, NULL, &d, res, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "after the pass: %s", err);
    double diff = fl_test_params_diff(layers, a, b);
    ck_assert_msg(diff == 0.0, "overlapped with late events differs by %.3g", diff);
    unlink(a);
    unlink(b);
    fl_dataset_free(&d);
}
END_TEST

/* The two-level exchange overlapped with the backward pass (--overlap: each shard's exchange
 * reduces its buckets as the last device finishes their layers) trains the very bits of the
 * reduction after the whole pass: dense, top-k and clipped, 2 x 2, 3 x 3, 2 x 3 and 2 x 4
 * devices. On cpu both reduce in host memory; on sim (test_wk_hybrid_sim) both go through the
 * intra-host collectives (device copies), after the pass in one call, or overlapped in one
 * reduce-scatter per layer behind the devices' layer events. The 2 x 4 model has a layer of
 * fewer parameters than devices (1 -> 1: its bucket is empty, its parameters in the next); the
 * last model's layers start at odd offsets (105, 361) of an even count (412): unless a bucket
 * starts at a multiple of the devices, the last one's padding runs past the buffers. */
START_TEST(test_overlap_trains_the_same_bits)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    char a[128], b[128], what[160], err[1200] = "";
    snprintf(a, sizeof a, "%s/overlap.safetensors", dir);
    snprintf(b, sizeof b, "%s/barrier.safetensors", dir);
    static const struct {
        int W, L;
        double topk, max_norm;
        const char *layers;
    } cases[] = {{2, 2, 0, 0, "6,16,16,3"},   {2, 2, 0.1, 0, "6,16,16,3"},
                 {3, 3, 0, 1.0, "6,16,16,3"}, {2, 3, 0.05, 0.5, "6,16,16,3"},
                 {2, 4, 0, 0, "6,16,1,1,3"},  {2, 2, 0, 0, "6,15,16,3"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *layers = cases[c].layers;
        fl_wk_train_opts_t o;
        base_opts(&o, layers, a);
        o.mode = FL_WK_MODE_RING;
        o.batch = 4;
        o.replicas = cases[c].L;
        o.topk = cases[c].topk;
        o.max_norm = cases[c].max_norm;
        o.overlap = true;
        snprintf(what, sizeof what, "%d x %d, top-k %g, clip %g, layers %s", cases[c].W, cases[c].L,
                 cases[c].topk, cases[c].max_norm, layers);
        /* The leg each device kind takes: host memory on cpu, device copies on sim. */
        const char *leg = o.device == FL_DEV_SIM ? "copy" : "host";
        fl_wk_train_result_t res[3];
        int rc = fl_test_run_hosts(cases[c].W, &o, NULL, &d, res, err, sizeof err);
        ck_assert_msg(rc == FL_OK, "%s: overlapped: %s", what, err);
        for (int r = 0; r < cases[c].W; r++)
            ck_assert_msg(res[r].first_leg != NULL && strcmp(res[r].first_leg, leg) == 0 &&
                              res[r].first_leg_overlapped,
                          "%s: rank %d's first leg is '%s' (overlapped %d), expected '%s' "
                          "overlapped",
                          what, r, res[r].first_leg ? res[r].first_leg : "(null)",
                          res[r].first_leg_overlapped, leg);
        o.overlap = false;
        o.save_path = b;
        rc = fl_test_run_hosts(cases[c].W, &o, NULL, &d, res, err, sizeof err);
        ck_assert_msg(rc == FL_OK, "%s: after the pass: %s", what, err);
        for (int r = 0; r < cases[c].W; r++)
            ck_assert_msg(strcmp(res[r].first_leg, leg) == 0 && !res[r].first_leg_overlapped,
                          "%s: rank %d's first leg without --overlap is '%s' (overlapped %d)", what,
                          r, res[r].first_leg, res[r].first_leg_overlapped);
        double diff = fl_test_params_diff(layers, a, b);
        ck_assert_msg(diff == 0.0, "%s: overlapped differs by %.3g", what, diff);
    }
    unlink(a);
    unlink(b);
    fl_dataset_free(&d);
}
END_TEST

/* --first-leg: on sim the devices' leg (device copies) and the host-memory leg train the same
 * bits, after the pass and overlapped, with --shard hybrid too, and each run says which leg it
 * took; on cpu the devices' leg is refused, naming the flag. */
START_TEST(test_first_leg_choice)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    const char *layers = "6,16,16,3";
    char ref[128], out[128], what[96], err[1200] = "";
    snprintf(ref, sizeof ref, "%s/leg-ref.safetensors", dir);
    snprintf(out, sizeof out, "%s/leg.safetensors", dir);
    fl_wk_train_opts_t o;
    base_opts(&o, layers, ref);
    o.mode = FL_WK_MODE_RING;
    o.batch = 4;
    o.replicas = 2;
    o.topk = 0.1;
    fl_wk_train_result_t res[2];
    if (o.device != FL_DEV_SIM) {
        o.first_leg = FL_WK_LEG_DEVICES;
        int rc = fl_test_run_hosts(2, &o, NULL, &d, res, err, sizeof err);
        ck_assert_msg(rc == FL_EINVAL && strstr(err, "--first-leg devices") != NULL,
                      "cpu replicas with --first-leg devices: %d %s", rc, err);
        fl_dataset_free(&d);
        return;
    }
    /* --hierarchy flat has no first leg to put on the devices: said, not ignored. */
    o.first_leg = FL_WK_LEG_DEVICES;
    o.hierarchy = FL_WK_HIER_FLAT;
    int frc = fl_test_run_hosts(2, &o, NULL, &d, res, err, sizeof err);
    ck_assert_msg(frc == FL_EINVAL && strstr(err, "--hierarchy flat has no first leg") != NULL,
                  "flat with --first-leg devices: %d %s", frc, err);
    o.hierarchy = FL_WK_HIER_HYBRID;
    static const struct {
        fl_wk_leg_t leg;
        bool overlap;
        const char *name;
    } runs[] = {{FL_WK_LEG_DEVICES, false, "copy"},
                {FL_WK_LEG_HOST, false, "host"},
                {FL_WK_LEG_HOST, true, "host"},
                {FL_WK_LEG_AUTO, true, "copy"}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        o.first_leg = runs[i].leg;
        o.overlap = runs[i].overlap;
        o.save_path = i == 0 ? ref : out;
        snprintf(what, sizeof what, "leg %d%s", (int)runs[i].leg,
                 runs[i].overlap ? " overlapped" : "");
        int rc = fl_test_run_hosts(2, &o, NULL, &d, res, err, sizeof err);
        ck_assert_msg(rc == FL_OK, "%s: %s", what, err);
        for (int r = 0; r < 2; r++)
            ck_assert_msg(strcmp(res[r].first_leg, runs[i].name) == 0 &&
                              res[r].first_leg_overlapped == runs[i].overlap,
                          "%s: rank %d took '%s' (overlapped %d), expected '%s'", what, r,
                          res[r].first_leg, res[r].first_leg_overlapped, runs[i].name);
        if (i > 0) {
            double diff = fl_test_params_diff(layers, ref, out);
            ck_assert_msg(diff == 0.0, "%s differs from the devices' leg by %.3g", what, diff);
        }
    }
    /* --shard hybrid: each device steps its range on the device; on the devices' leg the
     * ranges then go from device to device (a broadcast per range) instead of the whole model
     * from the host to each device: the same bits (sim's jitter would show a pass that read
     * the parameters before their broadcast landed). */
    /* --shard grad: each device steps its piece of its column; the columns, all-gathered
     * across hosts in host memory, go into their own device each and from there to the others
     * (the model crosses to the devices once, not once per device): the same bits. */
    o.topk = 0;
    o.overlap = false;
    const fl_wk_shard_t gathered[2] = {FL_WK_SHARD_HYBRID, FL_WK_SHARD_GRAD};
    for (int m = 0; m < 2; m++) {
        o.shard = gathered[m];
        for (int i = 0; i < 2; i++) {
            o.first_leg = i == 0 ? FL_WK_LEG_HOST : FL_WK_LEG_DEVICES;
            o.save_path = i == 0 ? ref : out;
            int rc = fl_test_run_hosts(2, &o, NULL, &d, res, err, sizeof err);
            ck_assert_msg(rc == FL_OK, "--shard %s, leg %d: %s", fl_wk_shard_name(o.shard),
                          (int)o.first_leg, err);
            for (int r = 0; r < 2; r++)
                ck_assert_msg(res[r].params_gathered_on_devices == (i == 1),
                              "--shard %s, leg %d: rank %d gathered on the devices: %d",
                              fl_wk_shard_name(o.shard), (int)o.first_leg, r,
                              res[r].params_gathered_on_devices);
        }
        double diff = fl_test_params_diff(layers, ref, out);
        ck_assert_msg(diff == 0.0, "--shard %s: the devices' all-gather differs by %.3g",
                      fl_wk_shard_name(o.shard), diff);
    }
    /* Top-k after the pass on the devices' leg: each device compresses the shard it holds
     * reduced (residuals there, only the pairs copied out), the host leg on the host: the same
     * bits. 173 parameters on 4 devices: the exchange's shards 2 and 3 start one and two
     * elements below the reduce-scatter's (87 against 88, 130 against 132, the last in the
     * output layer's weights), which devices 1 and 2 reduced (fetched from them). */
    const char *odd = "6,17,3";
    base_opts(&o, odd, ref);
    o.mode = FL_WK_MODE_RING;
    o.batch = 4;
    o.replicas = 4;
    o.topk = 0.1;
    o.max_norm = 0.5;
    for (int i = 0; i < 2; i++) {
        o.first_leg = i == 0 ? FL_WK_LEG_HOST : FL_WK_LEG_DEVICES;
        o.save_path = i == 0 ? ref : out;
        fl_wk_train_result_t r3[2];
        int rc = fl_test_run_hosts(2, &o, NULL, &d, r3, err, sizeof err);
        ck_assert_msg(rc == FL_OK, "top-k 2 x 4, leg %d: %s", (int)o.first_leg, err);
        for (int r = 0; r < 2; r++)
            ck_assert_msg(r3[r].topk_on_devices == (i == 1),
                          "top-k 2 x 4, leg %d: rank %d's top-k on the devices: %d",
                          (int)o.first_leg, r, r3[r].topk_on_devices);
    }
    double diff = fl_test_params_diff(odd, ref, out);
    ck_assert_msg(diff == 0.0, "top-k 2 x 4: on the devices differs from the host by %.3g", diff);
    unlink(ref);
    unlink(out);
    fl_dataset_free(&d);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("wk_hybrid");
    TCase *t = tcase_create("hybrid");
    tcase_set_timeout(t, 240);
    tcase_add_checked_fixture(t, setup_dir, teardown_dir);
    tcase_add_test(t, test_two_hosts_two_devices_equal_one_worker);
    tcase_add_test(t, test_three_hosts_two_devices_equal_one_worker);
    tcase_add_test(t, test_hybrid_sends_fewer_bytes_across_hosts);
    tcase_add_test(t, test_topk_over_hybrid_legs_learns);
    tcase_add_test(t, test_overlap_trains_the_same_bits);
    tcase_add_test(t, test_overlap_slice_timeout_as_event_completes);
    tcase_add_test(t, test_first_leg_choice);
    tcase_add_test(t, test_hosts_with_different_device_counts_refused);
    tcase_add_test(t, test_sharded_state_trains_the_same_parameters);
    tcase_add_test(t, test_shard_combinations_refused);
    tcase_add_test(t, test_device_memory_measured);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
