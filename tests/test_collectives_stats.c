/* The communicator's op and byte counters after each collective, the algorithm AUTO picks,
 * and messages that arrive before their operation. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collutil.h"

typedef struct st_arg {
    uint64_t sent[MAX_WORLD];
    uint64_t recv[MAX_WORLD];
} st_arg_t;

/* Elements rank r sends in the ring's reduce-scatter and/or all-gather. */
static uint64_t ring_elems(int r, int n, size_t count, bool rs, bool ag)
{
    uint64_t e = 0;
    for (int s = 0; s < n - 1; s++) {
        if (rs)
            e += fl_shard_count(count, n, fl_ring_rs_send_chunk(r, s, n));
        if (ag)
            e += fl_shard_count(count, n, fl_ring_ag_send_chunk(r, s, n));
    }
    return e;
}

/* Checks a call's result and that bytes_sent moved by exactly sent, with the algorithm and op
 * count given. bytes_recv is left to test_stats_early_messages: messages that arrive before
 * their collective starts (a neighbour running ahead) make it timing-dependent here. */
static int st_step(fl_comm_t *comm, int rc, const fl_comm_stats_t *before, uint64_t sent,
                   fl_algo_t algo, uint64_t ops, const char *what)
{
    if (rc != FL_OK)
        return bad("%s: %s: %s", what, fl_strerror(rc), fl_last_error());
    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    int r = fl_comm_rank(comm);
    if (st.bytes_sent - before->bytes_sent != sent)
        return bad("rank %d: %s sent %llu bytes, want %llu", r, what,
                   (unsigned long long)(st.bytes_sent - before->bytes_sent),
                   (unsigned long long)sent);
    if (st.last_algo != algo)
        return bad("rank %d: after %s last_algo is %d, want %d", r, what, (int)st.last_algo,
                   (int)algo);
    if (st.ops != ops || st.bad_msgs != 0)
        return bad("rank %d: after %s ops %llu (want %llu), bad_msgs %llu", r, what,
                   (unsigned long long)st.ops, (unsigned long long)ops,
                   (unsigned long long)st.bad_msgs);
    return FL_OK;
}

/* Bytes rank r sends in a small allreduce of b bytes: one-shot sends b to each peer; recursive
 * doubling over P = 2^k <= N ranks sends b per round, plus the fold-in (even ranks below
 * 2(N-P)) or the hand-out (odd ranks below 2(N-P)). */
static uint64_t small_sent(fl_algo_t algo, int r, int n, uint64_t b)
{
    if (algo == FL_ALGO_DIRECT)
        return (uint64_t)(n - 1) * b;
    int p = 1;
    int rounds = 0;
    while (p * 2 <= n) {
        p *= 2;
        rounds++;
    }
    int rem = n - p;
    if (r < 2 * rem)
        return r % 2 == 0 ? b : (uint64_t)(rounds + 1) * b;
    return (uint64_t)rounds * b;
}

static int st_rank(fl_comm_t *comm, void *arg)
{
    st_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    size_t c = 10007;
    float *buf = malloc(c * sizeof *buf);
    float *out = malloc(c * sizeof *out);
    uint16_t *half = calloc(c, sizeof *half);
    if (buf == NULL || out == NULL || half == NULL)
        return bad("out of memory");
    for (size_t i = 0; i < c; i++)
        buf[i] = (float)(r + 1);
    fl_comm_stats_t s;
    fl_comm_get_stats(comm, &s);
    int rc = FL_OK;
    if (s.ops != 0 || s.bytes_sent != 0 || s.bytes_recv != 0 || s.bad_msgs != 0 ||
        s.last_algo != FL_ALGO_AUTO)
        rc = bad("rank %d: fresh counters are not zero / AUTO", r);
    uint64_t rs_out = ring_elems(r, n, c, true, false);
    uint64_t ag_out = ring_elems(r, n, c, false, true);
    /* Up to small_bytes (4 KiB here) AUTO runs one-shot on up to 8 ranks, recursive doubling
     * on more; above it the ring. */
    fl_algo_t small = n <= 8 ? FL_ALGO_DIRECT : FL_ALGO_RD;
    if (rc == FL_OK) {
        rc = st_step(comm, fl_allreduce(comm, buf, out, 1024, FL_FLOAT32, FL_SUM), &s,
                     small_sent(small, r, n, 4096), small, 1, "4 KiB allreduce");
        if (rc == FL_OK && out[1023] != (float)(n * (n + 1) / 2))
            rc = bad("rank %d: 4 KiB allreduce gave %g", r, out[1023]);
    }
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_allreduce(comm, buf, out, c, FL_FLOAT32, FL_SUM), &s,
                     (rs_out + ag_out) * 4, FL_ALGO_RING, 2, "float32 ring allreduce");
        fl_comm_stats_t t;
        fl_comm_get_stats(comm, &t);
        a->sent[r] = t.bytes_sent - s.bytes_sent;
        if (rc == FL_OK && out[c - 1] != (float)(n * (n + 1) / 2))
            rc = bad("rank %d: ring allreduce gave %g", r, out[c - 1]);
    }
    /* float16: float32 partial sums in the reduce-scatter, float16 in the all-gather. */
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_allreduce(comm, half, half, c, FL_FLOAT16, FL_SUM), &s,
                     rs_out * 4 + ag_out * 2, FL_ALGO_RING, 3, "float16 ring allreduce");
    }
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_allreduce(comm, buf, out, 100, FL_FLOAT32, FL_MAX), &s,
                     small_sent(small, r, n, 400), small, 4, "400-byte allreduce");
    }
    /* Reduce-scatter and all-gather are not allreduces: last_algo stays. */
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_reduce_scatter(comm, buf, out, c, FL_FLOAT32, FL_SUM), &s, rs_out * 4,
                     small, 5, "reduce-scatter");
    }
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_allgather(comm, buf + fl_shard_offset(c, n, r), buf, c, FL_FLOAT32),
                     &s, ag_out * 4, small, 6, "all-gather");
    }
    if (rc == FL_OK) {
        fl_comm_get_stats(comm, &s);
        rc = st_step(comm, fl_barrier(comm), &s, 0, small, 7, "barrier");
    }
    free(buf);
    free(out);
    free(half);
    return rc;
}

START_TEST(test_stats)
{
    static const int worlds[] = {2, 3, 4, 5, 9};
    int world = worlds[_i];
    st_arg_t a;
    memset(&a, 0, sizeof a);
    fl_comm_opts_t o;
    opts_base(&o);
    o.small_bytes = 4096;
    o.segment_bytes = 4096;
    run_world(world, &o, st_rank, &a);
    uint64_t sent = 0;
    for (int r = 0; r < world; r++)
        sent += a.sent[r];
    /* Each of the N chunks is sent N-1 times in each phase: 2(N-1)/N of the buffer per rank. */
    uint64_t want = 2ULL * (uint64_t)(world - 1) * 10007 * 4;
    ck_assert_msg(sent == want,
                  "%d ranks: ring allreduce of %d bytes sent %llu in total, want "
                  "%llu",
                  world, 10007 * 4, (unsigned long long)sent, (unsigned long long)want);
}
END_TEST

/* Rank 2 arrives late to a broadcast that rank 3 waits on (tree: 0 -> 2 -> 3), so rank 1's
 * second-round message of the following recursive-doubling allreduce (partners 0, then 3)
 * reaches rank 3 early and is stashed. Every payload byte sent is received by someone. */
static int stash_rank(fl_comm_t *comm, void *arg)
{
    st_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    float buf[256];
    for (int i = 0; i < 256; i++)
        buf[i] = r == 0 ? (float)i : -1.0f;
    if (r == 2)
        usleep(300 * 1000);
    EXPECT_OK(fl_broadcast(comm, buf, 256, FL_FLOAT32, 0));
    EXPECT_OK(fl_allreduce(comm, buf, buf, 256, FL_FLOAT32, FL_SUM));
    for (int i = 0; i < 256; i++)
        if (buf[i] != (float)(4 * i))
            return bad("rank %d: element %d is %g, want %d", r, i, buf[i], 4 * i);
    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    a->sent[r] = st.bytes_sent;
    a->recv[r] = st.bytes_recv;
    return FL_OK;
}

START_TEST(test_stats_early_messages)
{
    st_arg_t a;
    memset(&a, 0, sizeof a);
    fl_comm_opts_t o;
    opts_base(&o);
    o.algo = FL_ALGO_RD; /* the schedule the comment above relies on */
    run_world(4, &o, stash_rank, &a);
    /* Broadcast: ranks 1..3 receive 1 KiB each (rank 0 sends two, rank 2 one); recursive
     * doubling over 4 ranks: everyone sends and receives 2 KiB. */
    static const uint64_t want_sent[4] = {4096, 2048, 3072, 2048};
    static const uint64_t want_recv[4] = {2048, 3072, 3072, 3072};
    for (int r = 0; r < 4; r++) {
        if (a.sent[r] != want_sent[r] || a.recv[r] != want_recv[r])
            ck_abort_msg("rank %d counted %llu bytes sent and %llu received, want %llu and %llu", r,
                         (unsigned long long)a.sent[r], (unsigned long long)a.recv[r],
                         (unsigned long long)want_sent[r], (unsigned long long)want_recv[r]);
    }
}
END_TEST

Suite *collectives_stats_suite(void);
Suite *collectives_stats_suite(void)
{
    Suite *s = suite_create("collectives_stats");
    TCase *t = tcase_create("stats");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_stats, 0, 5);
    tcase_add_test(t, test_stats_early_messages);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(collectives_stats_suite());
}
