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
        {"float32", FL_FLOAT32}, {"f32", FL_FLOAT32},   {"float", FL_FLOAT32},
        {"float16", FL_FLOAT16}, {"f16", FL_FLOAT16},   {"half", FL_FLOAT16},
        {"bfloat16", FL_BFLOAT16}, {"bf16", FL_BFLOAT16}, {"float64", FL_FLOAT64},
        {"f64", FL_FLOAT64},     {"double", FL_FLOAT64}, {"int32", FL_INT32},
        {"int64", FL_INT64},     {"uint8", FL_UINT8},
    };
    if (s != NULL) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (strcasecmp(s, names[i].name) == 0) {
                *out = names[i].dtype;
                return FL_OK;
            }
        }
    }
    return fl_fail(FL_EINVAL, "dtype '%s' is not one of float32|float16|bfloat16|float64|int32|"
                              "int64|uint8",
                   s ? s : "(null)");
}

uint16_t fl_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {
        if (ax > 0x7f800000u) /* NaN: keep it quiet and keep the top payload bits */
            return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero in half precision */
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

float fl_f16_to_f32(uint16_t h)
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
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t fl_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float fl_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
