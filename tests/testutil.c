/* Test helpers: suite runner, in-process coordinator, ranks as threads. */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fl_ps.h"

int fl_test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

void fl_test_describe_msg(const fl_tp_msg_t *m, char *out, size_t cap)
{
    if (m->hdr.type == FL_MSG_ERROR)
        snprintf(out, cap, "error %d: %s", m->hdr.u.error.code, m->hdr.u.error.text);
    else if (m->hdr.type == FL_MSG_SHUTDOWN)
        snprintf(out, cap, "shutdown %d: %s", m->hdr.u.shutdown.code, m->hdr.u.shutdown.text);
    else
        snprintf(out, cap, "%s", fl_msg_type_name(m->hdr.type));
}

void fl_test_expect_msg(fl_tp_sock_t *s, fl_msg_type_t want, int timeout_ms, fl_tp_msg_t *m)
{
    int64_t deadline = fl_deadline_in(timeout_ms);
    for (;;) {
        int rc = fl_tp_recv(s, m, deadline);
        if (rc == FL_EPROTO)
            continue;
        ck_assert_msg(rc == FL_OK, "waiting %d ms for %s: %s", timeout_ms, fl_msg_type_name(want),
                      fl_last_error());
        if (m->hdr.type == want)
            return;
        if (m->hdr.type != FL_MSG_HEARTBEAT) {
            char got[FL_MSG_TEXT_MAX + 64];
            fl_test_describe_msg(m, got, sizeof got);
            fl_tp_msg_close(m);
            ck_abort_msg("waiting for %s, got %s", fl_msg_type_name(want), got);
        }
        fl_tp_msg_close(m);
    }
}

fl_coord_t *fl_test_coord(int world, int hb_timeout_ms)
{
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = "tcp://127.0.0.1:0";
    o.world_size = world;
    o.heartbeat_timeout_ms = hb_timeout_ms > 0 ? hb_timeout_ms : 2000;
    o.rendezvous_timeout_ms = 30000;
    o.log_level = FL_LOG_WARN;
    fl_coord_t *c = NULL;
    int rc = fl_coord_create(&o, &c);
    ck_assert_msg(rc == FL_OK, "coordinator: %s", fl_last_error());
    rc = fl_coord_start(c);
    ck_assert_msg(rc == FL_OK, "coordinator start: %s", fl_last_error());
    return c;
}

void fl_test_comm_opts(fl_comm_opts_t *o, fl_coord_t *coord, int rank, int world)
{
    fl_comm_opts_init(o);
    o->rank = rank;
    o->world_size = world;
    o->coordinator = fl_coord_endpoint(coord);
    o->host = "127.0.0.1";
    o->timeout_ms = 20000;
    o->rendezvous_timeout_ms = 20000;
    o->log_level = FL_LOG_ERROR;
}

typedef struct rank_arg {
    fl_comm_opts_t opts;
    fl_test_rank_fn fn;
    void *arg;
    int rc;
    char err[1024];
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    fl_comm_t *comm = NULL;
    a->rc = fl_comm_init(&a->opts, &comm);
    if (a->rc == FL_OK) {
        a->rc = a->fn(comm, a->arg);
        if (a->rc != FL_OK)
            snprintf(a->err, sizeof a->err, "%s", fl_last_error());
        fl_comm_destroy(&comm);
    } else {
        snprintf(a->err, sizeof a->err, "init: %s", fl_last_error());
    }
    return NULL;
}

int fl_test_run_ranks(int world, const fl_comm_opts_t *base, fl_test_rank_fn fn, void *arg,
                      char *err, size_t errcap)
{
    fl_coord_t *coord = NULL;
    if (base == NULL || base->coordinator == NULL)
        coord = fl_test_coord(world, 0);
    rank_arg_t *args = calloc((size_t)world, sizeof *args);
    pthread_t *th = calloc((size_t)world, sizeof *th);
    ck_assert(args != NULL && th != NULL);
    for (int r = 0; r < world; r++) {
        if (base != NULL)
            args[r].opts = *base;
        else
            fl_test_comm_opts(&args[r].opts, coord, r, world);
        if (coord != NULL)
            args[r].opts.coordinator = fl_coord_endpoint(coord);
        args[r].opts.rank = r;
        args[r].opts.world_size = world;
        args[r].fn = fn;
        args[r].arg = arg;
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    int rc = FL_OK;
    for (int r = 0; r < world; r++) {
        pthread_join(th[r], NULL);
        if (args[r].rc != FL_OK && rc == FL_OK) {
            rc = args[r].rc;
            if (err != NULL)
                snprintf(err, errcap, "rank %d: %s", r, args[r].err);
        }
    }
    free(args);
    free(th);
    if (coord != NULL) {
        fl_coord_stop(coord);
        fl_coord_destroy(&coord);
    }
    return rc;
}

int fl_test_gpu_probe(const char *suite)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        int code = 0;
        if (!fl_gpu_available()) {
            char why[256];
            fl_gpu_describe(why, sizeof why);
            /* On a machine meant to have one (scripts/gpu-check.sh), a skip would hide it. */
            const char *req = getenv("FLODL_REQUIRE_GPU");
            bool required = req != NULL && strcmp(req, "1") == 0;
            printf("%s: %s needs a CUDA device: %s%s\n", required ? "FAIL" : "SKIP", suite, why,
                   required ? " (FLODL_REQUIRE_GPU=1)" : "");
            code = required ? 1 : 77;
        }
        fflush(stdout);
        _exit(code);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return 1;
    return WEXITSTATUS(status);
}

uint64_t fl_test_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double fl_test_uniform(uint64_t *s)
{
    return (double)(fl_test_rand(s) >> 11) / (double)(1ULL << 52) - 1.0;
}
