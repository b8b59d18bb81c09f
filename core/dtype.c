/* Element types: sizes, names, parsing, and the float16 / bfloat16 conversions (round to
 * nearest even, NaN kept NaN, overflow to infinity) that reductions and casts share. */
#include "fl_core.h"

#include <string.h>
#include <strings.h>

size_t fl_dtype_size(fl_dtype_t dtype)
{
    switch (dtype) {
    case FL_FLOAT32: return 4;
    case FL_FLOAT16: return 2;
    case FL_BFLOAT16: return 2;
    case FL_FLOAT64: return 8;
    case FL_INT32: return 4;
    case FL_UINT8: return 1;
    case FL_INT64: return 8;
    default: return 0;
    }
}

bool fl_dtype_is_valid(int dtype)
{
    return fl_dtype_size((fl_dtype_t)dtype) != 0;
}

const char *fl_dtype_name(fl_dtype_t dtype)
{
    switch (dtype) {
    case FL_FLOAT32: return "float32";
    case FL_FLOAT16: return "float16";
    case FL_BFLOAT16: return "bfloat16";
    case FL_FLOAT64: return "float64";
    case FL_INT32: return "int32";
    case FL_UINT8: return "uint8";
    case FL_INT64: return "int64";
    default: return "unknown";
    }
}

const char *fl_op_name(fl_op_t op)
{
    switch (op) {
    case FL_SUM: return "sum";
    case FL_AVG: return "avg";
    case FL_MAX: return "max";
    case FL_MIN: return "min";
    default: return "unknown";
    }
}

int fl_dtype_parse(const char *s, fl_dtype_t *out)
{
    static const struct {
        const char *name;
        fl_dtype_t dtype;
    } names[] = {
        {"float32", FL_FLOAT32},   {"f32", FL_FLOAT32},    {"float", FL_FLOAT32},
        {"float16", FL_FLOAT16},   {"f16", FL_FLOAT16},    {"half", FL_FLOAT16},
        {"bfloat16", FL_BFLOAT16}, {"bf16", FL_BFLOAT16},  {"float64", FL_FLOAT64},
        {"f64", FL_FLOAT64},       {"double", FL_FLOAT64}, {"int32", FL_INT32},
        {"int64", FL_INT64},       {"uint8", FL_UINT8},
    };
    if (s != NULL) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (strcasecmp(s, names[i].name) == 0) {
                *out = names[i].dtype;
                return FL_OK;
            }
        }
    }
    return fl_fail(FL_EINVAL,
                   "dtype '%s' is not one of float32|float16|bfloat16|float64|int32|"
                   "int64|uint8",
                   s ? s : "(null)");
}

/* The conversions' bodies are fl_math.h's, shared with the device kernels. */
uint16_t fl_f32_to_f16(float f)
{
    return fl_hd_f32_to_f16(f);
}

float fl_f16_to_f32(uint16_t h)
{
    return fl_hd_f16_to_f32(h);
}

uint16_t fl_f32_to_bf16(float f)
{
    return fl_hd_f32_to_bf16(f);
}

float fl_bf16_to_f32(uint16_t h)
{
    return fl_hd_bf16_to_f32(h);
}

/* The largest |x| as bits (|x| orders like its bit pattern) and whether one is NaN or Inf (bits
 * at or above 0x7f800000): integer work the compiler vectorises, one pass at memory speed. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 &&           \
    !defined(__SANITIZE_THREAD__) /* its resolver would run before the TSan runtime */
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
uint32_t
fl_f32_max_abs_bits(const void *x, size_t n)
{
    const uint32_t *u = (const uint32_t *)(const void *)x;
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a;
        memcpy(&a, u + i, sizeof a);
        a &= 0x7fffffffu;
        m = a > m ? a : m;
    }
    return m;
}
