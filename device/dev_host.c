/* The operations on host memory: the cpu backend runs them when they are issued, sim's stream
 * threads run them in queue order. GEMMs are OpenBLAS's, called as the MLP always called them;
 * every loop body is fl_math.h's or has the same form as the CUDA kernel's, so the backends
 * agree bit for bit on elementwise results. */
#include "dev_int.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

static void gemm(const dev_op_t *op)
{
    int b = (int)op->n[0];
    int out = (int)op->n[1];
    int in = (int)op->n[2];
    const float *p0 = op->p[0];
    const float *p1 = op->p[1];
    float *c = op->p[2];
    switch (op->code) {
    case DOP_GEMM_FWD: /* z[b, out] = x w^T + beta z */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, out, in, 1.0f, p0, in, p1, in,
                    op->f[0], c, out);
        break;
    case DOP_GEMM_WGRAD: /* gw[out, in] = dz^T a */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, b, 1.0f, p0, out, p1, in,
                    0.0f, c, in);
        break;
    default: /* da[b, in] = dz w */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, in, out, 1.0f, p0, out, p1, in,
                    0.0f, c, in);
        break;
    }
}

/* Softmax cross-entropy, row by row in double as the CPU model always computed it. */
static void xent(const dev_op_t *op)
{
    const float *logits = op->p[0];
    const int32_t *y = op->p[1];
    float *dz = op->p[2];
    double *row_loss = op->p[3];
    double *out = op->p[4];
    size_t b = op->n[0];
    size_t c = op->n[1];
    double sum = 0.0;
    double ok = 0.0;
    for (size_t r = 0; r < b; r++) {
        const float *z = logits + r * c;
        size_t arg = 0;
        for (size_t j = 1; j < c; j++)
            if (z[j] > z[arg])
                arg = j;
        size_t label = (size_t)y[r];
        ok += arg == label;
        double mx = z[arg];
        double se = 0.0;
        for (size_t j = 0; j < c; j++)
            se += exp((double)z[j] - mx);
        double lse = log(se) + mx;
        row_loss[r] = lse - (double)z[label];
        sum += row_loss[r];
        if (dz != NULL) {
            float *g = dz + r * c;
            for (size_t j = 0; j < c; j++)
                g[j] = (float)(exp((double)z[j] - lse) / (double)b);
            g[label] -= 1.0f / (float)b;
        }
    }
    out[0] = sum;
    out[1] = ok;
}

/* core/optim.c's loops (vectorised where the CPU has FMA), the same bodies as the kernels. */
static void opt_step(const dev_op_t *op)
{
    fl_opt_apply(&op->sc, op->p[0], op->p[1], op->p[2], op->p[3], op->n[0]);
}

static void ef_accum(const dev_op_t *op)
{
    float *v = op->p[0];
    float *u = op->p[1];
    const float *g = op->p[2];
    float m = op->f[0];
    float scale = op->f[1];
    float unused = 0.0f;
    if (u != NULL)
        for (size_t i = 0; i < op->n[0]; i++)
            fl_ef_accum(&v[i], &u[i], g[i], m, scale, true);
    else
        for (size_t i = 0; i < op->n[0]; i++)
            fl_ef_accum(&v[i], &unused, g[i], m, scale, false);
}

static int ef_sent(const dev_op_t *op)
{
    float *v = op->p[0];
    float *u = op->p[1];
    const uint32_t *idx = op->p[2];
    float *val = op->p[3];
    for (size_t j = 0; j < op->n[0]; j++)
        if (idx[j] >= op->n[1])
            return fl_fail(FL_EINVAL,
                           "device: error feedback: index %u at %zu is past the %zu "
                           "entries",
                           idx[j], j, op->n[1]);
    for (size_t j = 0; j < op->n[0]; j++) {
        float sent = fl_wire_round(val[j], op->i0);
        val[j] = sent;
        v[idx[j]] -= sent; /* zero, or the rounding error the wire type could not carry */
        if (u != NULL)
            u[idx[j]] = 0.0f;
    }
    return FL_OK;
}

int fl_dev_host_run(const dev_op_t *op)
{
    size_t n = op->n[0];
    float *x = op->p[0];
    const float *y = op->p[1];
    switch (op->code) {
    case DOP_H2D:
    case DOP_D2H:
    case DOP_D2D:
    case DOP_PEER:
        if (op->p[0] != op->p[1])
            memmove(op->p[0], op->p[1], n);
        return FL_OK;
    case DOP_MEMSET: memset(op->p[0], op->i0, n); return FL_OK;
    case DOP_GEMM_FWD:
    case DOP_GEMM_WGRAD:
    case DOP_GEMM_IGRAD: gemm(op); return FL_OK;
    case DOP_BIAS_ROWS:
        for (size_t r = 0; r < op->n[0]; r++)
            memcpy(x + r * op->n[1], y, op->n[1] * sizeof(float));
        return FL_OK;
    case DOP_RELU:
        for (size_t i = 0; i < n; i++)
            x[i] = fl_relu(x[i]);
        return FL_OK;
    case DOP_RELU_BACK:
        for (size_t i = 0; i < n; i++)
            x[i] = fl_relu_back(x[i], y[i]);
        return FL_OK;
    case DOP_BIAS_GRAD: {
        size_t cols = op->n[1];
        for (size_t j = 0; j < cols; j++)
            x[j] = 0.0f;
        for (size_t r = 0; r < op->n[0]; r++)
            for (size_t j = 0; j < cols; j++)
                x[j] += y[r * cols + j];
        return FL_OK;
    }
    case DOP_XENT: xent(op); return FL_OK;
    case DOP_SCALE:
        for (size_t i = 0; i < n; i++)
            x[i] *= op->f[0];
        return FL_OK;
    case DOP_AXPY: {
        float a = op->f[0];
        if (a == 1.0f)
            for (size_t i = 0; i < n; i++)
                x[i] += y[i];
        else
            for (size_t i = 0; i < n; i++)
                x[i] += a * y[i];
        return FL_OK;
    }
    case DOP_SUMSQ: {
        double s = 0.0;
        for (size_t i = 0; i < n; i++)
            s += (double)x[i] * x[i];
        *(double *)op->p[1] = s;
        return FL_OK;
    }
    case DOP_NONFINITE: {
        int64_t at = -1;
        for (size_t i = 0; i < n && at < 0; i++)
            if (!fl_is_finite(x[i]))
                at = (int64_t)i;
        *(int64_t *)op->p[1] = at;
        return FL_OK;
    }
    case DOP_OPT: opt_step(op); return FL_OK;
    case DOP_EF_ACCUM: ef_accum(op); return FL_OK;
    case DOP_EF_SENT: return ef_sent(op);
    case DOP_TOPK:
        fl_dev_host_topk(op->p[0], op->n[0], op->n[1], op->p[1], op->p[2], op->p[3]);
        return FL_OK;
    case DOP_SUM_ROWS:
        for (size_t i = 0; i < n; i++)
            x[i] = fl_sum_rows(y, n, op->n[1], i, op->f[0]);
        return FL_OK;
    case DOP_COUNT: break;
    }
    return fl_fail(FL_EINVAL, "device: unknown operation %d", (int)op->code);
}

/* The key T of the need-th largest key (1 <= need <= count of keys) by three histogram levels
 * over bits 30..20, 19..9 and 8..0, as the CUDA kernels do; *gt: keys strictly above T. */
static uint32_t threshold(const float *x, size_t n, size_t need, size_t *gt)
{
    static const int shift[3] = {20, 9, 0};
    static const uint32_t mask[3] = {0x7ffu, 0x7ffu, 0x1ffu};
    uint32_t hist[2048];
    uint32_t prefix = 0;
    uint32_t pmask = 0;
    size_t above = 0;
    for (int lv = 0; lv < 3; lv++) {
        memset(hist, 0, sizeof hist);
        for (size_t i = 0; i < n; i++) {
            uint32_t key = fl_mag_key(x[i]);
            if ((key & pmask) == prefix)
                hist[(key >> shift[lv]) & mask[lv]]++;
        }
        /* From the top bin down until the need-th largest is inside. */
        uint32_t bin = mask[lv];
        for (;;) {
            if (above + hist[bin] >= need || bin == 0)
                break;
            above += hist[bin];
            bin--;
        }
        prefix |= bin << shift[lv];
        pmask |= mask[lv] << shift[lv];
    }
    *gt = above;
    return prefix;
}

void fl_dev_host_topk(const float *x, size_t n, size_t k, uint32_t *idx, float *val, int64_t *out)
{
    out[0] = 0;
    out[1] = -1;
    for (size_t i = 0; i < n; i++) {
        if (!fl_is_finite(x[i])) {
            out[1] = (int64_t)i;
            return;
        }
    }
    if (k == 0)
        return;
    size_t gt = 0;
    uint32_t t = threshold(x, n, k, &gt);
    size_t eq = k - gt; /* entries equal to T taken, lowest indices first */
    size_t w = 0;
    for (size_t i = 0; i < n && w < k; i++) {
        uint32_t key = fl_mag_key(x[i]);
        if (key > t || (key == t && eq > 0)) {
            if (key == t)
                eq--;
            idx[w] = (uint32_t)i;
            val[w] = x[i];
            w++;
        }
    }
    out[0] = (int64_t)w;
}
