/* DGC's sampled top-k (approximate, as the paper runs it on GPUs): estimate the threshold on a
 * random sample, gather every entry at or above it in one pass, and if that gathered more than
 * k, select the exact top-k among them. It may return fewer than k entries when the estimate
 * was high; the count achieved is reported. Sample positions come from the seed, so a run is
 * reproducible. */
#include "cmp_int.h"

#include <math.h>

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int fl_cmp_topk_sampled(fl_cmp_ws_t *ws, const float *x, size_t n, size_t k,
                        const fl_cmp_topk_opts_t *o, uint32_t *idx, float *val, size_t *k_out)
{
    const char *name = o->name != NULL ? o->name : "gradient";
    size_t s = (size_t)(o->sample_fraction * (double)n);
    if (s < 1024)
        s = n < 1024 ? n : 1024;
    int rc = fl_cmp_grow((void **)&ws->tmp_key, sizeof *ws->tmp_key, NULL, 0, &ws->tmp_cap, s);
    if (rc != FL_OK)
        return rc;
    /* One random position per stretch of n/s entries: random enough, and in address order, so
     * the reads stream instead of missing the cache at every sample. */
    uint64_t st = o->seed;
    size_t stride = n / s;
    for (size_t j = 0; j < s; j++)
        ws->tmp_key[j] = fl_cmp_key(x[j * stride + (size_t)(splitmix(&st) % stride)]);
    size_t need = (size_t)ceil((double)k * (double)s / (double)n);
    if (need < 1)
        need = 1;
    if (need > s)
        need = s;
    size_t gt;
    uint32_t thr = fl_cmp_threshold(ws->tmp_key, s, need, &gt);
    if (thr >= FL_CMP_KEY_NONFINITE)
        return fl_cmp_nonfinite_at(x, n, name);

    /* Gather everything at or above the estimate; room for a generous overshoot. */
    size_t cap = 4 * k + 65536;
    if (cap > n)
        cap = n;
    if ((rc = fl_cmp_grow((void **)&ws->cand_idx, sizeof *ws->cand_idx, (void **)&ws->cand_key,
                          sizeof *ws->cand_key, &ws->cand_cap, cap)) != FL_OK)
        return rc;
    pass_t p;
    fl_cmp_bracket_pass(x, n, thr, UINT32_MAX, ws, 0, cap, &p);
    if (p.maxkey >= FL_CMP_KEY_NONFINITE)
        return fl_cmp_nonfinite_at(x, n, name);
    if (p.nc > cap) /* the estimate was far too low: the exact path costs one pass more */
        return fl_cmp_topk_exact_radix(ws, x, n, k, name, idx, val, k_out);
    size_t take = p.nc > k ? k : p.nc;
    *k_out = fl_cmp_finish(x, NULL, NULL, 0, ws->cand_idx, ws->cand_key, p.nc, take, idx, val);
    return FL_OK;
}
