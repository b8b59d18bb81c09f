/* Sharded checkpoints: training state saved as a file per range plus a manifest, loaded into
 * another layout (other hosts, devices and --shard) so that the resumed run trains the same
 * parameters as one that never stopped; a checkpoint of another model or optimizer, or with a
 * range missing, is refused with the reason. */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testproc.h"
#include "testutil.h"
#include "train_int.h"
#include "wkdata.h"

#define N 512
#define LAYERS "6,16,3"

static char dir[64];

static void base_opts(fl_wk_train_opts_t *o)
{
    fl_wk_train_opts_init(o);
    fl_mlp_parse(LAYERS, &o->shape);
    o->mode = FL_WK_MODE_RING;
    o->epochs = 2;
    o->shuffle = true; /* the sampler's epoch permutation must continue too */
    o->seed = 5;
    o->lr.lr = 0.1;
    o->quiet = true;
    o->batch = 8;
}

static void rm_dir(const char *path)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    ck_assert(system(cmd) == 0);
}

/* 2 hosts x 2 devices with --shard shard1 for one epoch, then W2 hosts x L2 devices with
 * shard2 for the second, against 2 x 2 straight through. */
static void resume_into(fl_wk_shard_t shard1, int W2, int L2, fl_wk_shard_t shard2,
                        fl_opt_kind_t kind)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 13);
    char straight[128], resumed[128], ck[128], err[1200] = "";
    snprintf(straight, sizeof straight, "%s/straight.safetensors", dir);
    snprintf(resumed, sizeof resumed, "%s/resumed.safetensors", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    fl_wk_train_opts_t o;
    base_opts(&o);
    o.opt.kind = kind;
    if (kind != FL_OPT_SGD) {
        o.opt.momentum = 0;
        o.lr.lr = 0.01;
    }
    o.replicas = 2;
    o.shard = shard1;
    o.save_path = straight;
    int rc = fl_test_run_hosts(2, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "straight: %s", err);

    o.epochs = 1;
    o.save_path = NULL;
    o.checkpoint_dir = ck;
    rc = fl_test_run_hosts(2, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "first epoch: %s", err);
    char path[256];
    snprintf(path, sizeof path, "%s/manifest.safetensors", ck);
    ck_assert_msg(access(path, R_OK) == 0, "no manifest");
    /* One file per piece: 2 hosts x 2 devices (x 2 layers under --shard full). */
    /* none: one range, rank 0's device 0's (every device holds the same state). */
    int files = shard1 == FL_WK_SHARD_NONE ? 1 : 2;
    for (int r = 0; r < files; r++)
        for (int t = 0; t < files; t++)
            for (int u = 0; u < (shard1 == FL_WK_SHARD_FULL ? 2 : 1); u++) {
                int id = shard1 == FL_WK_SHARD_FULL ? t * FL_MLP_MAX_LAYERS + u : t;
                snprintf(path, sizeof path, "%s/shard-s%d-r%d-d%d.safetensors", ck, N / 32, r, id);
                ck_assert_msg(access(path, R_OK) == 0, "missing %s", path);
            }

    o.epochs = 2;
    o.checkpoint_dir = NULL;
    o.resume_dir = ck;
    o.replicas = L2;
    o.shard = shard2;
    o.save_path = resumed;
    fl_wk_train_result_t res[FL_TEST_MAX_HOSTS];
    rc = fl_test_run_hosts(W2, &o, NULL, &d, res, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "resumed: %s", err);
    ck_assert_int_eq(res[0].steps, 2 * N / 32);
    char what[128];
    snprintf(what, sizeof what, "--shard %s resumed into %d x %d --shard %s",
             fl_wk_shard_name(shard1), W2, L2, fl_wk_shard_name(shard2));
    fl_test_params_close(LAYERS, straight, resumed, what);
    rm_dir(ck);
    unlink(straight);
    unlink(resumed);
    fl_dataset_free(&d);
}

START_TEST(test_resume_into_one_host_of_four_devices)
{
    resume_into(FL_WK_SHARD_GRAD, 1, 4, FL_WK_SHARD_HYBRID, FL_OPT_SGD);
}
END_TEST

/* --shard full's pieces (a range per device and layer) load into other layouts, and other
 * layouts into its pieces. */
START_TEST(test_full_resumes_into_other_layouts)
{
    resume_into(FL_WK_SHARD_FULL, 1, 4, FL_WK_SHARD_HYBRID, FL_OPT_SGD);
    resume_into(FL_WK_SHARD_FULL, 4, 1, FL_WK_SHARD_GRAD, FL_OPT_ADAM);
    resume_into(FL_WK_SHARD_GRAD, 1, 4, FL_WK_SHARD_FULL, FL_OPT_ADAM);
}
END_TEST

/* --shard none keeps parameters and optimizer state on the devices (copied out for the
 * checkpoint, back in on resume), and hands them to and from the host's layouts. */
START_TEST(test_resident_state_resumes)
{
    resume_into(FL_WK_SHARD_NONE, 1, 4, FL_WK_SHARD_NONE, FL_OPT_ADAM);
    resume_into(FL_WK_SHARD_NONE, 4, 1, FL_WK_SHARD_GRAD, FL_OPT_SGD);
    resume_into(FL_WK_SHARD_GRAD, 2, 2, FL_WK_SHARD_NONE, FL_OPT_ADAM);
}
END_TEST

START_TEST(test_resume_into_four_hosts_adam)
{
    resume_into(FL_WK_SHARD_GRAD, 4, 1, FL_WK_SHARD_GRAD, FL_OPT_ADAM);
}
END_TEST

/* El Che's schedule follows the job's samples: a resumed run takes up the schedule where the
 * checkpoint left it (warm-up included), not from its first step. */
START_TEST(test_el_che_resume_keeps_the_schedule)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 13);
    char straight[128], resumed[128], ck[128], err[1200] = "";
    snprintf(straight, sizeof straight, "%s/straight.safetensors", dir);
    snprintf(resumed, sizeof resumed, "%s/resumed.safetensors", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    fl_wk_train_opts_t o;
    base_opts(&o);
    o.mode = FL_WK_MODE_LOCAL;
    o.replicas = 2;
    o.max_anchor = 2;
    o.replan_every = 0; /* fixed counts: the two runs see the same batches */
    o.lr.warmup_steps = 40;
    o.save_path = straight;
    fl_wk_train_result_t res;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());
    o.epochs = 1;
    o.save_path = NULL;
    o.checkpoint_dir = ck;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());
    o.epochs = 2;
    o.checkpoint_dir = NULL;
    o.resume_dir = ck;
    o.save_path = resumed;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());
    fl_test_params_close(LAYERS, straight, resumed, "El Che resumed vs straight");
    (void)err;
    rm_dir(ck);
    unlink(straight);
    unlink(resumed);
    fl_dataset_free(&d);
}
END_TEST

/* Removes the checkpoint's per-rank state files (residuals, local optimizers): how many. */
static size_t remove_state_files(const char *ck)
{
    char pat[256];
    snprintf(pat, sizeof pat, "%s/state-s*-r*.safetensors", ck);
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0)
        return 0;
    size_t n = g.gl_pathc;
    for (size_t i = 0; i < n; i++)
        ck_assert(unlink(g.gl_pathv[i]) == 0);
    globfree(&g);
    return n;
}

/* A rank's own state (top-k's residuals, local SGD's optimizer per device) goes into the
 * checkpoint: W hosts of o run one epoch with --checkpoint, then resume for the second and
 * train exactly the parameters of a run that never stopped; resumed from the same checkpoint
 * without the state files (residuals and momenta at zero) they differ. */
static void resume_own_state(fl_wk_train_opts_t *o, int W, const char *what)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 13);
    char straight[128], resumed[128], bare[128], ck[128], err[1200] = "";
    snprintf(straight, sizeof straight, "%s/straight.safetensors", dir);
    snprintf(resumed, sizeof resumed, "%s/resumed.safetensors", dir);
    snprintf(bare, sizeof bare, "%s/bare.safetensors", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    o->epochs = 2;
    o->save_path = straight;
    int rc = fl_test_run_hosts(W, o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s straight: %s", what, err);
    o->epochs = 1;
    o->save_path = NULL;
    o->checkpoint_dir = ck;
    rc = fl_test_run_hosts(W, o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s first epoch: %s", what, err);
    o->epochs = 2;
    o->checkpoint_dir = NULL;
    o->resume_dir = ck;
    o->save_path = resumed;
    rc = fl_test_run_hosts(W, o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s resumed: %s", what, err);
    double same = fl_test_params_diff(LAYERS, straight, resumed);
    ck_assert_msg(same == 0.0, "%s: resumed differs from straight by %.3g", what, same);
    ck_assert_msg(remove_state_files(ck) == (size_t)W, "%s: not one state file per rank", what);
    o->save_path = bare;
    rc = fl_test_run_hosts(W, o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s resumed without state: %s", what, err);
    double lost = fl_test_params_diff(LAYERS, straight, bare);
    ck_assert_msg(lost > 1e-5, "%s: the state files made no difference (%.3g)", what, lost);
    o->resume_dir = NULL;
    o->save_path = NULL;
    rm_dir(ck);
    unlink(straight);
    unlink(resumed);
    unlink(bare);
    fl_dataset_free(&d);
}

static void topk_opts(fl_wk_train_opts_t *o)
{
    base_opts(o);
    o->replicas = 2;
    o->topk = 0.1;
    o->bucket_bytes = 64 * sizeof(float); /* several buckets, a residual each */
}

/* Residuals of the two-level exchange (one per device's shard, on the host) and of the flat
 * ring (one per device; on the device itself under sim), and of one device per host. */
START_TEST(test_topk_residuals_resume)
{
    fl_wk_train_opts_t o;
    topk_opts(&o);
    resume_own_state(&o, 2, "2 x 2 hybrid top-k");
    topk_opts(&o);
    o.hierarchy = FL_WK_HIER_FLAT;
    resume_own_state(&o, 2, "2 x 2 flat top-k");
    topk_opts(&o);
    o.replicas = 1;
    resume_own_state(&o, 2, "2 x 1 top-k");
}
END_TEST

START_TEST(test_topk_residuals_resume_sharded)
{
    fl_wk_train_opts_t o;
    topk_opts(&o);
    o.shard = FL_WK_SHARD_HYBRID;
    o.max_norm = 1.0; /* clipped before accumulation */
    resume_own_state(&o, 2, "2 x 2 --shard hybrid top-k");
}
END_TEST

/* Local SGD: every device's own optimizer (momentum) and, with top-k, the residuals of the
 * rounds' deltas; --policy async with no run-ahead (the same rounds every run). */
START_TEST(test_local_sgd_state_resumes)
{
    fl_wk_train_opts_t o;
    topk_opts(&o);
    o.policy = FL_WK_POLICY_CADENCE;
    o.max_anchor = 2;
    o.replan_every = 0; /* fixed counts: every run sees the same rounds */
    resume_own_state(&o, 2, "--policy cadence top-k");
    topk_opts(&o);
    o.topk = 0;
    o.policy = FL_WK_POLICY_ASYNC;
    o.max_anchor = 2;
    o.replan_every = 0;
    o.run_ahead = 0;
    resume_own_state(&o, 2, "--policy async");
}
END_TEST

START_TEST(test_bad_checkpoints_refused)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 13);
    char ck[128], err[1200] = "", path[256];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    fl_wk_train_opts_t o;
    base_opts(&o);
    o.epochs = 1;
    o.replicas = 2;
    o.shard = FL_WK_SHARD_HYBRID;
    o.checkpoint_dir = ck;
    ck_assert_msg(fl_test_run_hosts(1, &o, NULL, &d, NULL, err, sizeof err) == FL_OK, "%s", err);
    o.checkpoint_dir = NULL;
    o.resume_dir = ck;
    o.epochs = 2;

    /* Another model. */
    fl_mlp_parse("6,17,3", &o.shape);
    int rc = fl_test_run_hosts(1, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EINVAL && strstr(err, "another model") != NULL, "%s", err);
    fl_mlp_parse(LAYERS, &o.shape);
    /* Another optimizer. */
    o.opt.kind = FL_OPT_ADAMW;
    o.opt.momentum = 0;
    rc = fl_test_run_hosts(1, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EINVAL && strstr(err, "adamw") != NULL, "%s", err);
    o.opt.kind = FL_OPT_SGD;
    o.opt.momentum = 0.9;
    /* A range missing. */
    snprintf(path, sizeof path, "%s/shard-s%d-r0-d1.safetensors", ck, N / 16);
    ck_assert_msg(unlink(path) == 0, "no %s", path);
    rc = fl_test_run_hosts(1, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EIO || rc == FL_EPROTO, "%s: %s", fl_strerror(rc), err);
    ck_assert_msg(strstr(err, "shard-s") != NULL, "%s", err);
    /* --init and --resume together. */
    o.init_path = path;
    rc = fl_test_run_hosts(1, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EINVAL && strstr(err, "--init and --resume") != NULL, "%s", err);
    rm_dir(ck);
    fl_dataset_free(&d);
}
END_TEST

/* Creates dir/name.tmp.<pid><tail> holding 1000 bytes. */
static void put_tmp(const char *in, const char *name, long pid, const char *tail)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.tmp.%ld%s", in, name, pid, tail);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 1000; i++)
        fputc('x', f);
    ck_assert_int_eq(fclose(f), 0);
}

static bool tmp_exists(const char *in, const char *name, long pid, const char *tail)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.tmp.%ld%s", in, name, pid, tail);
    return access(path, F_OK) == 0;
}

/* Writers killed inside a checkpoint leave "<file>.tmp.<pid>" behind (ten kills left 4 files,
 * 50 MB). A rank removes those of its own files (rank 0: and the manifest's) at
 * start and at --resume, when their pid no longer runs or is its own (an earlier process's);
 * another rank's, a live writer's and other names stay. */
START_TEST(test_killed_writers_temporaries_removed)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 13);
    char ck[128], err[1200] = "";
    snprintf(ck, sizeof ck, "%s/ck", dir);
    ck_assert_int_eq(mkdir(ck, 0755), 0);
    long dead = (long)proc_dead_pid();
    proc_t live;
    memset(&live, 0, sizeof live);
    const char *sleeper[] = {"/bin/sleep", "120", NULL};
    proc_start(&live, "/bin/sleep", sleeper, NULL);
    ck_assert_int_gt(live.pid, 0);
    put_tmp(ck, "shard-s16-r0-d0.safetensors", dead, "");
    put_tmp(ck, "manifest.safetensors", dead, "");
    put_tmp(ck, "shard-s8-r0-d0.safetensors", (long)getpid(), "");
    put_tmp(ck, "shard-s16-r1-d0.safetensors", dead, "");
    put_tmp(ck, "shard-s24-r0-d0.safetensors", (long)live.pid, "");
    put_tmp(ck, "model.safetensors", dead, "");
    put_tmp(ck, "shard-s16-r0-d0.safetensors", dead, "x");

    fl_wk_train_opts_t o;
    base_opts(&o);
    o.epochs = 1;
    o.checkpoint_dir = ck;
    int rc = fl_test_run_hosts(1, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s", err);
    ck_assert(!tmp_exists(ck, "shard-s16-r0-d0.safetensors", dead, ""));
    ck_assert(!tmp_exists(ck, "manifest.safetensors", dead, ""));
    ck_assert(!tmp_exists(ck, "shard-s8-r0-d0.safetensors", (long)getpid(), ""));
    ck_assert(tmp_exists(ck, "shard-s16-r1-d0.safetensors", dead, ""));           /* rank 1's */
    ck_assert(tmp_exists(ck, "shard-s24-r0-d0.safetensors", (long)live.pid, "")); /* running */
    ck_assert(tmp_exists(ck, "model.safetensors", dead, ""));            /* not a checkpoint's */
    ck_assert(tmp_exists(ck, "shard-s16-r0-d0.safetensors", dead, "x")); /* not our pattern */

    /* --resume cleans the directory it reads. */
    put_tmp(ck, "shard-s16-r0-d0.safetensors", dead, "");
    o.checkpoint_dir = NULL;
    o.resume_dir = ck;
    o.epochs = 2;
    rc = fl_test_run_hosts(1, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s", err);
    ck_assert(!tmp_exists(ck, "shard-s16-r0-d0.safetensors", dead, ""));
    ck_assert(tmp_exists(ck, "shard-s24-r0-d0.safetensors", (long)live.pid, ""));
    procs_stop(&live, 1);
    procs_free(&live, 1);
    rm_dir(ck);
    fl_dataset_free(&d);
}
END_TEST

static void setup_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/flodl-wk-ckpt-XXXXXX");
    ck_assert(mkdtemp(dir) != NULL);
}

static void teardown_dir(void)
{
    rm_dir(dir);
}

static Suite *suite(void)
{
    Suite *s = suite_create("wk_ckpt");
    TCase *t = tcase_create("ckpt");
    tcase_set_timeout(t, 240);
    tcase_add_checked_fixture(t, setup_dir, teardown_dir);
    tcase_add_test(t, test_resume_into_one_host_of_four_devices);
    tcase_add_test(t, test_resume_into_four_hosts_adam);
    tcase_add_test(t, test_resident_state_resumes);
    tcase_add_test(t, test_full_resumes_into_other_layouts);
    tcase_add_test(t, test_el_che_resume_keeps_the_schedule);
    tcase_add_test(t, test_topk_residuals_resume);
    tcase_add_test(t, test_topk_residuals_resume_sharded);
    tcase_add_test(t, test_local_sgd_state_resumes);
    tcase_add_test(t, test_bad_checkpoints_refused);
    tcase_add_test(t, test_killed_writers_temporaries_removed);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
