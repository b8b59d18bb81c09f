/* flodl-bench train: end-to-end training throughput and time to accuracy. Runs the real
 * binaries (flodl-worker --mode local for 1 worker, flodl-launch --workers N for more) on the
 * built-in dataset, each run bounded in time, and reads their epoch and summary lines: samples/s,
 * the epoch and seconds at which the test accuracy reached the target, bytes each rank sent and
 * the compute/exchange split. Training itself is the worker's; spawning, bench_util.c's; the
 * GPU side (--device cuda|sim) is bench_train_dev.c's. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "fl_core.h"

#define MAX_RUNS (BENCH_MAX_LIST * (BENCH_MAX_LIST + 1))
#define MAX_EXTRA 64
#define TAIL_LINES 6
#define GRACE_MS 15000 /* past flodl-launch's own 10 s from SIGTERM to SIGKILL */

/* One training run: a worker count and an exchange. */
typedef struct tr_run {
    int workers;
    double density; /* 0: dense ring, or no exchange at all with 1 worker */
    int code;       /* exit status; -1 when killed or not started */
    bool timed_out;
    double wall_s;
    /* rank 0's epoch lines */
    int epochs_seen;
    int target_epoch; /* first epoch at or above the target; 0 when never */
    double target_s;
    double final_acc;
    double train_s;
    /* the rank summaries */
    int nsum;
    double sps;      /* the slowest rank's samples/s */
    double sent_mib; /* the busiest rank's bytes, and what dense would have sent from it */
    double raw_mib;
    double compute_ms; /* means over the ranks, per step */
    double comm_ms;
    double exposed_ms;
    char tail[TAIL_LINES][200]; /* the last lines, shown when the run fails */
    int ntail;
} tr_run_t;

typedef struct tr_bench {
    int wlist[BENCH_MAX_LIST];
    int nw;
    double dens[BENCH_MAX_LIST];
    int ndens;
    const char *workers_s; /* the lists as given, parsed once every flag is in */
    const char *dens_s;
    int epochs;
    const char *epochs_s; /* NULL: no --epochs (the device runs pick their own) */
    long batch;           /* 0: the worker's default */
    const char *device;   /* NULL: no --device flag for the workers */
    int cpu_s;
    double target;
    int timeout_s;
    bool verbose;
    const char *layers;
    char *extra[MAX_EXTRA];
    int nextra;
    char extra_buf[1024];   /* --worker-flags as given, for the table's header */
    char extra_words[1024]; /* the same, cut into the words extra[] points into */
    char launch[PATH_MAX];
    char worker[PATH_MAX];
    tr_run_t runs[MAX_RUNS];
    int nruns;
} tr_bench_t;

static const char usage[] =
    "usage: flodl-bench train [--workers 1,2,4] [--densities 0.01,0.001] [--epochs 5]\n"
    "                         [--target 0.93] [--layers 64,256,128,10] [--worker-flags \"...\"]\n"
    "                         [--timeout 600] [--launch PATH] [--worker PATH] [--verbose]\n"
    "                         [--batch-size B] [--device cpu|cuda|sim] [--cpu-seconds 120]\n"
    "Trains on the built-in dataset with the real binaries: 1 worker as flodl-worker --mode\n"
    "local (the baseline), N > 1 as flodl-launch --workers N, once dense and once per top-k\n"
    "density. Reports samples/s (slowest rank), speed-up over 1 worker and over dense, the epoch\n"
    "and seconds at which rank 0's test accuracy first reached --target, the final accuracy,\n"
    "bytes sent per rank, the compression and the compute/exchange split per step.\n"
    "--worker-flags is split at spaces (no quoting) and goes to every worker; --timeout is\n"
    "seconds per run (then the run is stopped). flodl-launch and flodl-worker are looked up\n"
    "next to flodl-bench, then in ../worker/ (the build tree).\n"
    "--device cpu: the runs above with --device cpu (by default no --device flag goes to the\n"
    "workers). --device cuda: flodl-worker --mode local --device cuda against PyTorch on the\n"
    "same GPU (torch_train.py: the same MLP, batch and epochs; default --layers\n"
    "64,4096,4096,4096,10 --batch-size 512 --epochs 2), against flodl-worker --device cpu (1\n"
    "epoch, stopped after --cpu-seconds), and a 2-worker job on the GPU for the communication\n"
    "share. --device sim: the simulated GPU against the CPU, a correctness path (default\n"
    "--layers 64,256,128,10 --batch-size 64 --epochs 1).\n";

static bool is_executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* name in our own directory (installed), else in ../worker/ or ../launch/ (the build tree). */
static int find_binary(const char *name, char *out, size_t cap)
{
    char dir[PATH_MAX];
    bench_self_dir(dir, sizeof dir);
    const char *sub = strcmp(name, "flodl-launch") == 0 ? "launch" : "worker";
    int w = snprintf(out, cap, "%s/%s", dir, name);
    if (w > 0 && (size_t)w < cap && is_executable(out))
        return 0;
    w = snprintf(out, cap, "%s/../%s/%s", dir, sub, name);
    if (w > 0 && (size_t)w < cap && is_executable(out))
        return 0;
    fprintf(stderr, "flodl-bench: cannot find %s in %s or %s/../%s (pass --%s PATH)\n", name, dir,
            dir, sub, sub);
    return -1;
}

static void keep_tail(tr_run_t *r, const char *line)
{
    if (r->ntail == TAIL_LINES) {
        memmove(r->tail[0], r->tail[1], sizeof r->tail[0] * (TAIL_LINES - 1));
        r->ntail--;
    }
    snprintf(r->tail[r->ntail++], sizeof r->tail[0], "%s", line);
}

/* "epoch e/E done: ..." from rank 0 (behind "[rank 0] " under flodl-launch). */
static void parse_epoch(tr_run_t *r, const char *line, double target)
{
    for (const char *p = strstr(line, "epoch "); p != NULL; p = strstr(p + 1, "epoch ")) {
        int e;
        int total;
        double train_loss;
        double test_loss;
        double acc;
        double secs;
        if (sscanf(p,
                   "epoch %d/%d done: train loss %lf, test loss %lf, test accuracy %lf%% (%lf s)",
                   &e, &total, &train_loss, &test_loss, &acc, &secs) != 6)
            continue;
        r->epochs_seen = e;
        r->final_acc = acc / 100.0;
        /* Compared at the printed precision, so that "93.00%" meets a 0.93 target. */
        if (r->target_epoch == 0 && acc + 1e-9 >= target * 100.0) {
            r->target_epoch = e;
            r->target_s = secs;
        }
        return;
    }
}

/* "rank K summary: ..." (worker_main.c's summary()), one per rank. */
static void parse_summary(tr_run_t *r, const char *line)
{
    for (const char *p = strstr(line, "rank "); p != NULL; p = strstr(p + 1, "rank ")) {
        int rank;
        int epochs;
        long steps;
        double acc;
        double loss;
        double secs;
        double sps;
        double comp;
        double comm;
        double exposed;
        double hidden;
        double sent;
        double raw;
        double ratio;
        double remote;
        int n = 0;
        int got = sscanf(p,
                         "rank %d summary: %d epochs, %ld steps, test accuracy %lf%% (loss %lf), "
                         "%lf s, %lf samples/s; per step compute %lf ms, exchange %lf ms "
                         "(exposed %lf ms, %lf%% hidden); %n",
                         &rank, &epochs, &steps, &acc, &loss, &secs, &sps, &comp, &comm, &exposed,
                         &hidden, &n);
        if (got != 11 || n == 0)
            continue;
        if (strncmp(p + n, "nothing exchanged", 17) == 0) {
            sent = raw = ratio = remote = 0.0;
        } else if (sscanf(p + n,
                          "sent %lf MiB (%lf MiB to other hosts), dense would send %lf MiB "
                          "(%lfx less)",
                          &sent, &remote, &raw, &ratio) != 4) {
            continue;
        }
        /* The summary prints MiB to one decimal, too coarse for a sparse rank's few hundred KiB;
         * the ratio keeps three or more digits, so raw over it is the finer figure. */
        double sent_fine = ratio > 0 && sent < 100.0 ? raw / ratio : sent;
        if (r->nsum == 0 || sps < r->sps)
            r->sps = sps;
        if (r->nsum == 0 || sent_fine > r->sent_mib) {
            r->sent_mib = sent_fine;
            r->raw_mib = raw;
        }
        if (rank == 0 || r->train_s == 0)
            r->train_s = secs;
        r->compute_ms += comp;
        r->comm_ms += comm;
        r->exposed_ms += exposed;
        r->nsum++;
        return;
    }
}

typedef struct line_ctx {
    tr_run_t *run;
    double target;
    bool verbose;
} line_ctx_t;

static void on_line(const char *line, void *ud)
{
    line_ctx_t *c = ud;
    if (c->verbose)
        fprintf(stderr, "  %s\n", line);
    keep_tail(c->run, line);
    if (strstr(line, " done: ") != NULL)
        parse_epoch(c->run, line, c->target);
    else if (strstr(line, " summary: ") != NULL)
        parse_summary(c->run, line);
}

static void exchange_name(const tr_run_t *r, char *out, size_t cap)
{
    if (r->workers == 1)
        snprintf(out, cap, "none");
    else if (r->density <= 0)
        snprintf(out, cap, "dense");
    else
        snprintf(out, cap, "top-k %g%%", r->density * 100.0);
}

static void run_one(const tr_bench_t *b, tr_run_t *r)
{
    char nw[16];
    char ep[16];
    char dens[32];
    char batch[24];
    char *argv[20 + MAX_EXTRA];
    int a = 0;
    snprintf(nw, sizeof nw, "%d", r->workers);
    snprintf(ep, sizeof ep, "%d", b->epochs);
    snprintf(dens, sizeof dens, "%.17g", r->density);
    const char *path = r->workers == 1 ? b->worker : b->launch;
    argv[a++] = (char *)path;
    if (r->workers == 1) {
        argv[a++] = "--mode";
        argv[a++] = "local";
    } else {
        argv[a++] = "--workers";
        argv[a++] = nw;
        argv[a++] = "--worker";
        argv[a++] = (char *)b->worker;
        argv[a++] = "--";
    }
    argv[a++] = "--epochs";
    argv[a++] = ep;
    if (b->device != NULL) {
        argv[a++] = "--device";
        argv[a++] = (char *)b->device;
    }
    if (b->batch > 0) {
        snprintf(batch, sizeof batch, "%ld", b->batch);
        argv[a++] = "--batch-size";
        argv[a++] = batch;
    }
    if (r->workers > 1 && r->density > 0) {
        argv[a++] = "--topk";
        argv[a++] = dens;
    }
    if (b->layers != NULL) {
        argv[a++] = "--layers";
        argv[a++] = (char *)b->layers;
    }
    for (int i = 0; i < b->nextra; i++)
        argv[a++] = b->extra[i];
    argv[a] = NULL;

    r->code = -1;
    int64_t t0 = fl_now_ns();
    int64_t deadline = fl_deadline_in(b->timeout_s * 1000);
    int fd;
    pid_t pid = bench_spawn_group(path, argv, &fd);
    if (pid < 0) {
        keep_tail(r, "cannot start the run");
        return;
    }
    line_ctx_t c = {r, b->target, b->verbose};
    r->timed_out =
        bench_read_lines(fd, deadline, on_line, &c) != 0 && fl_deadline_left_ms(deadline) == 0;
    r->code = bench_wait_group(pid, deadline, GRACE_MS);
    r->wall_s = (double)(fl_now_ns() - t0) / 1e9;
    if (r->nsum > 0) {
        r->compute_ms /= r->nsum;
        r->comm_ms /= r->nsum;
        r->exposed_ms /= r->nsum;
    }
}

static bool run_ok(const tr_run_t *r)
{
    return r != NULL && r->code == 0 && r->nsum == r->workers;
}

static const tr_run_t *find_run(const tr_bench_t *b, int workers, double density)
{
    for (int i = 0; i < b->nruns; i++)
        if (b->runs[i].workers == workers && b->runs[i].density == density)
            return &b->runs[i];
    return NULL;
}

static int ncpus(void)
{
    cpu_set_t s;
    if (sched_getaffinity(0, sizeof s, &s) != 0)
        return 1;
    return CPU_COUNT(&s);
}

static void print_ratio(double num, double den, int width)
{
    if (num > 0 && den > 0)
        printf(" %*.2fx", width - 1, num / den);
    else
        printf(" %*s", width, "-");
}

static void print_tables(const tr_bench_t *b)
{
    char ex[32];
    char tcol[32];
    snprintf(tcol, sizeof tcol, "to %g%%", b->target * 100.0);
    printf("\nflodl-bench train: the built-in dataset (60000 train, 10000 test samples),\n"
           "model %s, %d epoch%s, batch %ld per worker\n"
           "(where --worker-flags says nothing else); %d CPUs here%s\n",
           b->layers ? b->layers : "64,256,128,10 (the worker's default)", b->epochs,
           b->epochs == 1 ? "" : "s", b->batch > 0 ? b->batch : 64L, ncpus(),
           b->device ? "; --device cpu" : "");
    if (b->nextra > 0)
        printf("worker flags: %s\n", b->extra_buf);
    const tr_run_t *base = find_run(b, 1, 0);
    printf("%7s %-11s | %10s %8s %8s | %8s %8s %8s | %9s %8s\n", "workers", "exchange", "samples/s",
           "vs 1", "vs dense", tcol, "seconds", "vs dense", "final acc", "train s");
    for (int i = 0; i < b->nruns; i++) {
        const tr_run_t *r = &b->runs[i];
        exchange_name(r, ex, sizeof ex);
        printf("%7d %-11s |", r->workers, ex);
        if (!run_ok(r)) {
            printf(" %s (exit %d)\n", r->timed_out ? "timed out" : "failed", r->code);
            continue;
        }
        const tr_run_t *dense = r->density > 0 ? find_run(b, r->workers, 0) : NULL;
        if (!run_ok(dense))
            dense = NULL;
        printf(" %10.0f", r->sps);
        print_ratio(r->sps, run_ok(base) ? base->sps : 0, 8);
        print_ratio(r->sps, dense ? dense->sps : 0, 8);
        printf(" |");
        if (r->target_epoch > 0)
            printf(" %8d %8.1f", r->target_epoch, r->target_s);
        else
            printf(" %8s %8s", "never", "-");
        /* Time to target, dense over top-k: above 1 when top-k gets there sooner. */
        print_ratio(dense && dense->target_epoch > 0 ? dense->target_s : 0,
                    r->target_epoch > 0 ? r->target_s : 0, 8);
        printf(" | %8.2f%% %8.1f\n", 100.0 * r->final_acc, r->train_s);
    }
    printf("\n%7s %-11s | %12s %11s | %10s %11s %10s %10s\n", "workers", "exchange", "sent/rank",
           "compression", "compute ms", "exchange ms", "exposed ms", "comm share");
    for (int i = 0; i < b->nruns; i++) {
        const tr_run_t *r = &b->runs[i];
        if (!run_ok(r))
            continue;
        exchange_name(r, ex, sizeof ex);
        double step = r->compute_ms + r->exposed_ms;
        printf("%7d %-11s |", r->workers, ex);
        if (r->workers == 1)
            printf(" %12s %11s |", "-", "-");
        else
            printf(" %8.2f MiB %10.1fx |", r->sent_mib,
                   r->sent_mib > 0 ? r->raw_mib / r->sent_mib : 0.0);
        printf(" %10.2f %11.2f %10.2f %9.1f%%\n", r->compute_ms, r->comm_ms, r->exposed_ms,
               step > 0 ? 100.0 * r->exposed_ms / step : 0.0);
    }
    printf("samples/s: the slowest rank's (global batch x steps / training seconds);\n"
           "vs 1: over the 1-worker run; vs dense: top-k over dense at the same worker count,\n"
           "for the seconds to the target dense over top-k (above 1: top-k is better);\n"
           "to %g%%: the first epoch whose test accuracy (rank 0) reached it, and the seconds\n"
           "from the start of training then (rendezvous and data loading not counted);\n"
           "sent/rank: the busiest rank's bytes over the run; compression: what dense would\n"
           "have sent over that; per step, means over ranks: compute, exchange busy time\n"
           "(overlapping compute), exposed (waited for); comm share: exposed / (compute +\n"
           "exposed).\n",
           b->target * 100.0);
    int cpus = ncpus();
    int maxw = 0;
    for (int i = 0; i < b->nw; i++)
        maxw = b->wlist[i] > maxw ? b->wlist[i] : maxw;
    if (maxw > cpus)
        printf("note: %d workers share %d CPUs here (flodl-launch pins rank k to CPU k mod %d),\n"
               "so samples/s cannot scale past %d workers on this machine.\n",
               maxw, cpus, cpus, cpus);
}

/* Where the GPU figures come from. */
static void gpu_part(void)
{
    char desc[256];
    fl_gpu_describe(desc, sizeof desc);
    if (fl_gpu_available())
        printf("GPU: %s: flodl-bench train --device cuda gives the GPU figures (against PyTorch, "
               "against the CPU, the communication share).\n",
               desc);
    else
        printf("GPU: none here (%s); flodl-bench train --device cuda needs one.\n", desc);
}

int bench_train_dev(const char *device, const char *worker, const char *launch, const char *layers,
                    long batch, int epochs, int timeout_s, int cpu_s, char *const extra[],
                    int nextra, bool verbose);

static int parse_workers(const char *s, tr_bench_t *b)
{
    size_t v[BENCH_MAX_LIST];
    int n = 0;
    if (bench_parse_counts("--workers", s, 1, 256, v, &n) != 0)
        return -1;
    b->nw = n;
    for (int i = 0; i < n; i++)
        b->wlist[i] = (int)v[i];
    return 0;
}

static int split_extra(void *p, const char *s)
{
    tr_bench_t *b = p;
    if (strlen(s) >= sizeof b->extra_buf)
        return fl_fail(FL_EINVAL, "--worker-flags: too long");
    snprintf(b->extra_buf, sizeof b->extra_buf, "%s", s);
    snprintf(b->extra_words, sizeof b->extra_words, "%s", s);
    char *save = NULL;
    b->nextra = 0;
    for (char *t = strtok_r(b->extra_words, " \t", &save); t != NULL;
         t = strtok_r(NULL, " \t", &save)) {
        if (b->nextra == MAX_EXTRA)
            return fl_fail(FL_EINVAL, "--worker-flags: more than %d words", MAX_EXTRA);
        b->extra[b->nextra++] = t;
    }
    return FL_OK;
}

static int set_target(void *p, const char *v)
{
    tr_bench_t *b = p;
    char *end = NULL;
    b->target = strtod(v, &end);
    if (end == v || *end != '\0' || !(b->target > 0.0 && b->target <= 1.0))
        return fl_fail(FL_EINVAL, "--target: '%s' is not an accuracy in (0, 1]", v);
    return FL_OK;
}

static int set_binary(const char *flag, const char *v, char *out)
{
    snprintf(out, PATH_MAX, "%s", v);
    if (!is_executable(v))
        return fl_fail(FL_EINVAL, "--%s: '%s' is not an executable file", flag, v);
    return FL_OK;
}

static int set_launch(void *p, const char *v)
{
    return set_binary("launch", v, ((tr_bench_t *)p)->launch);
}

static int set_worker(void *p, const char *v)
{
    return set_binary("worker", v, ((tr_bench_t *)p)->worker);
}

#define AT(f) BENCH_AT(tr_bench_t, f)
static const bench_flag_t flags[] = {
    {.name = "workers",
     .kind = BENCH_TEXT,
     .at = AT(workers_s),
     .arg = "LIST",
     .help = "worker counts, each 1..256"},
    {.name = "densities",
     .kind = BENCH_TEXT,
     .at = AT(dens_s),
     .arg = "LIST",
     .help = "top-k densities, each in (0, 1]"},
    {.name = "epochs",
     .kind = BENCH_INT,
     .at = AT(epochs),
     .lo = 1,
     .hi = 10000,
     .arg = "E",
     .help = "epochs per run",
     .given = AT(epochs_s)},
    {.name = "target",
     .kind = BENCH_CALL,
     .set = set_target,
     .arg = "ACC",
     .help = "test accuracy to reach, in (0, 1]",
     .def = "0.93"},
    {.name = "layers",
     .kind = BENCH_TEXT,
     .at = AT(layers),
     .arg = "LIST",
     .help = "the MLP's widths",
     .def = "the worker's"},
    {.name = "worker-flags",
     .kind = BENCH_CALL,
     .set = split_extra,
     .arg = "\"...\"",
     .help = "more flags for every worker, split at spaces"},
    {.name = "timeout",
     .kind = BENCH_INT,
     .at = AT(timeout_s),
     .lo = 1,
     .hi = 86400,
     .arg = "S",
     .help = "seconds per run"},
    {.name = "launch",
     .kind = BENCH_CALL,
     .set = set_launch,
     .arg = "PATH",
     .help = "flodl-launch",
     .def = "beside flodl-bench"},
    {.name = "worker",
     .kind = BENCH_CALL,
     .set = set_worker,
     .arg = "PATH",
     .help = "flodl-worker",
     .def = "beside flodl-bench"},
    {.name = "verbose",
     .kind = BENCH_SWITCH,
     .at = AT(verbose),
     .help = "every line of the runs to stderr"},
    {.name = "batch-size",
     .kind = BENCH_LONG,
     .at = AT(batch),
     .lo = 1,
     .hi = 1 << 20,
     .arg = "B",
     .help = "batch per worker",
     .def = "the worker's"},
    {.name = "device",
     .kind = BENCH_WORD,
     .at = AT(device),
     .words = "cpu|cuda|sim",
     .help = "the workers' device",
     .def = "no --device flag"},
    {.name = "cpu-seconds",
     .kind = BENCH_INT,
     .at = AT(cpu_s),
     .lo = 1,
     .hi = 86400,
     .arg = "S",
     .help = "--device cuda: the CPU run's cap"},
    {.name = NULL},
};
#undef AT

/* The lists, then the binaries: 0, or -1 after printing what is wrong. */
static int prepare(tr_bench_t *b)
{
    if (parse_workers(b->workers_s, b) != 0 ||
        bench_parse_densities("--densities", b->dens_s, b->dens, &b->ndens) != 0)
        return -1;
    if (b->worker[0] == '\0' && find_binary("flodl-worker", b->worker, sizeof b->worker) != 0)
        return -1;
    if (b->launch[0] == '\0' && find_binary("flodl-launch", b->launch, sizeof b->launch) != 0)
        return -1;
    return 0;
}

/* Every run, one after the other; stops early once the worker refuses the flags. */
static int run_all(tr_bench_t *b)
{
    for (int i = 0; i < b->nw; i++) {
        int w = b->wlist[i];
        if (find_run(b, w, 0) != NULL)
            continue; /* a worker count listed twice */
        b->runs[b->nruns++] = (tr_run_t){.workers = w};
        for (int j = 0; w > 1 && j < b->ndens; j++)
            b->runs[b->nruns++] = (tr_run_t){.workers = w, .density = b->dens[j]};
    }
    int status = 0;
    for (int i = 0; i < b->nruns; i++) {
        tr_run_t *r = &b->runs[i];
        char ex[32];
        exchange_name(r, ex, sizeof ex);
        fprintf(stderr, "flodl-bench train: [%d/%d] %d worker%s, exchange %s, %d epochs...\n",
                i + 1, b->nruns, r->workers, r->workers > 1 ? "s" : "", ex, b->epochs);
        run_one(b, r);
        if (run_ok(r)) {
            fprintf(stderr, "  %.0f samples/s, %.2f%% after %d epochs, %.1f s wall\n", r->sps,
                    100.0 * r->final_acc, r->epochs_seen, r->wall_s);
            continue;
        }
        status = 1;
        fprintf(stderr, "  %s (exit %d, %d of %d summaries) after %.1f s; last lines:\n",
                r->timed_out ? "timed out" : "failed", r->code, r->nsum, r->workers, r->wall_s);
        for (int k = 0; k < r->ntail; k++)
            fprintf(stderr, "    %s\n", r->tail[k]);
        /* Every run gets the same flags: once the worker refuses them, the rest would too. */
        if (r->workers == 1 && r->code == 2) {
            b->nruns = i + 1;
            break;
        }
    }
    return status;
}

int bench_train_main(int argc, char **argv);
int bench_train_main(int argc, char **argv)
{
    tr_bench_t *b = calloc(1, sizeof *b);
    if (b == NULL)
        return 1;
    b->epochs = 5;
    b->target = 0.93;
    b->timeout_s = 600;
    b->cpu_s = 120;
    b->workers_s = "1,2,4";
    b->dens_s = "0.01,0.001";
    int status = bench_flags_parse(argc, argv, flags, NULL, usage, b);
    if (status < 0 && prepare(b) != 0)
        status = 2;
    if (status >= 0)
        goto out;
    if (b->device != NULL && strcmp(b->device, "cpu") != 0) {
        status = bench_train_dev(b->device, b->worker, b->launch, b->layers, b->batch,
                                 b->epochs_s != NULL ? b->epochs : 0, b->timeout_s, b->cpu_s,
                                 b->extra, b->nextra, b->verbose);
        goto out;
    }
    status = run_all(b);
    print_tables(b);
    gpu_part();
out:
    free(b);
    return status;
}
