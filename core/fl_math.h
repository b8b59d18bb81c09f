/* Per-element math written once for the host loops (core/optim.c, compression/ef.c, the cpu and
 * sim device backends) and the CUDA kernels (device/dev_cuda.cu): under nvcc FL_HD makes each
 * body __host__ __device__. Device code is built with --fmad=false and without fast math, and
 * every multiply-add the rules below want fused is an explicit fmaf, so a kernel and its host
 * loop give the same bits. Only plain C here: no libc calls but fmaf and sqrtf, which CUDA
 * provides on the device and rounds correctly. */
#ifndef FL_MATH_H
#define FL_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define FL_HD __host__ __device__ __forceinline__ static
#else
#define FL_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bits of a float and back, without aliasing a pointer (memcpy is not a device function). */
FL_HD uint32_t fl_f2u(float f)
{
    union {
        float f;
        uint32_t u;
    } c;
    c.f = f;
    return c.u;
}

FL_HD float fl_u2f(uint32_t u)
{
    union {
        float f;
        uint32_t u;
    } c;
    c.u = u;
    return c.f;
}

/* ---- layers ---- */

FL_HD float fl_relu(float z)
{
    return z > 0.0f ? z : 0.0f;
}

/* The gradient through a ReLU whose output was a: zero where the unit was off. */
FL_HD float fl_relu_back(float da, float a)
{
    return a <= 0.0f ? 0.0f : da;
}

/* Column i of rows x cols floats summed down the rows in order, ((x0 + x1) + x2) + ..., then
 * times alpha unless alpha is 1: the intra-host reduction's fixed order (collective/fl_intra.h),
 * the same bits as the worker's sum of its replicas' gradients. */
FL_HD float fl_sum_rows(const float *x, size_t cols, size_t rows, size_t i, float alpha)
{
    float s = x[i];
    for (size_t r = 1; r < rows; r++)
        s += x[r * cols + i];
    return alpha != 1.0f ? s * alpha : s;
}

/* Magnitude key: the bits without the sign, ordered like |x| for finite values; NaN and Inf are
 * at or above FL_KEY_NONFINITE. */
#define FL_KEY_NONFINITE 0x7f800000u
FL_HD uint32_t fl_mag_key(float x)
{
    return fl_f2u(x) & 0x7fffffffu;
}

FL_HD bool fl_is_finite(float x)
{
    return fl_mag_key(x) < FL_KEY_NONFINITE;
}

/* ---- wire types: round to nearest even, NaN kept quiet ---- */

FL_HD uint16_t fl_hd_f32_to_f16(float f)
{
    uint32_t x = fl_f2u(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {
        if (ax > 0x7f800000u) /* NaN: keep it quiet and keep the top payload bits */
            return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {   /* below 2^-14: subnormal or zero in half precision */
        if (ax < 0x33000000u) /* <= 2^-25 (the tie rounds to even, zero) */
            return (uint16_t)sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax - 0x38000000u; /* rebias exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

FL_HD float fl_hd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t x;

    if (e == 0) {
        if (m == 0) {
            x = sign;
        } else {
            e = 113; /* 127 - 15 + 1: normalise the subnormal */
            while ((m & 0x400u) == 0) {
                m <<= 1;
                e--;
            }
            x = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    return fl_u2f(x);
}

FL_HD uint16_t fl_hd_f32_to_bf16(float f)
{
    uint32_t x = fl_f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

FL_HD float fl_hd_bf16_to_f32(uint16_t h)
{
    return fl_u2f((uint32_t)h << 16);
}

/* What a value becomes on the wire: wire 0 float32 (unchanged), 1 float16, 2 bfloat16. */
#define FL_WIRE_F32 0
#define FL_WIRE_F16 1
#define FL_WIRE_BF16 2
FL_HD float fl_wire_round(float v, int wire)
{
    if (wire == FL_WIRE_F16)
        return fl_hd_f16_to_f32(fl_hd_f32_to_f16(v));
    if (wire == FL_WIRE_BF16)
        return fl_hd_bf16_to_f32(fl_hd_f32_to_bf16(v));
    return v;
}

/* ---- error feedback (DGC) ---- */

/* One gradient entry g joins the residual v (and, with momentum correction, the velocity u:
 * u = m u + s g; v += u). scale is the clipping factor (1: none). The forms match
 * compression/ef.c's loops operation for operation. */
FL_HD void fl_ef_accum(float *v, float *u, float g, float m, float scale, bool momentum)
{
    if (momentum) {
        *u = m * *u + scale * g;
        *v += *u;
    } else if (scale != 1.0f) {
        *v += scale * g;
    } else {
        *v += g;
    }
}

/* ---- optimizers (PyTorch 1.13's rules; core/optim.c explains the rounding) ---- */

/* The scalars of one optimizer step, computed once on the host in double as Python does and
 * cast to float; the per-element bodies below use only these. */
typedef struct fl_opt_scalars {
    int kind;     /* fl_opt_kind_t */
    bool first;   /* SGD: the momentum buffer starts from d */
    bool has_buf; /* SGD: momentum != 0 */
    bool nesterov;
    bool decay; /* SGD: weight_decay != 0; Adam: L2 term (not AdamW) */
    float wd;
    float mom;
    float keep; /* 1 - dampening */
    float neg_lr;
    float shrink; /* AdamW: 1 - lr wd */
    float b1, one_b1, b2, one_b2, eps;
    float neg_step; /* -(lr / bias1) */
    float bias2_sqrt;
} fl_opt_scalars_t;

/* torch.optim.SGD for one entry: buf may be unused (no momentum). */
FL_HD void fl_sgd_elem(const fl_opt_scalars_t *s, float *p, float g, float *buf)
{
    float d = s->decay ? fmaf(*p, s->wd, g) : g;
    if (s->has_buf) {
        /* buf.mul_(momentum) rounds before add_(d, alpha=1 - dampening) fuses. */
        *buf = s->first ? d : fmaf(d, s->keep, *buf * s->mom);
        d = s->nesterov ? fmaf(*buf, s->mom, d) : *buf;
    }
    *p = fmaf(d, s->neg_lr, *p);
}

/* torch.optim.Adam / AdamW (amsgrad off) for one entry. kind 2 is AdamW. */
FL_HD void fl_adam_elem(const fl_opt_scalars_t *s, float *p, float g, float *m, float *v)
{
    float gi = g;
    /* AdamW decays unconditionally (param.mul_(1 - lr * wd), a no-op multiply by 1 when
     * wd = 0); Adam adds the L2 term to the gradient only when wd != 0. */
    if (s->kind == 2)
        *p = *p * s->shrink;
    else if (s->decay)
        gi = fmaf(*p, s->wd, gi);
    *m = fmaf(gi, s->one_b1, *m * s->b1);
    *v = fmaf(s->one_b2 * gi, gi, *v * s->b2);
    const float denom = sqrtf(*v) / s->bias2_sqrt + s->eps;
    *p = *p + (s->neg_step * *m) / denom;
}

#ifdef __cplusplus
}
#endif

#endif
