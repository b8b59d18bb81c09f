/* Reduction kernels. Incoming partial results sit in ZeroMQ's receive buffers at any byte
 * offset, so they are read through aligned(1) types (plain vector loads on x86, and no
 * misaligned-access undefined behaviour). float16 and bfloat16 accumulate in float32.
 * The float32 and float16 loops are built twice, for AVX2(+F16C) and baseline x86-64, and
 * the loader picks one (target_clones). */
#include "fl_coll.h"

#include <math.h>
#include <string.h>

typedef float uf32 __attribute__((aligned(1), may_alias));
typedef double uf64 __attribute__((aligned(1), may_alias));
typedef int32_t ui32 __attribute__((aligned(1), may_alias));
typedef int64_t ui64 __attribute__((aligned(1), may_alias));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define FL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FL_CLONES
#endif

fl_dtype_t fl_acc_dtype(fl_dtype_t dtype)
{
    if (dtype == FL_FLOAT16 || dtype == FL_BFLOAT16)
        return FL_FLOAT32;
    return dtype;
}

bool fl_op_supports(fl_op_t op, fl_dtype_t dtype)
{
    if (op != FL_SUM && op != FL_AVG && op != FL_MAX && op != FL_MIN)
        return false;
    switch (dtype) {
    case FL_FLOAT32:
    case FL_FLOAT16:
    case FL_BFLOAT16:
    case FL_FLOAT64: return true;
    case FL_INT32:
    case FL_INT64: return op != FL_AVG;
    default: return false;
    }
}

FL_CLONES static void f32_sum(float *dst, const float *local, const uf32 *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = local[i] + in[i];
}

FL_CLONES static void f32_max(float *dst, const float *local, const uf32 *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = local[i] > in[i] ? local[i] : in[i];
}

FL_CLONES static void f32_min(float *dst, const float *local, const uf32 *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = local[i] < in[i] ? local[i] : in[i];
}

static void f16_combine(fl_op_t op, float *dst, const uint16_t *local, const uf32 *in, size_t n,
                        bool bf16)
{
    for (size_t i = 0; i < n; i++) {
        float a = bf16 ? fl_bf16_to_f32(local[i]) : fl_f16_to_f32(local[i]);
        float b = in[i];
        dst[i] = op == FL_MAX ? (a > b ? a : b) : op == FL_MIN ? (a < b ? a : b) : a + b;
    }
}

#define INT_COMBINE(T, UT)                                                                         \
    static void T##_combine(fl_op_t op, T##_t *dst, const T##_t *local, const UT *in, size_t n)    \
    {                                                                                              \
        for (size_t i = 0; i < n; i++) {                                                           \
            T##_t a = local[i], b = in[i];                                                         \
            /* Wrap-around sum, like MPI and NCCL: computed unsigned, no overflow UB. */           \
            dst[i] = op == FL_MAX   ? (a > b ? a : b)                                              \
                     : op == FL_MIN ? (a < b ? a : b)                                              \
                                    : (T##_t)((uint64_t)a + (uint64_t)b);                          \
        }                                                                                          \
    }
INT_COMBINE(int32, ui32)
INT_COMBINE(int64, ui64)

static void f64_combine(fl_op_t op, double *dst, const double *local, const uf64 *in, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double a = local[i], b = in[i];
        dst[i] = op == FL_MAX ? (a > b ? a : b) : op == FL_MIN ? (a < b ? a : b) : a + b;
    }
}

void fl_reduce_combine(fl_op_t op, fl_dtype_t dtype, void *dst, const void *local, const void *in,
                       size_t n)
{
    switch (dtype) {
    case FL_FLOAT32:
        if (op == FL_MAX)
            f32_max(dst, local, in, n);
        else if (op == FL_MIN)
            f32_min(dst, local, in, n);
        else
            f32_sum(dst, local, in, n);
        break;
    case FL_FLOAT16: f16_combine(op, dst, local, in, n, false); break;
    case FL_BFLOAT16: f16_combine(op, dst, local, in, n, true); break;
    case FL_FLOAT64: f64_combine(op, dst, local, in, n); break;
    case FL_INT32: int32_combine(op, dst, local, in, n); break;
    case FL_INT64: int64_combine(op, dst, local, in, n); break;
    default: break;
    }
}

void fl_reduce_widen(fl_dtype_t dtype, void *dst, const void *src, size_t n)
{
    if (dtype == FL_FLOAT16 || dtype == FL_BFLOAT16) {
        float *d = dst;
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            d[i] = dtype == FL_FLOAT16 ? fl_f16_to_f32(s[i]) : fl_bf16_to_f32(s[i]);
    } else if (dst != src) {
        memmove(dst, src, n * fl_dtype_size(dtype));
    }
}

FL_CLONES static void f32_div(float *out, const float *acc, size_t n, float d)
{
    for (size_t i = 0; i < n; i++)
        out[i] = acc[i] / d;
}

void fl_reduce_finish(fl_op_t op, fl_dtype_t dtype, void *out, const void *acc, size_t n,
                      int nranks)
{
    switch (dtype) {
    case FL_FLOAT32:
        if (op == FL_AVG)
            f32_div(out, acc, n, (float)nranks);
        else if (out != acc)
            memmove(out, acc, n * sizeof(float));
        break;
    case FL_FLOAT16:
    case FL_BFLOAT16: {
        uint16_t *o = out;
        const float *a = acc;
        for (size_t i = 0; i < n; i++) {
            float v = op == FL_AVG ? a[i] / (float)nranks : a[i];
            o[i] = dtype == FL_FLOAT16 ? fl_f32_to_f16(v) : fl_f32_to_bf16(v);
        }
        break;
    }
    case FL_FLOAT64: {
        double *o = out;
        const double *a = acc;
        for (size_t i = 0; i < n; i++)
            o[i] = op == FL_AVG ? a[i] / (double)nranks : a[i];
        break;
    }
    default:
        if (out != acc)
            memmove(out, acc, n * fl_dtype_size(dtype));
        break;
    }
}
