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
    "usage: flodl-bench pytorch [--workers N] [--insecure] [--python PATH] [SCRIPT FLAGS]\n"
    "Runs flodl-launch --workers N (default 4) -- PYTHON pytorch_bench.py SCRIPT FLAGS: every\n"
    "rank times DistributedOptimizer dense, top-k 1% and PyTorch DDP (gloo) on one MLP of\n"
    "12.6 M parameters, and rank 0 prints the medians side by side (--steps, --warmup, --rounds,\n"
    "--batch, --density: the script's --help). --insecure: flodl in plain text, as gloo is\n"
    "(by default flodl-launch's throw-away CurveZMQ keys encrypt flodl's side). PYTHON: --python,\n"
    "else /usr/bin/python3. The script is looked up beside flodl-bench, then in\n"
    "../share/flodl; flodl-launch beside flodl-bench, then in ../launch.\n";

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

int bench_pytorch_main(int argc, char **argv);
int bench_pytorch_main(int argc, char **argv)
{
    const char *workers = "4";
    const char *python = "/usr/bin/python3";
    bool insecure = false;
    int first = 1; /* the first argument for the script */
    for (; first < argc; first++) {
        const char *a = argv[first];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--insecure") == 0) {
            insecure = true;
        } else if ((strcmp(a, "--workers") == 0 || strcmp(a, "--python") == 0) &&
                   first + 1 < argc) {
            if (strcmp(a, "--workers") == 0)
                workers = argv[++first];
            else
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
    args[n++] = "--workers";
    args[n++] = (char *)workers;
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
