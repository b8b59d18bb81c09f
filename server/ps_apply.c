/* The fused average-and-update pass of a shard: the gradient is assembled block by block from
 * the pushed sources (in the order given: rank order) and each block goes straight into the
 * optimizer's range step while it is still in cache. The whole averaged gradient never exists,
 * and each source is read once: a sync step over W pushes reads W gradients and the parameters
 * and optimizer state once, instead of W accumulation passes and one update pass. */
#include "ps_int.h"

#include <stdlib.h>
#include <string.h>

#define BLOCK PS_BLOCK /* floats: 8 KiB, with the optimizer's state it stays in L1/L2 */

/* g[j] (+)= w * x[j] for one dense source over [off, off + len). */
static void add_dense(float *g, const ps_src_t *s, uint64_t off, size_t len, float w, bool first)
{
    switch (s->kind) {
    case PS_SRC_F32: {
        const ps_uf32 *x = ps_src_at(s, off, 4);
        if (first && w == 1.0f)
            memcpy(g, x, len * sizeof(float));
        else if (first)
            for (size_t j = 0; j < len; j++)
                g[j] = w * x[j];
        else if (w == 1.0f)
            for (size_t j = 0; j < len; j++)
                g[j] = g[j] + x[j];
        else
            for (size_t j = 0; j < len; j++)
                g[j] = g[j] + w * x[j];
        return;
    }
    case PS_SRC_F16:
    case PS_SRC_BF16: {
        const ps_u16 *x = ps_src_at(s, off, 2);
        bool half = s->kind == PS_SRC_F16;
        for (size_t j = 0; j < len; j++) {
            float v = half ? fl_f16_to_f32(x[j]) : fl_bf16_to_f32(x[j]);
            float t = w == 1.0f ? v : w * v;
            g[j] = first ? t : g[j] + t;
        }
        return;
    }
    default: return;
    }
}

void fl_ps__apply(fl_opt_t *opt, float *params, uint64_t count, const ps_src_t *const *srcs,
                  const float *weight, size_t nsrc, float scale, float divisor)
{
    float g[BLOCK] __attribute__((aligned(64)));
    /* Where each sparse source stands; without the memory, scans restart at 0 for every block:
     * slower, never wrong. */
    size_t *cursor = calloc(nsrc > 0 ? nsrc : 1, sizeof *cursor);
    for (uint64_t off = 0; off < count; off += BLOCK) {
        size_t len = count - off < BLOCK ? (size_t)(count - off) : BLOCK;
        bool first = true;
        for (size_t s = 0; s < nsrc; s++) {
            const ps_src_t *src = srcs[s];
            float w = weight[s];
            if (src->kind != PS_SRC_SPARSE) {
                add_dense(g, src, off, len, w, first);
                first = false;
                continue;
            }
            if (first)
                memset(g, 0, len * sizeof(float));
            first = false;
            size_t c = cursor != NULL ? cursor[s] : 0;
            while (c < src->k && src->idx[c] < off)
                c++;
            for (; c < src->k && src->idx[c] < off + len; c++) {
                size_t j = (size_t)(src->idx[c] - off);
                g[j] = g[j] + (w == 1.0f ? src->val[c] : w * src->val[c]);
            }
            if (cursor != NULL)
                cursor[s] = c;
        }
        if (first)
            memset(g, 0, len * sizeof(float));
        if (scale != 1.0f)
            for (size_t j = 0; j < len; j++)
                g[j] = g[j] * scale;
        if (divisor != 1.0f)
            for (size_t j = 0; j < len; j++)
                g[j] = g[j] / divisor;
        fl_opt_step_range(opt, params + off, g, (size_t)off, len);
    }
    free(cursor);
}
