/* core's dtypes and operators: float16 (exhaustively, against GCC's _Float16) and bfloat16
 * (against an independent long double reference), each way and at the rounding boundaries. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"

/* ---- dtypes and operators ---- */

START_TEST(test_dtypes)
{
    static const struct {
        fl_dtype_t dt;
        size_t size;
        const char *name;
    } known[] = {
        {FL_FLOAT32, 4, "float32"}, {FL_FLOAT16, 2, "float16"}, {FL_BFLOAT16, 2, "bfloat16"},
        {FL_FLOAT64, 8, "float64"}, {FL_INT32, 4, "int32"},     {FL_UINT8, 1, "uint8"},
        {FL_INT64, 8, "int64"},
    };
    for (size_t i = 0; i < NELEM(known); i++) {
        fl_dtype_t back = (fl_dtype_t)0;
        if (fl_dtype_size(known[i].dt) != known[i].size ||
            strcmp(fl_dtype_name(known[i].dt), known[i].name) != 0 ||
            !fl_dtype_is_valid((int)known[i].dt) || fl_dtype_parse(known[i].name, &back) != FL_OK ||
            back != known[i].dt)
            ck_abort_msg("dtype %d (%s): size %zu name %s", (int)known[i].dt, known[i].name,
                         fl_dtype_size(known[i].dt), fl_dtype_name(known[i].dt));
    }
    static const int invalid[] = {0, 8, 9, -1, 100};
    for (size_t i = 0; i < NELEM(invalid); i++) {
        if (fl_dtype_size((fl_dtype_t)invalid[i]) != 0 || fl_dtype_is_valid(invalid[i]) ||
            strcmp(fl_dtype_name((fl_dtype_t)invalid[i]), "unknown") != 0)
            ck_abort_msg("dtype %d should be unknown", invalid[i]);
    }

    static const struct {
        const char *s;
        fl_dtype_t dt;
    } aliases[] = {
        {"f32", FL_FLOAT32},    {"FLOAT32", FL_FLOAT32},   {"float", FL_FLOAT32},
        {"f16", FL_FLOAT16},    {"half", FL_FLOAT16},      {"Half", FL_FLOAT16},
        {"bf16", FL_BFLOAT16},  {"BFloat16", FL_BFLOAT16}, {"f64", FL_FLOAT64},
        {"double", FL_FLOAT64}, {"INT32", FL_INT32},       {"int64", FL_INT64},
        {"UInt8", FL_UINT8},
    };
    for (size_t i = 0; i < NELEM(aliases); i++) {
        fl_dtype_t dt = (fl_dtype_t)0;
        if (fl_dtype_parse(aliases[i].s, &dt) != FL_OK || dt != aliases[i].dt)
            ck_abort_msg("'%s' parsed as %d", aliases[i].s, (int)dt);
    }
    static const char *const bad[] = {"float8", "", "f 32", "int16", "bfloat"};
    for (size_t i = 0; i < NELEM(bad); i++) {
        fl_dtype_t dt = FL_INT32;
        if (fl_dtype_parse(bad[i], &dt) != FL_EINVAL || dt != FL_INT32)
            ck_abort_msg("'%s' accepted", bad[i]);
        char quoted[32];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        if (strstr(fl_last_error(), quoted) == NULL)
            ck_abort_msg("'%s': detail '%s'", bad[i], fl_last_error());
    }
    fl_dtype_t dt;
    ck_assert_int_eq(fl_dtype_parse(NULL, &dt), FL_EINVAL);

    ck_assert_str_eq(fl_op_name(FL_SUM), "sum");
    ck_assert_str_eq(fl_op_name(FL_AVG), "avg");
    ck_assert_str_eq(fl_op_name(FL_MAX), "max");
    ck_assert_str_eq(fl_op_name(FL_MIN), "min");
    ck_assert_str_eq(fl_op_name((fl_op_t)0), "unknown");
    ck_assert_str_eq(fl_op_name((fl_op_t)5), "unknown");
}
END_TEST

/* ---- float16 against GCC's _Float16, bfloat16 against a long double reference ---- */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* GCC's _Float16 is the reference; ISO C has no such type, hence __extension__. */
__extension__ typedef _Float16 gcc_f16_t;

/* The reference conversions; volatile keeps GCC from folding them at compile time, so the
 * run-time conversion (libgcc or F16C) is what we compare with. */
static uint16_t ref_f32_to_f16(float f)
{
    volatile float v = f;
    gcc_f16_t h = (gcc_f16_t)v;
    uint16_t b;
    memcpy(&b, &h, sizeof b);
    return b;
}

static float ref_f16_to_f32(uint16_t b)
{
    gcc_f16_t h;
    memcpy(&h, &b, sizeof h);
    volatile gcc_f16_t v = h;
    return (float)v;
}

static bool f16_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

START_TEST(test_f16_exhaustive_round_trip)
{
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = fl_f16_to_f32(h);
        float r = ref_f16_to_f32(h);
        uint16_t back = fl_f32_to_f16(f);
        if (f16_is_nan(h)) {
            /* Quieted (as IEEE conversions do) but still NaN, same sign, same payload. */
            if (!isnan(f) || !isnan(r) || !signbit(f) != !signbit(r))
                ck_abort_msg("half 0x%04x: float 0x%08x, GCC 0x%08x", h, f2u(f), f2u(r));
            if (!f16_is_nan(back) || (back | 0x200u) != (h | 0x200u))
                ck_abort_msg("NaN half 0x%04x came back as 0x%04x", h, back);
            if ((h & 0x200u) != 0 && back != h)
                ck_abort_msg("quiet NaN half 0x%04x came back as 0x%04x", h, back);
            continue;
        }
        if (f2u(f) != f2u(r))
            ck_abort_msg("half 0x%04x: float 0x%08x (%.9g), GCC 0x%08x (%.9g)", h, f2u(f),
                         (double)f, f2u(r), (double)r);
        if (back != h)
            ck_abort_msg("half 0x%04x -> %.9g -> 0x%04x", h, (double)f, back);
    }
}
END_TEST

static void check_f16(float f)
{
    uint16_t got = fl_f32_to_f16(f);
    uint16_t want = ref_f32_to_f16(f);
    if (got != want)
        ck_abort_msg("float 0x%08x (%.9g): half 0x%04x, GCC 0x%04x", f2u(f), (double)f, got, want);
}

START_TEST(test_f16_special_cases)
{
    /* The reference itself, pinned to known encodings. */
    ck_assert_uint_eq(ref_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(ref_f32_to_f16(65520.0f), 0x7c00);
    ck_assert_uint_eq(ref_f32_to_f16(ldexpf(1.0f, -24)), 0x0001);

    static const struct {
        float f;
        uint16_t want;
    } known[] = {
        {0.0f, 0x0000},          {-0.0f, 0x8000},
        {1.0f, 0x3c00},          {-2.0f, 0xc000},
        {65504.0f, 0x7bff},  /* largest finite */
        {65519.99f, 0x7bff}, /* just below the rounding threshold */
        {65520.0f, 0x7c00},  /* the threshold itself rounds to infinity */
        {-65520.0f, 0xfc00},     {1e10f, 0x7c00},
        {FLT_MAX, 0x7c00},       {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},     {0x1p-24f, 0x0001},        /* smallest subnormal */
        {0x1p-25f, 0x0000},                                 /* tie between 0 and 2^-24: even is 0 */
        {-0x1p-25f, 0x8000},     {0x1.000002p-25f, 0x0001}, /* just above the tie */
        {0x1.8p-24f, 0x0002},                               /* 1.5 * 2^-24: tie, even is 2 */
        {0x1.4p-23f, 0x0002},                               /* 2.5 * 2^-24: tie, even is 2 */
        {0x1.cp-23f, 0x0004},                               /* 3.5 * 2^-24: tie, even is 4 */
        {0x1p-26f, 0x0000},      {FLT_TRUE_MIN, 0x0000},
        {FLT_MIN, 0x0000},       {0x1p-14f, 0x0400}, /* smallest normal */
        {0x1.ff8p-15f, 0x03ff},                      /* largest subnormal, exact */
        {0x1.ffcp-15f, 0x0400},  /* largest subnormal tie rounds up into the normals */
        {0x1.002p0f, 0x3c00},    /* 1 + 2^-11: tie, even is 1 */
        {0x1.006p0f, 0x3c02},    /* 1 + 3 * 2^-11: tie, even is 1 + 2^-9 */
        {0x1.002002p0f, 0x3c01}, /* just above the tie */
        {2049.0f, 0x6800},       /* 2048 + 1: tie, even is 2048 */
        {2051.0f, 0x6802},       /* tie, even is 2052 */
    };
    for (size_t i = 0; i < NELEM(known); i++) {
        uint16_t got = fl_f32_to_f16(known[i].f);
        if (got != known[i].want)
            ck_abort_msg("case %zu: %a -> 0x%04x, expected 0x%04x", i, (double)known[i].f, got,
                         known[i].want);
        check_f16(known[i].f);
    }
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                                    0x7fffffffu, 0x7fa00000u, 0x7fc12345u, 0xffbfe000u};
    for (size_t i = 0; i < NELEM(nans); i++) {
        uint16_t got = fl_f32_to_f16(u2f(nans[i]));
        if (!f16_is_nan(got) || (got >> 15) != (nans[i] >> 31))
            ck_abort_msg("NaN 0x%08x -> 0x%04x", nans[i], got);
        check_f16(u2f(nans[i]));
    }
}
END_TEST

START_TEST(test_f16_rounding_boundaries)
{
    /* For every finite positive half h: the midpoint to the next half (a tie) and its float
     * neighbours, both signs. This visits every rounding decision the converter makes. */
    for (uint32_t h = 0; h < 0x7c00u; h++) {
        double lo = (double)ref_f16_to_f32((uint16_t)h);
        double hi = h + 1 < 0x7c00u ? (double)ref_f16_to_f32((uint16_t)(h + 1)) : 65536.0;
        float mid = (float)((lo + hi) / 2); /* exact: halves have 11 significant bits */
        float cands[] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY), (float)lo};
        for (size_t k = 0; k < NELEM(cands); k++) {
            check_f16(cands[k]);
            check_f16(-cands[k]);
        }
    }
}
END_TEST

START_TEST(test_f16_random)
{
    uint64_t s = 0x5eed1234;
    for (int i = 0; i < 2000000; i++) {
        uint32_t bits = (uint32_t)fl_test_rand(&s);
        if (i % 2 == 1) {
            /* Concentrate half the samples on exponents a half can represent or round to. */
            uint32_t e = 96u + (uint32_t)(fl_test_rand(&s) % 50u);
            bits = (bits & 0x807fffffu) | (e << 23);
        }
        check_f16(u2f(bits));
    }
}
END_TEST

/* Value of a non-negative bfloat16 pattern; 0x7f80 stands for 2^128, the value IEEE rounding
 * treats as the next step after the largest finite number. */
static long double bf16_value(uint32_t p)
{
    if (p == 0x7f80u)
        return ldexpl(1.0L, 128);
    int e = (int)(p >> 7);
    int m = (int)(p & 0x7fu);
    if (e == 0)
        return ldexpl((long double)m, -133);
    return ldexpl((long double)(m + 128), e - 134);
}

/* Round to nearest even by comparing distances, independent of the library's bit tricks. */
static uint16_t ref_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    long double x = fabsl((long double)f);
    if (isinf(f))
        return (uint16_t)(sign | 0x7f80u);
    uint32_t lo = (u & 0x7fffffffu) >> 16; /* truncation: the neighbour toward zero */
    if ((long double)bf16_value(lo) == x)
        return (uint16_t)(sign | lo);
    long double dlo = x - bf16_value(lo);
    long double dhi = bf16_value(lo + 1) - x;
    uint32_t r;
    if (dlo < dhi)
        r = lo;
    else if (dhi < dlo)
        r = lo + 1;
    else
        r = (lo & 1u) ? lo + 1 : lo;
    return (uint16_t)(sign | r);
}

static void check_bf16(float f)
{
    uint16_t got = fl_f32_to_bf16(f);
    if (isnan(f)) {
        if ((got & 0x7f80u) != 0x7f80u || (got & 0x7fu) == 0 || (got >> 15) != (f2u(f) >> 31))
            ck_abort_msg("NaN 0x%08x -> bf16 0x%04x", f2u(f), got);
        return;
    }
    uint16_t want = ref_f32_to_bf16(f);
    if (got != want)
        ck_abort_msg("float 0x%08x (%a): bf16 0x%04x, expected 0x%04x", f2u(f), (double)f, got,
                     want);
}

START_TEST(test_bf16)
{
    static const struct {
        float f;
        uint16_t want;
    } known[] = {
        {0.0f, 0x0000},          {-0.0f, 0x8000},
        {1.0f, 0x3f80},          {0x1.01p0f, 0x3f80}, /* 1 + 2^-8: tie, even is 1 */
        {0x1.03p0f, 0x3f82},                          /* 1 + 3 * 2^-8: tie, even is 1 + 2^-6 */
        {0x1.010002p0f, 0x3f81}, {INFINITY, 0x7f80},
        {-INFINITY, 0xff80},     {FLT_MAX, 0x7f80}, /* rounds past the largest finite bf16 */
        {0x1.fep127f, 0x7f7f},                      /* largest finite bf16 */
        {0x1.ff00p127f, 0x7f80}, /* tie between it and "2^128": even is infinity */
        {FLT_TRUE_MIN, 0x0000},  {0x1p-133f, 0x0001}, /* smallest bf16 subnormal */
    };
    for (size_t i = 0; i < NELEM(known); i++) {
        uint16_t got = fl_f32_to_bf16(known[i].f);
        uint16_t ref = ref_f32_to_bf16(known[i].f);
        if (got != known[i].want || ref != known[i].want)
            ck_abort_msg("case %zu: %a -> 0x%04x (reference 0x%04x), expected 0x%04x", i,
                         (double)known[i].f, got, ref, known[i].want);
    }

    /* Every bfloat16 pattern comes back from float32 unchanged; NaNs stay NaN. */
    for (uint32_t p = 0; p < 65536; p++) {
        float f = fl_bf16_to_f32((uint16_t)p);
        if (f2u(f) != p << 16)
            ck_abort_msg("bf16 0x%04x -> float 0x%08x", p, f2u(f));
        check_bf16(f);
        uint16_t back = fl_f32_to_bf16(f);
        if (!isnan(f) && back != p)
            ck_abort_msg("bf16 0x%04x came back as 0x%04x", p, back);
    }
    /* Around every rounding decision: exact ties and their neighbours. */
    static const uint32_t lows[] = {0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
    for (uint32_t p = 0; p < 65536; p++)
        for (size_t k = 0; k < NELEM(lows); k++)
            check_bf16(u2f(p << 16 | lows[k]));
    /* NaNs whose payload sits only in the bits bfloat16 drops must not become infinity. */
    check_bf16(u2f(0x7f800001u));
    check_bf16(u2f(0xff80ffffu));
    ck_assert(isnan(fl_bf16_to_f32(fl_f32_to_bf16(NAN))));

    uint64_t s = 42;
    for (int i = 0; i < 1000000; i++)
        check_bf16(u2f((uint32_t)fl_test_rand(&s)));
}
END_TEST

Suite *core_dtype_suite(void);
Suite *core_dtype_suite(void)
{
    Suite *s = suite_create("core_dtype");
    TCase *t = tcase_create("dtype");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_dtypes);
    tcase_add_test(t, test_f16_exhaustive_round_trip);
    tcase_add_test(t, test_f16_special_cases);
    tcase_add_test(t, test_f16_rounding_boundaries);
    tcase_add_test(t, test_f16_random);
    tcase_add_test(t, test_bf16);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(core_dtype_suite());
}
