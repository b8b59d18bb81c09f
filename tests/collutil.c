/* Helpers shared by the collectives suites: the ranks' world and their wrong results. */
#include "collutil.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int bad(const char *fmt, ...)
{
    char text[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return fl_fail(TEST_EBAD, "%s", text);
}

void opts_base(fl_comm_opts_t *o)
{
    fl_comm_opts_init(o);
    o->host = "127.0.0.1";
    o->timeout_ms = 10000;
    o->rendezvous_timeout_ms = 20000;
    o->log_level = FL_LOG_ERROR;
}

typedef struct rank_slot {
    fl_comm_opts_t opts;
    char bind[128];
    fl_test_rank_fn fn;
    void *arg;
    int rc;
    char err[1024];
} rank_slot_t;

static void *rank_main(void *p)
{
    rank_slot_t *s = p;
    fl_comm_t *comm = NULL;
    s->rc = fl_comm_init(&s->opts, &comm);
    if (s->rc == FL_OK)
        s->rc = s->fn(comm, s->arg);
    if (s->rc != FL_OK)
        snprintf(s->err, sizeof s->err, "%s", fl_last_error());
    fl_comm_destroy(&comm);
    return NULL;
}

void (*before_ranks)(const char *coordinator, const char *job_id);

int ipc_off_rank = -1;

const char *const *rank_hosts;

void run_world_at(int world, const fl_comm_opts_t *o, const char *ipc_tag, fl_test_rank_fn fn,
                  void *arg)
{
    ck_assert(world >= 1 && world <= MAX_WORLD);
    fl_coord_t *coord = fl_test_coord(world, 0);
    if (before_ranks != NULL)
        before_ranks(fl_coord_endpoint(coord), o->job_id);
    rank_slot_t *slots = calloc((size_t)world, sizeof *slots);
    pthread_t th[MAX_WORLD];
    ck_assert(slots != NULL);
    for (int r = 0; r < world; r++) {
        slots[r].opts = *o;
        slots[r].opts.coordinator = fl_coord_endpoint(coord);
        slots[r].opts.rank = r;
        slots[r].opts.world_size = world;
        if (r == ipc_off_rank)
            slots[r].opts.ipc = 0;
        if (rank_hosts != NULL)
            slots[r].opts.host = rank_hosts[r];
        if (ipc_tag != NULL) {
            snprintf(slots[r].bind, sizeof slots[r].bind, "ipc:///tmp/flodl-coll-%d-%s-%d",
                     (int)getpid(), ipc_tag, r);
            slots[r].opts.bind = slots[r].bind;
        }
        slots[r].fn = fn;
        slots[r].arg = arg;
        ck_assert(pthread_create(&th[r], NULL, rank_main, &slots[r]) == 0);
    }
    for (int r = 0; r < world; r++)
        pthread_join(th[r], NULL);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    char report[4096] = "";
    size_t len = 0;
    int nfail = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < world; r++) {
            if (slots[r].rc == FL_OK || (slots[r].rc == TEST_EBAD) != (pass == 0))
                continue;
            nfail++;
            if (len < sizeof report)
                len += (size_t)snprintf(report + len, sizeof report - len, "\n  rank %d: %s: %s", r,
                                        fl_strerror(slots[r].rc), slots[r].err);
        }
    }
    for (int r = 0; ipc_tag != NULL && r < world; r++) {
        char path[160];
        unlink(slots[r].bind + strlen("ipc://"));
        for (int k = 1; k < o->stripes; k++) {
            snprintf(path, sizeof path, "%s.%d", slots[r].bind + strlen("ipc://"), k);
            unlink(path);
        }
    }
    free(slots);
    ck_assert_msg(nfail == 0, "%d of %d ranks failed:%s", nfail, world, report);
}

void run_world(int world, const fl_comm_opts_t *o, fl_test_rank_fn fn, void *arg)
{
    run_world_at(world, o, NULL, fn, arg);
}
