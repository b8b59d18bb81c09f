/* Top-k on device buffers, for builds without CUDA: there is no device, so every call fails
 * with FL_EGPU. topk_cuda.cu implements the same function when FLODL_CUDA builds CUDA. */
#include "cmp_int.h"

int fl_cmp_topk_device(const float *x, size_t n, const fl_cmp_topk_opts_t *opts, uint32_t *idx,
                       float *val, size_t *k_out)
{
    (void)x;
    (void)idx;
    (void)val;
    (void)opts;
    *k_out = 0;
    return fl_fail(FL_EGPU, "top-k on device buffers of %zu entries: CUDA not built in", n);
}
