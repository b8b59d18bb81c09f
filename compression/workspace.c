/* The compressor's workspace: scratch arrays that grow on demand and are reused, so selection
 * and decoding allocate nothing in the steady state. */
#include "cmp_int.h"

#include <stdlib.h>

int fl_cmp_ws_create(fl_cmp_ws_t **out)
{
    *out = calloc(1, sizeof **out);
    if (*out == NULL)
        return fl_fail(FL_ENOMEM, "compressor: out of memory for a workspace");
    return FL_OK;
}

void fl_cmp_ws_destroy(fl_cmp_ws_t **ws)
{
    if (ws == NULL || *ws == NULL)
        return;
    fl_cmp_ws_t *w = *ws;
    free(w->sel_idx);
    free(w->sel_val);
    free(w->cand_idx);
    free(w->cand_key);
    free(w->tmp_key);
    free(w->buf);
    free(w->dec_idx);
    free(w->dec_val);
    free(w);
    *ws = NULL;
}

int fl_cmp_grow(void **a, size_t asz, void **b, size_t bsz, size_t *cap, size_t n)
{
    if (n <= *cap && *a != NULL && (b == NULL || *b != NULL))
        return FL_OK;
    size_t want = n + n / 4 + 64;
    void *qa = malloc(want * asz);
    void *qb = b != NULL ? malloc(want * bsz) : NULL;
    if (qa == NULL || (b != NULL && qb == NULL)) {
        free(qa);
        free(qb);
        return fl_fail(FL_ENOMEM, "compressor: out of memory for %zu scratch entries", want);
    }
    /* Contents need not survive: callers grow before they fill. */
    free(*a);
    *a = qa;
    if (b != NULL) {
        free(*b);
        *b = qb;
    }
    *cap = want;
    return FL_OK;
}
