/* Ring plan arithmetic, without sockets: the shard layout (exact cover, contiguity, balance,
 * huge counts, out-of-range arguments), the reduce-scatter and all-gather chunk schedules
 * simulated symbolically with contribution bitmasks for 1..64 ranks, segmentation limits
 * (fl_ring_segn, fl_ring_nseg) and the collective kind / phase names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define MAX_RANKS 64

/* Checks the layout of count elements over n shards; returns NULL or a static description. */
static const char *layout_error(size_t count, int n)
{
    static char why[256];
    size_t next = 0;
    size_t big = fl_shard_count(count, n, 0);
    for (int i = 0; i < n; i++) {
        size_t off = fl_shard_offset(count, n, i);
        size_t cnt = fl_shard_count(count, n, i);
        size_t want = count / (size_t)n + ((size_t)i < count % (size_t)n ? 1 : 0);
        if (off != next) {
            snprintf(why, sizeof why, "shard %d starts at %zu, previous ended at %zu", i, off,
                     next);
            return why;
        }
        if (cnt != want || cnt > big || big - cnt > 1) {
            snprintf(why, sizeof why, "shard %d has %zu elements (want %zu, shard 0 has %zu)", i,
                     cnt, want, big);
            return why;
        }
        if (i > 0 && cnt > fl_shard_count(count, n, i - 1)) {
            snprintf(why, sizeof why, "shard %d (%zu) larger than shard %d", i, cnt, i - 1);
            return why;
        }
        next = off + cnt;
    }
    if (next != count) {
        snprintf(why, sizeof why, "shards end at %zu, not %zu", next, count);
        return why;
    }
    /* The offset one past the last shard is the end of the buffer. */
    if (fl_shard_offset(count, n, n) != count) {
        snprintf(why, sizeof why, "offset of shard %d is %zu, not the end %zu", n,
                 fl_shard_offset(count, n, n), count);
        return why;
    }
    return NULL;
}

START_TEST(test_shard_layout_exhaustive)
{
    for (size_t count = 0; count <= 2000; count++) {
        for (int n = 1; n <= 17; n++) {
            const char *why = layout_error(count, n);
            if (why != NULL)
                ck_abort_msg("count %zu, %d shards: %s", count, n, why);
        }
    }
}
END_TEST

START_TEST(test_shard_layout_huge)
{
    static const size_t counts[] = {SIZE_MAX / 8, SIZE_MAX / 8 - 1, SIZE_MAX / 8 - 16,
                                    (size_t)1 << 60, ((size_t)1 << 40) + 12345};
    static const int ns[] = {1, 2, 3, 7, 16, 17, 64, 1000};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
            const char *why = layout_error(counts[k], ns[j]);
            if (why != NULL)
                ck_abort_msg("count %zu, %d shards: %s", counts[k], ns[j], why);
        }
    }
    /* 3 shards of SIZE_MAX/8 = 2305843009213693951 = 3 * 768614336404564650 + 1. */
    ck_assert_uint_eq(fl_shard_count(SIZE_MAX / 8, 3, 0), 768614336404564651u);
    ck_assert_uint_eq(fl_shard_count(SIZE_MAX / 8, 3, 2), 768614336404564650u);
    ck_assert_uint_eq(fl_shard_offset(SIZE_MAX / 8, 3, 2), 2u * 768614336404564650u + 1u);
}
END_TEST

START_TEST(test_shard_out_of_range)
{
    ck_assert_uint_eq(fl_shard_count(100, 4, -1), 0);
    ck_assert_uint_eq(fl_shard_count(100, 4, 4), 0);
    ck_assert_uint_eq(fl_shard_count(100, 4, 1000), 0);
    ck_assert_uint_eq(fl_shard_count(100, 0, 0), 0);
    ck_assert_uint_eq(fl_shard_count(100, -3, 0), 0);
    ck_assert_uint_eq(fl_shard_offset(100, 4, -1), 0);
    ck_assert_uint_eq(fl_shard_offset(100, 0, 0), 0);
    ck_assert_uint_eq(fl_shard_offset(100, -3, 1), 0);
    /* Fewer elements than shards: the first count shards have one, the rest none. */
    ck_assert_uint_eq(fl_shard_count(3, 5, 2), 1);
    ck_assert_uint_eq(fl_shard_count(3, 5, 3), 0);
    ck_assert_uint_eq(fl_shard_offset(3, 5, 4), 3);
    ck_assert_uint_eq(fl_shard_count(0, 5, 0), 0);
}
END_TEST

/* Reduce-scatter: acc[r][c] is the set of ranks whose contribution rank r's partial sum of
 * chunk c holds. In step s rank r sends its chunk send(r, s) to r+1, which adds its own
 * contribution to what arrives (it already holds its own, so the sets must be disjoint). */
static const char *rs_schedule_error(int n)
{
    static char why[256];
    static uint64_t acc[MAX_RANKS][MAX_RANKS];
    static uint64_t sent[MAX_RANKS];
    uint64_t all = n == 64 ? ~0ULL : (1ULL << n) - 1;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < n; c++)
            acc[r][c] = 1ULL << r;
    for (int s = 0; s < n - 1; s++) {
        /* Everyone sends what it held after the previous step, then everyone receives. */
        for (int r = 0; r < n; r++)
            sent[r] = acc[r][fl_ring_rs_send_chunk(r, s, n)];
        for (int r = 0; r < n; r++) {
            int to = fl_ring_mod((long)r + 1, n);
            int c = fl_ring_rs_send_chunk(r, s, n);
            if (fl_ring_rs_recv_chunk(to, s, n) != c) {
                snprintf(why, sizeof why, "step %d: rank %d sends chunk %d, rank %d expects %d", s,
                         r, c, to, fl_ring_rs_recv_chunk(to, s, n));
                return why;
            }
            if (acc[to][c] & sent[r]) {
                snprintf(why, sizeof why,
                         "step %d: rank %d's chunk %d counts a contribution "
                         "twice",
                         s, to, c);
                return why;
            }
            acc[to][c] |= sent[r];
            /* Pipelining: what arrives in step s is sent on in step s+1. */
            if (s + 1 < n - 1 && fl_ring_rs_send_chunk(to, s + 1, n) != c) {
                snprintf(why, sizeof why,
                         "rank %d receives chunk %d in step %d but sends %d "
                         "in step %d",
                         to, c, s, fl_ring_rs_send_chunk(to, s + 1, n), s + 1);
                return why;
            }
        }
    }
    for (int r = 0; r < n; r++) {
        if (acc[r][r] != all) {
            snprintf(why, sizeof why, "rank %d's chunk %d holds contributions %#llx, not all", r, r,
                     (unsigned long long)acc[r][r]);
            return why;
        }
        if (n > 1 && fl_ring_rs_recv_chunk(r, n - 2, n) != r) {
            snprintf(why, sizeof why, "rank %d's last reduce-scatter chunk is %d", r,
                     fl_ring_rs_recv_chunk(r, n - 2, n));
            return why;
        }
    }
    return NULL;
}

/* All-gather: have[r] is the set of chunks rank r holds, starting with its own. */
static const char *ag_schedule_error(int n)
{
    static char why[256];
    static uint64_t have[MAX_RANKS];
    uint64_t all = n == 64 ? ~0ULL : (1ULL << n) - 1;
    for (int r = 0; r < n; r++) {
        have[r] = 1ULL << r;
        if (n > 1 && fl_ring_ag_send_chunk(r, 0, n) != r) {
            snprintf(why, sizeof why, "rank %d starts the all-gather with chunk %d", r,
                     fl_ring_ag_send_chunk(r, 0, n));
            return why;
        }
    }
    for (int s = 0; s < n - 1; s++) {
        uint64_t before[MAX_RANKS];
        memcpy(before, have, sizeof before);
        for (int r = 0; r < n; r++) {
            int to = fl_ring_mod((long)r + 1, n);
            int c = fl_ring_ag_send_chunk(r, s, n);
            if (!(before[r] & (1ULL << c))) {
                snprintf(why, sizeof why, "step %d: rank %d sends chunk %d it does not hold", s, r,
                         c);
                return why;
            }
            if (fl_ring_ag_recv_chunk(to, s, n) != c) {
                snprintf(why, sizeof why, "step %d: rank %d sends chunk %d, rank %d expects %d", s,
                         r, c, to, fl_ring_ag_recv_chunk(to, s, n));
                return why;
            }
            if (have[to] & (1ULL << c)) {
                snprintf(why, sizeof why, "step %d: rank %d receives chunk %d a second time", s, to,
                         c);
                return why;
            }
            have[to] |= 1ULL << c;
            if (s + 1 < n - 1 && fl_ring_ag_send_chunk(to, s + 1, n) != c) {
                snprintf(why, sizeof why,
                         "rank %d receives chunk %d in step %d but sends %d "
                         "in step %d",
                         to, c, s, fl_ring_ag_send_chunk(to, s + 1, n), s + 1);
                return why;
            }
        }
    }
    for (int r = 0; r < n; r++) {
        if (have[r] != all) {
            snprintf(why, sizeof why, "rank %d ends with chunks %#llx", r,
                     (unsigned long long)have[r]);
            return why;
        }
    }
    return NULL;
}

START_TEST(test_rs_schedule)
{
    for (int n = 1; n <= MAX_RANKS; n++) {
        const char *why = rs_schedule_error(n);
        if (why != NULL)
            ck_abort_msg("%d ranks: %s", n, why);
    }
}
END_TEST

START_TEST(test_ag_schedule)
{
    for (int n = 1; n <= MAX_RANKS; n++) {
        const char *why = ag_schedule_error(n);
        if (why != NULL)
            ck_abort_msg("%d ranks: %s", n, why);
    }
}
END_TEST

START_TEST(test_ring_mod)
{
    ck_assert_int_eq(fl_ring_mod(-1, 5), 4);
    ck_assert_int_eq(fl_ring_mod(-10, 5), 0);
    ck_assert_int_eq(fl_ring_mod(-11, 5), 4);
    ck_assert_int_eq(fl_ring_mod(7, 5), 2);
    ck_assert_int_eq(fl_ring_mod(0, 1), 0);
    /* Examples from the header: step 0 of 4 ranks, rank 2 sends chunk 1 and reduces 0. */
    ck_assert_int_eq(fl_ring_rs_send_chunk(2, 0, 4), 1);
    ck_assert_int_eq(fl_ring_rs_recv_chunk(2, 0, 4), 0);
    ck_assert_int_eq(fl_ring_ag_send_chunk(2, 1, 4), 1);
    ck_assert_int_eq(fl_ring_ag_recv_chunk(2, 1, 4), 0);
}
END_TEST

START_TEST(test_segn_limits)
{
    static const size_t chunks[] = {0,
                                    1,
                                    2,
                                    7,
                                    1000,
                                    4095,
                                    4096,
                                    4097,
                                    65536,
                                    1000003,
                                    (size_t)1 << 24,
                                    ((size_t)1 << 32) + 5,
                                    (size_t)1 << 40};
    static const size_t elems[] = {0, 1, 2, 4, 8};
    static const size_t segs[] = {1, 3, 4, 7, 4096, 65536, (size_t)1 << 20, (size_t)64 << 20};
    for (size_t a = 0; a < sizeof chunks / sizeof chunks[0]; a++) {
        for (size_t b = 0; b < sizeof elems / sizeof elems[0]; b++) {
            for (size_t d = 0; d < sizeof segs / sizeof segs[0]; d++) {
                size_t cnt = chunks[a];
                size_t esz = elems[b];
                size_t sb = segs[d];
                size_t segn = fl_ring_segn(cnt, esz, sb);
                size_t want = sb / (esz ? esz : 1);
                if (want == 0)
                    want = 1;
                if (segn < 1)
                    ck_abort_msg("chunk %zu, %zu-byte elements, segment %zu: segn 0", cnt, esz, sb);
                uint64_t nseg = (cnt + segn - 1) / segn;
                if (nseg > 4096)
                    ck_abort_msg("chunk %zu, %zu-byte elements, segment %zu: %llu segments", cnt,
                                 esz, sb, (unsigned long long)nseg);
                /* Where 4096 segments of the requested size cover the chunk, that size is
                 * used; else the fewest elements per segment that stay within 4096. */
                if (cnt <= 4096 * want && segn != want)
                    ck_abort_msg("chunk %zu, %zu-byte elements, segment %zu: segn %zu, want "
                                 "%zu",
                                 cnt, esz, sb, segn, want);
                if (cnt > 4096 * want && segn != (cnt + 4095) / 4096)
                    ck_abort_msg("chunk %zu, %zu-byte elements, segment %zu: segn %zu for a "
                                 "capped chunk",
                                 cnt, esz, sb, segn);
                if (fl_ring_nseg(cnt, segn) != (uint32_t)nseg)
                    ck_abort_msg("nseg(%zu, %zu) = %u, want %llu", cnt, segn,
                                 fl_ring_nseg(cnt, segn), (unsigned long long)nseg);
            }
        }
    }
    ck_assert_uint_eq(fl_ring_segn(1000, 4, 4096), 1024);
    ck_assert_uint_eq(fl_ring_segn(10000000, 4, 4096), 2442);
    ck_assert_uint_eq(fl_ring_segn(10, 8, 4), 1);
}
END_TEST

START_TEST(test_nseg)
{
    ck_assert_uint_eq(fl_ring_nseg(0, 1), 0);
    ck_assert_uint_eq(fl_ring_nseg(0, 1024), 0);
    ck_assert_uint_eq(fl_ring_nseg(1, 1024), 1);
    ck_assert_uint_eq(fl_ring_nseg(1024, 1024), 1);
    ck_assert_uint_eq(fl_ring_nseg(1025, 1024), 2);
    ck_assert_uint_eq(fl_ring_nseg(9, 3), 3);
    ck_assert_uint_eq(fl_ring_nseg(10, 3), 4);
    ck_assert_uint_eq(fl_ring_nseg(4096, 1), 4096);
}
END_TEST

START_TEST(test_names)
{
    ck_assert_str_eq(fl_coll_kind_name(FL_COLL_ALLREDUCE), "allreduce");
    ck_assert_str_eq(fl_coll_kind_name(FL_COLL_REDUCE_SCATTER), "reduce-scatter");
    ck_assert_str_eq(fl_coll_kind_name(FL_COLL_ALLGATHER), "all-gather");
    ck_assert_str_eq(fl_coll_kind_name(FL_COLL_BROADCAST), "broadcast");
    ck_assert_str_eq(fl_coll_kind_name(FL_COLL_BARRIER), "barrier");
    ck_assert_str_eq(fl_coll_kind_name(0), "unknown collective");
    ck_assert_str_eq(fl_coll_kind_name(7), "unknown collective");
    ck_assert_str_eq(fl_coll_kind_name(-1), "unknown collective");
    ck_assert_str_eq(fl_coll_phase_name(FL_PHASE_RS), "reduce-scatter");
    ck_assert_str_eq(fl_coll_phase_name(FL_PHASE_AG), "all-gather");
    ck_assert_str_eq(fl_coll_phase_name(FL_PHASE_RD_PRE), "recursive-doubling fold-in");
    ck_assert_str_eq(fl_coll_phase_name(FL_PHASE_RD), "recursive doubling");
    ck_assert_str_eq(fl_coll_phase_name(FL_PHASE_RD_POST), "recursive-doubling hand-out");
    ck_assert_str_eq(fl_coll_phase_name(FL_PHASE_BCAST), "broadcast");
    ck_assert_str_eq(fl_coll_phase_name(FL_PHASE_DIRECT), "one-shot exchange");
    ck_assert_str_eq(fl_coll_phase_name(0), "start");
    ck_assert_str_eq(fl_coll_phase_name(99), "start");
}
END_TEST

Suite *ring_plan_suite(void);
Suite *ring_plan_suite(void)
{
    Suite *s = suite_create("ring_plan");
    TCase *t = tcase_create("shards");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_shard_layout_exhaustive);
    tcase_add_test(t, test_shard_layout_huge);
    tcase_add_test(t, test_shard_out_of_range);
    suite_add_tcase(s, t);
    t = tcase_create("schedule");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_rs_schedule);
    tcase_add_test(t, test_ag_schedule);
    tcase_add_test(t, test_ring_mod);
    suite_add_tcase(s, t);
    t = tcase_create("segments");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_segn_limits);
    tcase_add_test(t, test_nseg);
    tcase_add_test(t, test_names);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(ring_plan_suite());
}
