/* Private to compression/: the workspace layout shared by selection, error feedback and the
 * sparse codec. */
#ifndef FL_CMP_INT_H
#define FL_CMP_INT_H

#include "fl_cmp.h"

struct fl_cmp_ws {
    /* selection: entries surely in (above the bracket) and candidates (inside it) */
    uint32_t *sel_idx;
    float *sel_val;
    size_t sel_cap;
    uint32_t *cand_idx;
    uint32_t *cand_key;
    size_t cand_cap;
    /* selection's second level, and the sampled mode's gathered set */
    uint32_t *tmp_key;
    size_t tmp_cap;
    /* codec: body before/after lz4 */
    uint8_t *buf;
    size_t buf_cap;
    /* decoded pairs for fl_cmp_sparse_accumulate */
    uint32_t *dec_idx;
    float *dec_val;
    size_t dec_cap;
};

/* Grows the parallel arrays *a (elements of asz bytes) and *b (bsz bytes; b may be NULL for a
 * single array) to at least n elements, *cap recording their common capacity. FL_OK or
 * FL_ENOMEM (the arrays stay as they were). */
int fl_cmp_grow(void **a, size_t asz, void **b, size_t bsz, size_t *cap, size_t n);

/* Magnitude key of a float: its bits without the sign. Ordered like |x| for finite values;
 * NaN and Inf are at or above 0x7f800000. */
static inline uint32_t fl_cmp_key(float x)
{
    uint32_t u;
    __builtin_memcpy(&u, &x, sizeof u);
    return u & 0x7fffffffu;
}

#define FL_CMP_KEY_NONFINITE 0x7f800000u

/* fl_cmp_topk_count plus the mode and sample fraction: the checks the CPU and device
 * selections share. */
int fl_cmp_topk_check(size_t n, const fl_cmp_topk_opts_t *o, size_t *k);

/* FL_ENONFINITE naming the tensor and the first NaN/Inf of x, or FL_OK when there is none. */
int fl_cmp_nonfinite_at(const float *x, size_t n, const char *name);

/* The key T of the need-th largest of keys[0..m) (1 <= need <= m), by a three-level radix
 * select; *gt gets how many keys are strictly above T. */
uint32_t fl_cmp_threshold(const uint32_t *keys, size_t m, size_t need, size_t *gt);

/* What one pass over the data found: entries above the bracket (sure), inside it
 * (candidates), and the largest key seen (to detect NaN/Inf). Counts may exceed the caps. */
typedef struct pass {
    size_t ns;
    size_t nc;
    uint32_t maxkey;
} pass_t;

/* One pass: key > hi into ws->sel (at most sel_cap), lo <= key <= hi into ws->cand (at most
 * cand_cap), everything in index order. */
void fl_cmp_bracket_pass(const float *x, size_t n, uint32_t lo, uint32_t hi, fl_cmp_ws_t *ws,
                         size_t sel_cap, size_t cand_cap, pass_t *p);

/* Writes every sure entry plus the need best candidates (ties to the lower index), merged in
 * index order, into idx/val. Returns the count (ns + need). */
size_t fl_cmp_finish(const float *x, const uint32_t *sel_idx, const float *sel_val, size_t ns,
                     const uint32_t *cand_idx, const uint32_t *cand_key, size_t nc, size_t need,
                     uint32_t *idx, float *val);

/* Exact top-k by a two-pass radix select over all of x (the path that never fails). */
int fl_cmp_topk_exact_radix(fl_cmp_ws_t *ws, const float *x, size_t n, size_t k, const char *name,
                            uint32_t *idx, float *val, size_t *k_out);

/* DGC's sampled selection (topk_sampled.c); k already validated. */
int fl_cmp_topk_sampled(fl_cmp_ws_t *ws, const float *x, size_t n, size_t k,
                        const fl_cmp_topk_opts_t *o, uint32_t *idx, float *val, size_t *k_out);

#endif
