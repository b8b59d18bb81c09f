/* flodl-ps: the coordinator of a job and its parameter server. By default one process runs
 * the coordinator and serves every shard (each with its own thread); with --num-shards and
 * --shard-index several processes split the shards, the others pointing at the first with
 * --coordinator. Exit 0 when every rank left cleanly, 1 when the job failed (a rank or server
 * died, the rendezvous failed) or on SIGINT/SIGTERM (after a final checkpoint and telling the
 * ranks), 2 for bad flags or a configuration the job refuses (one line naming it). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fl_ps.h"
#include "ps_metrics.h"
#include "fl_tp.h"

static const char usage[] =
    "usage: flodl-ps --world-size N [options]\n"
    "coordinator:\n"
    "  --bind ENDPOINT             where ranks register (default tcp://0.0.0.0:29500, or the\n"
    "                              port of FLODL_COORDINATOR or torchrun's MASTER_PORT)\n"
    "  --world-size N              ranks in the job (or FLODL_WORLD_SIZE / WORLD_SIZE)\n"
    "  --job-id ID                 ranks of another job are refused (default flodl)\n"
    "  --heartbeat-timeout MS      a rank silent this long is dead (default 5000)\n"
    "  --rendezvous-timeout MS     all ranks must register within this (default 300000)\n"
    "  --endpoint-file PATH        write the bound endpoint there (useful with port 0)\n"
    "  --log-level LEVEL           debug|info|warn|error (default info, or FLODL_LOG)\n"
    "  --held-max BYTES            most bytes of messages not yet complete that connections\n"
    "                              may make the coordinator hold, and the shards (each their\n"
    "                              own), K/M/G (default 256M); past it the largest are closed;\n"
    "                              the shards' is raised to twice the ranks' pushes if more\n"
    "parameter server (none unless --shards or --num-shards is given):\n"
    "  --shards K                  shards this process serves, a thread each (default: all)\n"
    "  --num-shards S              shards of the job (default: --shards)\n"
    "  --shard-index I             the first shard this process serves (default 0)\n"
    "  --coordinator ENDPOINT      serve shards of a job whose coordinator is another flodl-ps\n"
    "  --host ADDR                 address ranks dial for the shards (default: FLODL_HOST, the\n"
    "                              --bind address, or the address of the default route)\n"
    "  --consistency sync|async|ssp  (default sync)   --staleness S (ssp)\n"
    "  --async-scale X             async/ssp: factor on each push (default 1 / world size)\n"
    "  --optimizer sgd|adam|adamw  --lr 0.01  --momentum M  --nesterov  --dampening D\n"
    "  --weight-decay W  --beta1 0.9  --beta2 0.999  --eps 1e-8\n"
    "  --lr-schedule constant|step|cosine  --warmup-steps N  --total-steps N\n"
    "  --lr-step-size N  --lr-gamma 0.1  --min-lr X\n"
    "  --init FILE.safetensors     initial parameters (float32 tensors, in file order)\n"
    "  --checkpoint-dir DIR        write shard checkpoints there\n"
    "  --checkpoint-every N|Ns     every N steps, or every N seconds (rank 0 decides)\n"
    "  --keep K                    checkpoints kept per shard (default 3)\n"
    "  --resume                    start from the newest checkpoint every shard holds\n"
    "  --max-wait MS               the longest a pull is held (default 3600000)\n"
    "security (one of them is required):\n"
    "  --curve-dir DIR             CurveZMQ keys (flodl-keygen): every connection\n"
    "                              authenticated and encrypted (or FLODL_CURVE_DIR)\n"
    "  --insecure                  plain text (or FLODL_INSECURE=1)\n"
    "observability:\n"
    "  --metrics-port N            serve Prometheus metrics (/metrics) and /healthz on port N\n"
    "                              (0: any free port, printed at start; default: off)\n"
    "  --health-port N             serve /healthz alone on port N, a listener of its own that\n"
    "                              idle or slow clients cannot starve: point probes at it\n"
    "                              (0: any free port, printed at start; default: off)\n"
    "  --metrics-bind ADDR         IPv4 address to serve both on (default 0.0.0.0)\n"
    "  --stall-report MS           log every rank's state when a collective makes no progress\n"
    "                              this long, and again every MS while it lasts (default\n"
    "                              60000; 0: never)\n";

/* The parameter server's flags are O_SHARDS..O_OPTIM (apply_server), the others the job's. */
enum {
    O_BIND = 1000,
    O_WORLD,
    O_JOB,
    O_HBT,
    O_RDV,
    O_EPFILE,
    O_LOG,
    O_HELP,
    O_VERSION,
    O_SHARDS,
    O_NUM,
    O_INDEX,
    O_COORD,
    O_HOST,
    O_CONS,
    O_STALE,
    O_SCALE,
    O_INIT,
    O_CKDIR,
    O_CKEVERY,
    O_KEEP,
    O_RESUME,
    O_MAXWAIT,
    O_OPTIM,
    O_MPORT,
    O_MBIND,
    O_HPORT,
    O_STALL,
    O_CURVE,
    O_INSECURE,
    O_HELDMAX
};

typedef struct args {
    fl_coord_opts_t co;
    fl_ps_server_opts_t so;
    const char *epfile;
    const char *coordinator;             /* server-only mode */
    int shards, num_shards, shard_index; /* -1: not given */
    bool any_ps_flag;
    int metrics_port; /* -1: off */
    int health_port;  /* -1: off */
    const char *metrics_bind;
    const char *curve_dir;
    bool insecure;
    size_t held_max; /* 0: the default */
} args_t;

static const char *env_get(const char *name, void *ud)
{
    (void)ud;
    return getenv(name);
}

static int bad_flag(void)
{
    fprintf(stderr, "flodl-ps: %s\n", fl_last_error());
    return 2;
}

static int every(const char *v, fl_ps_server_opts_t *so)
{
    size_t n = strlen(v);
    long x;
    char num[32];
    if (n > 1 && n < sizeof num && (v[n - 1] == 's' || v[n - 1] == 'S')) {
        bool ms = n > 2 && (v[n - 2] == 'm' || v[n - 2] == 'M');
        snprintf(num, sizeof num, "%.*s", (int)(n - (ms ? 2 : 1)), v);
        if (fl_cli_long("--checkpoint-every", num, 1, 1L << 40, &x) != FL_OK)
            return FL_EINVAL;
        so->ckpt_every_ms = (uint64_t)x * (ms ? 1 : 1000);
        return FL_OK;
    }
    if (fl_cli_long("--checkpoint-every", v, 1, 1L << 40, &x) != FL_OK)
        return fl_fail(FL_EINVAL, "--checkpoint-every: '%s' is not N (steps), Ns or Nms", v);
    so->ckpt_every_steps = (uint64_t)x;
    return FL_OK;
}

/* A flag of the parameter server (its shards, consistency, optimizer, checkpoints). */
static int apply_server(args_t *a, int ch, const char *name, const char *v)
{
    long x;
    fl_ps_server_opts_t *so = &a->so;
    switch (ch) {
    case O_SHARDS:
        if (fl_cli_long("--shards", v, 0, FL_MSG_MAX_SHARDS, &x) != FL_OK)
            return FL_EINVAL;
        a->shards = (int)x;
        return FL_OK;
    case O_NUM:
        if (fl_cli_long("--num-shards", v, 1, FL_MSG_MAX_SHARDS, &x) != FL_OK)
            return FL_EINVAL;
        a->num_shards = (int)x;
        return FL_OK;
    case O_INDEX:
        if (fl_cli_long("--shard-index", v, 0, FL_MSG_MAX_SHARDS - 1, &x) != FL_OK)
            return FL_EINVAL;
        a->shard_index = (int)x;
        return FL_OK;
    case O_COORD: a->coordinator = v; return FL_OK;
    case O_HOST: so->host = v; return FL_OK;
    case O_CONS:
        return fl_ps_consistency_parse(v, &so->consistency) == FL_OK
                   ? FL_OK
                   : fl_fail(FL_EINVAL, "--consistency: '%s' is not one of sync|async|ssp", v);
    case O_STALE:
        if (fl_cli_long("--staleness", v, 0, 1000000, &x) != FL_OK)
            return FL_EINVAL;
        so->staleness = (uint32_t)x;
        return FL_OK;
    case O_SCALE: return fl_cli_double("--async-scale", v, 1e-9, 1e6, &so->async_scale);
    case O_INIT: so->init_path = v; return FL_OK;
    case O_CKDIR: so->checkpoint_dir = v; return FL_OK;
    case O_CKEVERY: return every(v, so);
    case O_KEEP:
        if (fl_cli_long("--keep", v, 1, 1000, &x) != FL_OK)
            return FL_EINVAL;
        so->keep = (int)x;
        return FL_OK;
    case O_RESUME: so->resume = true; return FL_OK;
    case O_MAXWAIT:
        if (fl_cli_long("--max-wait", v, 1, 86400000, &x) != FL_OK)
            return FL_EINVAL;
        so->max_wait_ms = (int)x;
        return FL_OK;
    case O_OPTIM: return fl_cli_optim_flag(name, v, &so->opt, &so->lr);
    default: return fl_fail(FL_EINVAL, "unknown flag");
    }
}

/* A flag of the coordinator, the security or the metrics. */
static int apply_job(args_t *a, int ch, const char *v)
{
    long x;
    fl_ps_server_opts_t *so = &a->so;
    switch (ch) {
    case O_BIND: a->co.bind = v; return FL_OK;
    case O_WORLD:
        if (fl_cli_long("--world-size", v, 1, 65536, &x) != FL_OK)
            return FL_EINVAL;
        a->co.world_size = (int)x;
        return FL_OK;
    case O_JOB:
        a->co.job_id = v;
        so->job_id = v;
        return FL_OK;
    case O_HBT:
        if (fl_cli_long("--heartbeat-timeout", v, 10, 3600000, &x) != FL_OK)
            return FL_EINVAL;
        a->co.heartbeat_timeout_ms = (int)x;
        return FL_OK;
    case O_RDV:
        if (fl_cli_long("--rendezvous-timeout", v, 1, 86400000, &x) != FL_OK)
            return FL_EINVAL;
        a->co.rendezvous_timeout_ms = (int)x;
        so->rendezvous_timeout_ms = (int)x;
        return FL_OK;
    case O_EPFILE: a->epfile = v; return FL_OK;
    case O_LOG:
        if (fl_log_level_parse(v, &a->co.log_level) != FL_OK)
            return fl_fail(FL_EINVAL, "--log-level: '%s' is not one of debug|info|warn|error", v);
        so->log_level = a->co.log_level;
        return FL_OK;
    case O_MPORT: {
        long n;
        int rc = fl_cli_long("--metrics-port", v, 0, 65535, &n);
        a->metrics_port = (int)n;
        return rc;
    }
    case O_MBIND: a->metrics_bind = v; return FL_OK;
    case O_HPORT: {
        long n;
        int rc = fl_cli_long("--health-port", v, 0, 65535, &n);
        a->health_port = (int)n;
        return rc;
    }
    case O_CURVE: a->curve_dir = v; return FL_OK;
    case O_INSECURE: a->insecure = true; return FL_OK;
    case O_HELDMAX:
        if (fl_cli_size("--held-max", v, (size_t)1 << 20, (size_t)1 << 40, &a->held_max) != FL_OK)
            return FL_EINVAL;
        so->held_max_bytes = a->held_max;
        return FL_OK;
    case O_STALL: {
        long n;
        int rc = fl_cli_long("--stall-report", v, 0, 86400000, &n);
        a->co.stall_report_ms = (int)n;
        return rc;
    }
    default: return fl_fail(FL_EINVAL, "unknown flag");
    }
}

static int apply(args_t *a, int ch, const char *name, const char *v)
{
    if (ch >= O_SHARDS && ch <= O_OPTIM) {
        a->any_ps_flag = true; /* the metrics, stall and security flags are not the server's */
        return apply_server(a, ch, name, v);
    }
    return apply_job(a, ch, v);
}

/* Works out which shards this process serves; FL_EINVAL naming the conflict. */
static int resolve_shards(args_t *a)
{
    fl_ps_server_opts_t *so = &a->so;
    bool server_only = a->coordinator != NULL;
    if (server_only && a->num_shards < 0)
        return fl_fail(FL_EINVAL, "--coordinator: a server of another coordinator's job needs "
                                  "--num-shards");
    int index = a->shard_index >= 0 ? a->shard_index : 0;
    int num = a->num_shards;
    int mine = a->shards;
    if (num < 0)
        num = mine > 0 ? index + mine : 0;
    if (mine < 0)
        mine = a->shard_index >= 0 || server_only ? 1 : num - index;
    if (num == 0 && a->any_ps_flag && a->shards != 0)
        return fl_fail(FL_EINVAL, "parameter-server flags without --shards or --num-shards");
    if (mine > 0 && index + mine > num)
        return fl_fail(FL_EINVAL, "--shard-index %d --shards %d: beyond --num-shards %d", index,
                       mine, num);
    if (server_only && mine < 1)
        return fl_fail(FL_EINVAL, "--coordinator: this process serves no shard (--shards 0)");
    a->co.num_shards = num;
    so->num_shards = num;
    so->shard_first = index;
    so->shard_count = mine;
    return FL_OK;
}

/* The address ranks dial for this process's shards. */
static void pick_host(const args_t *a, char *out, size_t cap)
{
    const char *env = getenv("FLODL_HOST");
    fl_tp_endpoint_t ep;
    if (a->so.host != NULL) {
        snprintf(out, cap, "%s", a->so.host);
    } else if (env != NULL && env[0] != '\0') {
        snprintf(out, cap, "%s", env);
    } else if (a->coordinator != NULL &&
               fl_tp_local_addr_towards(a->coordinator, out, cap) == FL_OK) {
        /* the address of the route to the coordinator */
    } else if (a->co.bind != NULL && fl_tp_endpoint_parse(a->co.bind, &ep) == FL_OK &&
               ep.scheme == FL_TP_TCP && strcmp(ep.host, "*") != 0 &&
               strcmp(ep.host, "0.0.0.0") != 0 && strcmp(ep.host, "::") != 0) {
        snprintf(out, cap, "%s", ep.host);
    } else if (fl_tp_local_addr_towards("tcp://192.0.2.1:9", out, cap) != FL_OK) {
        /* No default route (no packet is sent to find it): this host alone. */
        snprintf(out, cap, "127.0.0.1");
    }
}

/* The coordinator's own endpoint as its in-process server dials it. */
static void local_endpoint(const char *bound, char *out, size_t cap)
{
    fl_tp_endpoint_t ep;
    if (fl_tp_endpoint_parse(bound, &ep) == FL_OK && ep.scheme == FL_TP_TCP &&
        (strcmp(ep.host, "0.0.0.0") == 0 || strcmp(ep.host, "*") == 0))
        snprintf(out, cap, "tcp://127.0.0.1:%d", ep.port);
    else if (fl_tp_endpoint_parse(bound, &ep) == FL_OK && ep.scheme == FL_TP_TCP &&
             strcmp(ep.host, "::") == 0)
        snprintf(out, cap, "tcp://[::1]:%d", ep.port);
    else
        snprintf(out, cap, "%s", bound);
}

static int parse(args_t *a, int argc, char **argv)
{
    static const struct option fixed[] = {
        {"bind", 1, NULL, O_BIND},
        {"world-size", 1, NULL, O_WORLD},
        {"job-id", 1, NULL, O_JOB},
        {"heartbeat-timeout", 1, NULL, O_HBT},
        {"rendezvous-timeout", 1, NULL, O_RDV},
        {"endpoint-file", 1, NULL, O_EPFILE},
        {"log-level", 1, NULL, O_LOG},
        {"help", 0, NULL, O_HELP},
        {"version", 0, NULL, O_VERSION},
        {"shards", 1, NULL, O_SHARDS},
        {"num-shards", 1, NULL, O_NUM},
        {"shard-index", 1, NULL, O_INDEX},
        {"coordinator", 1, NULL, O_COORD},
        {"host", 1, NULL, O_HOST},
        {"consistency", 1, NULL, O_CONS},
        {"staleness", 1, NULL, O_STALE},
        {"async-scale", 1, NULL, O_SCALE},
        {"init", 1, NULL, O_INIT},
        {"checkpoint-dir", 1, NULL, O_CKDIR},
        {"metrics-port", 1, NULL, O_MPORT},
        {"metrics-bind", 1, NULL, O_MBIND},
        {"health-port", 1, NULL, O_HPORT},
        {"stall-report", 1, NULL, O_STALL},
        {"curve-dir", 1, NULL, O_CURVE},
        {"insecure", 0, NULL, O_INSECURE},
        {"checkpoint-every", 1, NULL, O_CKEVERY},
        {"keep", 1, NULL, O_KEEP},
        {"resume", 0, NULL, O_RESUME},
        {"max-wait", 1, NULL, O_MAXWAIT},
        {"held-max", 1, NULL, O_HELDMAX},
    };
    static struct option longopts[64];
    int n = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        longopts[n++] = fixed[i];
    for (size_t i = 0; fl_cli_optim_names[i] != NULL; i++) {
        const char *o = fl_cli_optim_names[i];
        longopts[n++] = (struct option){o, strcmp(o, "nesterov") == 0 ? 0 : 1, NULL, O_OPTIM};
    }
    longopts[n] = (struct option){NULL, 0, NULL, 0};
    int ch, li = 0;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
        if (ch == 'h' || ch == O_HELP) {
            fputs(usage, stdout);
            return 1;
        }
        if (ch == O_VERSION) {
            fl_cli_version("flodl-ps");
            return 1;
        }
        if (ch == '?' || ch == ':')
            return fl_fail(FL_EINVAL, "unknown or incomplete flag '%s' (see --help)",
                           argv[optind - 1]);
        if (apply(a, ch, longopts[li].name, optarg) != FL_OK)
            return FL_EINVAL;
    }
    if (optind < argc)
        return fl_fail(FL_EINVAL, "unexpected argument '%s' (see --help)", argv[optind]);
    if (fl_cli_optim_check(&a->so.opt, &a->so.lr) != FL_OK)
        return FL_EINVAL;
    if (a->so.consistency != FL_PS_SSP && a->so.staleness != 0)
        return fl_fail(FL_EINVAL, "--staleness applies to --consistency ssp only");
    if (a->coordinator == NULL && a->co.world_size < 1)
        return fl_fail(FL_EINVAL, "--world-size: missing (or set FLODL_WORLD_SIZE)");
    if (a->coordinator != NULL && a->co.world_size > 0)
        return fl_fail(FL_EINVAL, "--world-size belongs to the coordinator, not to a server "
                                  "started with --coordinator");
    return resolve_shards(a);
}

/* Waits for the first signal or until done() says so; returns the signal or 0. */
static int wait_until(const sigset_t *sigs, fl_coord_t *coord, fl_ps_server_t *srv)
{
    struct timespec tick = {0, 100 * 1000000L};
    for (;;) {
        if (coord != NULL && fl_coord_wait(coord, 0) != FL_ETIMEDOUT)
            return 0;
        if (coord == NULL && fl_ps_server_wait(srv, 0) != FL_ETIMEDOUT)
            return 0;
        int s = sigtimedwait(sigs, NULL, &tick);
        if (s > 0)
            return s;
    }
}

/* What a run holds, made in this order and released in the reverse one. */
typedef struct run {
    fl_coord_t *coord;              /* NULL with --coordinator */
    fl_ps_server_t *srv;            /* NULL when this process serves no shard */
    ps_metrics_t *metrics;          /* NULL without --metrics-port */
    char coord_ep[FL_ENDPOINT_MAX]; /* the coordinator as this process's server dials it */
    char host[FL_HOST_MAX];         /* the address ranks dial for this process's shards */
} run_t;

static void release(run_t *r)
{
    ps_metrics_stop(&r->metrics);
    fl_ps_server_destroy(&r->srv);
    fl_coord_destroy(&r->coord);
}

static void init_args(args_t *a)
{
    memset(a, 0, sizeof *a);
    fl_coord_opts_init(&a->co);
    a->co.bind = "tcp://0.0.0.0:29500";
    fl_ps_server_opts_init(&a->so);
    a->shards = a->num_shards = a->shard_index = -1;
    a->metrics_port = -1;
    a->health_port = -1;
}

/* The launcher's environment (FLODL_*, torchrun's) as defaults the flags override; env and
 * bind (cap bytes) hold the strings a points into. */
static int from_env(args_t *a, fl_launch_info_t *env, char *bind, size_t cap)
{
    if (fl_launch_from_env(env_get, NULL, env) != FL_OK)
        return FL_EINVAL;
    if (env->world_size > 0)
        a->co.world_size = env->world_size;
    if (env->job_id[0] != '\0')
        a->co.job_id = a->so.job_id = env->job_id;
    if (env->log_level >= 0)
        a->co.log_level = a->so.log_level = (fl_log_level_t)env->log_level;
    /* The port the workers dial (FLODL_COORDINATOR's, or torchrun's MASTER_PORT), unless
     * --bind says otherwise. */
    if (env->port > 0) {
        snprintf(bind, cap, "tcp://0.0.0.0:%d", env->port);
        a->co.bind = bind;
    }
    return FL_OK;
}

/* The coordinator, unless --coordinator names another one, and its --endpoint-file. 0, or the
 * exit status. */
static int make_coordinator(const args_t *a, run_t *r)
{
    if (a->coordinator != NULL) {
        snprintf(r->coord_ep, sizeof r->coord_ep, "%s", a->coordinator);
        return 0;
    }
    int rc = fl_coord_create(&a->co, &r->coord);
    if (rc != FL_OK) {
        fprintf(stderr, "flodl-ps: %s\n", fl_last_error());
        return rc == FL_EINVAL ? 2 : 1;
    }
    if (a->held_max != 0)
        fl_coord_set_held_max(r->coord, a->held_max); /* in range: checked as a flag */
    local_endpoint(fl_coord_endpoint(r->coord), r->coord_ep, sizeof r->coord_ep);
    if (a->epfile != NULL) {
        FILE *f = fopen(a->epfile, "w");
        if (f == NULL || fprintf(f, "%s\n", fl_coord_endpoint(r->coord)) < 0 || fclose(f) != 0) {
            fprintf(stderr, "flodl-ps: cannot write --endpoint-file %s\n", a->epfile);
            return 1;
        }
    }
    return 0;
}

/* The parameter server (when this process serves shards) and the metrics, then the threads of
 * the coordinator and the server. 0, or the exit status. */
static int start(args_t *a, run_t *r)
{
    int rc;
    if (a->so.shard_count > 0) {
        a->so.coordinator = r->coord_ep;
        if ((rc = fl_ps_server_create(&a->so, &r->srv)) != FL_OK) {
            fprintf(stderr, "flodl-ps: %s\n", fl_last_error());
            return rc == FL_EINVAL ? 2 : 1;
        }
    }
    fl_fdlimit_start("flodl-ps", a->co.log_level); /* a descriptor per connection */
    if (a->curve_dir == NULL)
        fl_cli_security_notice("flodl-ps"); /* once everything is valid: about to serve */
    if (a->metrics_port >= 0 || a->health_port >= 0) {
        const char *addr = a->metrics_bind ? a->metrics_bind : "0.0.0.0";
        if ((rc = ps_metrics_start(a->metrics_bind, a->metrics_port, a->health_port, r->coord,
                                   r->srv, a->co.world_size, &r->metrics)) != FL_OK) {
            fprintf(stderr, "flodl-ps: %s\n", fl_last_error());
            return rc == FL_EINVAL ? 2 : 1;
        }
        if (a->metrics_port >= 0)
            fprintf(stderr, "flodl-ps: metrics on http://%s:%d/metrics\n", addr,
                    ps_metrics_port(r->metrics));
        if (a->health_port >= 0)
            fprintf(stderr, "flodl-ps: health on http://%s:%d/healthz\n", addr,
                    ps_metrics_health_port(r->metrics));
    }
    if ((r->coord != NULL && (rc = fl_coord_start(r->coord)) != FL_OK) ||
        (r->srv != NULL && (rc = fl_ps_server_start(r->srv)) != FL_OK)) {
        fprintf(stderr, "flodl-ps: %s\n", fl_last_error());
        return 1;
    }
    return 0;
}

/* The job is over: the coordinator stays a little so the members hear how it ended. */
static void linger(const args_t *a, const run_t *r, int job_rc, const sigset_t *sigs)
{
    struct timespec tick = {0, 100 * 1000000L};
    int grace = a->co.heartbeat_timeout_ms + 2000;
    int64_t until = fl_now_ms() + grace;
    if (job_rc == FL_OK) {
        /* The servers were told the job is over: they write final checkpoints and leave. */
        if (r->srv != NULL)
            fl_ps_server_wait(r->srv, 60000);
        while (fl_coord_servers_active(r->coord) > 0 && fl_now_ms() < until + 58000)
            if (sigtimedwait(sigs, NULL, &tick) > 0)
                break;
        return;
    }
    /* The job failed: give the survivors time to hear it and leave before closing, and ranks
     * that have not registered yet (a refused rendezvous) a chance to hear why instead of
     * waiting out their rendezvous timeout. */
    while ((fl_coord_active(r->coord) > 0 || fl_coord_servers_active(r->coord) > 0 ||
            fl_coord_unheard(r->coord) > 0) &&
           fl_now_ms() < until)
        if (sigtimedwait(sigs, NULL, &tick) > 0)
            break;
}

/* Stops the parameter server (a final checkpoint unless it ended already), says what it
 * served, and returns how it ended, with the detail in detail. */
static int finish_server(const args_t *a, run_t *r, char *detail, size_t cap)
{
    fl_ps_server_stop(r->srv);
    int rc = fl_ps_server_wait(r->srv, 0);
    snprintf(detail, cap, "%s", fl_last_error());
    fl_ps_server_stats_t st;
    fl_ps_server_get_stats(r->srv, &st);
    if (a->so.log_level <= FL_LOG_INFO)
        fprintf(stderr,
                "flodl-ps: shards %d..%d served %llu pushes and %llu pulls up to step %llu "
                "(version %llu); refused %llu requests and %llu malformed messages; %llu "
                "checkpoints, %llu pulls timed out\n",
                a->so.shard_first, a->so.shard_first + a->so.shard_count - 1,
                (unsigned long long)st.pushes, (unsigned long long)st.pulls,
                (unsigned long long)st.step, (unsigned long long)st.version,
                (unsigned long long)st.refused, (unsigned long long)st.bad_msgs,
                (unsigned long long)st.checkpoints, (unsigned long long)st.timeouts);
    fl_ps_server_destroy(&r->srv);
    return rc;
}

static void finish_coordinator(run_t *r)
{
    fl_coord_stop(r->coord);
    /* Every rank's end, in one line (the operator's answer to "which one, and why"). */
    char outcome[8192];
    fl_coord_outcome(r->coord, outcome, sizeof outcome);
    fprintf(stderr, "flodl-ps: outcome: %s\n", outcome);
    fl_coord_destroy(&r->coord);
}

/* The exit status: 1 after a signal; then the job's failure, or else the server's own (2 for
 * a configuration refused, 1 otherwise). */
static int exit_status(int signo, int job_rc, const char *detail, int server_rc,
                       const char *server_detail)
{
    if (signo != 0) {
        fprintf(stderr, "flodl-ps: stopped by signal %d\n", signo);
        return 1;
    }
    if (job_rc != FL_OK) {
        fprintf(stderr, "flodl-ps: job failed: %s\n", detail);
        return job_rc == FL_EINVAL ? 2 : 1;
    }
    if (server_rc != FL_OK && server_rc != FL_ECLOSED) {
        fprintf(stderr, "flodl-ps: parameter server failed: %s\n", server_detail);
        return server_rc == FL_EINVAL ? 2 : 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    args_t a;
    init_args(&a);
    fl_launch_info_t env;
    char env_bind[64];
    if (from_env(&a, &env, env_bind, sizeof env_bind) != FL_OK)
        return bad_flag();
    int rc = parse(&a, argc, argv);
    if (rc == 1)
        return 0; /* --help */
    if (rc != FL_OK)
        return bad_flag();
    if (fl_cli_security(a.curve_dir, a.insecure, env.curve_dir, env.insecure, &a.curve_dir) !=
        FL_OK)
        return bad_flag();
    a.co.curve_dir = a.so.curve_dir = a.curve_dir;
    /* A bad --init file is refused before anything binds or connects: ranks must not meet a
     * job whose parameter server cannot start. */
    if (a.so.shard_count > 0 && a.so.init_path != NULL &&
        fl_ps_server_check_init(a.so.init_path) != FL_OK)
        return bad_flag();

    /* Signals are taken synchronously by this thread; the others never see them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    run_t r;
    memset(&r, 0, sizeof r);
    pick_host(&a, r.host, sizeof r.host);
    a.so.host = r.host;
    if (a.so.shard_count > 0 && a.so.tune_malloc)
        fl_malloc_tune(); /* before any thread: one arena, that malloc_trim can give back */
    if ((rc = make_coordinator(&a, &r)) != 0 || (rc = start(&a, &r)) != 0) {
        release(&r);
        return rc;
    }

    int signo = wait_until(&sigs, r.coord, r.srv);
    char detail[1024] = "";
    int job_rc = FL_OK;
    if (signo == 0) {
        job_rc = r.coord != NULL ? fl_coord_wait(r.coord, 0) : fl_ps_server_wait(r.srv, 0);
        snprintf(detail, sizeof detail, "%s", fl_last_error());
        if (r.coord != NULL)
            linger(&a, &r, job_rc, &sigs);
    }
    ps_metrics_stop(&r.metrics); /* it reads the coordinator and the server: before either goes */
    int server_rc = FL_OK;
    char server_detail[1024] = "";
    if (r.srv != NULL)
        server_rc = finish_server(&a, &r, server_detail, sizeof server_detail);
    if (r.coord != NULL)
        finish_coordinator(&r);
    return exit_status(signo, job_rc, detail, server_rc, server_detail);
}
