/* The multilayer perceptron's shape: Linear layers with ReLU between them and mean softmax
 * cross-entropy. Parameters live in one flat buffer in PyTorch's order and layout (weight
 * [out, in] row-major, then bias, layer by layer), so one communication call moves all
 * gradients and a PyTorch user can load the weights as they are. Parsing, offsets, the
 * signature and the seeded initialisation are here; the passes are mlp_dev.c's. */
#include "fl_mlp.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fl_core.h"

#define MAX_SIZE 1000000

int fl_mlp_parse(const char *s, fl_mlp_shape_t *out)
{
    memset(out, 0, sizeof *out);
    if (s == NULL || *s == '\0')
        return fl_fail(FL_EINVAL, "layers: empty (expected sizes like 784,512,256,10)");
    const char *p = s;
    int n = 0;
    for (;;) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno != 0 || v < 1 || v > MAX_SIZE)
            return fl_fail(FL_EINVAL, "layers '%s': size %d is not an integer in 1..%d", s, n + 1,
                           MAX_SIZE);
        if (n > FL_MLP_MAX_LAYERS)
            return fl_fail(FL_EINVAL, "layers '%s': more than %d layers", s, FL_MLP_MAX_LAYERS);
        out->sizes[n++] = (int)v;
        if (*end == '\0')
            break;
        if (*end != ',')
            return fl_fail(FL_EINVAL, "layers '%s': expected a comma after size %d", s, n);
        p = end + 1;
    }
    if (n < 2)
        return fl_fail(FL_EINVAL, "layers '%s': need at least inputs and outputs", s);
    out->nlayers = n - 1;
    return FL_OK;
}

size_t fl_mlp_weight_at(const fl_mlp_shape_t *m, int layer)
{
    size_t off = 0;
    for (int l = 0; l < layer; l++)
        off += (size_t)m->sizes[l + 1] * ((size_t)m->sizes[l] + 1);
    return off;
}

size_t fl_mlp_bias_at(const fl_mlp_shape_t *m, int layer)
{
    return fl_mlp_weight_at(m, layer) + (size_t)m->sizes[layer + 1] * (size_t)m->sizes[layer];
}

size_t fl_mlp_nparams(const fl_mlp_shape_t *m)
{
    return fl_mlp_weight_at(m, m->nlayers);
}

uint64_t fl_mlp_signature(const fl_mlp_shape_t *m)
{
    /* FNV-1a over a tag, the layer count and the sizes. */
    uint64_t h = 0xcbf29ce484222325ULL;
    const char *tag = "flodl.mlp.v1";
    for (const char *c = tag; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ULL;
    for (int l = 0; l <= m->nlayers; l++) {
        uint32_t v = (uint32_t)m->sizes[l];
        for (int b = 0; b < 4; b++)
            h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
    }
    return h ? h : 1;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void fl_mlp_init(const fl_mlp_shape_t *m, float *params, uint64_t seed)
{
    /* kaiming_uniform_(a=sqrt(5)) gives bound sqrt(6 / ((1 + 5) * fan_in)) = 1 / sqrt(fan_in);
     * nn.Linear's bias uses the same bound. */
    uint64_t st = seed;
    for (int l = 0; l < m->nlayers; l++) {
        float bound = 1.0f / sqrtf((float)m->sizes[l]);
        size_t nw = (size_t)m->sizes[l + 1] * (size_t)m->sizes[l];
        float *w = params + fl_mlp_weight_at(m, l);
        for (size_t i = 0; i < nw + (size_t)m->sizes[l + 1]; i++) {
            float u = (float)(splitmix(&st) >> 40) * 0x1p-24f; /* [0, 1) */
            w[i] = (2.0f * u - 1.0f) * bound;                  /* bias follows the weight */
        }
    }
}
