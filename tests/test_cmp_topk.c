/* compression: top-k selection (topk.c, topk_sampled.c, the device stub). The exact mode is
 * compared with a sort-based reference over sizes 1..10^6, densities 1e-4..1 and 16 kinds of
 * data, some crafted to defeat the sampled bracket so the radix fallback runs; bad arguments
 * and NaN/Inf fail naming the value or index and write nothing; the sampled mode stays within
 * its bounds and is reproducible; fl_cmp_topk_count rounds up. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_cmp.h"
#include "testutil.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))
#define HALF_PI 1.5707963267948966
#define CANARY 0xa5

#ifdef __SANITIZE_ADDRESS__
#define LARGE_SEEDS 1 /* ASan runs the 10^6 sweep once per kind of data */
#else
#define LARGE_SEEDS 2
#endif

enum dist {
    D_UNIFORM,
    D_GAUSS,
    D_CAUCHY,
    D_SMALLINT,    /* -3..3: many exact ties, -3 and 3 tie */
    D_ALLEQ,       /* one magnitude, random signs */
    D_KTIES,       /* half the entries are +-0.5: ties at the threshold for many k */
    D_QUANT,       /* multiples of 1/64 */
    D_ZEROS,       /* mostly +0.0 and -0.0 */
    D_SUBNORMAL,   /* subnormals, zeros and FLT_MIN */
    D_HUGE,        /* +-FLT_MAX and other huge finite values among small ones */
    D_ASC,         /* magnitudes sorted ascending */
    D_DESC,        /* magnitudes sorted descending */
    D_BLOCKEND,    /* the last tenth large */
    D_PERIODIC,    /* large every n/16384 entries: the bracket's sample stride */
    D_SAMPLE_LOW,  /* tiny exactly where the bracket samples, large elsewhere */
    D_SAMPLE_HIGH, /* large exactly where the bracket samples */
    D_COUNT,
};

static fl_cmp_ws_t *new_ws(void)
{
    fl_cmp_ws_t *ws = NULL;
    ck_assert_int_eq(fl_cmp_ws_create(&ws), FL_OK);
    return ws;
}

static uint32_t key_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
}

static uint32_t bits_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static float from_bits(uint32_t u)
{
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static float rsign(uint64_t *s)
{
    return (fl_test_rand(s) & 1) ? -1.0f : 1.0f;
}

/* The positions the one-pass bracket of topk.c samples for n >= 65536 (its fixed hash). If
 * topk.c changes its sample these inputs stop being adversarial but the checks still hold. */
static void set_sample_positions(float *x, size_t n, float lo, float hi, uint64_t *s)
{
    if (n < 65536)
        return;
    size_t stride = n / 16384;
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (size_t j = 0; j < 16384; j++) {
        h ^= h >> 29;
        h *= 0xbf58476d1ce4e5b9ULL;
        double u = (fl_test_uniform(s) + 1.0) / 2.0;
        x[j * stride + (size_t)(h % stride)] = rsign(s) * (float)(lo + (hi - lo) * u);
    }
}

static void fill(float *x, size_t n, int dist, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + (uint64_t)dist;
    size_t stride = n / 16384 > 1 ? n / 16384 : 2;
    for (size_t i = 0; i < n; i++) {
        double u = fl_test_uniform(&s);
        float v;
        switch (dist) {
        case D_GAUSS:
            v = (float)(u + fl_test_uniform(&s) + fl_test_uniform(&s) + fl_test_uniform(&s));
            break;
        case D_CAUCHY: v = (float)tan(u * HALF_PI * 0.99999); break;
        case D_SMALLINT: v = (float)(int)(fl_test_rand(&s) % 7) - 3.0f; break;
        case D_ALLEQ: v = rsign(&s) * 0.75f; break;
        case D_KTIES: v = (fl_test_rand(&s) & 2) ? rsign(&s) * 0.5f : (float)u; break;
        case D_QUANT: v = floorf((float)u * 64.0f) / 64.0f; break;
        case D_ZEROS: v = fl_test_rand(&s) % 10 == 0 ? (float)u : rsign(&s) * 0.0f; break;
        case D_SUBNORMAL: {
            uint64_t r = fl_test_rand(&s);
            v = r % 16 == 0 ? FLT_MIN : from_bits((uint32_t)(r >> 8) & 0x807fffffu);
            if (r % 16 == 1)
                v = rsign(&s) * 0.0f;
            break;
        }
        case D_HUGE: {
            uint64_t r = fl_test_rand(&s) % 3;
            v = r == 0 ? rsign(&s) * FLT_MAX : r == 1 ? FLT_MAX * (float)u : (float)u;
            break;
        }
        case D_ASC: v = rsign(&s) * (float)i; break;
        case D_DESC: v = rsign(&s) * (float)(n - i); break;
        case D_BLOCKEND: v = i >= n - n / 10 ? 100.0f + (float)u : (float)u; break;
        case D_PERIODIC: v = i % stride == 0 ? 50.0f + (float)u : (float)u; break;
        case D_SAMPLE_LOW: v = rsign(&s) * (1.0f + (float)u); break;
        case D_SAMPLE_HIGH: v = (float)u; break;
        default: v = (float)u; break;
        }
        x[i] = v;
    }
    if (dist == D_SAMPLE_LOW)
        set_sample_positions(x, n, 0.0, 1e-3, &s);
    if (dist == D_SAMPLE_HIGH)
        set_sample_positions(x, n, 100.0, 200.0, &s);
}

/* Buffers for inputs of up to n entries, in one block: the data, two sets of pairs, the
 * reference's arrays and marks. */
typedef struct bufs {
    float *x;
    uint32_t *idx;
    float *val;
    uint32_t *idx2;
    float *val2;
    uint32_t *order; /* reference: entries by magnitude descending, then index ascending */
    uint32_t *tmp;
    uint32_t *rank; /* reference: each entry's place in that order */
    uint8_t *mark;
    void *block;
} bufs_t;

static void bufs_alloc(bufs_t *b, size_t n)
{
    uint32_t *p = malloc(n * (8 * sizeof(uint32_t) + 1));
    ck_assert_ptr_nonnull(p);
    b->block = p;
    b->x = (float *)(void *)p;
    b->idx = p + n;
    b->val = (float *)(void *)(p + 2 * n);
    b->idx2 = p + 3 * n;
    b->val2 = (float *)(void *)(p + 4 * n);
    b->order = p + 5 * n;
    b->tmp = p + 6 * n;
    b->rank = p + 7 * n;
    b->mark = (uint8_t *)(p + 8 * n);
}

static void bufs_free(bufs_t *b)
{
    free(b->block);
}

/* The reference order of b->x[0..n): three stable counting-sort passes over the inverted key
 * (11, 11, 9 bits); the input is in index order, so equal magnitudes stay in index order. */
static void ref_build(bufs_t *b, size_t n)
{
    static const int shift[3] = {0, 11, 22};
    static const uint32_t mask[3] = {0x7ff, 0x7ff, 0x1ff};
    for (size_t i = 0; i < n; i++)
        b->order[i] = (uint32_t)i;
    for (int p = 0; p < 3; p++) {
        size_t count[2049];
        memset(count, 0, sizeof count);
        for (size_t i = 0; i < n; i++)
            count[(((0x7fffffffu - key_of(b->x[b->order[i]])) >> shift[p]) & mask[p]) + 1]++;
        for (size_t c = 1; c < 2049; c++)
            count[c] += count[c - 1];
        for (size_t i = 0; i < n; i++) {
            uint32_t d = ((0x7fffffffu - key_of(b->x[b->order[i]])) >> shift[p]) & mask[p];
            b->tmp[count[d]++] = b->order[i];
        }
        uint32_t *t = b->order;
        b->order = b->tmp;
        b->tmp = t;
    }
    for (size_t i = 0; i < n; i++)
        b->rank[b->order[i]] = (uint32_t)i;
}

/* Checks b->idx/val[0..k_out) against the reference's top k: the same indices, ascending,
 * and values bit-identical to x (so -0.0 stays -0.0). */
static void ref_check(const bufs_t *b, size_t n, size_t k, size_t k_out, const char *what)
{
    if (k_out != k)
        ck_abort_msg("%s: k_out %zu, want %zu", what, k_out, k);
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (b->rank[i] >= k)
            continue;
        if (b->idx[j] != i)
            ck_abort_msg("%s: idx[%zu] = %u, want %zu (|x| %g vs %g)", what, j, b->idx[j], i,
                         fabs((double)b->x[b->idx[j] < n ? b->idx[j] : 0]), fabs((double)b->x[i]));
        if (bits_of(b->val[j]) != bits_of(b->x[i]))
            ck_abort_msg("%s: val[%zu] = %a, x[%zu] = %a", what, j, (double)b->val[j], i,
                         (double)b->x[i]);
        j++;
    }
}

static const size_t sweep_sizes[] = {1, 2, 3, 7, 100, 4096, 65535, 65536, 65537, 100000};
static const double densities[] = {1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0};

/* Every density and k = 1, n - 1, n on one input; fresh_ws: a new workspace per call. */
static void check_all_k(fl_cmp_ws_t *shared, bufs_t *b, size_t n, int dist, uint64_t seed,
                        const double *dens, size_t ndens, bool fresh_ws)
{
    char what[160];
    for (size_t c = 0; c < ndens + 3; c++) {
        fl_cmp_topk_opts_t o;
        fl_cmp_topk_opts_init(&o);
        if (c < ndens)
            o.density = dens[c];
        else
            o.k = c == ndens ? 1 : c == ndens + 1 ? (n > 1 ? n - 1 : 1) : n;
        size_t k = 0;
        if (fl_cmp_topk_count(n, &o, &k) != FL_OK)
            ck_abort_msg("count n=%zu: %s", n, fl_last_error());
        fl_cmp_ws_t *ws = shared;
        if (fresh_ws && fl_cmp_ws_create(&ws) != FL_OK)
            ck_abort_msg("ws: %s", fl_last_error());
        size_t k_out = 0;
        int rc = fl_cmp_topk(ws, b->x, n, &o, b->idx, b->val, &k_out);
        if (fresh_ws)
            fl_cmp_ws_destroy(&ws);
        snprintf(what, sizeof what, "dist %d n %zu seed %llu k %zu%s", dist, n,
                 (unsigned long long)seed, k, fresh_ws ? " (fresh ws)" : "");
        if (rc != FL_OK)
            ck_abort_msg("%s: rc %d: %s", what, rc, fl_last_error());
        ref_check(b, n, k, k_out, what);
    }
}

/* All kinds of data at sizes up to 10^5, one workspace reused across sizes going up and down. */
START_TEST(test_exact_sweep)
{
    const size_t maxn = 100000;
    bufs_t b;
    bufs_alloc(&b, maxn);
    fl_cmp_ws_t *ws = new_ws();
    int dist = _i;
    for (size_t si = 0; si < NELEM(sweep_sizes); si++) {
        size_t n = sweep_sizes[si];
        int seeds = n <= 4096 ? 8 : 2;
        for (int seed = 1; seed <= seeds; seed++) {
            fill(b.x, n, dist, (uint64_t)seed);
            ref_build(&b, n);
            check_all_k(ws, &b, n, dist, (uint64_t)seed, densities, NELEM(densities), false);
        }
    }
    fl_cmp_ws_destroy(&ws);
    bufs_free(&b);
}
END_TEST

/* 10^6 entries, then the same input with a fresh workspace per call at 65537. */
START_TEST(test_exact_large)
{
    const size_t n = 1000000;
    static const double dens[] = {1e-4, 1e-2, 0.3};
    bufs_t b;
    bufs_alloc(&b, n);
    fl_cmp_ws_t *ws = new_ws();
    int dist = _i;
    for (int seed = 1; seed <= LARGE_SEEDS; seed++) {
        fill(b.x, n, dist, (uint64_t)seed + 100);
        ref_build(&b, n);
        check_all_k(ws, &b, n, dist, (uint64_t)seed + 100, dens, NELEM(dens), false);
        /* shrink back: the grown workspace must serve a smaller input */
        fill(b.x, 65537, dist, (uint64_t)seed + 200);
        ref_build(&b, 65537);
        check_all_k(ws, &b, 65537, dist, (uint64_t)seed + 200, dens, NELEM(dens), false);
        check_all_k(NULL, &b, 65537, dist, (uint64_t)seed + 200, dens, NELEM(dens), true);
    }
    fl_cmp_ws_destroy(&ws);
    bufs_free(&b);
}
END_TEST

static void expect_pairs(const float *x, size_t n, size_t k, const uint32_t *want_idx,
                         const char *what)
{
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o;
    fl_cmp_topk_opts_init(&o);
    o.k = k;
    uint32_t idx[8];
    float val[8];
    size_t k_out = 0;
    ck_assert_msg(fl_cmp_topk(ws, x, n, &o, idx, val, &k_out) == FL_OK, "%s: %s", what,
                  fl_last_error());
    fl_cmp_ws_destroy(&ws);
    ck_assert_msg(k_out == k, "%s: k_out %zu", what, k_out);
    for (size_t j = 0; j < k; j++)
        if (idx[j] != want_idx[j] || bits_of(val[j]) != bits_of(x[want_idx[j]]))
            ck_abort_msg("%s: pair %zu = (%u, %a), want (%u, %a)", what, j, idx[j], (double)val[j],
                         want_idx[j], (double)x[want_idx[j]]);
}

START_TEST(test_exact_small_cases)
{
    const float pm3[] = {-3.0f, 3.0f, 1.0f, -3.0f, 2.0f};
    expect_pairs(pm3, 5, 1, (const uint32_t[]){0}, "-3 before 3");
    expect_pairs(pm3, 5, 2, (const uint32_t[]){0, 1}, "-3, 3");
    expect_pairs(pm3, 5, 3, (const uint32_t[]){0, 1, 3}, "-3, 3, -3");
    expect_pairs(pm3, 5, 4, (const uint32_t[]){0, 1, 3, 4}, "then 2");
    const float zeros[] = {0.0f, -0.0f, 0.0f, -0.0f};
    expect_pairs(zeros, 4, 2, (const uint32_t[]){0, 1}, "+0, -0");
    const float z2[] = {-0.0f, 0.0f, 1e-45f, -0.0f};
    expect_pairs(z2, 4, 1, (const uint32_t[]){2}, "denormal over zeros");
    expect_pairs(z2, 4, 2, (const uint32_t[]){0, 2}, "-0 first among zeros");
    const float big[] = {1.0f, -FLT_MAX, FLT_MAX, 3e38f, -FLT_MAX};
    expect_pairs(big, 5, 2, (const uint32_t[]){1, 2}, "FLT_MAX ties");
    expect_pairs(big, 5, 3, (const uint32_t[]){1, 2, 4}, "all FLT_MAX");
    const float one[] = {-0.25f};
    expect_pairs(one, 1, 1, (const uint32_t[]){0}, "n = 1");
}
END_TEST

/* True when msg holds num as a whole number (no digit or '.' right before or after). */
static bool has_number(const char *msg, const char *num)
{
    size_t len = strlen(num);
    for (const char *p = strstr(msg, num); p != NULL; p = strstr(p + 1, num)) {
        char before = p == msg ? ' ' : p[-1];
        char after = p[len];
        if ((before < '0' || before > '9') && before != '.' && (after < '0' || after > '9') &&
            after != '.')
            return true;
    }
    return false;
}

/* fl_cmp_topk fails with FL_EINVAL naming num and writes nothing; so does
 * fl_cmp_topk_count when the count itself is bad (count_too). */
static void expect_einval(size_t n, const fl_cmp_topk_opts_t *o, const char *num, bool count_too)
{
    static const float x[16];
    uint32_t idx[16];
    float val[16];
    memset(idx, CANARY, sizeof idx);
    memset(val, CANARY, sizeof val);
    size_t k = 7;
    int rc = fl_cmp_topk_count(n, o, &k);
    if (count_too && (rc != FL_EINVAL || !has_number(fl_last_error(), num)))
        ck_abort_msg("count n=%zu (want %s named): rc %d: %s", n, num, rc, fl_last_error());
    fl_cmp_ws_t *ws = new_ws();
    size_t k_out = 0;
    rc = fl_cmp_topk(ws, x, n, o, idx, val, &k_out);
    fl_cmp_ws_destroy(&ws);
    if (rc != FL_EINVAL || !has_number(fl_last_error(), num))
        ck_abort_msg("topk n=%zu (want %s named): rc %d: %s", n, num, rc, fl_last_error());
    uint8_t canary[sizeof idx];
    memset(canary, CANARY, sizeof canary);
    if (memcmp(idx, canary, sizeof idx) != 0 || memcmp(val, canary, sizeof val) != 0)
        ck_abort_msg("n=%zu: output written on FL_EINVAL", n);
}

START_TEST(test_bad_args)
{
    fl_cmp_topk_opts_t o;
    fl_cmp_topk_opts_init(&o);
    expect_einval(0, &o, "0", true);
    o.k = 11;
    expect_einval(10, &o, "11", true);
    ck_assert_msg(has_number(fl_last_error(), "10"), "%s", fl_last_error());
    o.k = 0;
    o.density = 0.0;
    expect_einval(10, &o, "0", true);
    ck_assert_msg(strstr(fl_last_error(), "density") != NULL, "%s", fl_last_error());
    o.density = -0.5;
    expect_einval(10, &o, "-0.5", true);
    o.density = 1.5;
    expect_einval(10, &o, "1.5", true);
    o.density = NAN;
    expect_einval(10, &o, "nan", true);
    o.density = INFINITY;
    expect_einval(10, &o, "inf", true);
#if SIZE_MAX > UINT32_MAX
    fl_cmp_topk_opts_init(&o);
    expect_einval((size_t)UINT32_MAX + 1, &o, "4294967296", true);
#endif
    /* the tensor name is in the text */
    fl_cmp_topk_opts_init(&o);
    o.name = "layer3.weight";
    o.k = 5;
    expect_einval(4, &o, "5", true);
    ck_assert_msg(strstr(fl_last_error(), "layer3.weight") != NULL, "%s", fl_last_error());
    /* sampling fraction outside (0, 1] and an unknown mode */
    const double fractions[] = {0.0, -0.1, 1.5, NAN};
    const char *const named[] = {"0", "-0.1", "1.5", "nan"};
    for (size_t i = 0; i < NELEM(fractions); i++) {
        fl_cmp_topk_opts_init(&o);
        o.mode = FL_CMP_SAMPLED;
        o.sample_fraction = fractions[i];
        expect_einval(16, &o, named[i], false);
        if (strstr(fl_last_error(), "sample") == NULL)
            ck_abort_msg("fraction %g: %s", fractions[i], fl_last_error());
    }
    fl_cmp_topk_opts_init(&o);
    o.mode = (fl_cmp_select_t)7;
    expect_einval(16, &o, "7", false);
}
END_TEST

/* True when msg says "index <i>" for exactly this i. */
static bool names_index(const char *msg, size_t i)
{
    char want[48];
    snprintf(want, sizeof want, "index %zu", i);
    size_t len = strlen(want);
    for (const char *p = strstr(msg, want); p != NULL; p = strstr(p + 1, want))
        if (p[len] < '0' || p[len] > '9')
            return true;
    return false;
}

/* NaN, -NaN, Inf, -Inf at the first, middle and last index (and an earlier Inf ahead of a
 * later NaN), small and large inputs, exact and sampled, k < n and k = n. */
START_TEST(test_nonfinite)
{
    static const size_t sizes[] = {1, 1000, 65536, 300000};
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    const size_t maxn = 300000;
    bufs_t b;
    bufs_alloc(&b, maxn);
    fl_cmp_ws_t *ws = new_ws();
    uint8_t *canary = malloc(maxn * sizeof(float));
    ck_assert_ptr_nonnull(canary);
    memset(canary, CANARY, maxn * sizeof(float));
    for (size_t si = 0; si < NELEM(sizes); si++) {
        size_t n = sizes[si];
        const size_t pos[] = {0, n / 2, n - 1, n / 3};
        for (size_t bi = 0; bi < NELEM(bad); bi++) {
            for (size_t pi = 0; pi < NELEM(pos); pi++) {
                for (int mode = 0; mode < 2; mode++) {
                    for (int dense = 0; dense < 2; dense++) {
                        fill(b.x, n, D_GAUSS, si * 100 + bi * 10 + pi);
                        b.x[pos[pi]] = bad[bi];
                        if (pi == 3) /* a second bad value later on: the first is named */
                            b.x[n - 1] = bi % 2 ? NAN : INFINITY;
                        fl_cmp_topk_opts_t o;
                        fl_cmp_topk_opts_init(&o);
                        o.name = "fc2.bias";
                        o.mode = mode ? FL_CMP_SAMPLED : FL_CMP_EXACT;
                        o.density = dense ? 1.0 : 0.01;
                        memset(b.idx, CANARY, n * sizeof *b.idx);
                        memset(b.val, CANARY, n * sizeof *b.val);
                        size_t k_out = 0;
                        int rc = fl_cmp_topk(ws, b.x, n, &o, b.idx, b.val, &k_out);
                        const char *msg = fl_last_error();
                        if (rc != FL_ENONFINITE || strstr(msg, "fc2.bias") == NULL ||
                            !names_index(msg, pos[pi]))
                            ck_abort_msg("n %zu bad %g at %zu mode %d density %g: rc %d: %s", n,
                                         (double)bad[bi], pos[pi], mode, o.density, rc, msg);
                        if (memcmp(b.idx, canary, n * sizeof *b.idx) != 0 ||
                            memcmp(b.val, canary, n * sizeof *b.val) != 0)
                            ck_abort_msg("n %zu bad at %zu mode %d: output written", n, pos[pi],
                                         mode);
                    }
                }
            }
        }
    }
    free(canary);
    fl_cmp_ws_destroy(&ws);
    bufs_free(&b);
}
END_TEST

/* Sampled result: at most k pairs, indices ascending and unique, val == x[idx], and nothing
 * left out is larger in magnitude than anything selected. */
static void check_sampled(bufs_t *b, size_t n, size_t k, size_t k_out, const char *what)
{
    const float *x = b->x;
    const uint32_t *idx = b->idx;
    const float *val = b->val;
    uint8_t *mark = b->mark;
    if (k_out > k)
        ck_abort_msg("%s: k_out %zu > k %zu", what, k_out, k);
    memset(mark, 0, n);
    uint32_t min_sel = UINT32_MAX;
    for (size_t j = 0; j < k_out; j++) {
        if (idx[j] >= n || (j > 0 && idx[j] <= idx[j - 1]))
            ck_abort_msg("%s: idx[%zu] = %u not ascending below n", what, j, idx[j]);
        if (bits_of(val[j]) != bits_of(x[idx[j]]))
            ck_abort_msg("%s: val[%zu] != x[%u]", what, j, idx[j]);
        mark[idx[j]] = 1;
        if (key_of(val[j]) < min_sel)
            min_sel = key_of(val[j]);
    }
    for (size_t i = 0; i < n && k_out > 0; i++)
        if (!mark[i] && key_of(x[i]) > min_sel)
            ck_abort_msg("%s: x[%zu] = %g left out, selected down to |%g|", what, i, (double)x[i],
                         (double)from_bits(min_sel));
}

START_TEST(test_sampled_bounds)
{
    static const size_t sizes[] = {1, 7, 1000, 65537, 1000000};
    static const int dists[] = {D_UNIFORM, D_GAUSS, D_CAUCHY, D_SMALLINT, D_ALLEQ,
                                D_KTIES,   D_ZEROS, D_HUGE,   D_ASC,      D_SAMPLE_HIGH};
    static const double dens[] = {1e-3, 1e-2, 0.1, 1.0};
    const size_t maxn = 1000000;
    bufs_t b;
    bufs_alloc(&b, maxn);
    fl_cmp_ws_t *ws = new_ws();
    char what[128];
    for (size_t si = 0; si < NELEM(sizes); si++) {
        size_t n = sizes[si];
        for (size_t di = 0; di < NELEM(dists); di++) {
            fill(b.x, n, dists[di], 7 + si);
            for (size_t c = 0; c < NELEM(dens); c++) {
                fl_cmp_topk_opts_t o;
                fl_cmp_topk_opts_init(&o);
                o.mode = FL_CMP_SAMPLED;
                o.density = dens[c];
                o.seed = 1000 + c;
                size_t k = 0;
                size_t k_out = 0;
                ck_assert_int_eq(fl_cmp_topk_count(n, &o, &k), FL_OK);
                int rc = fl_cmp_topk(ws, b.x, n, &o, b.idx, b.val, &k_out);
                snprintf(what, sizeof what, "sampled n %zu dist %d density %g", n, dists[di],
                         dens[c]);
                if (rc != FL_OK)
                    ck_abort_msg("%s: %s", what, fl_last_error());
                check_sampled(&b, n, k, k_out, what);
            }
        }
    }
    fl_cmp_ws_destroy(&ws);
    bufs_free(&b);
}
END_TEST

/* On random data the estimate lands near k; the same seed gives the same pairs (with another
 * workspace too), and the seed does choose the sample. */
START_TEST(test_sampled_count_and_seed)
{
    const size_t n = 1000000;
    bufs_t b;
    bufs_alloc(&b, n);
    fl_cmp_ws_t *ws = NULL;
    fl_cmp_ws_t *ws2 = NULL;
    ck_assert_int_eq(fl_cmp_ws_create(&ws), FL_OK);
    ck_assert_int_eq(fl_cmp_ws_create(&ws2), FL_OK);
    const int dists[] = {D_UNIFORM, D_GAUSS};
    for (size_t di = 0; di < NELEM(dists); di++) {
        fill(b.x, n, dists[di], 99);
        size_t first_k = 0;
        bool differs = false;
        for (uint64_t seed = 1; seed <= 8; seed++) {
            fl_cmp_topk_opts_t o;
            fl_cmp_topk_opts_init(&o);
            o.mode = FL_CMP_SAMPLED;
            o.density = 0.01;
            o.sample_fraction = 0.01;
            o.seed = seed;
            size_t k = 0;
            size_t k1 = 0;
            size_t k2 = 0;
            ck_assert_int_eq(fl_cmp_topk_count(n, &o, &k), FL_OK);
            ck_assert_int_eq(fl_cmp_topk(ws, b.x, n, &o, b.idx, b.val, &k1), FL_OK);
            check_sampled(&b, n, k, k1, "sampled 1%");
            if (k1 < k / 2)
                ck_abort_msg("dist %d seed %llu: only %zu of %zu", dists[di],
                             (unsigned long long)seed, k1, k);
            ck_assert_int_eq(fl_cmp_topk(ws2, b.x, n, &o, b.idx2, b.val2, &k2), FL_OK);
            if (k1 != k2 || memcmp(b.idx, b.idx2, k1 * sizeof *b.idx) != 0 ||
                memcmp(b.val, b.val2, k1 * sizeof *b.val) != 0)
                ck_abort_msg("seed %llu: two runs differ (%zu vs %zu pairs)",
                             (unsigned long long)seed, k1, k2);
            if (seed == 1)
                first_k = k1;
            else if (k1 != first_k)
                differs = true;
        }
        ck_assert_msg(differs, "dist %d: 8 seeds all selected %zu pairs", dists[di], first_k);
    }
    fl_cmp_ws_destroy(&ws);
    fl_cmp_ws_destroy(&ws2);
    bufs_free(&b);
}
END_TEST

static size_t count_of(size_t n, size_t k, double density)
{
    fl_cmp_topk_opts_t o;
    fl_cmp_topk_opts_init(&o);
    o.k = k;
    o.density = density;
    size_t out = 0;
    int rc = fl_cmp_topk_count(n, &o, &out);
    ck_assert_msg(rc == FL_OK, "n %zu k %zu density %g: %s", n, k, density, fl_last_error());
    return out;
}

START_TEST(test_count)
{
    ck_assert_uint_eq(count_of(100, 0, 0.015), 2);
    ck_assert_uint_eq(count_of(1000, 0, 0.001), 1);
    ck_assert_uint_eq(count_of(1001, 0, 0.001), 2);
    ck_assert_uint_eq(count_of(1000003, 0, 0.01), 10001);
    ck_assert_uint_eq(count_of(10, 0, 1e-9), 1);
    ck_assert_uint_eq(count_of(1, 0, 1e-4), 1);
    ck_assert_uint_eq(count_of(3, 0, 0.5), 2);
    ck_assert_uint_eq(count_of(5, 0, 1.0), 5);
    ck_assert_uint_eq(count_of(4, 4, 0.01), 4);
    ck_assert_uint_eq(count_of(4, 1, 0.9), 1);
    fl_cmp_topk_opts_t o;
    fl_cmp_topk_opts_init(&o);
    ck_assert_uint_eq(o.k, 0);
    ck_assert(o.density == 0.01);
    ck_assert_int_eq(o.mode, FL_CMP_EXACT);
    ck_assert_str_eq(o.name, "gradient");
}
END_TEST

/* A density written in decimal means that share: 7% of 100 entries is 7, although
 * 0.07 * 100 evaluates to 7.000000000000001 in binary floating point. */
START_TEST(test_count_decimal_density)
{
    ck_assert_uint_eq(count_of(100, 0, 0.07), 7);
    ck_assert_uint_eq(count_of(10000, 0, 0.07), 700);
    ck_assert_uint_eq(count_of(100000, 0, 0.07), 7000);
}
END_TEST

/* Without a device (this suite's normal environment) the device entry point refuses. */
START_TEST(test_device_without_gpu)
{
    if (fl_gpu_available()) {
        printf("test_device_without_gpu: a GPU is present; test_gpu_topk covers the device\n");
        return;
    }
    float x[64];
    uint32_t idx[64];
    float val[64];
    fill(x, 64, D_UNIFORM, 1);
    fl_cmp_topk_opts_t o;
    fl_cmp_topk_opts_init(&o);
    o.k = 4;
    for (int mode = 0; mode < 2; mode++) {
        o.mode = mode ? FL_CMP_SAMPLED : FL_CMP_EXACT;
        size_t k_out = 99;
        int rc = fl_cmp_topk_device(x, 64, &o, idx, val, &k_out);
        ck_assert_msg(rc == FL_EGPU, "mode %d: rc %d: %s", mode, rc, fl_last_error());
        ck_assert_uint_eq(k_out, 0);
        ck_assert_msg(fl_last_error()[0] != '\0', "no detail text");
    }
}
END_TEST

Suite *cmp_topk_suite(void);
Suite *cmp_topk_suite(void)
{
    Suite *s = suite_create("cmp_topk");
    TCase *t = tcase_create("exact");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_exact_small_cases);
    tcase_add_loop_test(t, test_exact_sweep, 0, D_COUNT);
    tcase_add_loop_test(t, test_exact_large, 0, D_COUNT);
    suite_add_tcase(s, t);

    t = tcase_create("errors");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_bad_args);
    tcase_add_test(t, test_nonfinite);
    tcase_add_test(t, test_device_without_gpu);
    suite_add_tcase(s, t);

    t = tcase_create("sampled");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_sampled_bounds);
    tcase_add_test(t, test_sampled_count_and_seed);
    suite_add_tcase(s, t);

    t = tcase_create("count");
    tcase_add_test(t, test_count);
    tcase_add_test(t, test_count_decimal_density);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(cmp_topk_suite());
}
