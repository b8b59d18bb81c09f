/* flodl-bench train --device cuda|sim: training on a device, beside PyTorch on the same GPU.
 * cuda: flodl-worker --mode local --device cuda, bench/torch_train.py with the same MLP, batch
 * and epochs on random data of the built-in dataset's shape, flodl-worker --device cpu (capped:
 * 1 epoch, stopped after --cpu-seconds), and a 2-worker flodl-launch job on the GPU for the
 * communication share. sim: the simulated GPU against the CPU (the correctness path; its speed
 * says nothing about a GPU). Flags arrive resolved from bench_train.c; spawning is
 * bench_util.c's. */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "fl_core.h"

#define DV_TAIL 6
#define DV_GRACE_MS 15000 /* past flodl-launch's own 10 s from SIGTERM to SIGKILL */
#define DV_MAX_ARGS 96
#define TORCH_SCRIPT "torch_train.py"

/* One spawned run and what its lines said. */
typedef struct dv_run {
    int code;     /* exit status; -1 when stopped, killed or not started */
    bool stopped; /* its deadline passed */
    double wall_s;
    long params;       /* "N parameters" in the worker's training line */
    int nsum;          /* rank summaries */
    double sps;        /* the slowest rank's samples/s */
    double acc;        /* rank 0's test accuracy, or -1 */
    double compute_ms; /* means over the ranks, per step */
    double comm_ms;
    double exposed_ms;
    double progress_sps; /* the last progress line's samples/s (rank 0) */
    long progress_step;
    char torch[64]; /* torch_train.py's RESULT lines */
    double torch_sps;
    char tail[DV_TAIL][200];
    int ntail;
} dv_run_t;

typedef struct dv_args {
    const char *device;
    const char *worker;
    const char *launch;
    const char *layers;
    char batch[24];
    char epochs[16];
    int timeout_s;
    int cpu_s;
    char *const *extra;
    int nextra;
    bool verbose;
} dv_args_t;

static void keep_tail(dv_run_t *r, const char *line)
{
    if (r->ntail == DV_TAIL) {
        memmove(r->tail[0], r->tail[1], sizeof r->tail[0] * (DV_TAIL - 1));
        r->ntail--;
    }
    snprintf(r->tail[r->ntail++], sizeof r->tail[0], "%s", line);
}

/* The start of the comma-separated field that ends at end ("..., 0.5 s, 109265 samples/s"). */
static const char *field_start(const char *line, const char *end)
{
    for (const char *p = end; p > line + 1; p--)
        if (p[-2] == ',' && p[-1] == ' ')
            return p;
    return line;
}

/* "rank K summary: ..., test accuracy A% (loss L), S s, X samples/s; per step compute C ms,
 * exchange E ms (exposed X ms, ...)" (worker_main.c's summary()). Rank 0 may print "test
 * accuracy on rank 0" instead of a figure, so the timing part is found from its own words. */
static void parse_summary(dv_run_t *r, const char *line)
{
    const char *s = strstr(line, " summary: ");
    const char *q = s ? strstr(s, " samples/s; per step compute ") : NULL;
    if (q == NULL)
        return;
    const char *secs = field_start(line, field_start(line, q) - 2);
    double t;
    double sps;
    double comp;
    double comm;
    double exposed;
    if (sscanf(secs, "%lf s, %lf samples/s; per step compute %lf ms, exchange %lf ms (exposed %lf",
               &t, &sps, &comp, &comm, &exposed) != 5)
        return;
    int rank = -1;
    const char *rk = strstr(line, "rank ");
    if (rk != NULL && rk < s)
        sscanf(rk, "rank %d", &rank);
    const char *a = strstr(s, "test accuracy ");
    double acc;
    if (rank == 0 && a != NULL && sscanf(a, "test accuracy %lf%%", &acc) == 1)
        r->acc = acc / 100.0;
    if (r->nsum == 0 || sps < r->sps)
        r->sps = sps;
    r->compute_ms += comp;
    r->comm_ms += comm;
    r->exposed_ms += exposed;
    r->nsum++;
}

/* A progress line: "epoch E/N step S/T (P% ETA ...) loss L acc A% X samples/s ..." (the part
 * in brackets is optional: older workers printed none). */
static void parse_progress(dv_run_t *r, const char *p)
{
    const char *st = strstr(p, " step ");
    const char *sp = strstr(p, " samples/s");
    long step;
    if (st == NULL || sp == NULL || sscanf(st, " step %ld", &step) != 1)
        return;
    const char *num = sp;
    while (num > p && num[-1] != ' ')
        num--;
    char *end;
    double sps = strtod(num, &end);
    if (end != sp || sps <= 0)
        return;
    r->progress_sps = sps;
    r->progress_step = step;
}

static void on_line(const char *line, void *ud)
{
    dv_run_t *r = ud;
    const char *p;
    keep_tail(r, line);
    if ((p = strstr(line, "RESULT ")) == line) {
        if (sscanf(line, "RESULT samples_per_s %lf", &r->torch_sps) == 1)
            return;
        if (strncmp(line, "RESULT torch ", 13) == 0)
            snprintf(r->torch, sizeof r->torch, "%s", line + 13);
        return;
    }
    if (strstr(line, " summary: ") != NULL) {
        parse_summary(r, line);
    } else if ((p = strstr(line, "training: ")) != NULL && (p = strstr(p, " parameters")) != NULL) {
        r->params = strtol(field_start(line, p), NULL, 10);
    } else if ((p = strstr(line, "epoch ")) != NULL && strstr(line, " step ") != NULL) {
        parse_progress(r, p);
    }
}

typedef struct dv_line {
    dv_run_t *run;
    bool verbose;
} dv_line_t;

static void on_line_v(const char *line, void *ud)
{
    dv_line_t *c = ud;
    if (c->verbose)
        fprintf(stderr, "  %s\n", line);
    on_line(line, c->run);
}

/* Runs argv (argv[0] the path) until it ends or limit_s passes, then stops its group. */
static void run_cmd(dv_run_t *r, char **argv, int limit_s, bool verbose)
{
    memset(r, 0, sizeof *r);
    r->acc = -1;
    r->code = -1;
    int64_t t0 = fl_now_ns();
    int64_t deadline = fl_deadline_in(limit_s * 1000);
    int fd;
    pid_t pid = bench_spawn_group(argv[0], argv, &fd);
    if (pid < 0) {
        keep_tail(r, "cannot start the run");
        return;
    }
    dv_line_t c = {r, verbose};
    r->stopped =
        bench_read_lines(fd, deadline, on_line_v, &c) != 0 && fl_deadline_left_ms(deadline) == 0;
    r->code = bench_wait_group(pid, deadline, DV_GRACE_MS);
    r->wall_s = (double)(fl_now_ns() - t0) / 1e9;
    if (r->nsum > 0) {
        r->compute_ms /= r->nsum;
        r->comm_ms /= r->nsum;
        r->exposed_ms /= r->nsum;
    }
}

static void print_failure(const char *what, const dv_run_t *r)
{
    fprintf(stderr, "  %s: %s (exit %d) after %.1f s; last lines:\n", what,
            r->stopped ? "timed out" : "failed", r->code, r->wall_s);
    for (int k = 0; k < r->ntail; k++)
        fprintf(stderr, "    %s\n", r->tail[k]);
}

/* The worker's flags for one device: --mode local, the model and the extra flags. */
static void worker_argv(const dv_args_t *a, const char *device, const char *epochs, char **argv,
                        int *n)
{
    int k = *n;
    argv[k++] = "--device";
    argv[k++] = (char *)device;
    argv[k++] = "--layers";
    argv[k++] = (char *)a->layers;
    argv[k++] = "--batch-size";
    argv[k++] = (char *)a->batch;
    argv[k++] = "--epochs";
    argv[k++] = (char *)epochs;
    for (int i = 0; i < a->nextra && k < DV_MAX_ARGS - 1; i++)
        argv[k++] = a->extra[i];
    argv[k] = NULL;
    *n = k;
}

static void run_worker(const dv_args_t *a, const char *device, const char *epochs, int limit_s,
                       dv_run_t *r)
{
    char *argv[DV_MAX_ARGS];
    int n = 0;
    argv[n++] = (char *)a->worker;
    argv[n++] = "--mode";
    argv[n++] = "local";
    argv[n++] = "--progress"; /* the capped CPU run's figure when it is stopped */
    argv[n++] = "2";
    worker_argv(a, device, epochs, argv, &n);
    run_cmd(r, argv, limit_s, a->verbose);
}

static bool run_ok(const dv_run_t *r, int ranks)
{
    return r->code == 0 && r->nsum == ranks && r->sps > 0;
}

/* The file name of path, searched in PATH when it has no slash; false when not found. */
static bool find_in_path(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    if (strchr(name, '/') != NULL || path == NULL)
        return false;
    while (*path != '\0') {
        size_t len = strcspn(path, ":");
        int w = snprintf(out, cap, "%.*s/%s", (int)len, len ? path : ".", name);
        if (w > 0 && (size_t)w < cap && access(out, X_OK) == 0)
            return true;
        path += len;
        if (*path == ':')
            path++;
    }
    return false;
}

static bool imports_torch(const char *python)
{
    char *argv[] = {(char *)python, "-c", "import torch", NULL};
    dv_run_t *r = calloc(1, sizeof *r);
    if (r == NULL || access(python, X_OK) != 0) {
        free(r);
        return false;
    }
    run_cmd(r, argv, 120, false);
    bool ok = r->code == 0;
    free(r);
    return ok;
}

/* /usr/bin/python3 when it has torch (Debian's python3-torch), else python3 on PATH (a
 * virtual environment's). */
static bool find_python(char *out, size_t cap)
{
    snprintf(out, cap, "/usr/bin/python3");
    if (imports_torch(out))
        return true;
    return find_in_path("python3", out, cap) && strcmp(out, "/usr/bin/python3") != 0 &&
           imports_torch(out);
}

/* Beside the binary in the build tree, or in share/flodl once installed. */
static bool find_script(char *out, size_t cap)
{
    char dir[PATH_MAX];
    bench_self_dir(dir, sizeof dir);
    snprintf(out, cap, "%s/%s", dir, TORCH_SCRIPT);
    if (access(out, R_OK) == 0)
        return true;
    snprintf(out, cap, "%s/../share/flodl/%s", dir, TORCH_SCRIPT);
    return access(out, R_OK) == 0;
}

static void run_torch(const dv_args_t *a, dv_run_t *r, char *why, size_t cap)
{
    char python[PATH_MAX];
    char script[PATH_MAX + 32];
    memset(r, 0, sizeof *r);
    r->code = -1;
    if (!find_script(script, sizeof script)) {
        snprintf(why, cap, "no %s beside flodl-bench or in ../share/flodl", TORCH_SCRIPT);
        return;
    }
    if (!find_python(python, sizeof python)) {
        snprintf(why, cap, "neither /usr/bin/python3 nor python3 on PATH imports torch");
        return;
    }
    char *argv[] = {python,
                    script,
                    "--device",
                    (char *)a->device,
                    "--layers",
                    (char *)a->layers,
                    "--batch-size",
                    (char *)a->batch,
                    "--epochs",
                    (char *)a->epochs,
                    NULL};
    run_cmd(r, argv, a->timeout_s, a->verbose);
    if (r->code != 0 || r->torch_sps <= 0)
        snprintf(why, cap, "%s", r->ntail > 0 ? r->tail[r->ntail - 1] : "failed");
}

static const char *plural(const char *count)
{
    return strcmp(count, "1") == 0 ? "" : "s";
}

static void print_ratio(const char *label, double num, double den)
{
    if (num > 0 && den > 0)
        printf("%-34s %10.2fx\n", label, num / den);
    else
        printf("%-34s %11s\n", label, "-");
}

static void print_acc(double acc)
{
    if (acc >= 0)
        printf(" %8.2f%%", 100.0 * acc);
    else
        printf(" %9s", "-");
}

/* flodl-worker --device cpu, capped: 1 epoch at most, stopped after cpu_s seconds (then the
 * last progress line's samples/s stands for it). */
static void run_cpu(const dv_args_t *a, const char *epochs, dv_run_t *r, char *note, size_t cap)
{
    int limit = a->cpu_s < a->timeout_s ? a->cpu_s : a->timeout_s;
    run_worker(a, "cpu", epochs, limit, r);
    if (run_ok(r, 1)) {
        snprintf(note, cap, "%s epoch%s%s", epochs, plural(epochs),
                 strcmp(epochs, a->epochs) ? " (capped at 1)" : "");
    } else if (r->stopped && r->progress_sps > 0) {
        r->sps = r->progress_sps;
        snprintf(note, cap, "capped: stopped after %d s, %ld steps of 1 epoch", limit,
                 r->progress_step);
    }
}

/* The four runs of --device cuda and why a side is missing. */
typedef struct cuda_runs {
    dv_run_t gpu;
    dv_run_t torch;
    dv_run_t cpu;
    dv_run_t two;
    char torch_why[200]; /* "": PyTorch ran */
    char cpu_note[128];  /* "": the CPU run failed */
} cuda_runs_t;

/* [1/4]: flodl on the GPU. 0, or 1 when nothing else can run (no GPU: the worker's own line,
 * printed before anything else). */
static int cuda_gpu(const dv_args_t *a, dv_run_t *gpu)
{
    /* First the worker's own verdict on the GPU (and the flags): no GPU is one line from it,
     * exit 2, passed on as it is before anything else is printed. */
    char *probe[] = {(char *)a->worker, "--mode", "local",   "--device", "cuda",
                     "--epochs",        "0",      "--quiet", NULL};
    run_cmd(gpu, probe, 120, a->verbose);
    const char *last = gpu->ntail > 0 ? gpu->tail[gpu->ntail - 1] : "cannot run";
    if (gpu->code == 2 && strncmp(last, "flodl-worker: ", 14) == 0) {
        fprintf(stderr, "flodl-bench train: %s\n", last + 14);
        return 1;
    }
    fprintf(stderr, "flodl-bench train: [1/4] flodl-worker --device cuda, %s epoch%s...\n",
            a->epochs, plural(a->epochs));
    run_worker(a, "cuda", a->epochs, a->timeout_s, gpu);
    if (!run_ok(gpu, 1)) {
        print_failure("flodl-worker --device cuda", gpu);
        return 1;
    }
    return 0;
}

/* [2/4] .. [4/4]: PyTorch, the CPU, two workers on the GPU. 0, or 1 when one failed. */
static int cuda_others(const dv_args_t *a, cuda_runs_t *c)
{
    int status = 0;
    fprintf(stderr, "  %.0f samples/s\nflodl-bench train: [2/4] PyTorch on the GPU...\n",
            c->gpu.sps);
    run_torch(a, &c->torch, c->torch_why, sizeof c->torch_why);
    if (c->torch_why[0] != '\0') {
        fprintf(stderr, "  torch: %s\n", c->torch_why);
        if (c->torch.code > 0)
            status = 1; /* it ran and failed; a missing torch is a skip */
    }
    fprintf(stderr,
            "flodl-bench train: [3/4] flodl-worker --device cpu (1 epoch, at most %d s)"
            "...\n",
            a->cpu_s);
    run_cpu(a, "1", &c->cpu, c->cpu_note, sizeof c->cpu_note);
    if (c->cpu_note[0] == '\0') {
        print_failure("flodl-worker --device cpu", &c->cpu);
        status = 1;
    }
    fprintf(stderr, "flodl-bench train: [4/4] flodl-launch --workers 2, --device cuda, 1 "
                    "epoch...\n");
    char *argv[DV_MAX_ARGS];
    int n = 0;
    argv[n++] = (char *)a->launch;
    argv[n++] = "--workers";
    argv[n++] = "2";
    argv[n++] = "--worker";
    argv[n++] = (char *)a->worker;
    argv[n++] = "--";
    worker_argv(a, "cuda", "1", argv, &n);
    run_cmd(&c->two, argv, a->timeout_s, a->verbose);
    if (!run_ok(&c->two, 2)) {
        print_failure("flodl-launch --workers 2", &c->two);
        status = 1;
    }
    return status;
}

/* The GPU against PyTorch and against the CPU, the ratios and the target. */
static void print_cuda_runs(const dv_args_t *a, const cuda_runs_t *c)
{
    char desc[256];
    fl_gpu_describe(desc, sizeof desc);
    printf("\nflodl-bench train --device cuda: MLP %s (%ld parameters), batch %s, %s epoch%s;\n"
           "the built-in dataset's shape (60000 x 64, 10 classes); GPU: %s\n",
           a->layers, c->gpu.params, a->batch, a->epochs, plural(a->epochs), desc);
    printf("%-34s %11s %9s  %s\n", "run", "samples/s", "test acc", "note");
    printf("%-34s %11.0f", "flodl-worker --device cuda", c->gpu.sps);
    print_acc(c->gpu.acc);
    printf("  %s epoch%s\n", a->epochs, plural(a->epochs));
    char label[96];
    snprintf(label, sizeof label, "torch %s", c->torch.torch[0] ? c->torch.torch : "(cuda)");
    if (c->torch_why[0] == '\0')
        printf("%-34s %11.0f %9s  %s epoch%s after a warm-up one, random data of that shape\n",
               label, c->torch.torch_sps, "-", a->epochs, plural(a->epochs));
    else
        printf("%-34s %11s %9s  skipped: %s\n", label, "-", "-", c->torch_why);
    printf("%-34s", "flodl-worker --device cpu");
    if (c->cpu_note[0] != '\0') {
        printf(" %11.0f", c->cpu.sps);
        print_acc(c->cpu.acc);
        printf("  %s\n", c->cpu_note);
    } else {
        printf(" %11s %9s  %s\n", "-", "-", "failed");
    }
    print_ratio("flodl cuda / torch cuda", c->gpu.sps, c->torch.torch_sps);
    if (c->torch.torch_sps > 0)
        printf("  target flodl >= torch / 1.2 (%.2fx): %s\n", 1 / 1.2,
               c->gpu.sps * 1.2 >= c->torch.torch_sps ? "target met" : "NOT met");
    else
        printf("  target flodl >= torch / 1.2: not checked (no PyTorch figure)\n");
    print_ratio("flodl cuda / flodl cpu", c->gpu.sps, c->cpu_note[0] ? c->cpu.sps : 0);
}

/* The two workers' split of a step, and what the figures mean. */
static void print_cuda_share(const dv_run_t *two)
{
    if (run_ok(two, 2)) {
        double step = two->compute_ms + two->exposed_ms;
        printf("2 workers on this GPU (flodl-launch, dense ring over TCP on 127.0.0.1, 1 epoch):\n"
               "  %.0f samples/s; per step compute %.2f ms, exchange %.2f ms, exposed %.2f ms; "
               "comm share %.1f%%\n",
               two->sps, two->compute_ms, two->comm_ms, two->exposed_ms,
               step > 0 ? 100.0 * two->exposed_ms / step : 0.0);
    } else {
        printf("2 workers on this GPU: failed (exit %d)\n", two->code);
    }
    printf("samples/s: the worker's summary (training seconds, after its first step) and\n"
           "torch_train.py's timed epochs; comm share: exposed / (compute + exposed), means over\n"
           "the ranks.\n");
}

static int bench_cuda(const dv_args_t *a)
{
    cuda_runs_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return 1;
    int status = cuda_gpu(a, &c->gpu);
    if (status == 0) {
        status = cuda_others(a, c);
        print_cuda_runs(a, c);
        print_cuda_share(&c->two);
    }
    free(c);
    return status;
}

static int bench_sim(const dv_args_t *a)
{
    dv_run_t *runs = calloc(2, sizeof *runs);
    if (runs == NULL)
        return 1;
    int status = 0;
    fprintf(stderr, "flodl-bench train: [1/2] flodl-worker --device sim...\n");
    run_worker(a, "sim", a->epochs, a->timeout_s, &runs[0]);
    if (!run_ok(&runs[0], 1)) {
        print_failure("flodl-worker --device sim", &runs[0]);
        status = 1;
    }
    fprintf(stderr, "flodl-bench train: [2/2] flodl-worker --device cpu...\n");
    char cpu_note[128] = "";
    run_cpu(a, a->epochs, &runs[1], cpu_note, sizeof cpu_note);
    if (cpu_note[0] == '\0') {
        print_failure("flodl-worker --device cpu", &runs[1]);
        status = 1;
    }
    printf("\nflodl-bench train --device sim: MLP %s (%ld parameters), batch %s, %s epoch%s,\n"
           "the built-in dataset. sim is a simulated GPU (device memory of its own, a thread per\n"
           "stream): the correctness path of the device code; its speed says nothing about a "
           "GPU.\n",
           a->layers, runs[0].params, a->batch, a->epochs, plural(a->epochs));
    printf("%-34s %11s %9s\n", "run", "samples/s", "test acc");
    const char *names[2] = {"flodl-worker --device sim", "flodl-worker --device cpu"};
    for (int i = 0; i < 2; i++) {
        printf("%-34s", names[i]);
        if (runs[i].sps > 0) {
            printf(" %11.0f", runs[i].sps);
            print_acc(runs[i].acc);
            printf("\n");
        } else {
            printf(" %11s %9s\n", "failed", "-");
        }
    }
    print_ratio("sim / cpu", runs[0].sps, runs[1].sps);
    free(runs);
    return status;
}

int bench_train_dev(const char *device, const char *worker, const char *launch, const char *layers,
                    long batch, int epochs, int timeout_s, int cpu_s, char *const extra[],
                    int nextra, bool verbose);
int bench_train_dev(const char *device, const char *worker, const char *launch, const char *layers,
                    long batch, int epochs, int timeout_s, int cpu_s, char *const extra[],
                    int nextra, bool verbose)
{
    bool cuda = strcmp(device, "cuda") == 0;
    dv_args_t a = {
        .device = device,
        .worker = worker,
        .launch = launch,
        .layers = layers ? layers
                  : cuda ? "64,4096,4096,4096,10"
                         : "64,256,128,10",
        .timeout_s = timeout_s,
        .cpu_s = cpu_s,
        .extra = extra,
        .nextra = nextra,
        .verbose = verbose,
    };
    snprintf(a.batch, sizeof a.batch, "%ld", batch > 0 ? batch : cuda ? 512 : 64);
    snprintf(a.epochs, sizeof a.epochs, "%d", epochs > 0 ? epochs : cuda ? 2 : 1);
    return cuda ? bench_cuda(&a) : bench_sim(&a);
}
