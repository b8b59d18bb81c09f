/* Garbage and printf-format job ids sent to a rank's data socket while the job runs (ranks are
 * forked children reporting through pipes): every result stays exact and every bad message is
 * counted once in bad_msgs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_int.h"
#include "fl_tp.h"
#include "fl_wk.h"
#include "faultutil.h"

/* ---- rank side ---- */

/* Verified allreduces while the parent sends garbage to the special rank, which keeps the job
 * going (through a one-element flag allreduce) until it counted expect_bad refused messages
 * and two more steps ran, or 300 steps / 20 s passed. */
static void body_garbage(fl_comm_t *comm, const scenario_t *sc, rank_report_t *rep, int res_fd)
{
    float *buf = malloc(sc->count * sizeof *buf);
    if (buf == NULL) {
        rep->rc = FL_ENOMEM;
        return;
    }
    int64_t stop = fl_deadline_in(20000);
    int after = 0;
    for (int s = 0; s < 300; s++) {
        if (step_allreduce(comm, buf, sc->count, s, rep) != FL_OK)
            break;
        if (rep->rank == sc->progress_rank && rep->steps == sc->progress_at)
            send_event(res_fd, 'P');
        int32_t more = 0;
        if (rep->rank == sc->special) {
            fl_comm_stats_t st;
            fl_comm_get_stats(comm, &st);
            if (st.bad_msgs >= (uint64_t)sc->expect_bad)
                after++;
            more = after < 3 && fl_deadline_left_ms(stop) > 0;
        }
        int64_t t0 = fl_now_ms();
        int rc = fl_allreduce(comm, &more, &more, 1, FL_INT32, FL_SUM);
        if (rc != FL_OK) {
            rep->rc = rc;
            rep->fail_ms = fl_now_ms();
            rep->call_ms = rep->fail_ms - t0;
            snprintf(rep->err, sizeof rep->err, "flag: %s", fl_last_error());
            break;
        }
        if (more == 0)
            break;
    }
    free(buf);
}

/* ---- garbage on a data socket ---- */

typedef struct enc_buf {
    uint8_t data[4096];
    size_t len;
} enc_buf_t;

static void *enc_alloc(size_t len, void *ud)
{
    enc_buf_t *b = ud;
    if (len > sizeof b->data)
        return NULL;
    b->len = len;
    return b->data;
}

/* A chunk header of allreduce #seq as rank `sender` of job/generation would send it. */
static void chunk_hdr(fl_msg_hdr_t *h, const char *job, uint64_t gen, int sender, uint64_t seq,
                      size_t total)
{
    fl_msg_hdr_init(h, FL_MSG_CHUNK, sender);
    snprintf(h->job_id, sizeof h->job_id, "%s", job);
    h->generation = gen;
    h->seq = seq;
    h->u.chunk.coll = FL_COLL_ALLREDUCE;
    h->u.chunk.phase = FL_PHASE_RS;
    h->u.chunk.count = 4;
    h->u.chunk.op = FL_SUM;
    h->u.chunk.total = total;
    h->frames[0].dtype = FL_FLOAT32;
    h->frames[0].codec = FL_CODEC_RAW;
}

/* Sends h (unstamped: job, generation and sender as given) with one 16-byte payload. */
static int send_chunk(fl_tp_sock_t *s, fl_msg_hdr_t *h)
{
    float payload[4] = {1e30f, -1e30f, 12345.0f, 7.0f};
    fl_buf_t b = {payload, sizeof payload, NULL, NULL};
    return fl_tp_send(s, NULL, h, &b, 1, fl_deadline_in(2000));
}

/* Encodes h as is (any version) and sends it raw with the given payload frames. */
static int send_encoded(fl_tp_sock_t *s, const fl_msg_hdr_t *h, bool break_magic, size_t nextra,
                        size_t extra_bytes)
{
    enc_buf_t b;
    if (fl_msg_encode(h, enc_alloc, &b, &b.len) != FL_OK)
        return FL_EINVAL;
    if (break_magic) {
        /* Field 1, fixed32: tag byte 0x0d, then the magic little-endian. */
        static const uint8_t magic[5] = {0x0d, 'F', 'L', 'D', 'L'};
        uint8_t *m = memmem(b.data, b.len, magic, sizeof magic);
        if (m == NULL)
            return FL_EINVAL;
        m[1] = 'X';
    }
    static const uint8_t junk[256] = {0};
    const void *parts[32] = {b.data};
    size_t sizes[32] = {b.len};
    for (size_t i = 0; i < nextra && i + 1 < 32; i++) {
        parts[i + 1] = junk;
        sizes[i + 1] = extra_bytes;
    }
    return fl_tp_send_raw(s, parts, sizes, 1 + (nextra < 31 ? nextra : 31));
}

/* Counts a send that worked; keeps the first failure. */
static void tally(int r, int *rc, int *n)
{
    if (r == FL_OK)
        (*n)++;
    else if (*rc == FL_OK)
        *rc = r;
}

/* The garbage set: every message is refused and counted exactly once by the receiver. */
static int attack_garbage(fl_tp_sock_t *s, const char *job, uint64_t gen, int target, int world,
                          size_t total, int *sent)
{
    uint64_t seed = 42;
    uint8_t noise[200];
    for (size_t i = 0; i < sizeof noise; i++)
        noise[i] = (uint8_t)fl_test_rand(&seed);
    int rc = FL_OK;
    int n = 0;
    {
        /* Random bytes as a header, alone and with payload frames; an empty frame. */
        const void *p1[] = {noise};
        size_t s1[] = {37};
        tally(fl_tp_send_raw(s, p1, s1, 1), &rc, &n);
        const void *p2[] = {noise, noise + 50, noise + 100};
        size_t s2[] = {120, 64, 80};
        tally(fl_tp_send_raw(s, p2, s2, 3), &rc, &n);
        const void *p3[] = {noise};
        size_t s3[] = {0};
        tally(fl_tp_send_raw(s, p3, s3, 1), &rc, &n);
    }
    fl_msg_hdr_t h;
    /* Wrong magic, wrong version. */
    chunk_hdr(&h, job, gen, (target + world - 1) % world, 3, total);
    h.version = FL_MSG_VERSION;
    tally(send_encoded(s, &h, true, 0, 0), &rc, &n);
    h.version = FL_MSG_VERSION + 1;
    tally(send_encoded(s, &h, false, 0, 0), &rc, &n);
    /* Another job id, another generation of this job. */
    chunk_hdr(&h, "intruder", gen, 0, 3, total);
    tally(send_chunk(s, &h), &rc, &n);
    chunk_hdr(&h, job, gen + 1, 0, 3, total);
    tally(send_chunk(s, &h), &rc, &n);
    /* Frames unlike the header: one declared, 16 bytes promised, 8 sent; 20 frames. */
    chunk_hdr(&h, job, gen, 0, 3, total);
    h.version = FL_MSG_VERSION;
    h.nframes = 1;
    h.frames[0].bytes = 16;
    h.frames[0].raw_bytes = 16;
    tally(send_encoded(s, &h, false, 1, 8), &rc, &n);
    h.nframes = 0;
    tally(send_encoded(s, &h, false, 20, 4), &rc, &n);
    /* Well-formed, right job and generation, impossible senders: out of range, the target
     * itself, the coordinator's -1. */
    chunk_hdr(&h, job, gen, world + 3, 3, total);
    tally(send_chunk(s, &h), &rc, &n);
    chunk_hdr(&h, job, gen, target, 3, total);
    tally(send_chunk(s, &h), &rc, &n);
    chunk_hdr(&h, job, gen, -1, 3, total);
    tally(send_chunk(s, &h), &rc, &n);
    /* A real peer's name on a message that has no place on a data socket, and on a chunk of a
     * collective long finished (sequence numbers start at 1). */
    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, 0);
    snprintf(h.job_id, sizeof h.job_id, "%s", job);
    h.generation = gen;
    tally(fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(2000)), &rc, &n);
    chunk_hdr(&h, job, gen, (target + world - 1) % world, 0, total);
    tally(send_chunk(s, &h), &rc, &n);
    *sent = n;
    return rc;
}

/* One chunk header whose job id is a printf format: must be refused like any other job. */
static int attack_format(fl_tp_sock_t *s, const char *job, uint64_t gen, int target, int world,
                         size_t total, int *sent)
{
    (void)job;
    char fmt[FL_JOB_MAX] = "";
    for (int i = 0; i < 30; i++)
        strcat(fmt, "%s");
    fl_msg_hdr_t h;
    chunk_hdr(&h, fmt, gen, (target + world - 1) % world, 3, total);
    int rc = send_chunk(s, &h);
    *sent = rc == FL_OK ? 1 : 0;
    return rc;
}

typedef int (*attack_fn)(fl_tp_sock_t *s, const char *job, uint64_t gen, int target, int world,
                         size_t total, int *sent);

static void run_garbage(attack_fn attack, int expect)
{
    const scenario_t sc = {.world = 3,
                           .count = 300007,
                           .timeout_ms = 10000,
                           .algo = FL_ALGO_RING,
                           .segment = (size_t)64 << 10,
                           .special = 1,
                           .progress_at = 2,
                           .progress_rank = 1,
                           .expect_bad = expect,
                           .body = body_garbage};
    job_t job;
    bool forked = job_fork(&job, &sc, true);
    fl_coord_t *coord = forked ? make_coord(sc.world) : NULL;
    if (coord != NULL)
        job_send_endpoint(&job, fl_coord_endpoint(coord));
    bool going = coord != NULL && job_wait_event(&job, sc.special, 'P', fl_deadline_in(30000));
    int sent = 0;
    int arc = FL_EIO;
    char aerr[1024] = "";
    if (going) {
        /* The attacker knows the job's generation, as a confused peer of this job would. */
        uint64_t gen = coord->generation;
        fl_ctx_opts_t co;
        fl_ctx_opts_init(&co);
        co.log_level = FL_LOG_OFF;
        fl_ctx_t *ctx = NULL;
        fl_tp_sock_t *s = NULL;
        fl_tp_opts_t to;
        fl_tp_opts_init(&to);
        to.linger_ms = 3000;
        arc = fl_ctx_create(&co, &ctx);
        if (arc == FL_OK)
            arc = fl_tp_sock_create(ctx, FL_TP_PUSH, &to, "attacker", &s);
        if (arc == FL_OK)
            arc = fl_tp_sock_connect(s, job.ipc);
        if (arc == FL_OK)
            arc = attack(s, "flodl", gen, sc.special, sc.world, sc.count, &sent);
        if (arc != FL_OK)
            snprintf(aerr, sizeof aerr, "%s", fl_last_error());
        fl_tp_sock_destroy(&s); /* lingers until the messages left */
        fl_ctx_destroy(&ctx);
    }
    bool reported = going && job_wait_reports(&job, 0x7u, fl_deadline_in(30000));
    job_stop(&job);
    if (coord != NULL) {
        fl_coord_stop(coord);
        fl_coord_destroy(&coord);
    }

    ck_assert_msg(forked, "could not fork the ranks");
    ck_assert_msg(going, "rank 1 never completed 2 allreduces");
    ck_assert_msg(arc == FL_OK && sent == expect, "attacker: sent %d of %d: %s", sent, expect,
                  aerr);
    char st[4096];
    ck_assert_msg(reported, "ranks did not report within 30 s:%s", job_status(&job, st, sizeof st));
    /* The attacked rank first: when it crashed, that is the news, not its peers' errors. */
    for (int k = 0; k < sc.world; k++) {
        int r = (sc.special + k) % sc.world;
        rank_report_t rep = get_report(&job, r);
        if (rep.rc != FL_OK || rep.mismatches != 0 || rep.steps < 5)
            ck_abort_msg("rank %d: %s after %d steps, %d wrong elements: %s", r,
                         fl_strerror(rep.rc), rep.steps, rep.mismatches, rep.err);
        uint64_t want = r == sc.special ? (uint64_t)expect : 0;
        if (rep.bad_msgs != want)
            ck_abort_msg("rank %d counted %llu bad messages, want %llu", r,
                         (unsigned long long)rep.bad_msgs, (unsigned long long)want);
    }
}

START_TEST(test_garbage_on_data_socket)
{
    run_garbage(attack_garbage, 14);
}
END_TEST

START_TEST(test_format_string_job_id)
{
    run_garbage(attack_format, 1);
}
END_TEST

Suite *faults_garbage_suite(void);
Suite *faults_garbage_suite(void)
{
    Suite *s = suite_create("faults_garbage");
    TCase *t = tcase_create("garbage");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_garbage_on_data_socket);
    tcase_add_test(t, test_format_string_job_id);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(faults_garbage_suite());
}
