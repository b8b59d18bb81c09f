/* The multilayer perceptron on the CPU: Linear layers with ReLU between them and mean softmax
 * cross-entropy, forward and backward with OpenBLAS GEMMs. Parameters live in one flat buffer in
 * PyTorch's order and layout (weight [out, in] row-major, then bias, layer by layer), so one
 * communication call moves all gradients and a PyTorch user can load the weights as they are.
 * The backward pass reports each finished layer (last first) so its gradient can leave while the
 * earlier layers are still computing. */
#include "fl_wk.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fl_core.h"

#define MAX_SIZE 1000000

struct fl_wk_mlp_ws {
    size_t batch;
    float *act[FL_WK_MAX_LAYERS + 1]; /* act[l]: input of layer l (act[0] unused: the caller's x)
                                         after ReLU; act[nlayers]: logits */
    float *dz;                        /* gradient of a layer's output, batch x widest */
    float *da;                        /* gradient of a layer's input, batch x widest */
};

int fl_wk_mlp_parse(const char *s, fl_wk_mlp_shape_t *out)
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
            return fl_fail(FL_EINVAL, "layers '%s': size %d is not an integer in 1..%d", s,
                           n + 1, MAX_SIZE);
        if (n > FL_WK_MAX_LAYERS)
            return fl_fail(FL_EINVAL, "layers '%s': more than %d layers", s, FL_WK_MAX_LAYERS);
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

size_t fl_wk_mlp_weight_at(const fl_wk_mlp_shape_t *m, int layer)
{
    size_t off = 0;
    for (int l = 0; l < layer; l++)
        off += (size_t)m->sizes[l + 1] * ((size_t)m->sizes[l] + 1);
    return off;
}

size_t fl_wk_mlp_bias_at(const fl_wk_mlp_shape_t *m, int layer)
{
    return fl_wk_mlp_weight_at(m, layer) + (size_t)m->sizes[layer + 1] * (size_t)m->sizes[layer];
}

size_t fl_wk_mlp_nparams(const fl_wk_mlp_shape_t *m)
{
    return fl_wk_mlp_weight_at(m, m->nlayers);
}

uint64_t fl_wk_mlp_signature(const fl_wk_mlp_shape_t *m)
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

void fl_wk_mlp_init(const fl_wk_mlp_shape_t *m, float *params, uint64_t seed)
{
    /* kaiming_uniform_(a=sqrt(5)) gives bound sqrt(6 / ((1 + 5) * fan_in)) = 1 / sqrt(fan_in);
     * nn.Linear's bias uses the same bound. */
    uint64_t st = seed;
    for (int l = 0; l < m->nlayers; l++) {
        float bound = 1.0f / sqrtf((float)m->sizes[l]);
        size_t nw = (size_t)m->sizes[l + 1] * (size_t)m->sizes[l];
        float *w = params + fl_wk_mlp_weight_at(m, l);
        for (size_t i = 0; i < nw + (size_t)m->sizes[l + 1]; i++) {
            float u = (float)(splitmix(&st) >> 40) * 0x1p-24f; /* [0, 1) */
            w[i] = (2.0f * u - 1.0f) * bound;                  /* bias follows the weight */
        }
    }
}

int fl_wk_mlp_ws_create(const fl_wk_mlp_shape_t *m, size_t batch, fl_wk_mlp_ws_t **out)
{
    *out = NULL;
    if (batch == 0)
        return fl_fail(FL_EINVAL, "model: batch of 0");
    fl_wk_mlp_ws_t *w = calloc(1, sizeof *w);
    if (w == NULL)
        return fl_fail(FL_ENOMEM, "model: out of memory");
    w->batch = batch;
    size_t widest = 0;
    for (int l = 0; l <= m->nlayers; l++)
        widest = (size_t)m->sizes[l] > widest ? (size_t)m->sizes[l] : widest;
    bool ok = true;
    for (int l = 1; l <= m->nlayers; l++) {
        w->act[l] = malloc(batch * (size_t)m->sizes[l] * sizeof(float));
        ok = ok && w->act[l] != NULL;
    }
    w->dz = malloc(batch * widest * sizeof(float));
    w->da = malloc(batch * widest * sizeof(float));
    if (!ok || w->dz == NULL || w->da == NULL) {
        fl_wk_mlp_ws_destroy(&w);
        return fl_fail(FL_ENOMEM, "model: out of memory for a batch of %zu", batch);
    }
    *out = w;
    return FL_OK;
}

void fl_wk_mlp_ws_destroy(fl_wk_mlp_ws_t **ws)
{
    if (ws == NULL || *ws == NULL)
        return;
    for (int l = 0; l <= FL_WK_MAX_LAYERS; l++)
        free((*ws)->act[l]);
    free((*ws)->dz);
    free((*ws)->da);
    free(*ws);
    *ws = NULL;
}

/* Layer l's weight (bias after it) from the flat buffer or the source; put releases it. */
typedef struct layers {
    const fl_wk_mlp_shape_t *m;
    const float *flat;
    const fl_wk_mlp_src_t *src;
    const float *last; /* the last layer, held from the forward pass into the backward */
} layers_t;

static int get_layer(const layers_t *p, int l, const float **w)
{
    if (p->src == NULL) {
        *w = p->flat + fl_wk_mlp_weight_at(p->m, l);
        return FL_OK;
    }
    int rc = p->src->get(p->src->ud, l, w);
    return rc == FL_OK ? FL_OK : fl_fail_ctx(rc, "model: layer %d's parameters: ", l);
}

static void put_layer(const layers_t *p, int l)
{
    if (p->src != NULL)
        p->src->put(p->src->ud, l);
}

/* act[l+1] = act[l] W_l^T + b_l, with ReLU except after the last layer. The last layer stays
 * held (the backward pass starts with it). */
static int forward(layers_t *p, fl_wk_mlp_ws_t *ws, const float *x, size_t b)
{
    const fl_wk_mlp_shape_t *m = p->m;
    for (int l = 0; l < m->nlayers; l++) {
        int in = m->sizes[l];
        int out = m->sizes[l + 1];
        const float *a = l == 0 ? x : ws->act[l];
        const float *w = NULL;
        int rc = get_layer(p, l, &w);
        if (rc != FL_OK)
            return rc;
        const float *bias = w + (size_t)out * (size_t)in;
        float *z = ws->act[l + 1];
        for (size_t r = 0; r < b; r++)
            memcpy(z + r * (size_t)out, bias, (size_t)out * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, out, in, 1.0f, a, in, w, in,
                    1.0f, z, out);
        if (l + 1 < m->nlayers) {
            size_t cnt = b * (size_t)out;
            for (size_t i = 0; i < cnt; i++)
                z[i] = z[i] > 0.0f ? z[i] : 0.0f;
            put_layer(p, l);
        } else {
            p->last = w;
        }
    }
    return FL_OK;
}

/* Mean cross-entropy of the logits; its gradient (softmax - onehot) / b into dz. */
static int loss_grad(const fl_wk_mlp_shape_t *m, fl_wk_mlp_ws_t *ws, const int32_t *y, size_t b,
                     float *dz, double *loss, size_t *correct)
{
    int c = m->sizes[m->nlayers];
    const float *logits = ws->act[m->nlayers];
    double sum = 0.0;
    size_t ok = 0;
    for (size_t r = 0; r < b; r++) {
        if (y[r] < 0 || y[r] >= c)
            return fl_fail(FL_EINVAL, "model: label %d of sample %zu is outside 0..%d", y[r], r,
                           c - 1);
        const float *z = logits + r * (size_t)c;
        int arg = 0;
        for (int j = 1; j < c; j++)
            if (z[j] > z[arg])
                arg = j;
        ok += arg == y[r];
        double mx = z[arg];
        double se = 0.0;
        for (int j = 0; j < c; j++)
            se += exp((double)z[j] - mx);
        double lse = log(se) + mx;
        sum += lse - (double)z[y[r]];
        if (dz != NULL) {
            float *g = dz + r * (size_t)c;
            for (int j = 0; j < c; j++)
                g[j] = (float)(exp((double)z[j] - lse) / (double)b);
            g[y[r]] -= 1.0f / (float)b;
        }
    }
    double mean = sum / (double)b;
    if (!isfinite(mean))
        return fl_fail(FL_ENONFINITE, "model: the loss is %g (diverged: lower the learning rate "
                                      "or clip gradients)",
                       mean);
    *loss = mean;
    *correct = ok;
    return FL_OK;
}

static int grad_of(layers_t *p, fl_wk_mlp_ws_t *ws, const float *x, const int32_t *y,
                   size_t b, float *grad, double *loss, size_t *correct,
                   fl_wk_layer_done_fn done, void *ud)
{
    const fl_wk_mlp_shape_t *m = p->m;
    if (b == 0 || b > ws->batch)
        return fl_fail(FL_EINVAL, "model: batch of %zu samples, the workspace holds %zu", b,
                       ws->batch);
    int rc = forward(p, ws, x, b);
    if (rc == FL_OK)
        rc = loss_grad(m, ws, y, b, ws->dz, loss, correct);
    if (rc != FL_OK)
        return rc;
    float *dz = ws->dz;
    float *da = ws->da;
    for (int l = m->nlayers - 1; l >= 0; l--) {
        int in = m->sizes[l];
        int out = m->sizes[l + 1];
        const float *a = l == 0 ? x : ws->act[l];
        float *gw = grad + fl_wk_mlp_weight_at(m, l);
        float *gb = grad + fl_wk_mlp_bias_at(m, l);
        /* dW = dz^T a: [out, b] x [b, in] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, (int)b, 1.0f, dz, out, a,
                    in, 0.0f, gw, in);
        for (int j = 0; j < out; j++)
            gb[j] = 0.0f;
        for (size_t r = 0; r < b; r++) {
            const float *row = dz + r * (size_t)out;
            for (int j = 0; j < out; j++)
                gb[j] += row[j];
        }
        if (l > 0) {
            /* da = dz W: [b, out] x [out, in]; through the ReLU: zero where the unit was off.
             * The last layer is still held from the forward pass. */
            const float *w = p->last;
            if (l != m->nlayers - 1 && (rc = get_layer(p, l, &w)) != FL_OK)
                return rc;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, in, out, 1.0f, dz,
                        out, w, in, 0.0f, da, in);
            size_t cnt = b * (size_t)in;
            for (size_t i = 0; i < cnt; i++)
                if (a[i] <= 0.0f)
                    da[i] = 0.0f;
            float *t = dz;
            dz = da;
            da = t;
        }
        if (l > 0 || m->nlayers == 1)
            put_layer(p, l);
        if (done != NULL)
            done(l, ud);
    }
    return FL_OK;
}

int fl_wk_mlp_grad(const fl_wk_mlp_shape_t *m, fl_wk_mlp_ws_t *ws, const float *params,
                   const float *x, const int32_t *y, size_t b, float *grad, double *loss,
                   size_t *correct, fl_wk_layer_done_fn done, void *ud)
{
    layers_t p = {.m = m, .flat = params};
    return grad_of(&p, ws, x, y, b, grad, loss, correct, done, ud);
}

int fl_wk_mlp_grad_src(const fl_wk_mlp_shape_t *m, fl_wk_mlp_ws_t *ws, const fl_wk_mlp_src_t *src,
                       const float *x, const int32_t *y, size_t b, float *grad, double *loss,
                       size_t *correct, fl_wk_layer_done_fn done, void *ud)
{
    layers_t p = {.m = m, .src = src};
    return grad_of(&p, ws, x, y, b, grad, loss, correct, done, ud);
}

int fl_wk_mlp_eval(const fl_wk_mlp_shape_t *m, fl_wk_mlp_ws_t *ws, const float *params,
                   const float *x, const int32_t *y, size_t n, double *loss, size_t *correct)
{
    double sum = 0.0;
    size_t ok = 0;
    size_t dim = (size_t)m->sizes[0];
    for (size_t at = 0; at < n; at += ws->batch) {
        size_t b = n - at < ws->batch ? n - at : ws->batch;
        layers_t p = {.m = m, .flat = params};
        int rc = forward(&p, ws, x + at * dim, b);
        double l;
        size_t c;
        if (rc == FL_OK)
            rc = loss_grad(m, ws, y + at, b, NULL, &l, &c);
        if (rc != FL_OK)
            return rc;
        sum += l * (double)b;
        ok += c;
    }
    *loss = n > 0 ? sum / (double)n : 0.0;
    *correct = ok;
    return FL_OK;
}
