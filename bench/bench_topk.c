/* flodl-bench topk: selection throughput of fl_cmp_topk on one thread (exact mode, and DGC's
 * sampled mode beside it) over float32 N(0,1) data, against one memcpy of the same buffer and,
 * in the same invocation, torch.topk on the CPU with one thread (bench/torch_topk.py, run with
 * /usr/bin/python3 when torch imports). Prints the table and whether the targets hold:
 * at least 10x torch.topk, and within 3x of one memcpy pass, at n = 50M, d = 1%. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <flodl/compress.h>

#include "bench_util.h"
#include "fl_core.h"

#define PYTHON "/usr/bin/python3"
#define TORCH_SCRIPT "torch_topk.py"
#define TARGET_N ((size_t)50 << 20)
#define TARGET_D 0.01
#define TARGET_SPEEDUP 10.0
#define TARGET_MEMCPY 3.0

typedef struct topk_row {
    size_t n;
    double density;
    size_t k;
    double exact_s;
    double sampled_s;
    size_t sampled_k; /* what the sampled mode achieved in its last repetition */
    double memcpy_s;
    double torch_s; /* -1: not measured */
} topk_row_t;

typedef struct topk_bench {
    size_t sizes[BENCH_MAX_LIST];
    int nsizes;
    double dens[BENCH_MAX_LIST];
    int ndens;
    int reps;
    bool no_torch;
    topk_row_t rows[BENCH_MAX_LIST * BENCH_MAX_LIST];
    int nrows;
    char torch_version[64];
} topk_bench_t;

static const char usage[] =
    "usage: flodl-bench topk [--sizes 1M,10M,50M] [--densities 0.01,0.001] [--reps 7]\n"
    "                        [--no-torch]\n"
    "Top-k by magnitude of n float32 N(0,1) entries on one thread: fl_cmp_topk exact (and\n"
    "sampled) mode, median of --reps after a warm-up, beside one memcpy of the same buffer and\n"
    "torch.topk on the CPU with one thread (" PYTHON " with torch; --no-torch skips it).\n"
    "Sizes count elements (K/M/G are powers of 1024); k = ceil(density * n).\n";

#define AT(f) BENCH_AT(topk_bench_t, f)
static const bench_flag_t flags[] = {
    {.name = "sizes",
     .kind = BENCH_COUNTS,
     .at = AT(sizes),
     .count = AT(nsizes),
     .lo = 1,
     .hi = UINT32_MAX,
     .arg = "LIST",
     .help = "element counts"},
    {.name = "densities",
     .kind = BENCH_DENSITIES,
     .at = AT(dens),
     .count = AT(ndens),
     .arg = "LIST",
     .help = "top-k densities"},
    {.name = "reps",
     .kind = BENCH_INT,
     .at = AT(reps),
     .lo = 1,
     .hi = 64,
     .arg = "N",
     .help = "timed selections after the warm-up"},
    {.name = "no-torch", .kind = BENCH_SWITCH, .at = AT(no_torch), .help = "without torch.topk"},
    {.name = NULL},
};
#undef AT

static double seconds_since(int64_t t0)
{
    return (double)(fl_now_ns() - t0) / 1e9;
}

/* Median time of one memcpy of n floats. The copy goes through a volatile function pointer and
 * its destination is read afterwards, so the compiler can neither drop nor shorten it. */
static double time_memcpy(float *dst, const float *src, size_t n, int reps)
{
    void *(*volatile copy)(void *, const void *, size_t) = memcpy;
    volatile float sink = 0.0f;
    double t[64];
    for (int rep = -1; rep < reps; rep++) { /* rep -1 warms up (and faults dst in) */
        int64_t t0 = fl_now_ns();
        copy(dst, src, n * sizeof *src);
        double s = seconds_since(t0);
        sink += dst[(size_t)(rep + 1) % n];
        if (rep >= 0)
            t[rep] = s;
    }
    (void)sink;
    return bench_median(t, reps);
}

/* Median time of fl_cmp_topk in the given mode; *k_got is the count of the last call. */
static int time_topk(fl_cmp_ws_t *ws, const float *x, size_t n, double density,
                     fl_cmp_select_t mode, int reps, uint32_t *idx, float *val, double *med,
                     size_t *k_got)
{
    fl_cmp_topk_opts_t o;
    fl_cmp_topk_opts_init(&o);
    o.density = density;
    o.mode = mode;
    double t[64];
    for (int rep = -1; rep < reps; rep++) { /* rep -1 warms up (and grows the workspace) */
        int64_t t0 = fl_now_ns();
        int rc = fl_cmp_topk(ws, x, n, &o, idx, val, k_got);
        double s = seconds_since(t0);
        if (rc != FL_OK) {
            fprintf(stderr, "flodl-bench: fl_cmp_topk: %s\n", fl_last_error());
            return 1;
        }
        if (rep >= 0)
            t[rep] = s;
    }
    *med = bench_median(t, reps);
    return 0;
}

static int measure_flodl(topk_bench_t *b)
{
    size_t maxn = 0;
    double maxd = 0;
    for (int i = 0; i < b->nsizes; i++)
        maxn = b->sizes[i] > maxn ? b->sizes[i] : maxn;
    for (int j = 0; j < b->ndens; j++)
        maxd = b->dens[j] > maxd ? b->dens[j] : maxd;
    size_t maxk = (size_t)ceil(maxd * (double)maxn) + 1;
    float *x = NULL;
    float *dst = NULL;
    uint32_t *idx = malloc(maxk * sizeof *idx);
    float *val = malloc(maxk * sizeof *val);
    fl_cmp_ws_t *ws = NULL;
    int status = 1;
    if (posix_memalign((void **)&x, 64, maxn * sizeof *x) != 0 ||
        posix_memalign((void **)&dst, 64, maxn * sizeof *dst) != 0 || idx == NULL || val == NULL ||
        fl_cmp_ws_create(&ws) != FL_OK) {
        fprintf(stderr, "flodl-bench: no memory for %zu floats\n", maxn);
        goto out;
    }
    /* Smaller sizes select from a prefix of the same data: the same distribution. */
    bench_fill_gauss(x, maxn, 1);
    b->nrows = 0;
    for (int i = 0; i < b->nsizes; i++) {
        size_t n = b->sizes[i];
        double mc = time_memcpy(dst, x, n, b->reps);
        for (int j = 0; j < b->ndens; j++) {
            topk_row_t *r = &b->rows[b->nrows++];
            fl_cmp_topk_opts_t o;
            fl_cmp_topk_opts_init(&o);
            o.density = b->dens[j];
            memset(r, 0, sizeof *r);
            r->n = n;
            r->density = b->dens[j];
            r->memcpy_s = mc;
            r->torch_s = -1;
            size_t kx;
            if (fl_cmp_topk_count(n, &o, &r->k) != FL_OK ||
                time_topk(ws, x, n, r->density, FL_CMP_EXACT, b->reps, idx, val, &r->exact_s,
                          &kx) != 0 ||
                time_topk(ws, x, n, r->density, FL_CMP_SAMPLED, b->reps, idx, val, &r->sampled_s,
                          &r->sampled_k) != 0)
                goto out;
        }
    }
    status = 0;
out:
    fl_cmp_ws_destroy(&ws);
    free(x);
    free(dst);
    free(idx);
    free(val);
    return status;
}

/* "torch VERSION" or "N K SECONDS" from torch_topk.py. */
static void on_torch_result(const char *rest, void *ud)
{
    topk_bench_t *b = ud;
    unsigned long long n;
    unsigned long long k;
    double s;
    if (strncmp(rest, "torch ", 6) == 0) {
        snprintf(b->torch_version, sizeof b->torch_version, "%s", rest + 6);
        b->torch_version[strcspn(b->torch_version, "\r\n")] = '\0';
    } else if (sscanf(rest, "%llu %llu %lf", &n, &k, &s) == 3) {
        for (int i = 0; i < b->nrows; i++)
            if (b->rows[i].n == (size_t)n && b->rows[i].k == (size_t)k)
                b->rows[i].torch_s = s;
    }
}

static bool torch_importable(void)
{
    char *argv[] = {PYTHON, "-c",
                    "import sys\ntry:\n    import torch\nexcept Exception:\n    sys.exit(3)\n",
                    NULL};
    int fd;
    if (access(PYTHON, X_OK) != 0)
        return false;
    pid_t pid = bench_spawn(argv, &fd, NULL);
    if (pid < 0)
        return false;
    close(fd);
    return bench_wait(pid, 120000) == 0;
}

/* The script sits beside the binary in the build tree, or in share/flodl once installed. */
static int find_script(char *out, size_t cap)
{
    char dir[1024];
    bench_self_dir(dir, sizeof dir);
    snprintf(out, cap, "%s/%s", dir, TORCH_SCRIPT);
    if (access(out, R_OK) == 0)
        return 0;
    snprintf(out, cap, "%s/../share/flodl/%s", dir, TORCH_SCRIPT);
    return access(out, R_OK) == 0 ? 0 : -1;
}

static void join_counts(char *out, size_t cap, const size_t *v, int n)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%zu", i ? "," : "", v[i]);
}

static void join_densities(char *out, size_t cap, const double *v, int n)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%.17g", i ? "," : "", v[i]);
}

static void measure_torch(topk_bench_t *b)
{
    char script[1200];
    if (find_script(script, sizeof script) != 0) {
        printf("torch.topk: skipped: no %s beside the binary or in ../share/flodl\n", TORCH_SCRIPT);
        return;
    }
    if (!torch_importable()) {
        printf("torch.topk: skipped: '" PYTHON " -c \"import torch\"' fails (scripts/"
               "install-deps.sh bench installs python3-torch)\n");
        return;
    }
    char sizes[BENCH_MAX_LIST * 24];
    char dens[BENCH_MAX_LIST * 28];
    char reps[16];
    join_counts(sizes, sizeof sizes, b->sizes, b->nsizes);
    join_densities(dens, sizeof dens, b->dens, b->ndens);
    snprintf(reps, sizeof reps, "%d", b->reps);
    char *argv[] = {PYTHON, script, sizes, dens, reps, NULL};
    int fd;
    pid_t pid = bench_spawn(argv, &fd, NULL);
    if (pid < 0) {
        fprintf(stderr, "flodl-bench: cannot run " PYTHON "\n");
        return;
    }
    bench_read_tagged(fd, on_torch_result, b);
    if (bench_wait(pid, 1800000) != 0)
        fprintf(stderr, "flodl-bench: %s failed; its column may be incomplete\n", script);
}

static void print_table(const topk_bench_t *b)
{
    printf("\nflodl-bench topk: fl_cmp_topk on one thread, float32 N(0,1), k = ceil(d*n); "
           "median of %d reps after a warm-up\n",
           b->reps);
    if (b->torch_version[0] != '\0')
        printf("torch.topk: torch %s on the CPU, set_num_threads(1), topk(x.abs(), k, "
               "sorted=False) and x[idx]; speed-up = torch time / flodl exact time\n",
               b->torch_version);
    printf("%6s %8s %8s | %9s %8s %7s %9s | %10s %6s | %9s | %9s %8s\n", "n", "density", "k",
           "exact ms", "Melem/s", "GB/s", "x memcpy", "sampled ms", "k got", "memcpy ms",
           "torch ms", "speed-up");
    for (int i = 0; i < b->nrows; i++) {
        const topk_row_t *r = &b->rows[i];
        char ns[32];
        bench_fmt_count(r->n, ns, sizeof ns);
        printf("%6s %7.2f%% %8zu | %9.3f %8.1f %7.2f %8.2fx | %10.3f %5.1f%% | %9.3f |", ns,
               r->density * 100.0, r->k, r->exact_s * 1e3, (double)r->n / r->exact_s / 1e6,
               (double)r->n * sizeof(float) / r->exact_s / 1e9, r->exact_s / r->memcpy_s,
               r->sampled_s * 1e3, 100.0 * (double)r->sampled_k / (double)r->k, r->memcpy_s * 1e3);
        if (r->torch_s > 0)
            printf(" %9.3f %7.1fx\n", r->torch_s * 1e3, r->torch_s / r->exact_s);
        else
            printf(" %9s %8s\n", "-", "-");
    }
    printf("GB/s: gradient bytes read (4n) per second; x memcpy: exact time over one memcpy of "
           "the 4n bytes; k got: entries the sampled mode returned, of k\n");

    const topk_row_t *t = NULL;
    for (int i = 0; i < b->nrows; i++)
        if (b->rows[i].n == TARGET_N && fabs(b->rows[i].density - TARGET_D) < 1e-12)
            t = &b->rows[i];
    if (t == NULL) {
        printf("targets (n = 50M, d = 1%%): not measured in this run (needs --sizes with 50M "
               "and --densities with 0.01)\n");
        return;
    }
    if (t->torch_s > 0)
        printf("target: >= %.0fx torch.topk at n = 50M, d = 1%%: %.1fx: %s\n", TARGET_SPEEDUP,
               t->torch_s / t->exact_s,
               t->torch_s / t->exact_s >= TARGET_SPEEDUP ? "holds" : "MISSED");
    else
        printf("target: >= %.0fx torch.topk at n = 50M, d = 1%%: not measured (no torch)\n",
               TARGET_SPEEDUP);
    printf("target: within %.0fx of one memcpy pass at n = 50M, d = 1%%: %.2fx one memcpy pass: "
           "%s\n",
           TARGET_MEMCPY, t->exact_s / t->memcpy_s,
           t->exact_s / t->memcpy_s <= TARGET_MEMCPY ? "holds" : "MISSED");
}

int bench_topk_main(int argc, char **argv);
int bench_topk_main(int argc, char **argv)
{
    topk_bench_t *b = calloc(1, sizeof *b);
    if (b == NULL)
        return 1;
    b->reps = 7;
    int status = 2;
    if (bench_parse_counts("--sizes", "1M,10M,50M", 1, UINT32_MAX, b->sizes, &b->nsizes) != 0 ||
        bench_parse_densities("--densities", "0.01,0.001", b->dens, &b->ndens) != 0)
        goto out;
    if ((status = bench_flags_parse(argc, argv, flags, NULL, usage, b)) >= 0)
        goto out;
    fprintf(stderr, "flodl-bench: fl_cmp_topk and memcpy, one thread...\n");
    status = measure_flodl(b);
    if (status == 0 && !b->no_torch) {
        fprintf(stderr, "flodl-bench: torch.topk, one thread...\n");
        measure_torch(b);
    }
    if (status == 0)
        print_table(b);
out:
    free(b);
    return status;
}
