/* flodl-bench pytorch: runs pytorch_bench.py (flodl's DistributedOptimizer, dense and top-k,
 * beside PyTorch DDP with gloo, on the same model and data) under flodl-launch. The measuring
 * and the table are the script's; this only finds flodl-launch, the script and python3. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"

#define SCRIPT "pytorch_bench.py"

static const char usage[] =
    "usage: flodl-bench pytorch [--workers N | [--hosts H] --nproc-per-host N] [--insecure]\n"
    "                           [--python PATH] [SCRIPT FLAGS]\n"
    "Runs flodl-launch --workers N (default 4) -- PYTHON pytorch_bench.py SCRIPT FLAGS: every\n"
    "rank times DistributedOptimizer dense, top-k 1% and PyTorch DDP (gloo) on one MLP of\n"
    "12.6 M parameters, and rank 0 prints the medians side by side (--steps, --warmup, --rounds,\n"
    "--batch, --density, --hierarchy auto|flat|hybrid, --flat-dense: the script's --help).\n"
    "--hosts H --nproc-per-host N go to flodl-launch instead of --workers: H hosts of N\n"
    "processes on this machine (127.0.0.1, 127.0.0.2, ...), where --hierarchy hybrid runs.\n"
    "--insecure: flodl in plain text, as gloo is (by default flodl-launch's throw-away\n"
    "CurveZMQ keys encrypt flodl's side). PYTHON: --python, else /usr/bin/python3. The script\n"
    "is looked up beside flodl-bench, then in ../share/flodl; flodl-launch beside flodl-bench,\n"
    "then in ../launch.\n";

static bool is_file(const char *path, int mode)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, mode) == 0;
}

static bool find_in(const char *dir, const char *const *subs, const char *name, int mode, char *out,
                    size_t cap)
{
    for (size_t i = 0; subs[i] != NULL; i++) {
        int w = snprintf(out, cap, "%s/%s%s", dir, subs[i], name);
        if (w > 0 && (size_t)w < cap && is_file(out, mode))
            return true;
    }
    return false;
}

/* The launcher flags that take a value and go to flodl-launch as they are. */
static const char *const launch_valued[] = {"--workers", "--hosts", "--nproc-per-host", NULL};

static bool is_launch_valued(const char *a)
{
    for (size_t i = 0; launch_valued[i] != NULL; i++)
        if (strcmp(a, launch_valued[i]) == 0)
            return true;
    return false;
}

int bench_pytorch_main(int argc, char **argv);
int bench_pytorch_main(int argc, char **argv)
{
    const char *python = "/usr/bin/python3";
    bool insecure = false;
    bool layout = false; /* --workers or --nproc-per-host given */
    int first = 1;       /* the first argument for the script */
    for (; first < argc; first++) {
        const char *a = argv[first];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--insecure") == 0) {
            insecure = true;
        } else if (is_launch_valued(a) && first + 1 < argc) {
            layout = layout || strcmp(a, "--hosts") != 0;
            first++;
        } else if (strcmp(a, "--python") == 0 && first + 1 < argc) {
            python = argv[++first];
        } else {
            break;
        }
    }
    char dir[PATH_MAX];
    bench_self_dir(dir, sizeof dir);
    char launch[PATH_MAX + 32];
    char script[PATH_MAX + 32];
    static const char *const lsubs[] = {"", "../launch/", NULL};
    static const char *const ssubs[] = {"", "../share/flodl/", NULL};
    if (!find_in(dir, lsubs, "flodl-launch", X_OK, launch, sizeof launch)) {
        fprintf(stderr, "flodl-bench pytorch: no flodl-launch in %s or %s/../launch\n", dir, dir);
        return 1;
    }
    if (!find_in(dir, ssubs, SCRIPT, R_OK, script, sizeof script)) {
        fprintf(stderr, "flodl-bench pytorch: no %s in %s or %s/../share/flodl\n", SCRIPT, dir,
                dir);
        return 1;
    }
    char **args = calloc((size_t)argc + 10, sizeof *args);
    if (args == NULL) {
        fprintf(stderr, "flodl-bench pytorch: no memory\n");
        return 1;
    }
    size_t n = 0;
    args[n++] = launch;
    if (!layout) {
        args[n++] = "--workers";
        args[n++] = "4";
    }
    /* flodl-launch judges the layout flags (and refuses --workers with --nproc-per-host). */
    for (int i = 1; i < first; i++) {
        if (is_launch_valued(argv[i])) {
            args[n++] = argv[i];
            args[n++] = argv[++i];
        } else if (strcmp(argv[i], "--python") == 0) {
            i++; /* its value is not a flag */
        }
    }
    if (insecure)
        args[n++] = "--insecure";
    args[n++] = "--";
    args[n++] = (char *)python;
    args[n++] = script;
    for (int i = first; i < argc; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    fflush(stdout);
    execv(launch, args);
    perror("flodl-bench pytorch: execv flodl-launch");
    free(args);
    return 1;
}
