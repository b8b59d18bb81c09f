/* fl_sparse_allreduce over 1..5 ranks (threads with their own communicators on 127.0.0.1)
 * against a serial reference that adds every rank's rounded pairs in rank order: exact on the
 * sparse path, to float32 rounding on the dense fallback. Sizes 1 to 10^6, overlapping and
 * disjoint indices, k = 0, float16/bfloat16, lz4 on and off, the stats, a mix with dense
 * allreduces, refused arguments, and ranks that disagree on the tensor. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define MAX_WORLD 5
#define MAX_CASES 20
#define TEST_EBAD (-100) /* a rank found a wrong result; the detail says what */

static int bad(const char *fmt, ...) FL_PRINTF(1, 2);
static int bad(const char *fmt, ...)
{
    char text[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return fl_fail(TEST_EBAD, "%s", text);
}

/* Notes a wrong result and lets the rank go on: one that stops early leaves its peers waiting
 * for their deadline, which hides the cause. */
static int note(char *first, size_t cap, int rc)
{
    if (rc == TEST_EBAD && first[0] == '\0')
        snprintf(first, cap, "%s", fl_last_error());
    return rc == TEST_EBAD ? FL_OK : rc;
}

static const char *code_name(int rc)
{
    return rc == TEST_EBAD ? "wrong result" : fl_strerror(rc);
}

static void comm_opts(fl_comm_opts_t *o, int timeout_ms)
{
    fl_comm_opts_init(o);
    o->host = "127.0.0.1";
    o->timeout_ms = timeout_ms;
    o->rendezvous_timeout_ms = 20000;
    o->log_level = FL_LOG_OFF;
}

/* ---- cases: who contributes which pairs ---- */

typedef enum kmode {
    K_SAME,      /* every rank k */
    K_VARY,      /* rank q: k * (q + 1) / N */
    K_SOME_ZERO, /* odd ranks none */
    K_ALL_ZERO,  /* no rank any */
    K_LAST_ONLY, /* only rank N-1 */
    K_SPLIT,     /* every rank n / N + k: the dense threshold exactly (k = 0) or one above */
} kmode_t;

typedef enum pat {
    P_SPREAD,   /* one index per slot of n / k, each rank its own draw: chance overlaps */
    P_HOT,      /* every rank picks from one shared set of 2 * kmax indices: heavy overlap */
    P_DISJOINT, /* rank q only indices i with i % N == q */
    P_CONTIG,   /* 0..k-1 on every rank: full overlap, deltas all 0 */
} pat_t;

typedef struct sp_case {
    const char *name;
    size_t n;
    size_t k;
    kmode_t km;
    pat_t pat;
    fl_dtype_t values; /* 0: float32 */
    fl_op_t op;        /* 0: sum */
    bool constant;     /* values 0.25 * (q + 1) instead of random ones (compressible) */
    bool no_lz4;
    bool no_dense;
    bool twin; /* the previous case again with lz4 flipped: same bytes, wire no larger */
    bool far;  /* sparse enough that wire must be far below raw with N > 1 */
} sp_case_t;

typedef struct sp_result {
    uint64_t hash; /* of out's bytes */
    fl_sparse_stats_t st;
} sp_result_t;

typedef struct sp_arg {
    const sp_case_t *cases;
    int ncases;
    bool mix; /* a dense fl_allreduce after every sparse one */
    sp_result_t res[MAX_CASES][MAX_WORLD];
} sp_arg_t;

static size_t rank_k(const sp_case_t *c, int q, int nr)
{
    switch (c->km) {
    case K_SAME: return c->k;
    case K_VARY: return c->k * (size_t)(q + 1) / (size_t)nr;
    case K_SOME_ZERO: return q % 2 == 1 ? 0 : c->k;
    case K_ALL_ZERO: return 0;
    case K_LAST_ONLY: return q == nr - 1 ? c->k : 0;
    case K_SPLIT: return c->n / (size_t)nr + c->k < c->n ? c->n / (size_t)nr + c->k : c->n;
    }
    return 0;
}

static size_t max_k(const sp_case_t *c, int nr)
{
    size_t m = 0;
    for (int q = 0; q < nr; q++)
        m = rank_k(c, q, nr) > m ? rank_k(c, q, nr) : m;
    return m;
}

/* k strictly ascending positions in [0, m) (k <= m), one in each of k equal slots. */
static void pick(size_t m, size_t k, uint64_t s, uint32_t *pos)
{
    for (size_t j = 0; j < k; j++) {
        size_t lo = j * m / k;
        size_t hi = (j + 1) * m / k;
        pos[j] = (uint32_t)(lo + fl_test_rand(&s) % (hi - lo));
    }
}

/* Rank q's pairs of case c (tmp: room for 2 * kmax indices). Returns k. */
static size_t gen(const sp_case_t *c, int q, int nr, size_t kmax, uint32_t *idx, float *val,
                  uint32_t *tmp)
{
    size_t k = rank_k(c, q, nr);
    uint64_t s = 0x5eedULL ^ (uint64_t)c->n * 131 ^ (uint64_t)(q + 1) * 0x9e3779b97f4a7c15ULL;
    switch (c->pat) {
    case P_SPREAD: pick(c->n, k, s, idx); break;
    case P_HOT: {
        size_t u = c->n < 2 * kmax ? c->n : 2 * kmax;
        pick(c->n, u, 0xfeedULL, tmp);
        pick(u, k, s, idx);
        for (size_t j = 0; j < k; j++)
            idx[j] = tmp[idx[j]];
        break;
    }
    case P_DISJOINT:
        pick((c->n - (size_t)q + (size_t)nr - 1) / (size_t)nr, k, s, idx);
        for (size_t j = 0; j < k; j++)
            idx[j] = idx[j] * (uint32_t)nr + (uint32_t)q;
        break;
    case P_CONTIG:
        for (size_t j = 0; j < k; j++)
            idx[j] = (uint32_t)j;
        break;
    }
    /* Magnitudes from 2^-6 to 2^5: the order of the additions shows in the low bits. */
    for (size_t j = 0; j < k; j++)
        val[j] = c->constant
                     ? 0.25f * (float)(q + 1)
                     : (float)(fl_test_uniform(&s) * ldexp(1.0, (int)(fl_test_rand(&s) % 12) - 6));
    return k;
}

static float rounded(float v, fl_dtype_t t)
{
    if (t == FL_FLOAT16)
        return fl_f16_to_f32(fl_f32_to_f16(v));
    if (t == FL_BFLOAT16)
        return fl_bf16_to_f32(fl_f32_to_bf16(v));
    return v;
}

static uint64_t hash_bytes(const void *p, size_t len)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

typedef struct bufs {
    uint32_t *idx, *tmp;
    float *val, *ref, *absref, *out;
    uint8_t *blk;
} bufs_t;

static void bufs_free(bufs_t *b)
{
    free(b->idx);
    free(b->tmp);
    free(b->val);
    free(b->ref);
    free(b->absref);
    free(b->out);
    free(b->blk);
}

/* Compares out with the reference: bit for bit on the sparse path, within float32 rounding of
 * differently ordered additions on the dense one. */
static int check_values(const sp_case_t *c, int r, int nr, bool dense, const bufs_t *b)
{
    for (size_t i = 0; i < c->n; i++) {
        float got = b->out[i];
        float want = b->ref[i];
        double tol = 2.0 * nr * FLT_EPSILON * b->absref[i] / (c->op == FL_AVG ? nr : 1);
        bool ok =
            dense ? fabs((double)got - (double)want) <= tol : memcmp(&got, &want, sizeof got) == 0;
        if (!ok)
            return bad("%s, %d ranks, rank %d (%s path): out[%zu] = %a, want %a", c->name, nr, r,
                       dense ? "dense" : "sparse", i, (double)got, (double)want);
    }
    return FL_OK;
}

static int check_stats(const sp_case_t *c, int r, int nr, const fl_sparse_stats_t *st, bool dense,
                       uint64_t ktot, uint64_t blocks)
{
    uint64_t raw = (uint64_t)(2.0 * (nr - 1) / nr * (double)c->n * 4);
    const char *nm = c->name;
    if (st->dense != (int)dense)
        return bad("%s, %d ranks, rank %d: stats.dense = %d, want %d", nm, nr, r, st->dense, dense);
    if (st->k_total != ktot || st->raw_bytes != raw)
        return bad("%s, %d ranks, rank %d: k_total %llu raw_bytes %llu, want %llu and %llu", nm, nr,
                   r, (unsigned long long)st->k_total, (unsigned long long)st->raw_bytes,
                   (unsigned long long)ktot, (unsigned long long)raw);
    if (st->wire_bytes > 0 && st->ratio != (double)raw / (double)st->wire_bytes)
        return bad("%s, %d ranks, rank %d: ratio %g, raw/wire = %g", nm, nr, r, st->ratio,
                   (double)raw / (double)st->wire_bytes);
    if (nr == 1 && st->wire_bytes != 0)
        return bad("%s: one rank sent %llu bytes", nm, (unsigned long long)st->wire_bytes);
    /* Sparse: the blocks this rank sends (all but its right neighbour's own) plus the k
     * all-gather, which is at least this rank's k and at most everybody's to everybody. */
    uint64_t ag = st->wire_bytes - blocks;
    if (nr > 1 && !dense && (st->wire_bytes < blocks + 8 || ag > 8ULL * nr * nr))
        return bad("%s, %d ranks, rank %d: sent %llu bytes, its blocks are %llu: %lld bytes "
                   "for the k all-gather",
                   nm, nr, r, (unsigned long long)st->wire_bytes, (unsigned long long)blocks,
                   (long long)ag);
    if (nr > 1 && dense && st->wire_bytes + 32ULL * nr < raw)
        return bad("%s, %d ranks, rank %d: dense path sent %llu bytes, a ring sends %llu", nm, nr,
                   r, (unsigned long long)st->wire_bytes, (unsigned long long)raw);
    if (nr > 1 && c->far && st->ratio < 100)
        return bad("%s, %d ranks, rank %d: ratio %g (%llu of %llu bytes)", nm, nr, r, st->ratio,
                   (unsigned long long)st->wire_bytes, (unsigned long long)raw);
    return FL_OK;
}

/* One sparse allreduce of case c on this rank, checked against the reference. FL_OK,
 * TEST_EBAD (wrong result; the peers are still in step) or the call's error. */
static int run_case(fl_comm_t *comm, fl_cmp_ws_t *ws, const sp_case_t *c, sp_result_t *res)
{
    int r = fl_comm_rank(comm);
    int nr = fl_comm_size(comm);
    size_t kmax = max_k(c, nr);
    fl_dtype_t vt = c->values != 0 ? c->values : FL_FLOAT32;
    fl_op_t op = c->op != 0 ? c->op : FL_SUM;
    size_t cap = fl_cmp_sparse_bound(kmax, vt);
    bufs_t b = {0};
    b.idx = malloc((kmax + 1) * sizeof *b.idx);
    b.tmp = malloc((2 * kmax + 1) * sizeof *b.tmp);
    b.val = malloc((kmax + 1) * sizeof *b.val);
    b.ref = calloc(c->n, sizeof *b.ref);
    b.absref = calloc(c->n, sizeof *b.absref);
    b.out = malloc(c->n * sizeof *b.out);
    b.blk = malloc(cap);
    if (!b.idx || !b.tmp || !b.val || !b.ref || !b.absref || !b.out || !b.blk) {
        bufs_free(&b);
        return fl_fail(FL_ENOMEM, "rank %d: %s: out of memory", r, c->name);
    }
    fl_cmp_sparse_opts_t so;
    fl_cmp_sparse_opts_init(&so);
    so.values = vt;
    so.lz4 = !c->no_lz4;
    uint64_t ktot = 0;
    uint64_t blocks = 0;
    int rc = FL_OK;
    for (int q = 0; q < nr && rc == FL_OK; q++) {
        size_t kq = gen(c, q, nr, kmax, b.idx, b.val, b.tmp);
        for (size_t j = 0; j < kq; j++) {
            float v = rounded(b.val[j], vt);
            b.ref[b.idx[j]] += v;
            b.absref[b.idx[j]] += fabsf(v);
        }
        ktot += kq;
        size_t len = 0;
        rc = fl_cmp_sparse_encode(ws, b.idx, b.val, kq, c->n, &so, b.blk, cap, &len);
        if (q != (r + 1) % nr)
            blocks += len;
    }
    if (rc != FL_OK) {
        bufs_free(&b);
        return fl_fail_ctx(rc, "rank %d: %s: encoding the reference blocks", r, c->name);
    }
    if (op == FL_AVG)
        for (size_t i = 0; i < c->n; i++)
            b.ref[i] /= (float)nr;
    bool dense =
        !c->no_dense && nr > 1 &&
        (double)nr * (double)kmax * (double)(fl_dtype_size(vt) + 4) > 2.0 * (double)c->n * 4.0;

    fl_sparse_opts_t o;
    fl_sparse_opts_init(&o);
    o.values = vt;
    o.lz4 = !c->no_lz4;
    o.allow_dense = !c->no_dense;
    memset(b.out, 0xff, c->n * sizeof *b.out); /* NaNs: "zeros elsewhere" must be written */
    size_t kr = gen(c, r, nr, kmax, b.idx, b.val, b.tmp);
    /* NULL pairs where there are none: allowed with k = 0. */
    rc = fl_sparse_allreduce(comm, kr ? b.idx : NULL, kr ? b.val : NULL, kr, b.out, c->n, op, &o,
                             &res->st);
    if (rc != FL_OK)
        rc = fl_fail_ctx(rc, "%s, %d ranks", c->name, nr);
    if (rc == FL_OK)
        rc = check_stats(c, r, nr, &res->st, dense, ktot, blocks);
    if (rc == FL_OK)
        rc = check_values(c, r, nr, dense, &b);
    res->hash = hash_bytes(b.out, c->n * sizeof *b.out);
    bufs_free(&b);
    return rc;
}

/* A dense float32 allreduce between sparse ones: 1000 + i elements (one-shot) or 70000 (ring). */
static int dense_step(fl_comm_t *comm, int i)
{
    int r = fl_comm_rank(comm);
    int nr = fl_comm_size(comm);
    size_t cnt = i % 2 == 0 ? 1000 + (size_t)i : 70000;
    float *buf = malloc(cnt * sizeof *buf);
    if (buf == NULL)
        return fl_fail(FL_ENOMEM, "out of memory");
    for (size_t j = 0; j < cnt; j++)
        buf[j] = (float)(r + (int)(j % 1000));
    int rc = fl_allreduce(comm, buf, buf, cnt, FL_FLOAT32, FL_SUM);
    for (size_t j = 0; rc == FL_OK && j < cnt; j++) {
        float want = (float)(nr * (int)(j % 1000) + nr * (nr - 1) / 2);
        if (buf[j] != want)
            rc = bad("rank %d: dense allreduce %d after a sparse one: [%zu] = %g, want %g", r, i, j,
                     (double)buf[j], (double)want);
    }
    free(buf);
    return rc;
}

static int sp_rank(fl_comm_t *comm, void *arg)
{
    sp_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    fl_cmp_ws_t *ws = NULL;
    char first[900] = "";
    int rc = fl_cmp_ws_create(&ws);
    for (int i = 0; rc == FL_OK && i < a->ncases; i++) {
        rc = note(first, sizeof first, run_case(comm, ws, &a->cases[i], &a->res[i][r]));
        if (rc == FL_OK && a->mix)
            rc = note(first, sizeof first, dense_step(comm, i));
    }
    fl_cmp_ws_destroy(&ws);
    if (rc == FL_OK && first[0] != '\0')
        rc = fl_fail(TEST_EBAD, "%s", first);
    return rc;
}

/* Runs the cases on world ranks, then checks that every rank got the same bytes, and that lz4
 * twins got the same bytes with no more on the wire. */
static void run_cases(int world, const sp_case_t *cases, int ncases, bool mix)
{
    ck_assert(ncases <= MAX_CASES && world <= MAX_WORLD);
    sp_arg_t *a = calloc(1, sizeof *a);
    ck_assert(a != NULL);
    a->cases = cases;
    a->ncases = ncases;
    a->mix = mix;
    fl_comm_opts_t o;
    comm_opts(&o, 10000);
    char err[1024] = "";
    int rc = fl_test_run_ranks(world, &o, sp_rank, a, err, sizeof err);
    if (rc != FL_OK)
        ck_abort_msg("%d ranks: %s: %s", world, code_name(rc), err);
    for (int i = 0; i < ncases; i++) {
        const sp_case_t *c = &cases[i];
        for (int r = 1; r < world; r++)
            if (a->res[i][r].hash != a->res[i][0].hash)
                ck_abort_msg("%s, %d ranks: rank %d's bytes differ from rank 0's", c->name, world,
                             r);
        if (!c->twin)
            continue;
        if (a->res[i][0].hash != a->res[i - 1][0].hash)
            ck_abort_msg("%s, %d ranks: lz4 on and off give different results", c->name, world);
        for (int r = 0; r < world; r++) {
            uint64_t on = (c->no_lz4 ? a->res[i - 1] : a->res[i])[r].st.wire_bytes;
            uint64_t off = (c->no_lz4 ? a->res[i] : a->res[i - 1])[r].st.wire_bytes;
            bool shrinks = c->constant && c->pat == P_CONTIG && world > 1;
            if (on > off || (shrinks && on >= off))
                ck_abort_msg("%s, %d ranks, rank %d: %llu bytes sent with lz4, %llu without",
                             c->name, world, r, (unsigned long long)on, (unsigned long long)off);
        }
    }
    free(a);
}

static const sp_case_t small_cases[] = {
    {.name = "n=1", .n = 1, .k = 1, .pat = P_CONTIG},
    {.name = "n=1 forced sparse avg",
     .n = 1,
     .k = 1,
     .pat = P_CONTIG,
     .op = FL_AVG,
     .no_dense = true},
    {.name = "n=1 k=0", .n = 1, .km = K_ALL_ZERO},
    {.name = "n=1 last rank only",
     .n = 1,
     .k = 1,
     .km = K_LAST_ONLY,
     .pat = P_CONTIG,
     .op = FL_AVG,
     .no_dense = true},
    {.name = "n=37 varying k", .n = 37, .k = 3, .km = K_VARY},
    {.name = "n=1000 overlapping", .n = 1000, .k = 20, .pat = P_HOT},
    {.name = "n=1000 disjoint avg", .n = 1000, .k = 20, .pat = P_DISJOINT, .op = FL_AVG},
    {.name = "n=1000 k=0 on odd ranks", .n = 1000, .k = 25, .km = K_SOME_ZERO},
    {.name = "n=1000 k=0 everywhere avg", .n = 1000, .km = K_ALL_ZERO, .op = FL_AVG},
    {.name = "n=4099 float16 overlapping",
     .n = 4099,
     .k = 60,
     .km = K_VARY,
     .pat = P_HOT,
     .values = FL_FLOAT16},
    {.name = "n=4099 bfloat16 avg", .n = 4099, .k = 60, .values = FL_BFLOAT16, .op = FL_AVG},
    {.name = "n=5000 bfloat16 disjoint",
     .n = 5000,
     .k = 50,
     .pat = P_DISJOINT,
     .values = FL_BFLOAT16,
     .no_lz4 = true},
    {.name = "contiguous constant", .n = 20000, .k = 400, .pat = P_CONTIG, .constant = true},
    {.name = "contiguous constant, no lz4",
     .n = 20000,
     .k = 400,
     .pat = P_CONTIG,
     .constant = true,
     .no_lz4 = true,
     .twin = true},
    {.name = "random, no lz4", .n = 20000, .k = 400, .op = FL_AVG, .no_lz4 = true},
    {.name = "random, lz4", .n = 20000, .k = 400, .op = FL_AVG, .twin = true},
    {.name = "float16 contiguous",
     .n = 3000,
     .k = 300,
     .pat = P_CONTIG,
     .values = FL_FLOAT16,
     .constant = true},
    {.name = "float16 contiguous, no lz4",
     .n = 3000,
     .k = 300,
     .pat = P_CONTIG,
     .values = FL_FLOAT16,
     .constant = true,
     .no_lz4 = true,
     .twin = true},
};

#define MILLION 1000000

static const sp_case_t large_cases[] = {
    {.name = "1% spread", .n = MILLION, .k = 10000},
    {.name = "1% overlapping, varying k, avg",
     .n = MILLION,
     .k = 10000,
     .km = K_VARY,
     .pat = P_HOT,
     .op = FL_AVG},
    {.name = "0.1% spread", .n = MILLION, .k = 1000, .far = true},
    {.name = "0.1% bfloat16 disjoint avg",
     .n = MILLION,
     .k = 1000,
     .pat = P_DISJOINT,
     .values = FL_BFLOAT16,
     .op = FL_AVG,
     .far = true},
    {.name = "0.1% float16, k=0 on odd ranks, no lz4",
     .n = MILLION,
     .k = 1000,
     .km = K_SOME_ZERO,
     .values = FL_FLOAT16,
     .no_lz4 = true,
     .far = true},
};

/* N * kmax * (value bytes + 4) against 2 * n * 4: dense for most of these when N > 1. */
static const sp_case_t dense_cases[] = {
    {.name = "50%", .n = 10000, .k = 5000},
    {.name = "60% overlapping avg",
     .n = 10000,
     .k = 6000,
     .km = K_VARY,
     .pat = P_HOT,
     .op = FL_AVG},
    {.name = "60% float16", .n = 10000, .k = 6000, .values = FL_FLOAT16},
    {.name = "60% overlapping avg, dense not allowed",
     .n = 10000,
     .k = 6000,
     .km = K_VARY,
     .pat = P_HOT,
     .op = FL_AVG,
     .no_dense = true},
    {.name = "60% bfloat16, dense not allowed",
     .n = 10000,
     .k = 6000,
     .values = FL_BFLOAT16,
     .no_dense = true},
    {.name = "exactly the threshold", .n = 6000, .km = K_SPLIT},
    {.name = "one pair above the threshold", .n = 6000, .k = 1, .km = K_SPLIT},
    {.name = "ring-sized, avg", .n = 300000, .k = 200000, .op = FL_AVG},
};

static const sp_case_t mix_cases[] = {
    {.name = "mix sparse", .n = 5000, .k = 50, .pat = P_HOT},
    {.name = "mix dense fallback", .n = 2000, .k = 1500, .op = FL_AVG},
    {.name = "mix k=0", .n = 100, .km = K_ALL_ZERO, .values = FL_FLOAT16},
    {.name = "mix bfloat16",
     .n = 100000,
     .k = 100,
     .km = K_VARY,
     .values = FL_BFLOAT16,
     .op = FL_AVG},
    {.name = "mix forced sparse", .n = 64, .k = 64, .pat = P_CONTIG, .no_dense = true},
};

#define NCASES(a) ((int)(sizeof(a) / sizeof((a)[0])))

START_TEST(test_small)
{
    run_cases(_i, small_cases, NCASES(small_cases), false);
}
END_TEST

START_TEST(test_large)
{
    run_cases(_i, large_cases, NCASES(large_cases), false);
}
END_TEST

START_TEST(test_dense_fallback)
{
    run_cases(_i, dense_cases, NCASES(dense_cases), false);
}
END_TEST

/* Dense allreduces between the sparse ones: the sequence numbers must stay in step. */
START_TEST(test_mix_with_dense)
{
    run_cases(_i, mix_cases, NCASES(mix_cases), true);
}
END_TEST

/* ---- refused arguments ---- */

static const uint32_t idx_ok[5] = {0, 1, 4, 6, 7};
static const uint32_t idx_dup[3] = {1, 4, 4};
static const uint32_t idx_down[3] = {1, 6, 4};
static const uint32_t idx_big[3] = {1, 4, 8};
static const float vals[5] = {1.0f, -2.0f, 3.0f, 0.5f, 8.0f};

typedef struct bad_call {
    const char *what;
    const char *want; /* in the error text */
    const uint32_t *idx;
    const float *val;
    size_t k;
    size_t n;
    bool null_out;
    fl_op_t op;
    fl_dtype_t values;
} bad_call_t;

/* Those found without looking at the pairs first, then those the encoder finds. */
static const bad_call_t bad_calls[] = {
    {"operator max", "max", idx_ok, vals, 3, 8, false, FL_MAX, FL_FLOAT32},
    {"operator min", "min", idx_ok, vals, 3, 8, false, FL_MIN, FL_FLOAT32},
    {"n = 0", "0 entries", NULL, NULL, 0, 0, false, FL_SUM, FL_FLOAT32},
    {"k > n", "5 pairs of a tensor of 4", idx_ok, vals, 5, 4, false, FL_SUM, FL_FLOAT32},
    {"n > 2^32", "4294967296", idx_ok, vals, 3, (size_t)UINT32_MAX + 1, false, FL_SUM, FL_FLOAT32},
    {"NULL out", "NULL", idx_ok, vals, 3, 8, true, FL_SUM, FL_FLOAT32},
    {"NULL idx", "NULL", NULL, vals, 3, 8, false, FL_SUM, FL_FLOAT32},
    {"NULL val", "NULL", idx_ok, NULL, 3, 8, false, FL_AVG, FL_FLOAT32},
    {"repeated index", "not ascending", idx_dup, vals, 3, 8, false, FL_SUM, FL_FLOAT32},
    {"descending index", "not ascending", idx_down, vals, 3, 8, false, FL_SUM, FL_FLOAT32},
    {"index = n", "out of range", idx_big, vals, 3, 8, false, FL_SUM, FL_FLOAT32},
    {"int32 values", "int32", idx_ok, vals, 3, 8, false, FL_SUM, FL_INT32},
    {"float64 values", "float64", idx_ok, vals, 3, 8, false, FL_AVG, FL_FLOAT64},
};

/* Makes the bad calls, each of which must be refused with FL_EINVAL naming the problem and
 * leave out alone; with `quiet`, also without running any collective (the op counter). */
static int make_bad_calls(fl_comm_t *comm, bool quiet)
{
    int r = fl_comm_rank(comm);
    float out[8];
    memset(out, 0x5a, sizeof out);
    for (size_t i = 0; i < sizeof bad_calls / sizeof bad_calls[0]; i++) {
        const bad_call_t *b = &bad_calls[i];
        fl_sparse_opts_t o;
        fl_sparse_opts_init(&o);
        o.values = b->values;
        fl_comm_stats_t before;
        fl_comm_get_stats(comm, &before);
        fl_sparse_stats_t st;
        int rc = fl_sparse_allreduce(comm, b->idx, b->val, b->k, b->null_out ? NULL : out, b->n,
                                     b->op, &o, &st);
        const char *t = fl_last_error();
        fl_comm_stats_t after;
        fl_comm_get_stats(comm, &after);
        if (rc != FL_EINVAL)
            return bad("rank %d: %s: returned %d (%s), want FL_EINVAL: %s", r, b->what, rc,
                       fl_strerror(rc), t);
        if (strstr(t, b->want) == NULL)
            return bad("rank %d: %s: error text '%s' does not say '%s'", r, b->what, t, b->want);
        for (size_t j = 0; j < sizeof out; j++)
            if (((const uint8_t *)out)[j] != 0x5a)
                return bad("rank %d: %s: refused, but out was written", r, b->what);
        if (quiet && after.ops != before.ops)
            return bad("rank %d: %s: refused after %llu collective(s) ran; a refused call must "
                       "not communicate",
                       r, b->what, (unsigned long long)(after.ops - before.ops));
    }
    return FL_OK;
}

static const sp_case_t after_bad = {.name = "after refused calls",
                                    .n = 300,
                                    .k = 7,
                                    .values = FL_FLOAT16};

typedef struct args_arg {
    bool one_rank;     /* only rank 1 makes the bad calls */
    int rc[MAX_WORLD]; /* the bad-call checks' verdicts, apart from the peers' errors */
    char text[MAX_WORLD][1024];
} args_arg_t;

/* Every rank makes the same bad calls, or only rank 1 does: an argument error is the caller's,
 * found before anything is sent, so the peers never see the call and the next real one lines
 * up. Either way the communicator works afterwards. */
static int args_rank(fl_comm_t *comm, void *arg)
{
    args_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    int rc = FL_OK;
    if (!a->one_rank || r == 1)
        rc = make_bad_calls(comm, a->one_rank);
    if (rc != FL_OK) {
        a->rc[r] = rc;
        snprintf(a->text[r], sizeof a->text[r], "%s", fl_last_error());
        if (a->one_rank)
            return rc; /* the peers run into their 3 s deadline */
    }
    fl_cmp_ws_t *ws = NULL;
    sp_result_t res;
    if ((rc = fl_cmp_ws_create(&ws)) == FL_OK)
        rc = run_case(comm, ws, &after_bad, &res);
    if (rc == FL_OK)
        rc = dense_step(comm, 1);
    fl_cmp_ws_destroy(&ws);
    return rc;
}

static void args_run(int world, bool one_rank)
{
    fl_comm_opts_t o;
    comm_opts(&o, 3000);
    char err[1024] = "";
    args_arg_t a = {.one_rank = one_rank};
    int rc = fl_test_run_ranks(world, &o, args_rank, &a, err, sizeof err);
    for (int r = 0; r < world; r++)
        if (a.rc[r] != FL_OK)
            ck_abort_msg("%d ranks, bad calls on %s: %s", world,
                         one_rank ? "rank 1 only" : "every rank", a.text[r]);
    ck_assert_msg(rc == FL_OK, "%d ranks: %s: %s", world, code_name(rc), err);
}

START_TEST(test_bad_arguments)
{
    args_run(_i, false);
}
END_TEST

START_TEST(test_bad_arguments_one_rank)
{
    args_run(3, true);
}
END_TEST

/* ---- ranks that disagree ---- */

typedef enum mm_kind {
    MM_N,  /* rank 0 sums a tensor of 1001 entries, the others 1000 */
    MM_OP, /* rank 0 averages, the others sum */
} mm_kind_t;

typedef struct mm_arg {
    mm_kind_t kind;
    int rc[MAX_WORLD];
    char text[MAX_WORLD][1024];
    int rc2[MAX_WORLD];
    char text2[MAX_WORLD][1024];
} mm_arg_t;

static int mm_rank(fl_comm_t *comm, void *arg)
{
    mm_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    static const uint32_t idx[4] = {3, 17, 500, 999};
    float out[1001];
    size_t n = a->kind == MM_N && r == 0 ? 1001 : 1000;
    fl_op_t op = a->kind == MM_OP && r == 0 ? FL_AVG : FL_SUM;
    a->rc[r] = fl_sparse_allreduce(comm, idx, vals, 4, out, n, op, NULL, NULL);
    snprintf(a->text[r], sizeof a->text[r], "%s", a->rc[r] == FL_OK ? "" : fl_last_error());
    if (a->rc[r] != FL_OK) {
        /* The failure broke the communicator: the next call must say so at once. */
        a->rc2[r] = fl_sparse_allreduce(comm, idx, vals, 4, out, 1000, FL_SUM, NULL, NULL);
        snprintf(a->text2[r], sizeof a->text2[r], "%s", fl_last_error());
    }
    return FL_OK;
}

/* Every rank needs every block, so every rank must fail (EPROTO, or a deadline or dead peer
 * behind one that did), one with EPROTO naming both sides; later calls FL_ECLOSED. */
static void mm_run(int world, mm_kind_t kind, const char *must1, const char *must2)
{
    mm_arg_t *a = calloc(1, sizeof *a);
    ck_assert(a != NULL);
    a->kind = kind;
    fl_comm_opts_t o;
    comm_opts(&o, 3000);
    char err[1024] = "";
    int64_t t0 = fl_now_ms();
    int rc = fl_test_run_ranks(world, &o, mm_rank, a, err, sizeof err);
    int64_t took = fl_now_ms() - t0;
    ck_assert_msg(rc == FL_OK, "%s", err);
    int found = -1;
    for (int r = 0; r < world; r++) {
        int q = a->rc[r];
        if (q != FL_EPROTO && q != FL_ETIMEDOUT && q != FL_EPEER)
            ck_abort_msg("mismatch %d, %d ranks: rank %d returned %d (%s): %s", kind, world, r, q,
                         fl_strerror(q), a->text[r]);
        if (q == FL_EPROTO && strstr(a->text[r], must1) && strstr(a->text[r], must2) && found < 0)
            found = r;
        if (a->rc2[r] != FL_ECLOSED || !strstr(a->text2[r], "broken by an earlier failure"))
            ck_abort_msg("mismatch %d, %d ranks: rank %d's next call returned %d: %s", kind, world,
                         r, a->rc2[r], a->text2[r]);
    }
    if (found < 0)
        ck_abort_msg("mismatch %d, %d ranks: no rank reported FL_EPROTO naming '%s' and '%s'; "
                     "rank 0: %s",
                     kind, world, must1, must2, a->text[0]);
    ck_assert_msg(took < 12000, "mismatch %d, %d ranks took %lld ms", kind, world, (long long)took);
    free(a);
}

START_TEST(test_mismatch_n)
{
    mm_run(_i, MM_N, "1001", "1000");
}
END_TEST

START_TEST(test_mismatch_op)
{
    mm_run(_i, MM_OP, "sparse allreduce", "operator");
}
END_TEST

static Suite *sparse_suite(void)
{
    Suite *s = suite_create("sparse_allreduce");
    TCase *t = tcase_create("sparse");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_small, 1, MAX_WORLD + 1);
    tcase_add_loop_test(t, test_large, 1, MAX_WORLD + 1);
    suite_add_tcase(s, t);
    t = tcase_create("dense");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_dense_fallback, 1, MAX_WORLD + 1);
    tcase_add_loop_test(t, test_mix_with_dense, 1, MAX_WORLD + 1);
    suite_add_tcase(s, t);
    t = tcase_create("arguments");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_bad_arguments, 1, 4);
    tcase_add_test(t, test_bad_arguments_one_rank);
    suite_add_tcase(s, t);
    t = tcase_create("mismatch");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_mismatch_n, 2, 4);
    tcase_add_loop_test(t, test_mismatch_op, 2, 3);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(sparse_suite());
}
