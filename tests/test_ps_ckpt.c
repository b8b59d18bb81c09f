/* Parameter-server checkpoints and restarts, in one process on 127.0.0.1: files written every
 * k steps (and at the end), the newest K kept, their contents bit for bit the parameters the
 * ranks pulled; a corrupt or truncated file refused and the previous one used; a directory of
 * another run refused without --resume; the whole parameter server restarted mid-training
 * with --resume, the ranks rejoining (FL_ERESYNC) and ending with the parameters of an
 * uninterrupted run; initial parameters from an --init file; a rank 0 that never offers its
 * parameters, and a rank that dies, named by the ranks that wait for them. */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fl_ps.h"
#include "fl_tp.h"
#include "ps_int.h"
#include "testproc.h"
#include "testutil.h"

#define N 3000
#define MAXW 3

#define ASSERT_HAS(text, needle)                                                                   \
    ck_assert_msg(strstr((text), (needle)) != NULL, "\"%s\" does not mention \"%s\"", (text),      \
                  (needle))

typedef struct job {
    fl_coord_t *coord;
    fl_ps_server_t *srv;
    char endpoint[FL_ENDPOINT_MAX];
} job_t;

static char tmpdir[256];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/flodl-ps-ckpt-XXXXXX");
    ck_assert(mkdtemp(tmpdir) != NULL);
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* The consistency the next job_start runs (tests set it, then put back sync). */
static fl_ps_consistency_t job_consistency = FL_PS_SYNC;
static uint32_t job_staleness;

static int job_start_rc(job_t *j, const char *bind, int world, int shards, const char *ckpt,
                        uint64_t every, bool resume, const char *init, int hb_timeout)
{
    memset(j, 0, sizeof *j);
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = bind ? bind : "tcp://127.0.0.1:0";
    co.world_size = world;
    co.num_shards = shards;
    co.heartbeat_timeout_ms = hb_timeout > 0 ? hb_timeout : 2000;
    co.rendezvous_timeout_ms = 20000;
    co.log_level = FL_LOG_OFF;
    ck_assert_msg(fl_coord_create(&co, &j->coord) == FL_OK, "%s", fl_last_error());
    ck_assert(fl_coord_start(j->coord) == FL_OK);
    snprintf(j->endpoint, sizeof j->endpoint, "%s", fl_coord_endpoint(j->coord));
    fl_ps_server_opts_t so;
    fl_ps_server_opts_init(&so);
    so.coordinator = j->endpoint;
    so.host = "127.0.0.1";
    so.num_shards = shards;
    so.shard_count = shards;
    so.opt.kind = FL_OPT_ADAM;
    fl_lr_sched_init(&so.lr, 0.01);
    so.consistency = job_consistency;
    so.staleness = job_staleness;
    so.checkpoint_dir = ckpt;
    so.ckpt_every_steps = every;
    so.keep = 2;
    so.resume = resume;
    so.init_path = init;
    so.rendezvous_timeout_ms = 20000;
    so.log_level = FL_LOG_OFF;
    int rc = fl_ps_server_create(&so, &j->srv);
    if (rc != FL_OK) {
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", fl_last_error());
        fl_coord_stop(j->coord);
        fl_coord_destroy(&j->coord);
        fl_fail(rc, "%s", detail);
        return rc;
    }
    ck_assert(fl_ps_server_start(j->srv) == FL_OK);
    return FL_OK;
}

static void job_start(job_t *j, const char *bind, int world, int shards, const char *ckpt,
                      uint64_t every, bool resume, const char *init)
{
    int rc = job_start_rc(j, bind, world, shards, ckpt, every, resume, init, 0);
    ck_assert_msg(rc == FL_OK, "%s", fl_last_error());
}

/* Files in dir whose name starts with prefix. */
static int count_files(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void job_end(job_t *j)
{
    fl_ps_server_stop(j->srv);
    fl_ps_server_destroy(&j->srv);
    fl_coord_stop(j->coord);
    fl_coord_destroy(&j->coord);
}

static void grad_of(int r, uint64_t t, float *g)
{
    for (int i = 0; i < N; i++)
        g[i] = (float)((i * 31 + r * 17 + (int)t * 11) % 97 - 48) / 97.0f;
}

static void init_of(float *p)
{
    for (int i = 0; i < N; i++)
        p[i] = (float)(i % 13) / 13.0f - 0.5f;
}

/* Adam at lr 0.01 on the mean of the ranks' gradients, `steps` times. */
static void reference(int world, int steps, float *p)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.kind = FL_OPT_ADAM;
    fl_opt_t *opt = NULL;
    ck_assert(fl_opt_create(&o, N, &opt) == FL_OK);
    init_of(p);
    static float g[MAXW][N], avg[N];
    for (int t = 0; t < steps; t++) {
        for (int r = 0; r < world; r++)
            grad_of(r, (uint64_t)t, g[r]);
        for (int i = 0; i < N; i++) {
            float acc = g[0][i];
            for (int r = 1; r < world; r++)
                acc = acc + g[r][i];
            avg[i] = acc / (float)world;
        }
        ck_assert(fl_opt_step(opt, p, avg, 0.01) == FL_OK);
    }
    fl_opt_destroy(&opt);
}

typedef struct rank_arg {
    const char *endpoint;
    int rank, world, steps;
    int timeout_ms;
    float params[N];
    float at_step[8][N]; /* parameters pulled for steps 1..7 */
    int rc, resyncs;
    char err[1024];
    _Atomic int *progress; /* rank 0 publishes its step */
    int sleep_ms;          /* per step, to make this rank the slow one */
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    fl_ps_client_opts_t o;
    fl_ps_client_opts_init(&o);
    o.rank = a->rank;
    o.world_size = a->world;
    o.coordinator = a->endpoint;
    o.host = "127.0.0.1";
    o.param_count = N;
    o.timeout_ms = a->timeout_ms ? a->timeout_ms : 15000;
    o.rendezvous_timeout_ms = 20000;
    o.reconnect_timeout_ms = 20000;
    o.log_level = FL_LOG_OFF;
    fl_ps_client_t *cl = NULL;
    a->rc = fl_ps_client_create(&o, &cl);
    if (a->rc != FL_OK) {
        snprintf(a->err, sizeof a->err, "%s", fl_last_error());
        return NULL;
    }
    init_of(a->params);
    if (a->rank != 0)
        memset(a->params, 0, sizeof a->params);
    a->rc = fl_ps_client_init(cl, a->params);
    static _Thread_local float g[N];
    while (a->rc == FL_OK && (int)fl_ps_client_step(cl) < a->steps) {
        grad_of(a->rank, fl_ps_client_step(cl), g);
        fl_ps_grad_t grad = {.dense = g, .batch = 2};
        a->rc = fl_ps_client_push_pull(cl, &grad, a->params);
        if (a->rc == FL_ERESYNC) {
            a->resyncs++;
            a->rc = FL_OK;
        }
        uint64_t s = fl_ps_client_step(cl);
        if (a->rc == FL_OK && s < 8)
            memcpy(a->at_step[s], a->params, sizeof a->params);
        if (a->progress != NULL)
            atomic_store(a->progress, (int)s);
        if (a->progress != NULL)
            usleep(20 * 1000); /* slow enough for the test to stop the server mid-run */
        if (a->sleep_ms > 0)
            usleep((useconds_t)a->sleep_ms * 1000);
    }
    if (a->rc != FL_OK)
        snprintf(a->err, sizeof a->err, "%s", fl_last_error());
    fl_ps_client_destroy(&cl);
    return NULL;
}

static void run_ranks(rank_arg_t *a, int world, pthread_t *th)
{
    for (int r = 0; r < world; r++)
        ck_assert(pthread_create(&th[r], NULL, rank_main, &a[r]) == 0);
}

static void join_ranks(rank_arg_t *a, int world, pthread_t *th)
{
    for (int r = 0; r < world; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < world; r++)
        ck_assert_msg(a[r].rc == FL_OK, "rank %d: %s", r, a[r].err);
}

static void setup(rank_arg_t *a, int world, const char *endpoint, int steps)
{
    for (int r = 0; r < world; r++) {
        memset(&a[r], 0, sizeof a[r]);
        a[r].endpoint = endpoint;
        a[r].rank = r;
        a[r].world = world;
        a[r].steps = steps;
    }
}

START_TEST(test_checkpoints_written_kept_and_exact)
{
    make_tmpdir();
    enum { W = 2, STEPS = 5 };
    job_t j;
    job_start(&j, NULL, W, 2, tmpdir, 2, false, NULL);
    static rank_arg_t a[W];
    pthread_t th[W];
    setup(a, W, j.endpoint, STEPS);
    run_ranks(a, W, th);
    join_ranks(a, W, th);
    /* The ranks left: the job is over and the server wrote its final checkpoints. */
    ck_assert_int_eq(fl_ps_server_wait(j.srv, 5000), FL_OK);
    fl_ps_server_stats_t st;
    fl_ps_server_get_stats(j.srv, &st);
    job_end(&j);
    ck_assert_uint_eq(st.checkpoints, 6); /* steps 2, 4 and the final 5, two shards */
    for (uint32_t s = 0; s < 2; s++) {
        uint64_t steps[8];
        size_t n = 0;
        ck_assert(fl_ps__ckpt_list(tmpdir, s, 2, steps, 8, &n, NULL) == FL_OK);
        /* Keep 2: writing 4 removed none (2 and 4), the final 5 removed 2 (it once
         * left K + 1). Two files on disk per shard, nothing else. */
        char prefix[32];
        snprintf(prefix, sizeof prefix, "shard-%u-of-2.", s);
        ck_assert_int_eq(count_files(tmpdir, prefix), 2);
        ck_assert_uint_eq(n, 2);
        ck_assert_uint_eq(steps[0], 5);
        ck_assert_uint_eq(steps[1], 4);
        for (size_t k = 0; k < 2; k++) {
            ps_ckpt_t c;
            ck_assert_msg(fl_ps__ckpt_open(tmpdir, s, 2, steps[k], &c) == FL_OK, "%s",
                          fl_last_error());
            ck_assert_uint_eq(c.meta.param_count, N);
            ck_assert_uint_eq(c.meta.version, steps[k]);
            ck_assert_uint_eq(c.meta.opt_steps, steps[k]);
            ck_assert_int_eq(c.meta.opt, FL_OPT_ADAM);
            ck_assert_ptr_nonnull(c.buf1);
            ck_assert_ptr_nonnull(c.buf2);
            ck_assert_uint_eq(c.nclocks, W);
            ck_assert_uint_eq(c.clocks[0], steps[k]);
            ck_assert_uint_eq(c.clocks[1], steps[k]);
            /* Bit for bit the parameters the ranks pulled for that step. */
            const float *want = steps[k] == STEPS ? a[0].params : a[0].at_step[steps[k]];
            ck_assert_int_eq(memcmp(c.params, want + c.meta.offset, c.meta.count * 4), 0);
            fl_ps__ckpt_close(&c);
        }
    }
    /* A truncated newest file is refused with a reason, the older one is used. */
    char path[512];
    snprintf(path, sizeof path, "%s/shard-0-of-2.step-%012d.safetensors", tmpdir, 5);
    ck_assert(truncate(path, 200) == 0);
    uint64_t valid[8], params = 0;
    size_t nv = 0;
    ck_assert(fl_ps__ckpt_valid_steps(tmpdir, 0, 2, NULL, valid, 8, &nv, &params) == FL_OK);
    ck_assert_uint_eq(nv, 1);
    ck_assert_uint_eq(valid[0], 4);
    ck_assert_uint_eq(params, N);
    ps_ckpt_t c;
    ck_assert_int_eq(fl_ps__ckpt_open(tmpdir, 0, 2, 5, &c), FL_EPROTO);
    ASSERT_HAS(fl_last_error(), path);
    /* A flipped bit in the data: the checksum catches it. */
    snprintf(path, sizeof path, "%s/shard-1-of-2.step-%012d.safetensors", tmpdir, 5);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, -100, SEEK_END);
    int ch = fgetc(f);
    fseek(f, -100, SEEK_END);
    fputc(ch ^ 0x10, f);
    fclose(f);
    ck_assert_int_eq(fl_ps__ckpt_open(tmpdir, 1, 2, 5, &c), FL_EPROTO);
    ASSERT_HAS(fl_last_error(), "CRC");

    /* Without --resume the directory of this run is refused, naming what to do. */
    job_t k;
    ck_assert_int_eq(job_start_rc(&k, NULL, W, 2, tmpdir, 2, false, NULL, 0), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "--resume");
    /* Another shard count cannot resume from these files. */
    ck_assert_int_eq(job_start_rc(&k, NULL, W, 3, tmpdir, 2, true, NULL, 0), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "2 shards");
    /* Shard 1 lost its files: --resume refuses to start over rather than lose the run. */
    for (int st2 = 0; st2 <= 5; st2++) {
        snprintf(path, sizeof path, "%s/shard-1-of-2.step-%012d.safetensors", tmpdir, st2);
        unlink(path);
    }
    ck_assert_int_eq(job_start_rc(&k, NULL, W, 2, tmpdir, 2, true, NULL, 0), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "no valid step common");
    ASSERT_HAS(fl_last_error(), "shard 1: 0 valid");
    remove_tree(tmpdir);
}
END_TEST

/* Creates tmpdir/<name>.tmp.<pid><tail> holding 1000 bytes; tmp_exists says whether it is
 * there. */
static void put_tmp(const char *name, long pid, const char *tail)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.tmp.%ld%s", tmpdir, name, pid, tail);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 1000; i++)
        fputc('x', f);
    ck_assert_int_eq(fclose(f), 0);
}

static bool tmp_exists(const char *name, long pid, const char *tail)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.tmp.%ld%s", tmpdir, name, pid, tail);
    return access(path, F_OK) == 0;
}

/* A server of shard 0 of 2 created (not started: it only scans its directory) and destroyed. */
static void create_shard0_server(bool resume)
{
    fl_ps_server_opts_t so;
    fl_ps_server_opts_init(&so);
    so.coordinator = "tcp://127.0.0.1:1";
    so.host = "127.0.0.1";
    so.num_shards = 2;
    so.shard_first = 0;
    so.shard_count = 1;
    so.checkpoint_dir = tmpdir;
    so.resume = resume;
    so.log_level = FL_LOG_OFF;
    fl_ps_server_t *srv = NULL;
    ck_assert_msg(fl_ps_server_create(&so, &srv) == FL_OK, "%s", fl_last_error());
    fl_ps_server_destroy(&srv);
}

#define S0 "shard-0-of-2.step-000000000004.safetensors"

/* Writers killed inside a checkpoint leave "<file>.tmp.<pid>" behind (ten kills left 4 files,
 * 50 MB). A server removes those of the shards it serves at start and at
 * --resume, when their pid no longer runs or is its own (an earlier process's); the shards
 * another process serves from the same directory, a live writer's file and other names stay. */
START_TEST(test_killed_writers_temporaries_removed)
{
    make_tmpdir();
    long dead = (long)proc_dead_pid();
    proc_t live;
    memset(&live, 0, sizeof live);
    const char *sleeper[] = {"/bin/sleep", "120", NULL};
    proc_start(&live, "/bin/sleep", sleeper, NULL);
    ck_assert_int_gt(live.pid, 0);
    put_tmp(S0, dead, "");
    put_tmp("shard-0-of-2.step-000000000006.safetensors", (long)getpid(), "");
    put_tmp("shard-1-of-2.step-000000000004.safetensors", dead, "");
    put_tmp("shard-0-of-2.step-000000000008.safetensors", (long)live.pid, "");
    put_tmp("shard-0-of-3.step-000000000004.safetensors", dead, "");
    put_tmp("notes.txt", dead, "");
    put_tmp(S0, dead, "x");
    create_shard0_server(false);
    ck_assert(!tmp_exists(S0, dead, ""));
    ck_assert(!tmp_exists("shard-0-of-2.step-000000000006.safetensors", (long)getpid(), ""));
    ck_assert(tmp_exists("shard-1-of-2.step-000000000004.safetensors", dead, ""));
    ck_assert(tmp_exists("shard-0-of-2.step-000000000008.safetensors", (long)live.pid, ""));
    ck_assert(tmp_exists("shard-0-of-3.step-000000000004.safetensors", dead, ""));
    ck_assert(tmp_exists("notes.txt", dead, ""));
    ck_assert(tmp_exists(S0, dead, "x"));
    /* And at --resume. */
    put_tmp(S0, dead, "");
    create_shard0_server(true);
    ck_assert(!tmp_exists(S0, dead, ""));
    ck_assert(tmp_exists("shard-0-of-2.step-000000000008.safetensors", (long)live.pid, ""));
    procs_stop(&live, 1);
    procs_free(&live, 1);
    remove_tree(tmpdir);
}
END_TEST

/* The whole parameter server (coordinator and shards) goes away after a few steps and comes
 * back on the same endpoint with --resume: the ranks rejoin, redo the steps since the last
 * checkpoint and end with exactly the parameters of a run that never stopped. */
START_TEST(test_restart_resumes_exactly)
{
    make_tmpdir();
    enum { W = 2, STEPS = 7 };
    job_t j;
    job_start(&j, NULL, W, 2, tmpdir, 2, false, NULL);
    char ep[FL_ENDPOINT_MAX];
    snprintf(ep, sizeof ep, "%s", j.endpoint);
    static rank_arg_t a[W];
    pthread_t th[W];
    setup(a, W, ep, STEPS);
    static _Atomic int progress;
    atomic_store(&progress, 0);
    a[0].progress = &progress;
    a[1].progress = &progress;
    run_ranks(a, W, th);
    int64_t until = fl_now_ms() + 10000;
    while (atomic_load(&progress) < 3 && fl_now_ms() < until)
        usleep(2000);
    ck_assert_int_ge(atomic_load(&progress), 3);
    /* Stopping writes a final checkpoint; the coordinator says goodbye (code 1): the ranks
     * wait for its successor. */
    job_end(&j);
    usleep(200 * 1000);
    job_start(&j, ep, W, 2, tmpdir, 2, true, NULL);
    join_ranks(a, W, th);
    ck_assert_int_ge(a[0].resyncs, 1);
    ck_assert_int_ge(a[1].resyncs, 1);
    static float ref[N];
    reference(W, STEPS, ref);
    ck_assert_int_eq(memcmp(a[0].params, ref, sizeof ref), 0);
    ck_assert_int_eq(memcmp(a[1].params, ref, sizeof ref), 0);
    job_end(&j);
    remove_tree(tmpdir);
}
END_TEST

/* SSP with the ranks apart: rank 1 is slow, so a checkpoint keeps rank 0 ahead of it; after
 * the restart both go on within the staleness bound (none of rank 0's pushes is refused as
 * beyond it) and finish. */
START_TEST(test_restart_ssp_with_ranks_apart)
{
    make_tmpdir();
    enum { W = 2, STEPS = 9 };
    job_consistency = FL_PS_SSP;
    job_staleness = 2;
    job_t j;
    job_start(&j, NULL, W, 2, tmpdir, 2, false, NULL);
    char ep[FL_ENDPOINT_MAX];
    snprintf(ep, sizeof ep, "%s", j.endpoint);
    static rank_arg_t a[W];
    pthread_t th[W];
    setup(a, W, ep, STEPS);
    static _Atomic int progress;
    atomic_store(&progress, 0);
    a[0].progress = &progress;
    a[1].sleep_ms = 60;
    run_ranks(a, W, th);
    int64_t until = fl_now_ms() + 10000;
    while (atomic_load(&progress) < 4 && fl_now_ms() < until)
        usleep(2000);
    job_end(&j);
    usleep(200 * 1000);
    job_start(&j, ep, W, 2, tmpdir, 2, true, NULL);
    join_ranks(a, W, th);
    ck_assert_int_ge(a[0].resyncs + a[1].resyncs, 1);
    job_end(&j);
    job_consistency = FL_PS_SYNC;
    job_staleness = 0;
    remove_tree(tmpdir);
}
END_TEST

/* Checkpoints whose clocks are apart (rank 0 at step 5, rank 1 at 2, staleness bound 2): the
 * joining rank 0 waits for rank 1 to be within the bound before its first push, which then is
 * taken, and both ranks finish. */
START_TEST(test_resume_ssp_clocks_apart)
{
    make_tmpdir();
    enum { W = 2 };
    static float p[N], zeros[N];
    init_of(p);
    uint64_t clocks[W] = {5, 2};
    for (uint32_t i = 0; i < 2; i++) {
        fl_ps_range_t r;
        fl_ps_map_range(N, 2, i, &r);
        ps_ckpt_meta_t m;
        fl_ps__ckpt_meta_init(&m);
        m.shard = i;
        m.num_shards = 2;
        m.offset = r.offset;
        m.count = r.count;
        m.param_count = N;
        m.step = 4;
        m.version = 7;
        m.opt_steps = 7;
        m.opt = FL_OPT_ADAM;
        m.consistency = FL_PS_SSP;
        ck_assert_msg(fl_ps__ckpt_write(tmpdir, &m, p + r.offset, zeros, zeros, clocks, W, 2) ==
                          FL_OK,
                      "%s", fl_last_error());
    }
    job_consistency = FL_PS_SSP;
    job_staleness = 2;
    job_t j;
    job_start(&j, NULL, W, 2, tmpdir, 0, true, NULL);
    static rank_arg_t a[W];
    pthread_t th[W];
    setup(a, W, j.endpoint, 9);
    a[1].sleep_ms = 30;
    run_ranks(a, W, th);
    join_ranks(a, W, th);
    job_end(&j);
    job_consistency = FL_PS_SYNC;
    job_staleness = 0;
    remove_tree(tmpdir);
}
END_TEST

START_TEST(test_init_file)
{
    make_tmpdir();
    /* Two tensors whose concatenation is the flat vector. */
    static float p[N];
    for (int i = 0; i < N; i++)
        p[i] = (float)i / 1000.0f;
    char path[512];
    snprintf(path, sizeof path, "%s/init.safetensors", tmpdir);
    fl_st_tensor_t t[2] = {
        {"layers.0.weight", FL_FLOAT32, 2, {10, 100}, p, 1000 * 4},
        {"layers.0.bias", FL_FLOAT32, 1, {2000}, p + 1000, 2000 * 4},
    };
    ck_assert(fl_st_write(path, t, 2, NULL, 0) == FL_OK);
    job_t j;
    job_start(&j, NULL, 2, 2, NULL, 0, false, path);
    ck_assert_uint_eq(fl_ps_server_param_count(j.srv), N);
    static rank_arg_t a[2];
    pthread_t th[2];
    setup(a, 2, j.endpoint, 0);
    run_ranks(a, 2, th);
    join_ranks(a, 2, th);
    /* Rank 0 offered its own parameters; the file's won. */
    ck_assert_int_eq(memcmp(a[0].params, p, sizeof p), 0);
    ck_assert_int_eq(memcmp(a[1].params, p, sizeof p), 0);
    job_end(&j);
    /* A file of another size is refused at the rendezvous, naming both counts. */
    fl_st_tensor_t small = {"w", FL_FLOAT32, 1, {100}, p, 400};
    ck_assert(fl_st_write(path, &small, 1, NULL, 0) == FL_OK);
    job_start(&j, NULL, 1, 1, NULL, 0, false, path);
    /* Once the server registered its count, the rank with another one is refused (had the
     * rank come first, the server would be the one refused). */
    int64_t until = fl_now_ms() + 10000;
    while (fl_coord_servers_active(j.coord) < 1 && fl_now_ms() < until)
        usleep(5000);
    fl_ps_client_opts_t o;
    fl_ps_client_opts_init(&o);
    o.rank = 0;
    o.world_size = 1;
    o.coordinator = j.endpoint;
    o.host = "127.0.0.1";
    o.param_count = N;
    o.rendezvous_timeout_ms = 5000;
    o.log_level = FL_LOG_OFF;
    fl_ps_client_t *cl = NULL;
    ck_assert_int_eq(fl_ps_client_create(&o, &cl), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "3000");
    ASSERT_HAS(fl_last_error(), "100");
    job_end(&j);
    remove_tree(tmpdir);
}
END_TEST

/* Rank 0 joins but never offers its parameters: rank 1's join times out naming rank 0. */
static void *idle_rank0(void *p)
{
    rank_arg_t *a = p;
    fl_ps_client_opts_t o;
    fl_ps_client_opts_init(&o);
    o.rank = 0;
    o.world_size = 2;
    o.coordinator = a->endpoint;
    o.host = "127.0.0.1";
    o.param_count = N;
    o.log_level = FL_LOG_OFF;
    fl_ps_client_t *cl = NULL;
    a->rc = fl_ps_client_create(&o, &cl);
    usleep(1500 * 1000);
    fl_ps_client_destroy(&cl);
    return NULL;
}

START_TEST(test_missing_init_names_rank0)
{
    job_t j;
    job_start(&j, NULL, 2, 1, NULL, 0, false, NULL);
    static rank_arg_t a[2];
    setup(a, 2, j.endpoint, 0);
    a[1].timeout_ms = 500;
    pthread_t th[2];
    ck_assert(pthread_create(&th[0], NULL, idle_rank0, &a[0]) == 0);
    ck_assert(pthread_create(&th[1], NULL, rank_main, &a[1]) == 0);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    ck_assert_int_eq(a[1].rc, FL_ETIMEDOUT);
    ASSERT_HAS(a[1].err, "waiting for rank 0 (127.0.0.1) to push its initial parameters");
    job_end(&j);
}
END_TEST

/* A rank that registers and then never beats is declared dead: the rank waiting for its push
 * gets FL_EPEER naming it, from its shard and its coordinator alike. */
START_TEST(test_dead_rank_fails_waiting_pulls)
{
    job_t j;
    int rc = job_start_rc(&j, NULL, 2, 1, NULL, 0, false, NULL, 800);
    ck_assert(rc == FL_OK);
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    fl_ctx_t *ctx = NULL;
    ck_assert(fl_ctx_create(&co, &ctx) == FL_OK);
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    fl_tp_sock_t *ghost = NULL;
    ck_assert(fl_tp_sock_create(ctx, FL_TP_DEALER, &t, "ghost", &ghost) == FL_OK);
    ck_assert(fl_tp_sock_connect(ghost, j.endpoint) == FL_OK);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, 1);
    snprintf(h.job_id, sizeof h.job_id, "flodl");
    h.u.reg.rank = 1;
    h.u.reg.world_size = 2;
    h.u.reg.param_count = N;
    snprintf(h.u.reg.host, sizeof h.u.reg.host, "ghost-host");
    snprintf(h.u.reg.tuning, sizeof h.u.reg.tuning, "ps");
    ck_assert(fl_tp_send(ghost, NULL, &h, NULL, 0, fl_deadline_in(1000)) == FL_OK);
    static rank_arg_t a[1];
    setup(a, 1, j.endpoint, 3);
    a[0].world = 2;
    pthread_t th;
    ck_assert(pthread_create(&th, NULL, rank_main, &a[0]) == 0);
    pthread_join(th, NULL);
    ck_assert_int_eq(a[0].rc, FL_EPEER);
    ASSERT_HAS(a[0].err, "rank 1");
    ASSERT_HAS(a[0].err, "ghost-host");
    ck_assert_int_eq(fl_ps_server_wait(j.srv, 5000), FL_EPEER);
    fl_tp_sock_destroy(&ghost);
    fl_ctx_destroy(&ctx);
    job_end(&j);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ps_ckpt");
    TCase *t = tcase_create("checkpoints");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_checkpoints_written_kept_and_exact);
    tcase_add_test(t, test_killed_writers_temporaries_removed);
    tcase_add_test(t, test_restart_resumes_exactly);
    tcase_add_test(t, test_restart_ssp_with_ranks_apart);
    tcase_add_test(t, test_resume_ssp_clocks_apart);
    tcase_add_test(t, test_init_file);
    tcase_add_test(t, test_missing_init_names_rank0);
    tcase_add_test(t, test_dead_rank_fails_waiting_pulls);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
