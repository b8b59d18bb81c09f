/* Top-k selection by magnitude on the CPU, in expected O(n) and usually one pass over the data.
 * A deterministic sample brackets the k-th largest magnitude; one pass then sorts every entry
 * into "surely selected" (above the bracket), "candidate" (inside it) or out, and the
 * candidates are resolved exactly by a radix select on their keys. If the sample misjudged
 * (too many sure entries, too few with the candidates, or more candidates than room), a
 * two-pass radix select over all the data takes over, so the result is always exact: the k
 * largest |x|, ties to the lower index, indices ascending. The sampled (approximate) mode of
 * DGC lives in topk_sampled.c. */
#include "cmp_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#endif

#define SAMPLE 16384
#define SMALL_N 65536

void fl_cmp_topk_opts_init(fl_cmp_topk_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->density = 0.01;
    o->mode = FL_CMP_EXACT;
    o->sample_fraction = 0.01;
    o->seed = 0x5eed;
    o->name = "gradient";
}

static const char *tname(const fl_cmp_topk_opts_t *o)
{
    return o != NULL && o->name != NULL ? o->name : "gradient";
}

int fl_cmp_topk_count(size_t n, const fl_cmp_topk_opts_t *o, size_t *k)
{
    if (n == 0)
        return fl_fail(FL_EINVAL, "top-k of '%s': the tensor has 0 entries", tname(o));
    if (n > UINT32_MAX)
        return fl_fail(FL_EINVAL, "top-k of '%s': %zu entries exceed 32-bit indices", tname(o), n);
    if (o->k > 0) {
        if (o->k > n)
            return fl_fail(FL_EINVAL, "top-k of '%s': k = %zu is more than its %zu entries",
                           tname(o), o->k, n);
        *k = o->k;
        return FL_OK;
    }
    if (!(o->density > 0.0 && o->density <= 1.0))
        return fl_fail(FL_EINVAL, "top-k of '%s': density %g is outside (0, 1] (and k is 0)",
                       tname(o), o->density);
    /* ceil of the exact product: 0.07 * 100 is 7.000000000000001 in binary, and asks for 7. */
    double p = o->density * (double)n;
    double near = nearbyint(p);
    double want = fabs(p - near) <= 1e-9 * near ? near : ceil(p);
    *k = want < 1.0 ? 1 : (want > (double)n ? n : (size_t)want);
    return FL_OK;
}

int fl_cmp_topk_check(size_t n, const fl_cmp_topk_opts_t *o, size_t *k)
{
    int rc = fl_cmp_topk_count(n, o, k);
    if (rc != FL_OK)
        return rc;
    if (o->mode != FL_CMP_EXACT && o->mode != FL_CMP_SAMPLED)
        return fl_fail(FL_EINVAL, "top-k of '%s': unknown mode %d", tname(o), (int)o->mode);
    if (o->mode == FL_CMP_SAMPLED && !(o->sample_fraction > 0.0 && o->sample_fraction <= 1.0))
        return fl_fail(FL_EINVAL, "top-k of '%s': sample fraction %g is outside (0, 1]", tname(o),
                       o->sample_fraction);
    return FL_OK;
}

int fl_cmp_nonfinite_at(const float *x, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (fl_cmp_key(x[i]) >= FL_CMP_KEY_NONFINITE)
            return fl_fail(FL_ENONFINITE, "'%s' holds %s at index %zu of %zu", name,
                           isnan(x[i]) ? "NaN" : "Inf", i, n);
    }
    return FL_OK;
}

uint32_t fl_cmp_threshold(const uint32_t *keys, size_t m, size_t need, size_t *gt_out)
{
    static const int shift[3] = {20, 9, 0};
    static const uint32_t mask[3] = {0x7ffu, 0x7ffu, 0x1ffu};
    uint32_t hist[2048];
    uint32_t prefix = 0;
    uint32_t pmask = 0;
    size_t gt = 0;
    for (int level = 0; level < 3; level++) {
        memset(hist, 0, sizeof hist);
        for (size_t i = 0; i < m; i++)
            if ((keys[i] & pmask) == prefix)
                hist[(keys[i] >> shift[level]) & mask[level]]++;
        size_t c = 0;
        uint32_t bin = 0;
        for (uint32_t b = mask[level] + 1; b-- > 0;) {
            if (gt + c + hist[b] >= need) {
                bin = b;
                break;
            }
            c += hist[b];
        }
        gt += c;
        prefix |= bin << shift[level];
        pmask |= mask[level] << shift[level];
    }
    *gt_out = gt;
    return prefix;
}

size_t fl_cmp_finish(const float *x, const uint32_t *sel_idx, const float *sel_val, size_t ns,
                     const uint32_t *cand_idx, const uint32_t *cand_key, size_t nc, size_t need,
                     uint32_t *idx, float *val)
{
    size_t gt = 0;
    uint32_t t = need > 0 ? fl_cmp_threshold(cand_key, nc, need, &gt) : UINT32_MAX;
    size_t eq = need - gt;
    size_t a = 0;
    size_t b = 0;
    size_t out = 0;
    for (;;) {
        /* next chosen candidate */
        while (b < nc && !(cand_key[b] > t || (cand_key[b] == t && eq > 0)))
            b++;
        if (a == ns && b == nc)
            break;
        if (b == nc || (a < ns && sel_idx[a] < cand_idx[b])) {
            idx[out] = sel_idx[a];
            val[out++] = sel_val[a++];
        } else {
            if (cand_key[b] == t)
                eq--;
            idx[out] = cand_idx[b];
            val[out++] = x[cand_idx[b]];
            b++;
        }
    }
    return out;
}

static inline void take(uint32_t i, float v, uint32_t key, uint32_t hi, fl_cmp_ws_t *ws,
                        size_t sel_cap, size_t cand_cap, pass_t *p)
{
    if (key > hi) {
        if (p->ns < sel_cap) {
            ws->sel_idx[p->ns] = i;
            ws->sel_val[p->ns] = v;
        }
        p->ns++;
    } else {
        if (p->nc < cand_cap) {
            ws->cand_idx[p->nc] = i;
            ws->cand_key[p->nc] = key;
        }
        p->nc++;
    }
}

static void bracket_pass_scalar(const float *x, size_t from, size_t n, uint32_t lo, uint32_t hi,
                                fl_cmp_ws_t *ws, size_t sel_cap, size_t cand_cap, pass_t *p)
{
    for (size_t i = from; i < n; i++) {
        uint32_t key = fl_cmp_key(x[i]);
        if (key > p->maxkey)
            p->maxkey = key;
        if (key >= lo)
            take((uint32_t)i, x[i], key, hi, ws, sel_cap, cand_cap, p);
    }
}

#ifdef HAVE_AVX2_PATH
/* Eight entries at a time: most groups hold nothing at or above lo and cost one compare. */
__attribute__((target("avx2"))) static void bracket_pass_avx2(const float *x, size_t n, uint32_t lo,
                                                              uint32_t hi, fl_cmp_ws_t *ws,
                                                              size_t sel_cap, size_t cand_cap,
                                                              pass_t *p)
{
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    /* keys are below 2^31, so a signed compare against lo - 1 means key >= lo */
    const __m256i lim = _mm256_set1_epi32((int32_t)lo - 1);
    __m256i maxk = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i k8 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i)), absmask);
        maxk = _mm256_max_epu32(maxk, k8);
        int m = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k8, lim)));
        while (m != 0) {
            int j = __builtin_ctz((unsigned)m);
            m &= m - 1;
            float v = x[i + (size_t)j];
            take((uint32_t)(i + (size_t)j), v, fl_cmp_key(v), hi, ws, sel_cap, cand_cap, p);
        }
    }
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, maxk);
    for (int j = 0; j < 8; j++)
        if (lanes[j] > p->maxkey)
            p->maxkey = lanes[j];
    bracket_pass_scalar(x, i, n, lo, hi, ws, sel_cap, cand_cap, p);
}
#endif

void fl_cmp_bracket_pass(const float *x, size_t n, uint32_t lo, uint32_t hi, fl_cmp_ws_t *ws,
                         size_t sel_cap, size_t cand_cap, pass_t *p)
{
    memset(p, 0, sizeof *p);
#ifdef HAVE_AVX2_PATH
    if (__builtin_cpu_supports("avx2")) {
        bracket_pass_avx2(x, n, lo, hi, ws, sel_cap, cand_cap, p);
        return;
    }
#endif
    bracket_pass_scalar(x, 0, n, lo, hi, ws, sel_cap, cand_cap, p);
}

/* The always-exact path: a histogram of the top 11 key bits, then one pass collecting the
 * buckets above the k-th entry's (sure) and its bucket (candidates). */
int fl_cmp_topk_exact_radix(fl_cmp_ws_t *ws, const float *x, size_t n, size_t k, const char *name,
                            uint32_t *idx, float *val, size_t *k_out)
{
    uint32_t hist[2048];
    memset(hist, 0, sizeof hist);
    uint32_t maxkey = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t key = fl_cmp_key(x[i]);
        maxkey = key > maxkey ? key : maxkey;
        hist[key >> 20]++;
    }
    if (maxkey >= FL_CMP_KEY_NONFINITE)
        return fl_cmp_nonfinite_at(x, n, name);
    size_t above = 0;
    uint32_t bucket = 0;
    for (uint32_t b = 2048; b-- > 0;) {
        if (above + hist[b] >= k) {
            bucket = b;
            break;
        }
        above += hist[b];
    }
    uint32_t lo = bucket << 20;
    uint32_t hi = lo | 0xfffffu;
    int rc;
    if ((rc = fl_cmp_grow((void **)&ws->sel_idx, sizeof *ws->sel_idx, (void **)&ws->sel_val,
                          sizeof *ws->sel_val, &ws->sel_cap, above + 1)) != FL_OK ||
        (rc = fl_cmp_grow((void **)&ws->cand_idx, sizeof *ws->cand_idx, (void **)&ws->cand_key,
                          sizeof *ws->cand_key, &ws->cand_cap, hist[bucket] + 1)) != FL_OK)
        return rc;
    pass_t p;
    fl_cmp_bracket_pass(x, n, lo, hi, ws, ws->sel_cap, ws->cand_cap, &p);
    *k_out = fl_cmp_finish(x, ws->sel_idx, ws->sel_val, p.ns, ws->cand_idx, ws->cand_key, p.nc,
                           k - p.ns, idx, val);
    return FL_OK;
}

/* The usual path: bracket the k-th key from a sample, one pass, resolve the candidates.
 * Returns 1 (without writing the result) when the sample misjudged. */
static int select_bracket(fl_cmp_ws_t *ws, const float *x, size_t n, size_t k, const char *name,
                          uint32_t *idx, float *val, size_t *k_out, int *done)
{
    uint32_t sample[SAMPLE];
    size_t stride = n / SAMPLE;
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (size_t j = 0; j < SAMPLE; j++) {
        h ^= h >> 29;
        h *= 0xbf58476d1ce4e5b9ULL;
        sample[j] = fl_cmp_key(x[j * stride + (size_t)(h % stride)]);
    }
    /* The k-th largest entry sits near rank q of the sample; widen by ~4 standard deviations
     * of that rank so the bracket almost always holds it. Two order statistics of the sample
     * (radix selects, no sort) give the bracket's ends. */
    double q = (double)k * SAMPLE / (double)n;
    double margin = 4.0 * sqrt(q + 1.0) + 8.0;
    long hi_rank = (long)floor(q - margin);
    long lo_rank = (long)ceil(q + margin);
    size_t gt;
    uint32_t hi =
        hi_rank >= 1 ? fl_cmp_threshold(sample, SAMPLE, (size_t)hi_rank, &gt) : UINT32_MAX;
    uint32_t lo = lo_rank < SAMPLE ? fl_cmp_threshold(sample, SAMPLE, (size_t)lo_rank + 1, &gt) : 0;
    if (hi < lo) /* equal keys around the threshold: one flat bracket */
        hi = lo;
    double expect_c = (lo_rank - (hi_rank > 0 ? hi_rank : 0) + 1.0) * (double)n / SAMPLE;
    size_t cand_cap = (size_t)(2.0 * expect_c) + 4096;
    if (cand_cap > n)
        cand_cap = n;
    int rc;
    if ((rc = fl_cmp_grow((void **)&ws->sel_idx, sizeof *ws->sel_idx, (void **)&ws->sel_val,
                          sizeof *ws->sel_val, &ws->sel_cap, k + 1)) != FL_OK ||
        (rc = fl_cmp_grow((void **)&ws->cand_idx, sizeof *ws->cand_idx, (void **)&ws->cand_key,
                          sizeof *ws->cand_key, &ws->cand_cap, cand_cap)) != FL_OK)
        return rc;
    pass_t p;
    fl_cmp_bracket_pass(x, n, lo, hi, ws, k, cand_cap, &p);
    if (p.maxkey >= FL_CMP_KEY_NONFINITE)
        return fl_cmp_nonfinite_at(x, n, name);
    if (p.ns > k || p.ns + p.nc < k || p.nc > cand_cap) {
        *done = 0;
        return FL_OK;
    }
    *k_out = fl_cmp_finish(x, ws->sel_idx, ws->sel_val, p.ns, ws->cand_idx, ws->cand_key, p.nc,
                           k - p.ns, idx, val);
    *done = 1;
    return FL_OK;
}

int fl_cmp_topk(fl_cmp_ws_t *ws, const float *x, size_t n, const fl_cmp_topk_opts_t *o,
                uint32_t *idx, float *val, size_t *k_out)
{
    size_t k;
    int rc = fl_cmp_topk_check(n, o, &k);
    if (rc != FL_OK)
        return rc;
    if (o->mode == FL_CMP_SAMPLED)
        return fl_cmp_topk_sampled(ws, x, n, k, o, idx, val, k_out);
    if (k == n) {
        if ((rc = fl_cmp_nonfinite_at(x, n, tname(o))) != FL_OK)
            return rc;
        for (size_t i = 0; i < n; i++) {
            idx[i] = (uint32_t)i;
            val[i] = x[i];
        }
        *k_out = n;
        return FL_OK;
    }
    if (n >= SMALL_N) {
        int done = 0;
        rc = select_bracket(ws, x, n, k, tname(o), idx, val, k_out, &done);
        if (rc != FL_OK || done)
            return rc;
    }
    return fl_cmp_topk_exact_radix(ws, x, n, k, tname(o), idx, val, k_out);
}
