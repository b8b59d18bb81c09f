/* flodl-bench ps: W worker processes push gradients to and pull parameters from the parameter
 * server (sync, plain SGD) for a model of n float32, for each shard count S, beside the dense
 * ring allreduce of the same n floats among the same W processes, measured in the same run.
 * Prints the step time (push + aggregate + update + pull), the aggregate bandwidth of all
 * workers, the ratio to the ring, and the push traffic of top-k sparse pushes. The parameter
 * server (coordinator and shards) runs in this process, the ranks in their own, rank r bound to
 * CPU r mod ncpus. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flodl/comm.h>
#include <flodl/compress.h>
#include <flodl/ps.h>

#include "bench_util.h"
#include "fl_core.h"
#include "fl_ps.h"

typedef struct ps_row {
    int shards;
    double density;    /* 0: dense pushes */
    double step_s;     /* median, rank 0 (sync: every rank waits for the slowest) */
    double push_bytes; /* rank 0's, per step */
    double raw_bytes;  /* what a dense float32 push would send */
    double pull_bytes;
    bool have;
} ps_row_t;

typedef struct ps_bench {
    int ranks;
    bool bind;
    bool report;
    int reps;
    size_t n;
    size_t shards[BENCH_MAX_LIST];
    int nshards;
    double density;
    int sparse_shards;
    /* the flags as given, passed on to the ranks */
    const char *n_s;
    const char *reps_s;
    const char *density_s; /* NULL: no --density (a rank then pushes dense) */
    /* report mode */
    int rank, world;
    const char *coordinator;
    const char *host;
    const char *phase; /* "ring", or the parameter server */
    /* launcher */
    double ring_s;
    ps_row_t rows[BENCH_MAX_LIST + 1];
    int nrows;
    ps_row_t *cur;
} ps_bench_t;

static const char usage[] =
    "usage: flodl-bench ps [--ranks 4] [--n 16M] [--shards 1,2,4] [--density 0.01]\n"
    "                      [--sparse-shards 2] [--reps 7] [--bind core|none]\n"
    "Runs the parameter server (sync, SGD) in this process and N worker processes; each step a\n"
    "worker pushes n float32 gradients and pulls n parameters. Times the step (median of --reps\n"
    "after a warm-up) for each shard count, then top-k pushes at --density, beside the dense\n"
    "ring allreduce of the same n floats among the same ranks. --n counts elements (16M = 64\n"
    "MiB; K/M/G are powers of 1024).\n";

#define AT(f) BENCH_AT(ps_bench_t, f)
static const bench_flag_t flags[] = {
    {.name = "ranks",
     .kind = BENCH_INT,
     .at = AT(ranks),
     .lo = 1,
     .hi = 256,
     .arg = "N",
     .help = "worker processes"},
    {.name = "n",
     .kind = BENCH_SIZE,
     .at = AT(n),
     .lo = 16,
     .hi = 4294967296.0,
     .arg = "COUNT",
     .help = "float32 parameters of the model",
     .given = AT(n_s)},
    {.name = "shards",
     .kind = BENCH_COUNTS,
     .at = AT(shards),
     .count = AT(nshards),
     .lo = 1,
     .hi = 64,
     .arg = "LIST",
     .help = "shard counts of the dense pushes"},
    {.name = "density",
     .kind = BENCH_DOUBLE,
     .at = AT(density),
     .lo = 0,
     .hi = 1,
     .arg = "D",
     .help = "top-k pushes' density (0: none)",
     .given = AT(density_s)},
    {.name = "sparse-shards",
     .kind = BENCH_INT,
     .at = AT(sparse_shards),
     .lo = 0,
     .hi = 64,
     .arg = "S",
     .help = "shards of the top-k pushes (0: none)"},
    {.name = "reps",
     .kind = BENCH_INT,
     .at = AT(reps),
     .lo = 1,
     .hi = 64,
     .arg = "N",
     .help = "timed steps after the warm-up",
     .given = AT(reps_s)},
    BENCH_ROWS_RUN(ps_bench_t),
    BENCH_ROWS_RANK(ps_bench_t),
    {.name = "phase", .kind = BENCH_TEXT, .at = AT(phase)},
    {.name = NULL},
};
#undef AT

static int fail_rc(int rc)
{
    fprintf(stderr, "flodl-bench: %s\n", fl_last_error());
    return rc;
}

/* Rank side, ring phase: the dense allreduce of n floats, median seconds (slowest rank). */
static int rank_ring(const ps_bench_t *b, const float *grad, float *buf)
{
    fl_comm_opts_t co;
    fl_comm_opts_init(&co);
    co.rank = b->rank;
    co.world_size = b->world;
    co.coordinator = b->coordinator;
    co.host = b->host;
    fl_comm_t *comm = NULL;
    int rc = fl_comm_init(&co, &comm);
    if (rc != FL_OK)
        return fail_rc(rc);
    double t[64];
    for (int rep = -1; rep < b->reps && rc == FL_OK; rep++) {
        memcpy(buf, grad, b->n * sizeof *buf);
        rc = fl_barrier(comm);
        int64_t t0 = fl_now_ns();
        if (rc == FL_OK)
            rc = fl_allreduce(comm, buf, buf, b->n, FL_FLOAT32, FL_AVG);
        double s = (double)(fl_now_ns() - t0) / 1e9;
        if (rc == FL_OK)
            rc = fl_allreduce(comm, &s, &s, 1, FL_FLOAT64, FL_MAX);
        if (rep >= 0)
            t[rep] = s;
    }
    if (rc == FL_OK && b->rank == 0)
        printf("RESULT ring %.9f\n", bench_median(t, b->reps));
    fl_comm_destroy(&comm);
    return rc == FL_OK ? FL_OK : fail_rc(rc);
}

/* Rank side, parameter-server phase: push (dense, or top-k at density) and pull, reps times. */
static int rank_ps(const ps_bench_t *b, const float *grad, float *params)
{
    fl_ps_client_opts_t po;
    fl_ps_client_opts_init(&po);
    po.rank = b->rank;
    po.world_size = b->world;
    po.coordinator = b->coordinator;
    po.host = b->host;
    po.param_count = b->n;
    fl_ps_client_t *cl = NULL;
    int rc = fl_ps_client_create(&po, &cl);
    if (rc != FL_OK)
        return fail_rc(rc);
    uint32_t *idx = NULL;
    float *val = NULL;
    fl_ps_grad_t g = {.dense = grad, .batch = 1};
    if (b->density_s != NULL && b->density > 0) {
        fl_cmp_topk_opts_t to;
        fl_cmp_topk_opts_init(&to);
        to.density = b->density;
        size_t kmax = 0;
        fl_cmp_ws_t *ws = NULL;
        if ((rc = fl_cmp_topk_count(b->n, &to, &kmax)) == FL_OK &&
            (rc = fl_cmp_ws_create(&ws)) == FL_OK) {
            idx = malloc(kmax * sizeof *idx);
            val = malloc(kmax * sizeof *val);
            if (idx == NULL || val == NULL)
                rc = fl_fail(FL_ENOMEM, "no memory for %zu pairs", kmax);
            else
                rc = fl_cmp_topk(ws, grad, b->n, &to, idx, val, &g.k);
        }
        fl_cmp_ws_destroy(&ws);
        g.dense = NULL;
        g.idx = idx;
        g.val = val;
    }
    memset(params, 0, b->n * sizeof *params);
    if (rc == FL_OK)
        rc = fl_ps_client_init(cl, params);
    double t[64];
    fl_ps_client_stats_t s0, s1;
    fl_ps_client_get_stats(cl, &s0);
    for (int rep = -1; rep < b->reps && rc == FL_OK; rep++) {
        if (rep == 0)
            fl_ps_client_get_stats(cl, &s0);
        int64_t t0 = fl_now_ns();
        rc = fl_ps_client_push_pull(cl, &g, params);
        if (rep >= 0)
            t[rep] = (double)(fl_now_ns() - t0) / 1e9;
    }
    fl_ps_client_get_stats(cl, &s1);
    if (rc == FL_OK && b->rank == 0)
        printf("RESULT ps %.9f %.0f %.0f %.0f\n", bench_median(t, b->reps),
               (double)(s1.bytes_sent - s0.bytes_sent) / b->reps,
               (double)(s1.raw_bytes - s0.raw_bytes) / b->reps,
               (double)(s1.bytes_recv - s0.bytes_recv) / b->reps);
    free(idx);
    free(val);
    fl_ps_client_destroy(&cl);
    return rc == FL_OK ? FL_OK : fail_rc(rc);
}

static int run_rank(const ps_bench_t *b)
{
    float *grad = malloc(b->n * sizeof *grad);
    float *buf = malloc(b->n * sizeof *buf);
    int rc = FL_ENOMEM;
    if (grad != NULL && buf != NULL) {
        bench_fill_gauss(grad, b->n, 2000 + (uint64_t)b->rank);
        for (size_t i = 0; i < b->n; i++)
            grad[i] *= 1e-3f; /* small steps keep the parameters finite over the reps */
        bool ring = b->phase != NULL && strcmp(b->phase, "ring") == 0;
        rc = ring ? rank_ring(b, grad, buf) : rank_ps(b, grad, buf);
    } else {
        fl_fail(FL_ENOMEM, "rank %d: no memory for %zu floats", b->rank, b->n);
        fail_rc(rc);
    }
    free(grad);
    free(buf);
    return rc == FL_OK ? 0 : 1;
}

static void on_result(const char *rest, void *ud)
{
    ps_bench_t *b = ud;
    ps_row_t *r = b->cur;
    if (sscanf(rest, "ring %lf", &b->ring_s) == 1)
        return;
    if (r != NULL && sscanf(rest, "ps %lf %lf %lf %lf", &r->step_s, &r->push_bytes, &r->raw_bytes,
                            &r->pull_bytes) == 4)
        r->have = true;
}

/* One parameter-server job: a coordinator with S shards and their server here, the ranks in
 * their own processes. */
static int run_ps_job(ps_bench_t *b, ps_row_t *row)
{
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = "tcp://127.0.0.1:0";
    co.world_size = b->ranks;
    co.num_shards = row->shards;
    co.log_level = FL_LOG_WARN;
    fl_coord_t *coord = NULL;
    fl_ps_server_t *srv = NULL;
    int status = 1;
    if (fl_coord_create(&co, &coord) != FL_OK || fl_coord_start(coord) != FL_OK)
        goto out;
    fl_ps_server_opts_t so;
    fl_ps_server_opts_init(&so);
    so.coordinator = fl_coord_endpoint(coord);
    so.host = "127.0.0.1";
    so.num_shards = row->shards;
    so.shard_count = row->shards;
    fl_lr_sched_init(&so.lr, 0.01);
    so.log_level = FL_LOG_WARN;
    if (fl_ps_server_create(&so, &srv) != FL_OK || fl_ps_server_start(srv) != FL_OK)
        goto out;
    char dens[32];
    snprintf(dens, sizeof dens, "%.17g", row->density);
    char *extra[] = {"--n",     (char *)b->n_s, "--reps",    (char *)b->reps_s,
                     "--phase", "ps",           "--density", dens};
    b->cur = row;
    status =
        bench_run_ranks(fl_coord_endpoint(coord), "ps", extra, 8, b->ranks, b->bind, on_result, b);
    b->cur = NULL;
    fl_ps_server_wait(srv, 10000);
out:
    if (status != 0 && coord == NULL)
        fprintf(stderr, "flodl-bench: %s\n", fl_last_error());
    fl_ps_server_stop(srv);
    fl_ps_server_destroy(&srv);
    if (coord != NULL) {
        fl_coord_stop(coord);
        fl_coord_destroy(&coord);
    }
    return status;
}

static void print_table(const ps_bench_t *b)
{
    char nstr[32], sz[32];
    bench_fmt_count(b->n, nstr, sizeof nstr);
    fl_fmt_bytes(b->n * sizeof(float), sz, sizeof sz);
    double model = (double)b->n * 4.0;
    printf("\nflodl-bench ps: %d worker processes on this machine (%s), model n = %s float32 "
           "(%s), sync, SGD; the parameter server in the launcher; median of %d steps after a "
           "warm-up\n",
           b->ranks, b->bind ? "rank k on CPU k mod ncpus" : "unbound", nstr, sz, b->reps);
    printf("%-22s %6s | %9s %13s %9s | %14s %13s\n", "path", "shards", "step ms", "GB/s (all)",
           "vs ring", "pushed/rank", "push traffic");
    if (b->ring_s > 0)
        printf("%-22s %6s | %9.1f %13.2f %9s | %14s %13s\n", "ring allreduce", "-", b->ring_s * 1e3,
               2.0 * (b->ranks - 1) / b->ranks * model * b->ranks / b->ring_s / 1e9, "1.00x", "-",
               "-");
    else
        printf("%-22s (no result)\n", "ring allreduce");
    for (int i = 0; i < b->nrows; i++) {
        const ps_row_t *r = &b->rows[i];
        char name[40];
        if (r->density > 0)
            snprintf(name, sizeof name, "ps top-k %.2g%% push", r->density * 100.0);
        else
            snprintf(name, sizeof name, "ps dense");
        if (!r->have) {
            printf("%-22s %6d | (no result)\n", name, r->shards);
            continue;
        }
        char pushed[32];
        if (r->push_bytes >= 1048576.0)
            snprintf(pushed, sizeof pushed, "%.2f MiB", r->push_bytes / 1048576.0);
        else
            snprintf(pushed, sizeof pushed, "%.1f KiB", r->push_bytes / 1024.0);
        char ratio[16] = "-";
        if (b->ring_s > 0)
            snprintf(ratio, sizeof ratio, "%.2fx", r->step_s / b->ring_s);
        printf("%-22s %6d | %9.1f %13.2f %9s | %14s %12.1fx\n", name, r->shards, r->step_s * 1e3,
               (r->push_bytes + r->pull_bytes) * b->ranks / r->step_s / 1e9, ratio, pushed,
               r->push_bytes > 0 ? r->raw_bytes / r->push_bytes : 0.0);
    }
    printf("GB/s (all): bytes all workers moved per second (ring: 2(N-1)/N of the model each; "
           "ps: push + pull); vs ring: step time over the ring allreduce's (lower is better); "
           "push traffic: dense float32 bytes over the bytes pushed\n");
}

/* A rank of a job the launcher started. */
static int report(const ps_bench_t *b)
{
    if (b->rank < 0 || b->world < 1 || b->coordinator == NULL) {
        fprintf(stderr, "flodl-bench: --report needs --rank, --world-size, --coordinator\n");
        return 2;
    }
    return run_rank(b);
}

/* The ring job, then a parameter-server job per row, then the table. */
static int launch(ps_bench_t *b)
{
    int status = 0;
    fprintf(stderr, "flodl-bench: ring allreduce, %d ranks...\n", b->ranks);
    char *ring_extra[] = {"--n", (char *)b->n_s, "--reps", (char *)b->reps_s, "--phase", "ring"};
    if (bench_run_job("ps", ring_extra, 6, b->ranks, b->bind, on_result, b) != 0)
        status = 1;
    for (int i = 0; i < b->nshards; i++)
        b->rows[b->nrows++] = (ps_row_t){.shards = (int)b->shards[i]};
    if (b->sparse_shards > 0 && b->density > 0)
        b->rows[b->nrows++] = (ps_row_t){.shards = b->sparse_shards, .density = b->density};
    for (int i = 0; i < b->nrows; i++) {
        fprintf(stderr, "flodl-bench: parameter server, %d shards%s...\n", b->rows[i].shards,
                b->rows[i].density > 0 ? ", top-k pushes" : "");
        if (run_ps_job(b, &b->rows[i]) != 0)
            status = 1;
    }
    print_table(b);
    return status;
}

int bench_ps_main(int argc, char **argv);
int bench_ps_main(int argc, char **argv)
{
    ps_bench_t *b = calloc(1, sizeof *b);
    if (b == NULL)
        return 1;
    b->ranks = 4;
    b->bind = true;
    b->reps = 7;
    b->n = (size_t)16 << 20;
    b->n_s = "16M";
    b->reps_s = "7";
    b->density = 0.01;
    b->sparse_shards = 2;
    b->shards[0] = 1, b->shards[1] = 2, b->shards[2] = 4;
    b->nshards = 3;
    b->rank = b->world = -1;
    int status = bench_flags_parse(argc, argv, flags, NULL, usage, b);
    if (status < 0)
        status = b->report ? report(b) : launch(b);
    free(b);
    return status;
}
