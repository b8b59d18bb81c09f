/* flodl-launch's command line (launch_int.h): its own flags, anywhere before "--", and the
 * security variables; every other argument goes to the workers. Finding the binaries and
 * running the job are launch_main.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_core.h"
#include "launch_int.h"

#define MAX_WORKERS 1024

static const char usage[] =
    "usage: flodl-launch [--workers N] [launcher options] [--] [flodl-worker flags]\n"
    "       flodl-launch [--workers N] [launcher options] -- PROGRAM [ARGS...]\n"
    "Runs flodl-ps and N flodl-worker processes (or N copies of PROGRAM) on this machine,\n"
    "prefixes their output with \"[ps] \" or \"[rank K] \", and stops them all when one fails.\n"
    "The word after \"--\" decides: a flag (it starts with '-') or nothing means flodl-worker\n"
    "flags; anything else is PROGRAM (looked up in PATH without a '/'), run with ARGS as\n"
    "they are and, in its environment, FLODL_RANK=K, FLODL_WORLD_SIZE=N,\n"
    "FLODL_COORDINATOR (flodl-ps's endpoint), LOCAL_RANK=K, LOCAL_WORLD_SIZE=N and\n"
    "FLODL_CURVE_DIR (the job's keys) or FLODL_INSECURE=1, as flodl.init() in Python reads:\n"
    "  flodl-launch --workers 4 -- python3 train.py --lr 0.1\n"
    "  --workers N              worker processes (default 4)\n"
    "  --heartbeat-timeout MS   passed to flodl-ps: a rank silent this long is dead\n"
    "  --no-pin                 do not pin workers; by default, with more workers than CPUs,\n"
    "                           rank K runs on CPU K mod ncpus\n"
    "  --ps-flag FLAG           one more argument for flodl-ps (repeat it), e.g. to run the\n"
    "                           parameter server: --ps-flag=--shards=2 -- --mode ps, or for\n"
    "                           a program whose DistributedOptimizer has mode=\"ps\":\n"
    "                           --ps-flag=--shards=2 --ps-flag=--lr=0.05 -- python3 train.py\n"
    "  --curve-dir DIR          the job's CurveZMQ keys (flodl-keygen), for flodl-ps and every\n"
    "                           worker; by default flodl-launch makes throw-away keys for the\n"
    "                           job (removed at the end), so it is authenticated and encrypted\n"
    "  --insecure               plain text instead (flodl-ps and every worker)\n"
    "  --ps PATH                flodl-ps to run (default: the one next to flodl-launch)\n"
    "  --worker PATH            flodl-worker to run (default: the one next to flodl-launch)\n"
    "  --help                   this text\n"
    "Otherwise every other argument, and everything after \"--\", goes to each worker, which\n"
    "also gets --rank K --world-size N --coordinator (flodl-ps's endpoint); --job-id goes to\n"
    "flodl-ps too.\n"
    "flodl-ps logs at level warn unless FLODL_LOG is set.\n"
    "Exit status: 0 when every process succeeded, 1 when one failed (named on stderr), 2 on bad\n"
    "flags, 128+signal after SIGINT or SIGTERM (forwarded to every process).\n";

/* Matches "--name VALUE" or "--name=VALUE" at argv[*i]: *val gets the value (NULL when none
 * follows) and *i moves past what was used. */
static bool opt_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0 || (a[n] != '\0' && a[n] != '='))
        return false;
    if (a[n] == '=')
        *val = a + n + 1;
    else
        *val = *i + 1 < argc ? argv[++*i] : NULL;
    return true;
}

static bool is_flag(const char *a, const char *name)
{
    size_t n = strlen(name);
    return strncmp(a, name, n) == 0 && (a[n] == '\0' || a[n] == '=');
}

/* Launcher options are recognized anywhere before "--"; everything else goes to the workers. */
static int parse_flags(int argc, char **argv, fl_launch_opts_t *o)
{
    static const char *const owned[] = {"--rank", "--world-size", "--coordinator", NULL};
    bool rest = false;
    const char *v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!rest && strcmp(a, "--") == 0) {
            /* A word that is not a flag right after "--" is a program: it and everything after
             * it are its own, and the launcher reads no further. */
            if (i + 1 < argc && argv[i + 1][0] != '-') {
                o->prog = argv + i + 1;
                break;
            }
            rest = true;
            continue;
        }
        if (!rest && opt_value(argc, argv, &i, "--workers", &v)) {
            if (fl_cli_long("--workers", v, 1, MAX_WORKERS, &o->workers) != FL_OK)
                return FL_EINVAL;
            continue;
        }
        if (!rest && opt_value(argc, argv, &i, "--heartbeat-timeout", &v)) {
            long ms;
            if (fl_cli_long("--heartbeat-timeout", v, 10, 3600000, &ms) != FL_OK)
                return FL_EINVAL;
            o->heartbeat = v;
            continue;
        }
        if (!rest && opt_value(argc, argv, &i, "--ps-flag", &v)) {
            if (v == NULL || v[0] == '\0')
                return fl_fail(FL_EINVAL, "--ps-flag: missing value");
            o->pargs[o->npargs++] = v;
            continue;
        }
        if (!rest && opt_value(argc, argv, &i, "--ps", &v)) {
            if (v == NULL || v[0] == '\0')
                return fl_fail(FL_EINVAL, "--ps: missing value");
            o->ps_path = v;
            continue;
        }
        if (!rest && opt_value(argc, argv, &i, "--worker", &v)) {
            if (v == NULL || v[0] == '\0')
                return fl_fail(FL_EINVAL, "--worker: missing value");
            o->worker_path = v;
            continue;
        }
        if (!rest && strcmp(a, "--no-pin") == 0) {
            o->pin = false;
            continue;
        }
        if (!rest && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            o->help = true;
            continue;
        }
        if (!rest && strcmp(a, "--version") == 0) {
            o->version = true;
            continue;
        }
        /* Security is the job's: it goes to flodl-ps and every worker, wherever it was given. */
        if (opt_value(argc, argv, &i, "--curve-dir", &v)) {
            if (v == NULL || v[0] == '\0')
                return fl_fail(FL_EINVAL, "--curve-dir: missing value");
            o->curve_dir = v;
            continue;
        }
        if (strcmp(a, "--insecure") == 0) {
            o->insecure = true;
            continue;
        }
        for (size_t k = 0; owned[k] != NULL; k++)
            if (is_flag(a, owned[k]))
                return fl_fail(FL_EINVAL, "%s: set by flodl-launch for each worker; remove it",
                               owned[k]);
        if (strcmp(a, "--job-id") == 0 && i + 1 < argc)
            o->job_id = argv[i + 1];
        else if (strncmp(a, "--job-id=", 9) == 0)
            o->job_id = a + 9;
        o->wargs[o->nwargs++] = a;
    }
    return FL_OK;
}

int fl_launch_opts_parse(int argc, char **argv, fl_launch_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->workers = 4;
    o->pin = true;
    o->wargs = calloc((size_t)argc + 1, sizeof *o->wargs);
    o->pargs = calloc((size_t)argc + 1, sizeof *o->pargs);
    if (o->wargs == NULL || o->pargs == NULL)
        return fl_fail(FL_ENOMEM, "no memory");
    int rc = parse_flags(argc, argv, o);
    if (rc != FL_OK)
        return rc;
    /* The security variables the binaries read are the job's choice here too (flags win). */
    const char *env_dir = getenv("FLODL_CURVE_DIR");
    const char *env_insecure = getenv("FLODL_INSECURE");
    if (o->curve_dir == NULL && !o->insecure) {
        if (env_dir != NULL && env_dir[0] != '\0')
            o->curve_dir = env_dir;
        else if (env_insecure != NULL && strcmp(env_insecure, "1") == 0)
            o->insecure = true;
    }
    if (o->curve_dir != NULL && o->insecure)
        return fl_fail(FL_EINVAL, "--curve-dir and --insecure: choose one");
    return FL_OK;
}

void fl_launch_opts_deinit(fl_launch_opts_t *o)
{
    free(o->wargs);
    free(o->pargs);
    o->wargs = NULL;
    o->pargs = NULL;
}

void fl_launch_opts_help(FILE *out)
{
    fputs(usage, out);
}
