/* flodl-bench sparse-allreduce: fl_sparse_allreduce of top-k gradients over N ranks on this
 * machine, beside the dense fl_allreduce of the same n floats in the same job. Each rank draws
 * its own N(0,1) gradient (so the index sets differ), selects top-k with fl_cmp_topk, and the
 * launcher prints time, bytes each rank sent, compression and speed-up, and which path ran.
 * The rank-launching plumbing is bench_run_job (bench_util.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flodl/comm.h>
#include <flodl/compress.h>

#include "bench_util.h"
#include "fl_core.h"

typedef struct sp_row {
    double density;
    double k_total;
    double select_s;
    double time_s;
    double wire_bytes; /* most any rank sent in one call */
    double raw_bytes;  /* what the dense ring sends from a rank, per fl_sparse_stats_t */
    int dense;         /* 1 when the dense fallback ran */
    bool have;
} sp_row_t;

typedef struct sp_bench {
    int ranks;
    bool bind;
    bool report;
    int reps;
    size_t n;
    double dens[BENCH_MAX_LIST];
    int ndens;
    fl_dtype_t values;
    /* the flags as given, passed on to the ranks */
    const char *n_s;
    const char *dens_s;
    const char *values_s;
    const char *reps_s;
    /* join (report) mode */
    int rank;
    int world;
    const char *coordinator;
    const char *host;
    /* results (launcher) */
    double dense_s;
    double dense_bytes;
    sp_row_t rows[BENCH_MAX_LIST];
} sp_bench_t;

static const char usage[] =
    "usage: flodl-bench sparse-allreduce [--ranks 4] [--n 16M] [--densities 0.01,0.001]\n"
    "                                    [--values float32|float16|bfloat16] [--reps 7]\n"
    "                                    [--bind core|none]\n"
    "Starts a coordinator and N ranks here. Each rank draws n float32 N(0,1) values (its own),\n"
    "selects top-k (k = ceil(density * n)) with fl_cmp_topk, and times fl_sparse_allreduce\n"
    "beside the dense fl_allreduce of the same n floats: median of --reps after a warm-up,\n"
    "slowest rank. --n counts elements (K/M/G are powers of 1024).\n";

/* fl_dtype_parse's names of the three types the sparse values travel as. */
static int set_values(void *p, const char *v)
{
    sp_bench_t *b = p;
    int rc = fl_dtype_parse(v, &b->values);
    if (rc == FL_OK && b->values != FL_FLOAT32 && b->values != FL_FLOAT16 &&
        b->values != FL_BFLOAT16)
        rc = fl_fail(FL_EINVAL, "--values: '%s' is not float32, float16 or bfloat16", v);
    return rc;
}

#define AT(f) BENCH_AT(sp_bench_t, f)
static const bench_flag_t flags[] = {
    {.name = "ranks",
     .kind = BENCH_INT,
     .at = AT(ranks),
     .lo = 1,
     .hi = 256,
     .arg = "N",
     .help = "ranks on this machine"},
    {.name = "n",
     .kind = BENCH_SIZE,
     .at = AT(n),
     .lo = 1,
     .hi = UINT32_MAX,
     .arg = "COUNT",
     .help = "float32 elements per rank",
     .given = AT(n_s)},
    {.name = "densities",
     .kind = BENCH_TEXT,
     .at = AT(dens_s),
     .arg = "LIST",
     .help = "top-k densities, each in (0, 1]"},
    {.name = "values",
     .kind = BENCH_CALL,
     .set = set_values,
     .arg = "float32|float16|bfloat16",
     .help = "the values' type on the wire",
     .def = "float32",
     .given = AT(values_s)},
    {.name = "reps",
     .kind = BENCH_INT,
     .at = AT(reps),
     .lo = 1,
     .hi = 64,
     .arg = "N",
     .help = "timed calls after the warm-up",
     .given = AT(reps_s)},
    BENCH_ROWS_RUN(sp_bench_t),
    BENCH_ROWS_RANK(sp_bench_t),
    {.name = NULL},
};
#undef AT

/* The slowest (largest) of each value over all ranks, in place. */
static int all_max(fl_comm_t *comm, double *v, size_t count)
{
    return fl_allreduce(comm, v, v, count, FL_FLOAT64, FL_MAX);
}

static int fail_rc(int rc)
{
    fprintf(stderr, "flodl-bench: %s\n", fl_last_error());
    return rc;
}

/* Dense ring allreduce of n floats: median seconds and bytes one rank sends per call. */
static int time_dense(fl_comm_t *comm, const sp_bench_t *b, const float *grad, float *buf, int rank)
{
    double t[64];
    double bytes = 0;
    for (int rep = -1; rep < b->reps; rep++) { /* rep -1 warms up */
        /* A fresh copy each time keeps the sums from growing; it is outside the timing. */
        memcpy(buf, grad, b->n * sizeof *buf);
        fl_comm_stats_t s0;
        fl_comm_stats_t s1;
        int rc = fl_barrier(comm);
        fl_comm_get_stats(comm, &s0);
        int64_t t0 = fl_now_ns();
        if (rc == FL_OK)
            rc = fl_allreduce(comm, buf, buf, b->n, FL_FLOAT32, FL_SUM);
        double m[2] = {(double)(fl_now_ns() - t0) / 1e9, 0};
        fl_comm_get_stats(comm, &s1);
        m[1] = (double)(s1.bytes_sent - s0.bytes_sent);
        if (rc != FL_OK || (rc = all_max(comm, m, 2)) != FL_OK)
            return fail_rc(rc);
        if (rep >= 0)
            t[rep] = m[0];
        bytes = m[1];
    }
    if (rank == 0)
        printf("RESULT dense %.9f %.0f\n", bench_median(t, b->reps), bytes);
    return FL_OK;
}

/* Top-k at one density, then the sparse allreduce of the pairs. */
static int time_sparse(fl_comm_t *comm, const sp_bench_t *b, double density, fl_cmp_ws_t *ws,
                       const float *grad, float *out, uint32_t *idx, float *val, int rank)
{
    fl_cmp_topk_opts_t to;
    fl_cmp_topk_opts_init(&to);
    to.density = density;
    fl_sparse_opts_t so;
    fl_sparse_opts_init(&so);
    so.values = b->values;
    double tsel[64];
    double t[64];
    double m[6] = {0};
    for (int rep = -1; rep < b->reps; rep++) { /* rep -1 warms up */
        size_t k = 0;
        int64_t t0 = fl_now_ns();
        int rc = fl_cmp_topk(ws, grad, b->n, &to, idx, val, &k);
        double sel = (double)(fl_now_ns() - t0) / 1e9;
        fl_sparse_stats_t st;
        memset(&st, 0, sizeof st);
        if (rc == FL_OK)
            rc = fl_barrier(comm);
        t0 = fl_now_ns();
        if (rc == FL_OK)
            rc = fl_sparse_allreduce(comm, idx, val, k, out, b->n, FL_SUM, &so, &st);
        m[0] = (double)(fl_now_ns() - t0) / 1e9;
        m[1] = sel;
        m[2] = (double)st.wire_bytes;
        m[3] = (double)st.raw_bytes;
        m[4] = st.dense;
        m[5] = (double)st.k_total;
        if (rc != FL_OK || (rc = all_max(comm, m, 6)) != FL_OK)
            return fail_rc(rc);
        if (rep >= 0) {
            t[rep] = m[0];
            tsel[rep] = m[1];
        }
    }
    if (rank == 0)
        printf("RESULT sparse %.17g %.0f %.9f %.9f %.0f %.0f %d\n", density, m[5],
               bench_median(tsel, b->reps), bench_median(t, b->reps), m[2], m[3], (int)m[4]);
    return FL_OK;
}

static int run_rank(const sp_bench_t *b)
{
    fl_comm_opts_t co;
    fl_comm_opts_init(&co);
    co.rank = b->rank;
    co.world_size = b->world;
    co.coordinator = b->coordinator;
    co.host = b->host;
    co.log_level = FL_LOG_WARN;
    fl_comm_t *comm = NULL;
    int rc = fl_comm_init(&co, &comm);
    if (rc != FL_OK)
        return fail_rc(1);
    double maxd = 0;
    for (int j = 0; j < b->ndens; j++)
        maxd = b->dens[j] > maxd ? b->dens[j] : maxd;
    size_t kcap = (size_t)(maxd * (double)b->n) + 2;
    float *grad = malloc(b->n * sizeof *grad);
    float *buf = malloc(b->n * sizeof *buf);
    uint32_t *idx = malloc(kcap * sizeof *idx);
    float *val = malloc(kcap * sizeof *val);
    fl_cmp_ws_t *ws = NULL;
    if (grad == NULL || buf == NULL || idx == NULL || val == NULL ||
        fl_cmp_ws_create(&ws) != FL_OK) {
        rc = fl_fail(FL_ENOMEM, "rank %d: no memory for %zu floats", b->rank, b->n);
        fail_rc(rc);
    } else {
        /* A seed per rank: different values, so the ranks' top-k index sets differ. */
        bench_fill_gauss(grad, b->n, 1000 + (uint64_t)b->rank);
        rc = time_dense(comm, b, grad, buf, b->rank);
        for (int j = 0; j < b->ndens && rc == FL_OK; j++) {
            rc = time_sparse(comm, b, b->dens[j], ws, grad, buf, idx, val, b->rank);
            fflush(stdout);
        }
    }
    fl_cmp_ws_destroy(&ws);
    free(grad);
    free(buf);
    free(idx);
    free(val);
    fl_comm_destroy(&comm);
    return rc == FL_OK ? 0 : 1;
}

static void on_result(const char *rest, void *ud)
{
    sp_bench_t *b = ud;
    sp_row_t r;
    memset(&r, 0, sizeof r);
    if (sscanf(rest, "dense %lf %lf", &b->dense_s, &b->dense_bytes) == 2)
        return;
    if (sscanf(rest, "sparse %lf %lf %lf %lf %lf %lf %d", &r.density, &r.k_total, &r.select_s,
               &r.time_s, &r.wire_bytes, &r.raw_bytes, &r.dense) != 7)
        return;
    for (int j = 0; j < b->ndens; j++) {
        if (b->dens[j] == r.density) {
            r.have = true;
            b->rows[j] = r;
        }
    }
}

static void fmt_mib(double bytes, char *out, size_t cap)
{
    if (bytes >= 1024.0 * 1024.0)
        snprintf(out, cap, "%.2f MiB", bytes / 1048576.0);
    else
        snprintf(out, cap, "%.1f KiB", bytes / 1024.0);
}

static void print_table(const sp_bench_t *b)
{
    char nstr[32];
    char sz[32];
    char w[32];
    bench_fmt_count(b->n, nstr, sizeof nstr);
    fl_fmt_bytes(b->n * sizeof(float), sz, sizeof sz);
    double ring = b->ranks > 1 ? 2.0 * (b->ranks - 1) / b->ranks * (double)b->n * 4.0 : 0.0;
    printf("\nflodl-bench sparse-allreduce: %d ranks on this machine (%s), n = %s float32 (%s) "
           "per rank, sum, values %s on the wire; median of %d reps, slowest rank\n",
           b->ranks, b->bind ? "rank k on CPU k mod ncpus" : "unbound", nstr, sz,
           fl_dtype_name(b->values), b->reps);
    printf("%-14s %8s %9s %9s | %10s %12s %11s | %9s %11s\n", "path", "density", "k/rank",
           "select ms", "time ms", "sent/rank", "compression", "vs dense", "+select");
    if (b->dense_s > 0) {
        fmt_mib(b->dense_bytes, w, sizeof w);
        printf("%-14s %8s %9s %9s | %10.2f %12s %10.2fx | %8.2fx %11s\n", "dense ring", "-", "-",
               "-", b->dense_s * 1e3, w, b->dense_bytes > 0 ? ring / b->dense_bytes : 0.0, 1.0,
               "-");
    } else {
        printf("%-14s (no result)\n", "dense ring");
    }
    for (int j = 0; j < b->ndens; j++) {
        const sp_row_t *r = &b->rows[j];
        if (!r->have) {
            printf("%-14s %7.2f%% (no result)\n", "sparse", b->dens[j] * 100.0);
            continue;
        }
        fmt_mib(r->wire_bytes, w, sizeof w);
        printf("%-14s %7.2f%% %9.0f %9.2f | %10.2f %12s %10.1fx |",
               r->dense ? "dense fallback" : "sparse", r->density * 100.0, r->k_total / b->ranks,
               r->select_s * 1e3, r->time_s * 1e3, w,
               r->wire_bytes > 0 ? r->raw_bytes / r->wire_bytes : 0.0);
        if (b->dense_s > 0)
            printf(" %8.2fx %10.2fx\n", b->dense_s / r->time_s,
                   b->dense_s / (r->time_s + r->select_s));
        else
            printf(" %9s %11s\n", "-", "-");
    }
    fmt_mib(ring, w, sizeof w);
    printf("sent/rank: bytes the busiest rank sent in one call (communicator counters; the ring's "
           "2(N-1)/N*4n is %s); compression: that over sent/rank;\nvs dense: dense time over "
           "this time (higher is better); +select: the same with the top-k selection added to "
           "the sparse side; path: sparse exchange or the dense fallback\n",
           w);
}

/* The job of ranks, then the table. */
static int launch(sp_bench_t *b)
{
    char *extra[] = {"--n",      (char *)b->n_s,      "--densities", (char *)b->dens_s,
                     "--values", (char *)b->values_s, "--reps",      (char *)b->reps_s};
    fprintf(stderr, "flodl-bench: sparse and dense allreduce, %d ranks...\n", b->ranks);
    int status = bench_run_job("sparse-allreduce", extra, (int)(sizeof extra / sizeof extra[0]),
                               b->ranks, b->bind, on_result, b);
    print_table(b);
    return status;
}

/* A rank of a job the launcher started. */
static int report(const sp_bench_t *b)
{
    if (b->rank < 0 || b->world < 1 || b->coordinator == NULL) {
        fprintf(stderr, "flodl-bench: --report needs --rank, --world-size, --coordinator\n");
        return 2;
    }
    return run_rank(b);
}

int bench_sparse_main(int argc, char **argv);
int bench_sparse_main(int argc, char **argv)
{
    sp_bench_t *b = calloc(1, sizeof *b);
    if (b == NULL)
        return 1;
    b->ranks = 4;
    b->bind = true;
    b->reps = 7;
    b->n = (size_t)16 << 20;
    b->values = FL_FLOAT32;
    b->rank = -1;
    b->world = -1;
    b->dens_s = "0.01,0.001";
    b->n_s = "16M";
    b->values_s = "float32";
    b->reps_s = "7";
    int status = bench_flags_parse(argc, argv, flags, NULL, usage, b);
    if (status < 0 && bench_parse_densities("--densities", b->dens_s, b->dens, &b->ndens) != 0)
        status = 2;
    if (status < 0)
        status = b->report ? report(b) : launch(b);
    free(b);
    return status;
}
