/* Reduction kernels against a scalar reference: fl_reduce_combine / widen / finish for float32,
 * float16, bfloat16, float64, int32 and int64 with sum, avg, max and min; incoming data at byte
 * offsets 0..3 (it sits in network buffers), vector tails (n = 0, 1, 7, 1000, 4099), dst aliasing
 * local, AVG divided once (float16/bfloat16 rounded once from float32), integer sums that wrap
 * without undefined behaviour, writes that stay within n, and the fl_acc_dtype / op tables. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define GUARD 64
#define CANARY 0xCD

static const fl_dtype_t dtypes[] = {FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16,
                                    FL_FLOAT64, FL_INT32,   FL_INT64};
static const fl_op_t ops[] = {FL_SUM, FL_AVG, FL_MAX, FL_MIN};
static const size_t lengths[] = {0, 1, 7, 1000, 4099};

/* Raw element access without alignment assumptions. */
static float get_f32(const void *p, size_t i)
{
    float v;
    memcpy(&v, (const uint8_t *)p + i * sizeof v, sizeof v);
    return v;
}
static double get_f64(const void *p, size_t i)
{
    double v;
    memcpy(&v, (const uint8_t *)p + i * sizeof v, sizeof v);
    return v;
}
static int32_t get_i32(const void *p, size_t i)
{
    int32_t v;
    memcpy(&v, (const uint8_t *)p + i * sizeof v, sizeof v);
    return v;
}
static int64_t get_i64(const void *p, size_t i)
{
    int64_t v;
    memcpy(&v, (const uint8_t *)p + i * sizeof v, sizeof v);
    return v;
}
static uint16_t get_u16(const void *p, size_t i)
{
    uint16_t v;
    memcpy(&v, (const uint8_t *)p + i * sizeof v, sizeof v);
    return v;
}

/* n random elements of dtype: floats of mixed magnitude and sign, integers over the whole
 * range (so that sums wrap), with a few equal pairs across seeds left to chance. */
static void fill(fl_dtype_t dt, void *buf, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 12345;
    uint8_t *b = buf;
    for (size_t i = 0; i < n; i++) {
        double u = fl_test_uniform(&s);
        double scale = (fl_test_rand(&s) & 3) == 0 ? 1e4 : 7.0;
        float f = (float)(u * scale);
        double d = u * scale * 1.0000001;
        int32_t i32 = (int32_t)(uint32_t)fl_test_rand(&s);
        int64_t i64 = (int64_t)fl_test_rand(&s);
        uint16_t h;
        switch (dt) {
        case FL_FLOAT32: memcpy(b + i * 4, &f, 4); break;
        case FL_FLOAT64: memcpy(b + i * 8, &d, 8); break;
        case FL_FLOAT16:
            h = fl_f32_to_f16(f);
            memcpy(b + i * 2, &h, 2);
            break;
        case FL_BFLOAT16:
            h = fl_f32_to_bf16(f);
            memcpy(b + i * 2, &h, 2);
            break;
        case FL_INT32: memcpy(b + i * 4, &i32, 4); break;
        case FL_INT64: memcpy(b + i * 8, &i64, 8); break;
        default: break;
        }
    }
}

static float widen16(fl_dtype_t dt, uint16_t h)
{
    return dt == FL_FLOAT16 ? fl_f16_to_f32(h) : fl_bf16_to_f32(h);
}

/* Compares element i of the kernel's dst (accumulation type) with the reference for op applied
 * to local[i] (dtype) and in[i] (accumulation type). Returns true when they agree. */
static bool combine_ok(fl_op_t op, fl_dtype_t dt, const void *dst, const void *local,
                       const void *in, size_t i, char *why, size_t cap)
{
    switch (dt) {
    case FL_FLOAT32:
    case FL_FLOAT16:
    case FL_BFLOAT16: {
        float a = dt == FL_FLOAT32 ? get_f32(local, i) : widen16(dt, get_u16(local, i));
        float b = get_f32(in, i);
        float want = op == FL_MAX ? (a > b ? a : b) : op == FL_MIN ? (a < b ? a : b) : a + b;
        float got = get_f32(dst, i);
        snprintf(why, cap, "%.9g op %.9g: got %.9g, want %.9g", a, b, got, want);
        return got == want;
    }
    case FL_FLOAT64: {
        double a = get_f64(local, i);
        double b = get_f64(in, i);
        double want = op == FL_MAX ? (a > b ? a : b) : op == FL_MIN ? (a < b ? a : b) : a + b;
        double got = get_f64(dst, i);
        snprintf(why, cap, "%.17g op %.17g: got %.17g, want %.17g", a, b, got, want);
        return got == want;
    }
    case FL_INT32: {
        int32_t a = get_i32(local, i);
        int32_t b = get_i32(in, i);
        int32_t want = op == FL_MAX   ? (a > b ? a : b)
                       : op == FL_MIN ? (a < b ? a : b)
                                      : (int32_t)((uint32_t)a + (uint32_t)b);
        int32_t got = get_i32(dst, i);
        snprintf(why, cap, "%d op %d: got %d, want %d", a, b, got, want);
        return got == want;
    }
    case FL_INT64: {
        int64_t a = get_i64(local, i);
        int64_t b = get_i64(in, i);
        int64_t want = op == FL_MAX   ? (a > b ? a : b)
                       : op == FL_MIN ? (a < b ? a : b)
                                      : (int64_t)((uint64_t)a + (uint64_t)b);
        int64_t got = get_i64(dst, i);
        snprintf(why, cap, "%lld op %lld: got %lld, want %lld", (long long)a, (long long)b,
                 (long long)got, (long long)want);
        return got == want;
    }
    default: snprintf(why, cap, "bad dtype"); return false;
    }
}

static bool guard_intact(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != CANARY)
            return false;
    return true;
}

/* One combine case: in at byte offset mis; dst separate, or dst == local (alias). */
static void combine_case(fl_op_t op, fl_dtype_t dt, size_t n, size_t mis, bool alias)
{
    fl_dtype_t acc = fl_acc_dtype(dt);
    size_t esz = fl_dtype_size(dt);
    size_t asz = fl_dtype_size(acc);
    uint8_t *local = malloc(n * esz + GUARD);
    uint8_t *local_copy = malloc(n * esz + GUARD);
    uint8_t *in_raw = malloc(n * asz + GUARD + 8);
    uint8_t *in_copy = malloc(n * asz + GUARD);
    uint8_t *dst = malloc(n * asz + GUARD);
    ck_assert(local && local_copy && in_raw && in_copy && dst);
    uint64_t seed = (uint64_t)dt * 1000 + (uint64_t)op * 100 + n + mis;
    fill(dt, local, n, seed);
    fill(acc, in_copy, n, seed + 7);
    memset(local + n * esz, CANARY, GUARD);
    memcpy(local_copy, local, n * esz + GUARD);
    uint8_t *in = in_raw + mis;
    memcpy(in, in_copy, n * asz);
    memset(dst, CANARY, n * asz + GUARD);

    uint8_t *out = alias ? local : dst;
    fl_reduce_combine(op, dt, out, local, in, n);

    char why[256];
    for (size_t i = 0; i < n; i++) {
        if (!combine_ok(op, dt, out, local_copy, in_copy, i, why, sizeof why))
            ck_abort_msg("combine %s %s n=%zu in+%zu%s element %zu: %s", fl_op_name(op),
                         fl_dtype_name(dt), n, mis, alias ? " dst==local" : "", i, why);
    }
    if (!guard_intact(out + n * asz, GUARD))
        ck_abort_msg("combine %s %s n=%zu wrote past element %zu", fl_op_name(op),
                     fl_dtype_name(dt), n, n);
    if (memcmp(in, in_copy, n * asz) != 0)
        ck_abort_msg("combine %s %s n=%zu changed its input", fl_op_name(op), fl_dtype_name(dt), n);
    if (!alias && memcmp(local, local_copy, n * esz) != 0)
        ck_abort_msg("combine %s %s n=%zu changed local", fl_op_name(op), fl_dtype_name(dt), n);
    free(local);
    free(local_copy);
    free(in_raw);
    free(in_copy);
    free(dst);
}

START_TEST(test_combine)
{
    fl_dtype_t dt = dtypes[_i];
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        if (!fl_op_supports(ops[o], dt))
            continue;
        for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
            for (size_t mis = 0; mis < 4; mis++) {
                combine_case(ops[o], dt, lengths[k], mis, false);
                /* dst may equal local only where the dtype is its own accumulation type. */
                if (fl_acc_dtype(dt) == dt)
                    combine_case(ops[o], dt, lengths[k], mis, true);
            }
        }
    }
}
END_TEST

START_TEST(test_int_wrap)
{
    uint8_t raw[64];
    int32_t l32[4] = {INT32_MAX, INT32_MIN, INT32_MAX, -5};
    int32_t i32[4] = {1, -1, INT32_MAX, 7};
    int32_t d32[4];
    memcpy(raw + 3, i32, sizeof i32);
    fl_reduce_combine(FL_SUM, FL_INT32, d32, l32, raw + 3, 4);
    ck_assert_int_eq(d32[0], INT32_MIN);
    ck_assert_int_eq(d32[1], INT32_MAX);
    ck_assert_int_eq(d32[2], -2);
    ck_assert_int_eq(d32[3], 2);

    int64_t l64[3] = {INT64_MAX, INT64_MIN, INT64_MIN};
    int64_t i64[3] = {1, -1, INT64_MIN};
    int64_t d64[3];
    memcpy(raw + 1, i64, sizeof i64);
    fl_reduce_combine(FL_SUM, FL_INT64, d64, l64, raw + 1, 3);
    ck_assert(d64[0] == INT64_MIN);
    ck_assert(d64[1] == INT64_MAX);
    ck_assert(d64[2] == 0);

    /* MAX / MIN at the extremes, in place. */
    int32_t m[2] = {INT32_MIN, INT32_MAX};
    int32_t mi[2] = {INT32_MAX, INT32_MIN};
    memcpy(raw + 2, mi, sizeof mi);
    fl_reduce_combine(FL_MAX, FL_INT32, m, m, raw + 2, 2);
    ck_assert_int_eq(m[0], INT32_MAX);
    ck_assert_int_eq(m[1], INT32_MAX);
    fl_reduce_combine(FL_MIN, FL_INT32, m, m, raw + 2, 2);
    ck_assert_int_eq(m[0], INT32_MAX);
    ck_assert_int_eq(m[1], INT32_MIN);
}
END_TEST

START_TEST(test_widen)
{
    fl_dtype_t dt = dtypes[_i];
    fl_dtype_t acc = fl_acc_dtype(dt);
    size_t esz = fl_dtype_size(dt);
    size_t asz = fl_dtype_size(acc);
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
        size_t n = lengths[k];
        uint8_t *src = malloc(n * esz + GUARD);
        uint8_t *copy = malloc(n * esz + GUARD);
        uint8_t *dst = malloc(n * asz + GUARD);
        ck_assert(src && copy && dst);
        fill(dt, src, n, n + 3);
        memcpy(copy, src, n * esz);
        memset(dst, CANARY, n * asz + GUARD);
        fl_reduce_widen(dt, dst, src, n);
        for (size_t i = 0; i < n; i++) {
            bool ok;
            if (dt == FL_FLOAT16 || dt == FL_BFLOAT16)
                ok = get_f32(dst, i) == widen16(dt, get_u16(src, i));
            else
                ok = memcmp(dst + i * asz, src + i * esz, esz) == 0;
            if (!ok)
                ck_abort_msg("widen %s n=%zu element %zu differs", fl_dtype_name(dt), n, i);
        }
        if (!guard_intact(dst + n * asz, GUARD))
            ck_abort_msg("widen %s n=%zu wrote past the end", fl_dtype_name(dt), n);
        if (memcmp(src, copy, n * esz) != 0)
            ck_abort_msg("widen %s n=%zu changed its source", fl_dtype_name(dt), n);
        /* Same type: widening in place leaves the data as it is. */
        if (acc == dt) {
            fl_reduce_widen(dt, src, src, n);
            if (memcmp(src, copy, n * esz) != 0)
                ck_abort_msg("widen %s n=%zu in place changed the data", fl_dtype_name(dt), n);
        }
        free(src);
        free(copy);
        free(dst);
    }
}
END_TEST

/* Element i of a finished result against the reference: AVG divides once, in the accumulation
 * type, and float16/bfloat16 are rounded once from that float32 value. */
static bool finish_ok(fl_op_t op, fl_dtype_t dt, const void *out, const void *acc, size_t i,
                      int nranks, char *why, size_t cap)
{
    switch (dt) {
    case FL_FLOAT32: {
        float a = get_f32(acc, i);
        float want = op == FL_AVG ? a / (float)nranks : a;
        float got = get_f32(out, i);
        snprintf(why, cap, "acc %.9g: got %.9g, want %.9g", a, got, want);
        return memcmp(&got, &want, sizeof got) == 0;
    }
    case FL_FLOAT16:
    case FL_BFLOAT16: {
        float a = get_f32(acc, i);
        float v = op == FL_AVG ? a / (float)nranks : a;
        uint16_t want = dt == FL_FLOAT16 ? fl_f32_to_f16(v) : fl_f32_to_bf16(v);
        uint16_t got = get_u16(out, i);
        snprintf(why, cap, "acc %.9g: got %#06x, want %#06x", a, got, want);
        return got == want;
    }
    case FL_FLOAT64: {
        double a = get_f64(acc, i);
        double want = op == FL_AVG ? a / (double)nranks : a;
        double got = get_f64(out, i);
        snprintf(why, cap, "acc %.17g: got %.17g, want %.17g", a, got, want);
        return memcmp(&got, &want, sizeof got) == 0;
    }
    case FL_INT32:
    case FL_INT64: {
        size_t sz = fl_dtype_size(dt);
        snprintf(why, cap, "integer result differs from the accumulator");
        return memcmp((const uint8_t *)out + i * sz, (const uint8_t *)acc + i * sz, sz) == 0;
    }
    default: snprintf(why, cap, "bad dtype"); return false;
    }
}

static void finish_case(fl_op_t op, fl_dtype_t dt, size_t n, int nranks, bool alias)
{
    fl_dtype_t accdt = fl_acc_dtype(dt);
    size_t esz = fl_dtype_size(dt);
    size_t asz = fl_dtype_size(accdt);
    uint8_t *acc = malloc(n * asz + GUARD);
    uint8_t *acc_copy = malloc(n * asz + GUARD);
    uint8_t *out = malloc(n * esz + GUARD);
    ck_assert(acc && acc_copy && out);
    fill(accdt, acc, n, (uint64_t)nranks * 31 + n);
    memset(acc + n * asz, CANARY, GUARD);
    memcpy(acc_copy, acc, n * asz + GUARD);
    memset(out, CANARY, n * esz + GUARD);
    uint8_t *o = alias ? acc : out;
    fl_reduce_finish(op, dt, o, acc, n, nranks);
    char why[256];
    for (size_t i = 0; i < n; i++) {
        if (!finish_ok(op, dt, o, acc_copy, i, nranks, why, sizeof why))
            ck_abort_msg("finish %s %s n=%zu over %d ranks%s, element %zu: %s", fl_op_name(op),
                         fl_dtype_name(dt), n, nranks, alias ? " in place" : "", i, why);
    }
    if (!guard_intact(o + n * esz, GUARD))
        ck_abort_msg("finish %s %s n=%zu wrote past the end", fl_op_name(op), fl_dtype_name(dt), n);
    if (!alias && memcmp(acc, acc_copy, n * asz) != 0)
        ck_abort_msg("finish %s %s n=%zu changed the accumulator", fl_op_name(op),
                     fl_dtype_name(dt), n);
    free(acc);
    free(acc_copy);
    free(out);
}

START_TEST(test_finish)
{
    static const int ranks[] = {1, 3, 4, 7};
    fl_dtype_t dt = dtypes[_i];
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        if (!fl_op_supports(ops[o], dt))
            continue;
        for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
            for (size_t r = 0; r < sizeof ranks / sizeof ranks[0]; r++) {
                finish_case(ops[o], dt, lengths[k], ranks[r], false);
                if (fl_acc_dtype(dt) == dt)
                    finish_case(ops[o], dt, lengths[k], ranks[r], true);
            }
        }
    }
}
END_TEST

/* The data above must be able to tell the single-rounding reference from the usual mistakes:
 * multiplying by 1/N, or rounding to the narrow type before dividing. */
START_TEST(test_finish_rounds_once)
{
    size_t n = 4099;
    int nranks = 3;
    float *acc = malloc(n * sizeof *acc);
    uint16_t *out = malloc(n * sizeof *out);
    float *out32 = malloc(n * sizeof *out32);
    ck_assert(acc && out && out32);
    fill(FL_FLOAT32, acc, n, 99);
    size_t recip_differs = 0;
    size_t twice_differs[2] = {0, 0};
    fl_reduce_finish(FL_AVG, FL_FLOAT32, out32, acc, n, nranks);
    for (size_t i = 0; i < n; i++) {
        float want = acc[i] / (float)nranks;
        if (memcmp(&out32[i], &want, sizeof want) != 0)
            ck_abort_msg("float32 avg element %zu: %.9g / %d gave %.9g", i, acc[i], nranks,
                         out32[i]);
        if (acc[i] * (1.0f / (float)nranks) != want)
            recip_differs++;
    }
    for (int b = 0; b < 2; b++) {
        fl_dtype_t dt = b == 0 ? FL_FLOAT16 : FL_BFLOAT16;
        fl_reduce_finish(FL_AVG, dt, out, acc, n, nranks);
        for (size_t i = 0; i < n; i++) {
            float q = acc[i] / (float)nranks;
            uint16_t once = b == 0 ? fl_f32_to_f16(q) : fl_f32_to_bf16(q);
            uint16_t narrow_acc = b == 0 ? fl_f32_to_f16(acc[i]) : fl_f32_to_bf16(acc[i]);
            float q2 = widen16(dt, narrow_acc) / (float)nranks;
            uint16_t twice = b == 0 ? fl_f32_to_f16(q2) : fl_f32_to_bf16(q2);
            if (out[i] != once)
                ck_abort_msg("%s avg element %zu: %.9g / %d gave %#06x, want %#06x",
                             fl_dtype_name(dt), i, acc[i], nranks, out[i], once);
            if (twice != once)
                twice_differs[b]++;
        }
    }
    ck_assert_msg(recip_differs > 0, "data cannot tell x/3 from x*(1/3)");
    ck_assert_msg(twice_differs[0] > 0 && twice_differs[1] > 0,
                  "data cannot tell single from double rounding (%zu, %zu)", twice_differs[0],
                  twice_differs[1]);
    /* Known values: 1 / 4 and 3 / 3 in every float type. */
    float a[2] = {1.0f, 3.0f};
    fl_reduce_finish(FL_AVG, FL_FLOAT16, out, a, 1, 4);
    ck_assert_uint_eq(out[0], 0x3400);
    fl_reduce_finish(FL_AVG, FL_BFLOAT16, out, a + 1, 1, 3);
    ck_assert_uint_eq(out[0], 0x3F80);
    free(acc);
    free(out);
    free(out32);
}
END_TEST

START_TEST(test_acc_dtype)
{
    ck_assert_int_eq(fl_acc_dtype(FL_FLOAT16), FL_FLOAT32);
    ck_assert_int_eq(fl_acc_dtype(FL_BFLOAT16), FL_FLOAT32);
    ck_assert_int_eq(fl_acc_dtype(FL_FLOAT32), FL_FLOAT32);
    ck_assert_int_eq(fl_acc_dtype(FL_FLOAT64), FL_FLOAT64);
    ck_assert_int_eq(fl_acc_dtype(FL_INT32), FL_INT32);
    ck_assert_int_eq(fl_acc_dtype(FL_INT64), FL_INT64);
    ck_assert_int_eq(fl_acc_dtype(FL_UINT8), FL_UINT8);
}
END_TEST

START_TEST(test_op_supports)
{
    /* Rows: dtypes 0..8 (0 and 8 unknown); columns: ops 0..5 (0 and 5 unknown). */
    static const bool want[9][6] = {
        {false, false, false, false, false, false}, /* 0 */
        {false, true, true, true, true, false},     /* float32 */
        {false, true, true, true, true, false},     /* float16 */
        {false, true, true, true, true, false},     /* bfloat16 */
        {false, true, true, true, true, false},     /* float64 */
        {false, true, false, true, true, false},    /* int32: no avg */
        {false, false, false, false, false, false}, /* uint8: nothing */
        {false, true, false, true, true, false},    /* int64: no avg */
        {false, false, false, false, false, false}, /* 8 */
    };
    for (int d = 0; d < 9; d++) {
        for (int o = 0; o < 6; o++) {
            if (fl_op_supports((fl_op_t)o, (fl_dtype_t)d) != want[d][o])
                ck_abort_msg("fl_op_supports(op %d, dtype %d) = %d, want %d", o, d, !want[d][o],
                             want[d][o]);
        }
    }
}
END_TEST

Suite *reduce_suite(void);
Suite *reduce_suite(void)
{
    int ndt = (int)(sizeof dtypes / sizeof dtypes[0]);
    Suite *s = suite_create("reduce");
    TCase *t = tcase_create("combine");
    tcase_set_timeout(t, 30);
    tcase_add_loop_test(t, test_combine, 0, ndt);
    tcase_add_test(t, test_int_wrap);
    suite_add_tcase(s, t);
    t = tcase_create("widen_finish");
    tcase_set_timeout(t, 30);
    tcase_add_loop_test(t, test_widen, 0, ndt);
    tcase_add_loop_test(t, test_finish, 0, ndt);
    tcase_add_test(t, test_finish_rounds_once);
    suite_add_tcase(s, t);
    t = tcase_create("tables");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_acc_dtype);
    tcase_add_test(t, test_op_supports);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(reduce_suite());
}
