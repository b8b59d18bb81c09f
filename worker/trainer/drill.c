/* The gradient-exchange drill (--drill): no model, only the exchange. Data is chosen so that
 * the exact sum is known in closed form, so every element of every step is checked. */
#include "fl_wk.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_coll.h"
#include "fl_core.h"

void fl_wk_drill_opts_init(fl_wk_drill_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->bytes = (size_t)64 << 20;
    o->steps = 20;
    o->dtype = FL_FLOAT32;
    o->op = FL_AVG;
}

static int value_k(size_t i, int rank, int step)
{
    return (int)((i * 7 + (size_t)step * 13 + (size_t)rank * 31) % 64) - 32;
}

void fl_wk_drill_fill(void *buf, size_t count, fl_dtype_t dtype, int rank, int step)
{
    for (size_t i = 0; i < count; i++) {
        float v = (float)value_k(i, rank, step) / 8.0f;
        switch (dtype) {
        case FL_FLOAT32: ((float *)buf)[i] = v; break;
        case FL_FLOAT64: ((double *)buf)[i] = v; break;
        case FL_FLOAT16: ((uint16_t *)buf)[i] = fl_f32_to_f16(v); break;
        case FL_BFLOAT16: ((uint16_t *)buf)[i] = fl_f32_to_bf16(v); break;
        default: break;
        }
    }
}

double fl_wk_drill_expected(size_t i, int nranks, int step, fl_op_t op)
{
    long sum = 0;
    for (int r = 0; r < nranks; r++)
        sum += value_k(i, r, step);
    double s = (double)sum / 8.0;
    return op == FL_AVG ? s / nranks : s;
}

/* The expected element as the dtype stores it: sums are exact in float32, and AVG divides once
 * in float32 (float64 for float64), then float16/bfloat16 round once. */
static double as_stored(double exact_sum, fl_dtype_t dtype, fl_op_t op, int nranks)
{
    if (dtype == FL_FLOAT64)
        return op == FL_AVG ? exact_sum / nranks : exact_sum;
    float f = (float)exact_sum;
    if (op == FL_AVG)
        f = f / (float)nranks;
    if (dtype == FL_FLOAT16)
        return fl_f16_to_f32(fl_f32_to_f16(f));
    if (dtype == FL_BFLOAT16)
        return fl_bf16_to_f32(fl_f32_to_bf16(f));
    return f;
}

static double load(const void *buf, size_t i, fl_dtype_t dtype)
{
    switch (dtype) {
    case FL_FLOAT32: return ((const float *)buf)[i];
    case FL_FLOAT64: return ((const double *)buf)[i];
    case FL_FLOAT16: return fl_f16_to_f32(((const uint16_t *)buf)[i]);
    case FL_BFLOAT16: return fl_bf16_to_f32(((const uint16_t *)buf)[i]);
    default: return NAN;
    }
}

static int verify(const void *buf, size_t count, fl_dtype_t dtype, fl_op_t op, int nranks, int step,
                  int rank)
{
    /* The pattern repeats every 64 elements: compute the 64 expected values once. */
    double want[64];
    for (size_t j = 0; j < 64; j++)
        want[j] = as_stored(fl_wk_drill_expected(j, nranks, step, FL_SUM), dtype, op, nranks);
    for (size_t i = 0; i < count; i++) {
        double got = load(buf, i, dtype);
        if (got != want[i % 64])
            return fl_fail(FL_EPROTO, "rank %d: step %d element %zu is %.9g, expected %.9g", rank,
                           step, i, got, want[i % 64]);
    }
    return FL_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int fl_wk_drill_run(fl_comm_t *comm, const fl_wk_drill_opts_t *o)
{
    int rank = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    size_t esz = fl_dtype_size(o->dtype);
    if (esz == 0 || o->dtype == FL_INT32 || o->dtype == FL_INT64 || o->dtype == FL_UINT8)
        return fl_fail(FL_EINVAL, "drill: dtype %s not supported (float types only)",
                       fl_dtype_name(o->dtype));
    size_t count = o->bytes / esz;
    void *buf = malloc(count ? count * esz : 1);
    double *ms = calloc((size_t)(o->steps > 0 ? o->steps : 1), sizeof *ms);
    if (buf == NULL || ms == NULL) {
        free(buf);
        free(ms);
        return fl_fail(FL_ENOMEM, "drill: no memory for %zu bytes", o->bytes);
    }
    double busfactor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
    char size[32];
    fl_fmt_bytes(count * esz, size, sizeof size);
    if (rank == 0 && !o->quiet)
        printf("flodl-worker: %d ranks, %s %s allreduce (%s), %d steps\n", n, size,
               fl_dtype_name(o->dtype), fl_op_name(o->op), o->steps);
    int rc = FL_OK;
    fl_comm_stats_t st0;
    fl_comm_get_stats(comm, &st0);
    for (int s = 0; s < o->steps && rc == FL_OK; s++) {
        fl_wk_drill_fill(buf, count, o->dtype, rank, s);
        int64_t t0 = fl_now_ns();
        rc = fl_allreduce(comm, buf, buf, count, o->dtype, o->op);
        ms[s] = (double)(fl_now_ns() - t0) / 1e6;
        if (rc != FL_OK)
            break;
        rc = verify(buf, count, o->dtype, o->op, n, s, rank);
        if (rank == 0 && !o->quiet)
            printf("step %3d: %9.3f ms  busbw %6.2f GB/s  %s\n", s + 1, ms[s],
                   ms[s] > 0 ? (double)(count * esz) * busfactor / (ms[s] * 1e6) : 0.0,
                   rc == FL_OK ? "verified" : "MISMATCH");
        fflush(stdout);
    }
    if (rc == FL_OK && o->steps > 0) {
        fl_comm_stats_t st;
        fl_comm_get_stats(comm, &st);
        qsort(ms, (size_t)o->steps, sizeof *ms, cmp_double);
        double med = ms[o->steps / 2];
        double algbw = med > 0 ? (double)(count * esz) / (med * 1e6) : 0.0;
        const char *algo = st.last_algo == FL_ALGO_RD       ? "recursive doubling"
                           : st.last_algo == FL_ALGO_DIRECT ? "one-shot"
                                                            : "ring";
        printf("rank %d summary: %d steps of %s verified; median %.3f ms (min %.3f), algbw "
               "%.2f GB/s, busbw %.2f GB/s (%s); sent %.1f MiB, received %.1f MiB; anonymous "
               "memory %.1f MiB\n",
               rank, o->steps, size, med, ms[0], algbw, algbw * busfactor,
               n > 1 ? algo : "single rank", (double)(st.bytes_sent - st0.bytes_sent) / 1048576.0,
               (double)(st.bytes_recv - st0.bytes_recv) / 1048576.0,
               (double)fl_rss_anon() / 1048576.0);
        fflush(stdout);
    }
    free(buf);
    free(ms);
    return rc;
}
