/* flodl-launch's command line (launch_int.h): its own flags, one row each (name, how the value
 * is read and checked, the field it sets, --help's text), which also make --help; the
 * security variables; and what goes to the workers instead. Finding the binaries and running
 * the job are launch_main.c's. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_core.h"
#include "launch_int.h"

#define MAX_WORKERS 1024 /* processes one launcher starts */
#define MAX_HOSTS 254    /* loopback identities 127.0.0.1..127.0.0.254 */
#define MAX_WORLD 65536  /* flodl-ps's --world-size */
#define HELP_WIDTH 90
#define HELP_COLUMN 27 /* where a flag's text starts */

static const char usage_head[] =
    "usage: flodl-launch [--workers N | [--hosts H] --nproc-per-host N] [launcher options]\n"
    "                    [--] [flodl-worker flags]\n"
    "       flodl-launch [--workers N | ...] [launcher options] -- PROGRAM [ARGS...]\n"
    "       flodl-launch --nnodes M --node-rank I --coordinator tcp://ADDR:PORT\n"
    "                    --nproc-per-host N (--curve-dir DIR | --insecure) [--] ...\n"
    "Runs flodl-ps and N flodl-worker processes (or N copies of PROGRAM) on this machine,\n"
    "prefixes their output with \"[ps] \" or \"[rank K] \", and stops them all when one fails.\n"
    "The word after \"--\" decides: a flag (it starts with '-') or nothing means flodl-worker\n"
    "flags; anything else is PROGRAM (looked up in PATH without a '/'), run with ARGS as\n"
    "they are and, in its environment, FLODL_RANK=K, FLODL_WORLD_SIZE=N,\n"
    "FLODL_COORDINATOR (flodl-ps's endpoint), LOCAL_RANK=K, LOCAL_WORLD_SIZE=N and\n"
    "FLODL_CURVE_DIR (the job's keys) or FLODL_INSECURE=1, as flodl.init() in Python reads:\n"
    "  flodl-launch --workers 4 -- python3 train.py --lr 0.1\n"
    "With --hosts H, rank h*N+k is process k of host h: LOCAL_RANK=k, LOCAL_WORLD_SIZE=N,\n"
    "FLODL_WORLD_SIZE=H*N and FLODL_HOST=127.0.0.(h+1) (a worker gets FLODL_HOST too):\n"
    "  flodl-launch --hosts 2 --nproc-per-host 2 -- python3 train.py\n"
    "With --nnodes, as torchrun, node I runs ranks I*N..I*N+N-1 of M*N, all dialing\n"
    "--coordinator, which node 0's flodl-ps binds; FLODL_HOST is left as it is (unset, a rank\n"
    "advertises its route to the coordinator).\n";

static const char usage_tail[] =
    "Otherwise every other argument, and everything after \"--\", goes to each worker, which\n"
    "also gets --rank K --world-size N --coordinator (flodl-ps's endpoint); --job-id goes to\n"
    "flodl-ps too.\n"
    "flodl-ps logs at level warn unless FLODL_LOG is set.\n"
    "Exit status: 0 when every process succeeded, 1 when one failed (named on stderr), 2 on bad\n"
    "flags, 128+signal after SIGINT or SIGTERM (forwarded to every process).\n";

/* How a flag's value is read. */
typedef enum lflag_kind {
    LF_COUNT, /* an integer in [lo, hi] into a long */
    LF_MS,    /* an integer in [lo, hi], kept as the text given (it is passed on) */
    LF_TEXT,  /* a non-empty value into a const char * */
    LF_PS,    /* a non-empty value appended to flodl-ps's arguments */
    LF_ON,    /* no value: the bool becomes true */
    LF_OFF,   /* no value: the bool becomes false */
} lflag_kind_t;

typedef struct lflag {
    const char *name; /* without "--" */
    lflag_kind_t kind;
    size_t off;        /* the field in fl_launch_opts_t (not for LF_PS) */
    long lo, hi;       /* LF_COUNT, LF_MS */
    bool anywhere;     /* the job's, not the launcher's: read after "--" too */
    const char *alias; /* another spelling of a flag without a value, or NULL */
    const char *meta;  /* the value as --help shows it; NULL for a flag that takes none */
    const char *help;  /* NULL: not listed */
} lflag_t;

#define AT(f) .off = offsetof(fl_launch_opts_t, f)

/* In --help's order. */
static const lflag_t flags[] = {
    {"workers", LF_COUNT, AT(workers), 1, MAX_WORKERS, .meta = "N",
     .help = "worker processes, one host (default 4); the same as --nproc-per-host N alone"},
    {"hosts", LF_COUNT, AT(hosts), 1, MAX_HOSTS, .meta = "H",
     .help = "H hosts on this machine, host h on 127.0.0.(h+1), each with --nproc-per-host "
             "processes (ranks h*N..h*N+N-1)"},
    {"nproc-per-host", LF_COUNT, AT(nproc), 1, MAX_WORKERS, .meta = "N",
     .help = "processes per host (LOCAL_WORLD_SIZE), as torchrun's --nproc-per-node"},
    {"nnodes", LF_COUNT, AT(nnodes), 1, MAX_WORLD, .meta = "M",
     .help = "machines in the job, one flodl-launch on each (with --node-rank, --coordinator "
             "and --nproc-per-host); with more than one, --curve-dir (the same keys on every "
             "node) or --insecure"},
    {"node-rank", LF_COUNT, AT(node_rank), 0, MAX_WORLD - 1, .meta = "I",
     .help = "this machine's index, 0..M-1; node 0 also runs flodl-ps"},
    {"coordinator", LF_TEXT, AT(coordinator), .meta = "ENDPOINT",
     .help = "with --nnodes: tcp://ADDR:PORT, an address of node 0 and a free port, which "
             "every node's ranks dial and node 0's flodl-ps binds"},
    {"heartbeat-timeout", LF_MS, AT(heartbeat), 10, 3600000, .meta = "MS",
     .help = "passed to flodl-ps: a rank silent this long is dead"},
    {"no-pin", LF_OFF, AT(pin),
     .help = "do not pin workers; by default, with more workers than CPUs, rank K runs on CPU "
             "K mod ncpus"},
    {"ps-flag", LF_PS, .meta = "FLAG",
     .help = "one more argument for flodl-ps (repeat it), e.g. to run the parameter server: "
             "--ps-flag=--shards=2 -- --mode ps, or for a program whose DistributedOptimizer "
             "has mode=\"ps\": --ps-flag=--shards=2 --ps-flag=--lr=0.05 -- python3 train.py"},
    /* Security is the job's: it goes to flodl-ps and every worker, wherever it was given. */
    {"curve-dir", LF_TEXT, AT(curve_dir), .anywhere = true, .meta = "DIR",
     .help = "the job's CurveZMQ keys (flodl-keygen), for flodl-ps and every worker; by "
             "default flodl-launch makes throw-away keys for the job (removed at the end), so "
             "it is authenticated and encrypted"},
    {"insecure", LF_ON, AT(insecure), .anywhere = true,
     .help = "plain text instead (flodl-ps and every worker)"},
    {"ps", LF_TEXT, AT(ps_path), .meta = "PATH",
     .help = "flodl-ps to run (default: the one next to flodl-launch)"},
    {"worker", LF_TEXT, AT(worker_path), .meta = "PATH",
     .help = "flodl-worker to run (default: the one next to flodl-launch)"},
    {"help", LF_ON, AT(help), .alias = "-h", .help = "this text"},
    {"version", LF_ON, AT(version)},
};

#define NFLAGS (sizeof flags / sizeof flags[0])

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

/* The row argv[*i] names, if any; rest: after "--", where only the job's flags are read. A
 * flag without a value is matched only as spelled. */
static const lflag_t *match(int argc, char **argv, int *i, bool rest, const char **val)
{
    for (size_t k = 0; k < NFLAGS; k++) {
        const lflag_t *f = &flags[k];
        char flag[48];
        snprintf(flag, sizeof flag, "--%s", f->name);
        if (rest && !f->anywhere)
            continue;
        if (f->meta != NULL && opt_value(argc, argv, i, flag, val))
            return f;
        if (f->meta == NULL &&
            (strcmp(argv[*i], flag) == 0 || (f->alias != NULL && strcmp(argv[*i], f->alias) == 0)))
            return f;
    }
    return NULL;
}

static int apply(fl_launch_opts_t *o, const lflag_t *f, const char *v)
{
    char flag[48];
    snprintf(flag, sizeof flag, "--%s", f->name);
    char *field = (char *)o + f->off;
    if (f->meta != NULL && (v == NULL || v[0] == '\0'))
        return fl_fail(FL_EINVAL, "%s: missing value", flag);
    long n;
    bool on = f->kind == LF_ON;
    int rc = FL_OK;
    switch (f->kind) {
    case LF_COUNT:
        if ((rc = fl_cli_long(flag, v, f->lo, f->hi, &n)) == FL_OK)
            memcpy(field, &n, sizeof n);
        break;
    case LF_MS:
        if ((rc = fl_cli_long(flag, v, f->lo, f->hi, &n)) == FL_OK)
            memcpy(field, &v, sizeof v);
        break;
    case LF_TEXT: memcpy(field, &v, sizeof v); break;
    case LF_PS: o->pargs[o->npargs++] = v; break;
    case LF_ON:
    case LF_OFF: memcpy(field, &on, sizeof on); break;
    }
    return rc;
}

static bool is_flag(const char *a, const char *name)
{
    size_t n = strlen(name);
    return strncmp(a, name, n) == 0 && (a[n] == '\0' || a[n] == '=');
}

/* argv[i], not the launcher's: the workers', but for what the launcher sets for each. */
static int worker_flag(int argc, char **argv, int i, fl_launch_opts_t *o)
{
    static const char *const owned[] = {"--rank", "--world-size", "--coordinator", NULL};
    const char *a = argv[i];
    for (size_t k = 0; owned[k] != NULL; k++)
        if (is_flag(a, owned[k]))
            return fl_fail(FL_EINVAL, "%s: set by flodl-launch for each worker; remove it",
                           owned[k]);
    if (strcmp(a, "--job-id") == 0 && i + 1 < argc)
        o->job_id = argv[i + 1];
    else if (strncmp(a, "--job-id=", 9) == 0)
        o->job_id = a + 9;
    o->wargs[o->nwargs++] = a;
    return FL_OK;
}

/* Launcher options are recognized anywhere before "--"; everything else goes to the workers. */
static int parse_flags(int argc, char **argv, fl_launch_opts_t *o)
{
    bool rest = false;
    for (int i = 1; i < argc; i++) {
        if (!rest && strcmp(argv[i], "--") == 0) {
            /* A word that is not a flag right after "--" is a program: it and everything after
             * it are its own, and the launcher reads no further. */
            if (i + 1 < argc && argv[i + 1][0] != '-') {
                o->prog = argv + i + 1;
                break;
            }
            rest = true;
            continue;
        }
        const char *v = NULL;
        const lflag_t *f = match(argc, argv, &i, rest, &v);
        int rc = f != NULL ? apply(o, f, v) : worker_flag(argc, argv, i, o);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

/* tcp://ADDR:PORT with a port other nodes can dial: not 0, which would bind a random one. */
static int check_coordinator(const char *ep)
{
    const char *colon = strrchr(ep, ':');
    long port = 0;
    bool ok = strncmp(ep, "tcp://", 6) == 0 && colon != NULL && colon > ep + 6 && colon[1] >= '1' &&
              colon[1] <= '9';
    if (ok) {
        char *end = NULL;
        port = strtol(colon + 1, &end, 10);
        ok = *end == '\0' && port <= 65535;
    }
    if (!ok)
        return fl_fail(FL_EINVAL,
                       "--coordinator '%s': want tcp://ADDR:PORT, an address of node 0 and a port "
                       "in 1..65535",
                       ep);
    return FL_OK;
}

/* --nnodes: which ranks this node runs, and whether it runs flodl-ps. */
static int nodes_layout(fl_launch_opts_t *o)
{
    if (o->hosts > 0)
        return fl_fail(FL_EINVAL, "--hosts and --nnodes: choose one (--hosts makes hosts on one "
                                  "machine, --nnodes spans machines)");
    if (o->nproc == 0)
        return fl_fail(FL_EINVAL, "--nnodes needs --nproc-per-host N (the processes of each node)");
    if (o->node_rank < 0 || o->coordinator == NULL)
        return fl_fail(FL_EINVAL, "--nnodes needs --node-rank I and --coordinator tcp://ADDR:PORT "
                                  "(the same on every node)");
    if (o->node_rank >= o->nnodes)
        return fl_fail(FL_EINVAL, "--node-rank %ld is not below --nnodes %ld", o->node_rank,
                       o->nnodes);
    if (o->nnodes * o->nproc > MAX_WORLD)
        return fl_fail(FL_EINVAL,
                       "--nnodes %ld --nproc-per-host %ld: %ld ranks, above flodl-ps's %d",
                       o->nnodes, o->nproc, o->nnodes * o->nproc, MAX_WORLD);
    /* Throw-away keys are made on each node: the others would not hold node 0's. */
    if (o->nnodes > 1 && o->curve_dir == NULL && !o->insecure)
        return fl_fail(FL_EINVAL,
                       "--nnodes %ld: give --curve-dir DIR (the same keys on every "
                       "node) or --insecure; throw-away keys cannot be shared across "
                       "nodes",
                       o->nnodes);
    int rc = check_coordinator(o->coordinator);
    if (rc != FL_OK)
        return rc;
    o->nlocal = o->per_host = o->nproc;
    o->first_rank = o->node_rank * o->nproc;
    o->world = o->nnodes * o->nproc;
    o->run_ps = o->node_rank == 0;
    return FL_OK;
}

/* The processes to start and their ranks, from --workers, --hosts, --nproc-per-host and the
 * --nnodes flags; refuses the combinations that say two different things. */
static int layout(fl_launch_opts_t *o)
{
    if (o->workers > 0 && o->nproc > 0)
        return fl_fail(FL_EINVAL, "--workers and --nproc-per-host: choose one (--nproc-per-host "
                                  "N alone is --workers N)");
    if (o->hosts > 0 && o->nproc == 0)
        return fl_fail(FL_EINVAL, "--hosts needs --nproc-per-host N (the processes of each host)");
    if (o->nnodes > 0)
        return nodes_layout(o);
    if (o->node_rank >= 0 || o->coordinator != NULL)
        return fl_fail(FL_EINVAL,
                       "%s needs --nnodes (a job across machines); on one machine "
                       "flodl-launch runs flodl-ps itself",
                       o->node_rank >= 0 ? "--node-rank" : "--coordinator");
    long hosts = o->hosts > 0 ? o->hosts : 1;
    long per_host = o->nproc > 0 ? o->nproc : o->workers > 0 ? o->workers : 4;
    if (hosts * per_host > MAX_WORKERS)
        return fl_fail(FL_EINVAL,
                       "--hosts %ld --nproc-per-host %ld: %ld processes, above the limit of %d",
                       hosts, per_host, hosts * per_host, MAX_WORKERS);
    o->nlocal = o->world = hosts * per_host;
    o->per_host = per_host;
    o->first_rank = 0;
    o->run_ps = true;
    return FL_OK;
}

int fl_launch_opts_parse(int argc, char **argv, fl_launch_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->node_rank = -1;
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
    return layout(o);
}

void fl_launch_opts_deinit(fl_launch_opts_t *o)
{
    free(o->wargs);
    free(o->pargs);
    o->wargs = NULL;
    o->pargs = NULL;
}

/* Writes text's words from column col, wrapping at HELP_WIDTH to lines that start at
 * HELP_COLUMN. */
static void help_text(FILE *out, int col, const char *text)
{
    bool first = true;
    for (const char *p = text; *p != '\0'; first = false) {
        int n = (int)strcspn(p, " ");
        if (!first && col + 1 + n > HELP_WIDTH)
            col = fprintf(out, "\n%*s", HELP_COLUMN, "") - 1;
        else if (!first)
            col += fprintf(out, " ");
        col += (int)fwrite(p, 1, (size_t)n, out);
        p += n + (int)strspn(p + n, " ");
    }
    fputc('\n', out);
}

void fl_launch_opts_help(FILE *out)
{
    fputs(usage_head, out);
    for (size_t k = 0; k < NFLAGS; k++) {
        const lflag_t *f = &flags[k];
        if (f->help == NULL)
            continue;
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", f->name, f->meta != NULL ? " " : "",
                 f->meta != NULL ? f->meta : "");
        help_text(out, fprintf(out, "  %-*s", HELP_COLUMN - 2, left), f->help);
    }
    fputs(usage_tail, out);
}
