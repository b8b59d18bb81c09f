/* Training through the parameter server (worker/train_ps.c) on a small dataset: two ranks with
 * batch 16 against a sync server running SGD with momentum (and Adam) end with the parameters
 * of one local worker with batch 32, to float32 tolerance; top-k pushes with error feedback
 * learn; a server holding another model is refused. Two hosts x two devices with a client
 * per device (each pushing and pulling its own shards) train the bits of the host's mean over
 * one client, and of one worker with the global batch to float32 tolerance; async and top-k
 * per device learn; their residuals resume bit for bit. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_ps.h"
#include "fl_wk.h"
#include "testutil.h"
#include "wkdata.h"

#define N 512

static char dir[64];
static int g_shards = 2;           /* the next server's shards */
static fl_ps_consistency_t g_cons; /* and its consistency (sync unless a test says) */

static void base_opts(fl_wk_train_opts_t *o, const char *save)
{
    fl_wk_train_opts_init(o);
    fl_mlp_parse("6,16,3", &o->shape);
    o->epochs = 2;
    o->shuffle = false;
    o->seed = 3;
    o->lr.lr = 0.1;
    o->quiet = true;
    o->save_path = save;
}

typedef struct ps_job {
    fl_coord_t *coord;
    fl_ps_server_t *srv;
} ps_job_t;

/* A coordinator and a 2-shard sync server running the optimizer o describes; with ckpt, it
 * checkpoints there every `every` steps (and at its stop), resuming from there when asked. */
static void ps_start_ck(ps_job_t *j, int world, const fl_wk_train_opts_t *o, const char *ckpt,
                        uint64_t every, bool resume)
{
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = "tcp://127.0.0.1:0";
    co.world_size = world;
    co.num_shards = g_shards;
    co.log_level = FL_LOG_OFF;
    ck_assert(fl_coord_create(&co, &j->coord) == FL_OK);
    ck_assert(fl_coord_start(j->coord) == FL_OK);
    fl_ps_server_opts_t so;
    fl_ps_server_opts_init(&so);
    so.coordinator = fl_coord_endpoint(j->coord);
    so.host = "127.0.0.1";
    so.num_shards = g_shards;
    so.shard_count = g_shards;
    so.consistency = g_cons;
    so.opt = o->opt;
    so.lr = o->lr;
    so.log_level = FL_LOG_OFF;
    so.checkpoint_dir = ckpt;
    so.ckpt_every_steps = every;
    so.resume = resume;
    ck_assert_msg(fl_ps_server_create(&so, &j->srv) == FL_OK, "%s", fl_last_error());
    ck_assert(fl_ps_server_start(j->srv) == FL_OK);
}

static void ps_start(ps_job_t *j, int world, const fl_wk_train_opts_t *o)
{
    ps_start_ck(j, world, o, NULL, 0, false);
}

static void ps_end(ps_job_t *j)
{
    fl_ps_server_stop(j->srv);
    fl_ps_server_destroy(&j->srv);
    fl_coord_stop(j->coord);
    fl_coord_destroy(&j->coord);
}

typedef struct rank_arg {
    const char *endpoint;
    int rank, world;
    fl_wk_train_opts_t o;
    const fl_dataset_t *data;
    fl_wk_train_result_t res;
    int rc;
    char err[1024];
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    fl_ps_client_opts_t po;
    fl_ps_client_opts_init(&po);
    po.rank = a->rank;
    po.world_size = a->world;
    po.coordinator = a->endpoint;
    po.host = "127.0.0.1";
    po.param_count = fl_mlp_nparams(&a->o.shape);
    po.model_signature = fl_mlp_signature(&a->o.shape);
    po.timeout_ms = 20000;
    po.rendezvous_timeout_ms = 20000;
    po.log_level = FL_LOG_OFF;
    fl_ps_client_t *cl = NULL;
    a->rc = fl_ps_client_create(&po, &cl);
    if (a->rc == FL_OK)
        a->rc = fl_wk_train_ps(cl, a->rank, a->world, a->data, a->data, &a->o, &a->res);
    if (a->rc != FL_OK)
        snprintf(a->err, sizeof a->err, "%s", fl_last_error());
    fl_ps_client_destroy(&cl);
    return NULL;
}

/* world ranks train through the server of j; rank 0 saves to base->save_path. */
static void run_ranks(ps_job_t *j, int world, const fl_wk_train_opts_t *base, const fl_dataset_t *d,
                      rank_arg_t *args)
{
    pthread_t th[4];
    for (int r = 0; r < world; r++) {
        memset(&args[r], 0, sizeof args[r]);
        args[r].endpoint = fl_coord_endpoint(j->coord);
        args[r].rank = r;
        args[r].world = world;
        args[r].o = *base;
        args[r].o.mode = FL_WK_MODE_PS;
        args[r].data = d;
        ck_assert(pthread_create(&th[r], NULL, rank_main, &args[r]) == 0);
    }
    for (int r = 0; r < world; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < world; r++)
        ck_assert_msg(args[r].rc == FL_OK, "rank %d: %s", r, args[r].err);
}

/* world ranks train through a fresh parameter server; rank 0 saves to save. */
static void run_ps(int world, const fl_wk_train_opts_t *base, const fl_dataset_t *d,
                   rank_arg_t *args)
{
    ps_job_t j;
    ps_start(&j, world, base);
    run_ranks(&j, world, base, d, args);
    ps_end(&j);
}

START_TEST(test_ps_data_parallel_equivalence)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 99);
    char one[128], ps[128];
    snprintf(one, sizeof one, "%s/one.safetensors", dir);
    snprintf(ps, sizeof ps, "%s/ps.safetensors", dir);
    static rank_arg_t args[4];

    /* SGD with momentum: one local worker of batch 32, two ranks of 16 through the server. */
    fl_wk_train_opts_t o;
    base_opts(&o, one);
    o.batch = 32;
    fl_wk_train_result_t res;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());
    base_opts(&o, ps);
    o.batch = 16;
    run_ps(2, &o, &d, args);
    ck_assert_int_eq(args[0].res.steps, 2 * (N / 32));
    ck_assert_int_eq(args[0].res.epochs, 2);
    ck_assert(args[0].res.test_acc > 0.8);
    ck_assert(isnan(args[1].res.test_acc)); /* rank 0 evaluates */
    double diff = fl_test_params_diff("6,16,3", one, ps);
    ck_assert_msg(diff < 1e-4, "2 ranks through the server vs 1 local: %.3g", diff);

    /* Adam, four ranks of batch 8. */
    base_opts(&o, one);
    o.batch = 32;
    o.opt.kind = FL_OPT_ADAM;
    o.opt.momentum = 0;
    o.lr.lr = 0.01;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());
    base_opts(&o, ps);
    o.batch = 8;
    o.opt.kind = FL_OPT_ADAM;
    o.opt.momentum = 0;
    o.lr.lr = 0.01;
    run_ps(4, &o, &d, args);
    diff = fl_test_params_diff("6,16,3", one, ps);
    ck_assert_msg(diff < 1e-4, "Adam, 4 ranks through the server vs 1 local: %.3g", diff);
    unlink(one);
    unlink(ps);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_ps_topk_learns)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 99);
    fl_wk_train_opts_t o;
    base_opts(&o, NULL);
    o.batch = 16;
    o.epochs = 4;
    o.topk = 0.1;
    static rank_arg_t args[2];
    run_ps(2, &o, &d, args);
    ck_assert_msg(args[0].res.test_acc > 0.9, "accuracy %.3f", args[0].res.test_acc);
    /* 10% of the entries, an index and a value each (plus a 40-byte block header per shard,
     * which weighs on a 163-parameter model). */
    ck_assert_msg(args[1].res.bytes_sent * 3 < args[1].res.raw_bytes, "%llu of %llu bytes",
                  (unsigned long long)args[1].res.bytes_sent,
                  (unsigned long long)args[1].res.raw_bytes);
    fl_dataset_free(&d);
}
END_TEST

/* The workers' top-k residuals across a restart of the whole job: the server checkpoints
 * every epoch, each worker saves its residual at the epoch's end (--checkpoint), and the job
 * resumed from both (--resume) trains the parameters of one that never stopped; resumed with
 * the residuals at zero (files removed), it does not. */
START_TEST(test_ps_topk_residual_resumes)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 99);
    char straight[128], resumed[128], bare[128], srv[128], srv2[128], wk[128], cmd[1024];
    snprintf(straight, sizeof straight, "%s/straight.safetensors", dir);
    snprintf(resumed, sizeof resumed, "%s/resumed.safetensors", dir);
    snprintf(bare, sizeof bare, "%s/bare.safetensors", dir);
    snprintf(srv, sizeof srv, "%s/srv", dir);
    snprintf(srv2, sizeof srv2, "%s/srv-copy", dir);
    snprintf(wk, sizeof wk, "%s/wk", dir);
    enum { W = 2 };
    static rank_arg_t args[W];
    fl_wk_train_opts_t o;
    base_opts(&o, straight);
    o.batch = 16;
    o.topk = 0.1;
    run_ps(W, &o, &d, args);
    uint64_t per_epoch = N / (W * 16);

    ps_job_t j;
    ps_start_ck(&j, W, &o, srv, per_epoch, false);
    o.epochs = 1;
    o.save_path = NULL;
    o.checkpoint_dir = wk;
    run_ranks(&j, W, &o, &d, args);
    ps_end(&j);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", srv, srv2);
    ck_assert(system(cmd) == 0);

    ps_start_ck(&j, W, &o, srv, per_epoch, true);
    o.epochs = 2;
    o.checkpoint_dir = NULL;
    o.resume_dir = wk;
    o.save_path = resumed;
    run_ranks(&j, W, &o, &d, args);
    ps_end(&j);
    ck_assert_int_eq(args[0].res.steps, (long)per_epoch);
    double diff = fl_test_params_diff("6,16,3", straight, resumed);
    ck_assert_msg(diff == 0.0, "resumed differs from straight by %.3g", diff);

    for (int r = 0; r < W; r++) {
        char path[256];
        snprintf(path, sizeof path, "%s/state-s%llu-r%d.safetensors", wk,
                 (unsigned long long)per_epoch, r);
        ck_assert_msg(unlink(path) == 0, "no %s", path);
    }
    ps_start_ck(&j, W, &o, srv2, per_epoch, true);
    o.save_path = bare;
    run_ranks(&j, W, &o, &d, args);
    ps_end(&j);
    diff = fl_test_params_diff("6,16,3", straight, bare);
    ck_assert_msg(diff > 1e-5, "the residuals made no difference (%.3g)", diff);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s' '%s' '%s' '%s'", srv, srv2, wk, straight,
             resumed, bare);
    ck_assert(system(cmd) == 0);
    fl_dataset_free(&d);
}
END_TEST

/* 2 hosts x 2 devices, batch 8 each: a client per device (2 and 4 shards, each device its
 * own), the host's mean over one client, and one worker of batch 32. */
START_TEST(test_ps_device_clients_equivalence)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 99);
    char one[128], host[128], dev[128];
    snprintf(one, sizeof one, "%s/dc-one.safetensors", dir);
    snprintf(host, sizeof host, "%s/dc-host.safetensors", dir);
    snprintf(dev, sizeof dev, "%s/dc-dev.safetensors", dir);
    static rank_arg_t args[2];
    fl_wk_train_opts_t o;
    base_opts(&o, one);
    o.batch = 32;
    o.opt.momentum = 0.9;
    fl_wk_train_result_t res;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());
    /* Clipping (on each host's mean, before the devices' split) only against one client. */
    for (int clip = 0; clip < 2; clip++) {
        base_opts(&o, host);
        o.batch = 8;
        o.replicas = 2;
        o.opt.momentum = 0.9;
        o.max_norm = clip ? 0.05 : 0.0;
        o.ps_host_client = true;
        run_ps(2, &o, &d, args);
        o.ps_host_client = false;
        o.save_path = dev;
        for (int shards = 2; shards <= (clip ? 2 : 4); shards += 2) {
            g_shards = shards;
            run_ps(2, &o, &d, args);
            g_shards = 2;
            ck_assert_int_eq(args[0].res.steps, 2 * (N / 32));
            ck_assert(args[0].res.test_acc > 0.8);
            double diff = fl_test_params_diff("6,16,3", host, dev);
            ck_assert_msg(diff == 0.0,
                          "%d shards%s: a client per device vs the host's mean: "
                          "%.3g",
                          shards, clip ? ", clipped" : "", diff);
            diff = fl_test_params_diff("6,16,3", one, dev);
            ck_assert_msg(clip || diff < 1e-4, "%d shards: 2 x 2 devices vs 1 local: %.3g", shards,
                          diff);
        }
    }
    unlink(one);
    unlink(host);
    unlink(dev);
    fl_dataset_free(&d);
}
END_TEST

/* Async and SSP with a client per device, dense and top-k: every device's pushes are
 * applied as they come, and the job still learns. */
START_TEST(test_ps_device_clients_async_learns)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 99);
    static rank_arg_t args[2];
    fl_wk_train_opts_t o;
    base_opts(&o, NULL);
    o.batch = 8;
    o.replicas = 2;
    o.epochs = 4;
    fl_ps_consistency_t cons[] = {FL_PS_ASYNC, FL_PS_SSP};
    for (int c = 0; c < 2; c++) {
        for (int topk = 0; topk < 2; topk++) {
            g_cons = cons[c];
            o.topk = topk ? 0.1 : 0.0;
            run_ps(2, &o, &d, args);
            g_cons = FL_PS_SYNC;
            ck_assert_msg(args[0].res.test_acc > 0.9, "%s%s: accuracy %.3f",
                          fl_ps_consistency_name(cons[c]), topk ? ", top-k" : "",
                          args[0].res.test_acc);
            ck_assert_int_eq(args[1].res.steps, 4 * (N / 32));
            if (topk)
                ck_assert_msg(args[1].res.bytes_sent * 3 < args[1].res.raw_bytes,
                              "%llu of %llu bytes", (unsigned long long)args[1].res.bytes_sent,
                              (unsigned long long)args[1].res.raw_bytes);
        }
    }
    fl_dataset_free(&d);
}
END_TEST

/* Each device's top-k residual is checkpointed beside the others (one file per rank) and a
 * job resumed from the server's and the workers' checkpoints trains the bits of one that
 * never stopped. */
START_TEST(test_ps_device_clients_residuals_resume)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 99);
    char straight[128], resumed[128], srv[128], wk[128], cmd[1024];
    snprintf(straight, sizeof straight, "%s/dstraight.safetensors", dir);
    snprintf(resumed, sizeof resumed, "%s/dresumed.safetensors", dir);
    snprintf(srv, sizeof srv, "%s/dsrv", dir);
    snprintf(wk, sizeof wk, "%s/dwk", dir);
    enum { W = 2 };
    static rank_arg_t args[W];
    fl_wk_train_opts_t o;
    base_opts(&o, straight);
    o.batch = 8;
    o.replicas = 2;
    o.topk = 0.1;
    run_ps(W, &o, &d, args);
    uint64_t per_epoch = N / (W * 2 * 8);

    ps_job_t j;
    ps_start_ck(&j, W, &o, srv, per_epoch, false);
    o.epochs = 1;
    o.save_path = NULL;
    o.checkpoint_dir = wk;
    run_ranks(&j, W, &o, &d, args);
    ps_end(&j);

    ps_start_ck(&j, W, &o, srv, per_epoch, true);
    o.epochs = 2;
    o.checkpoint_dir = NULL;
    o.resume_dir = wk;
    o.save_path = resumed;
    run_ranks(&j, W, &o, &d, args);
    ps_end(&j);
    ck_assert_int_eq(args[0].res.steps, (long)per_epoch);
    double diff = fl_test_params_diff("6,16,3", straight, resumed);
    ck_assert_msg(diff == 0.0, "resumed differs from straight by %.3g", diff);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s' '%s'", srv, wk, straight, resumed);
    ck_assert(system(cmd) == 0);
    fl_dataset_free(&d);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("wk_ps");
    TCase *t = tcase_create("train");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_ps_data_parallel_equivalence);
    tcase_add_test(t, test_ps_topk_learns);
    tcase_add_test(t, test_ps_topk_residual_resumes);
    tcase_add_test(t, test_ps_device_clients_equivalence);
    tcase_add_test(t, test_ps_device_clients_async_learns);
    tcase_add_test(t, test_ps_device_clients_residuals_resume);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/flodl-wkps-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return 1;
    int rc = fl_test_run(suite());
    rmdir(dir);
    return rc;
}
