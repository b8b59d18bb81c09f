/* flodl-launch: runs a whole job on this machine, or this machine's part of one (--nnodes).
 * Starts flodl-ps and N flodl-worker processes (or N copies of any program, e.g. a Python
 * script using the flodl package) on 127.0.0.1 (or 127.0.0.1..H as H hosts), relays their
 * output behind "[ps] " / "[rank K] ", forwards SIGINT/SIGTERM, and stops everything when one
 * process fails, naming it. The policy lives here; the flags and the layout in launch_flags.c;
 * fork/exec, the output relay and reaping in launch_proc.c. Exit 0 / 1 (a process failed) / 2
 * (bad flags) / 128+signal. */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fl_core.h"
#include "fl_tp.h"
#include "launch_int.h"

#define GRACE_MS 10000    /* from SIGTERM (or the end of the job) to SIGKILL */
#define KILL_WAIT_MS 5000 /* for SIGKILLed processes to be reaped */
#define ENDPOINT_MS 10000 /* for flodl-ps to write its endpoint */
#define DRAIN_MS 2000     /* for the last output once every process is reaped */
/* Node 0's flodl-ps also waits for the other nodes' ranks to leave once its own are done. */
#define NODES_GRACE_MS 60000

/* One job: flodl-ps is child 0 and local process k child k + 1; without flodl-ps (a node but
 * node 0), process k is child k. */
typedef struct job {
    fl_launch_procs_t *procs;
    bool has_ps;
    size_t first;    /* the child index of the first worker */
    int ps_grace_ms; /* how long flodl-ps may outlive this launcher's ranks */
    size_t nworkers;
    size_t started;
    size_t workers_ok;
    bool ps_done;     /* flodl-ps exited 0 */
    int code;         /* the exit status once decided; -1 while all goes well */
    bool stopping;    /* a stop signal went out; later exits are expected */
    bool killed;      /* SIGKILL went out */
    bool gave_up;     /* something survived SIGKILL: stop waiting */
    int64_t deadline; /* of the bounded wait under way; INT64_MAX when none */
} job_t;

static bool is_executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* The binary given by flag, else name in our own directory, else in ../sub/ (the build tree
 * keeps flodl-ps in server/ and flodl-worker in worker/). FL_EINVAL for a bad flag value,
 * FL_EIO when nothing was found. */
static int find_binary(const char *flag, const char *given, const char *name, const char *sub,
                       char *out, size_t cap)
{
    if (given != NULL) {
        if (!is_executable(given))
            return fl_fail(FL_EINVAL, "%s: '%s' is not an executable file", flag, given);
        snprintf(out, cap, "%s", given);
        return FL_OK;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return fl_fail(FL_EIO, "cannot read /proc/self/exe to find %s; pass %s PATH", name, flag);
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL)
        *slash = '\0';
    int w = snprintf(out, cap, "%s/%s", self, name);
    if (w > 0 && (size_t)w < cap && is_executable(out))
        return FL_OK;
    w = snprintf(out, cap, "%s/../%s/%s", self, sub, name);
    if (w > 0 && (size_t)w < cap && is_executable(out))
        return FL_OK;
    return fl_fail(FL_EIO, "cannot find %s in %s or %s/../%s; pass %s PATH", name, self, self, sub,
                   flag);
}

/* PROGRAM as given when it holds a '/', else the first executable of that name in PATH. */
static int find_program(const char *prog, char *out, size_t cap)
{
    if (strchr(prog, '/') != NULL) {
        if (!is_executable(prog))
            return fl_fail(FL_EINVAL, "program '%s' is not an executable file", prog);
        snprintf(out, cap, "%s", prog);
        return FL_OK;
    }
    const char *path = getenv("PATH");
    if (path == NULL || path[0] == '\0')
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p != '\0';) {
        size_t n = strcspn(p, ":");
        int w = snprintf(out, cap, "%.*s/%s", (int)n, n > 0 ? p : ".", prog);
        if (w > 0 && (size_t)w < cap && is_executable(out))
            return FL_OK;
        p += n;
        if (*p == ':')
            p++;
    }
    return fl_fail(FL_EINVAL, "program '%s' not found in PATH", prog);
}

/* Sends sig to every process still running: the workers first, then flodl-ps, so the ranks
 * are not first told by the coordinator that the job is over, which would bury the cause. */
static void stop_all(job_t *j, int sig)
{
    for (size_t i = j->first; i < j->started; i++)
        fl_launch_procs_kill(j->procs, i, sig);
    if (j->has_ps)
        fl_launch_procs_kill(j->procs, 0, sig);
    if (!j->stopping) {
        j->stopping = true;
        j->deadline = fl_deadline_in(GRACE_MS);
    }
    if (sig == SIGKILL) {
        j->killed = true;
        j->deadline = fl_deadline_in(KILL_WAIT_MS);
    }
}

static void on_signal(job_t *j, int sig)
{
    if (!j->stopping) {
        fprintf(stderr, "flodl-launch: got signal %d (%s); stopping all processes\n", sig,
                strsignal(sig));
        if (j->code < 0)
            j->code = 128 + sig;
        stop_all(j, sig);
    } else if (!j->killed) {
        fprintf(stderr, "flodl-launch: got signal %d (%s) again; killing all processes\n", sig,
                strsignal(sig));
        stop_all(j, SIGKILL);
    }
}

static void on_exit_status(job_t *j, size_t i, int status)
{
    if (j->stopping)
        return; /* we stopped it, or it noticed the job failing: the cause is already named */
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char how[96];
        fl_launch_status_describe(status, how, sizeof how);
        bool others = fl_launch_procs_running(j->procs) > 0;
        fprintf(stderr, "flodl-launch: %s %s%s\n", fl_launch_procs_name(j->procs, i), how,
                others ? "; stopping the others" : "");
        j->code = 1;
        stop_all(j, SIGTERM);
        return;
    }
    /* A clean exit: the rest of the job should follow soon; wait for it, bounded. */
    if (j->has_ps && i == 0)
        j->ps_done = true;
    else
        j->workers_ok++;
    bool ps_over = j->ps_done || !j->has_ps;
    if (ps_over && j->workers_ok == j->nworkers)
        j->deadline = INT64_MAX;
    else if (j->ps_done)
        j->deadline = fl_deadline_in(GRACE_MS);
    else if (j->workers_ok == j->nworkers)
        j->deadline = fl_deadline_in(j->ps_grace_ms);
}

static void on_deadline(job_t *j)
{
    size_t left = fl_launch_procs_running(j->procs);
    if (j->killed) {
        fprintf(stderr, "flodl-launch: %zu process(es) survived SIGKILL for %d s; giving up\n",
                left, KILL_WAIT_MS / 1000);
        j->gave_up = true;
    } else if (j->stopping) {
        fprintf(stderr,
                "flodl-launch: %zu process(es) still running %d s after the stop signal; "
                "killing them\n",
                left, GRACE_MS / 1000);
        stop_all(j, SIGKILL);
    } else {
        if (j->ps_done)
            fprintf(stderr,
                    "flodl-launch: %zu rank(s) still running %d s after flodl-ps finished; "
                    "stopping them\n",
                    left, GRACE_MS / 1000);
        else
            fprintf(stderr,
                    "flodl-launch: flodl-ps still running %d s after every rank%s finished; "
                    "stopping it\n",
                    j->ps_grace_ms / 1000, j->ps_grace_ms != GRACE_MS ? " of this node" : "");
        j->code = 1;
        stop_all(j, SIGTERM);
    }
}

/* One round: relay output for up to max_ms, then act on signals, exits and deadlines. */
static void step(job_t *j, int max_ms)
{
    int left = fl_deadline_left_ms(j->deadline);
    int signo;
    fl_launch_procs_pump(j->procs, left < max_ms ? left : max_ms, &signo);
    if (signo != 0)
        on_signal(j, signo);
    size_t i;
    int status;
    while (fl_launch_procs_next_exit(j->procs, &i, &status))
        on_exit_status(j, i, status);
    if (fl_deadline_left_ms(j->deadline) == 0 && fl_launch_procs_running(j->procs) > 0)
        on_deadline(j);
}

/* True once flodl-ps wrote a whole line (it writes the file with stdio, not atomically). */
static bool read_endpoint(const char *file, char *ep, size_t cap)
{
    FILE *f = fopen(file, "r");
    if (f == NULL)
        return false;
    bool ok = fgets(ep, (int)cap, f) != NULL && strchr(ep, '\n') != NULL;
    fclose(f);
    if (ok)
        ep[strcspn(ep, "\n")] = '\0';
    return ok && ep[0] != '\0';
}

static bool wait_endpoint(job_t *j, const char *file, char *ep, size_t cap)
{
    int64_t until = fl_deadline_in(ENDPOINT_MS);
    for (;;) {
        if (read_endpoint(file, ep, cap))
            return true;
        if (j->stopping)
            return false;
        if (j->ps_done || fl_deadline_left_ms(until) == 0) {
            if (j->ps_done)
                fprintf(stderr, "flodl-launch: flodl-ps exited before writing its endpoint\n");
            else
                fprintf(stderr,
                        "flodl-launch: flodl-ps wrote no endpoint to %s within %d s; "
                        "stopping it\n",
                        file, ENDPOINT_MS / 1000);
            j->code = 1;
            stop_all(j, SIGTERM);
            return false;
        }
        step(j, 50);
    }
}

/* --curve-dir DIR or --insecure, for flodl-ps and the workers. */
static size_t security_args(const fl_launch_opts_t *o, const char **argv, size_t a)
{
    if (o->insecure) {
        argv[a++] = "--insecure";
    } else {
        argv[a++] = "--curve-dir";
        argv[a++] = o->curve_dir;
    }
    return a;
}

/* Throw-away keys for one job in dir/keys: a server key pair, a client key pair, and the
 * client allowed in. */
static int make_keys(const char *dir, char *keys, size_t cap)
{
    snprintf(keys, cap, "%s/keys", dir);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/authorized", keys);
    if (mkdir(keys, 0700) != 0 || mkdir(path, 0700) != 0)
        return fl_fail(FL_EIO, "cannot make %s: %s", path, strerror(errno));
    int rc;
    snprintf(path, sizeof path, "%s/server", keys);
    if ((rc = fl_tp_curve_keygen(path, "flodl-launch, this job only", FL_TP_KEY_ANY)) != FL_OK)
        return rc;
    snprintf(path, sizeof path, "%s/authorized/client", keys);
    if ((rc = fl_tp_curve_keygen(path, "flodl-launch, this job only", FL_TP_KEY_ANY)) != FL_OK)
        return rc;
    /* The client's key pair is client.key beside server.key; its public half stays allowed. */
    char from[PATH_MAX + 64];
    snprintf(from, sizeof from, "%s/authorized/client.key", keys);
    snprintf(path, sizeof path, "%s/client.key", keys);
    if (rename(from, path) != 0)
        return fl_fail(FL_EIO, "cannot move %s: %s", from, strerror(errno));
    return FL_OK;
}

static void remove_keys(const char *keys)
{
    static const char *const files[] = {"server.key", "server.pub",
                                        "client.key", "authorized/client.pub",
                                        "authorized", NULL};
    char path[PATH_MAX + 64];
    for (size_t i = 0; files[i] != NULL; i++) {
        snprintf(path, sizeof path, "%s/%s", keys, files[i]);
        if (unlink(path) != 0)
            rmdir(path);
    }
    rmdir(keys);
}

static void start_ps(job_t *j, const fl_launch_opts_t *o, const char *path, const char *epfile)
{
    char world[24];
    snprintf(world, sizeof world, "%ld", o->world);
    const char **argv = calloc(o->npargs + 20, sizeof *argv);
    if (argv == NULL) {
        fprintf(stderr, "flodl-launch: no memory for flodl-ps's arguments\n");
        j->code = 1;
        return;
    }
    size_t a = 0;
    argv[a++] = path;
    argv[a++] = "--bind";
    argv[a++] = o->coordinator != NULL ? o->coordinator : "tcp://127.0.0.1:0";
    argv[a++] = "--world-size";
    argv[a++] = world;
    argv[a++] = "--endpoint-file";
    argv[a++] = epfile;
    /* Quiet unless the user asked flodl-ps for more through its variable. */
    const char *log = getenv("FLODL_LOG");
    if (log == NULL || log[0] == '\0') {
        argv[a++] = "--log-level";
        argv[a++] = "warn";
    }
    if (o->heartbeat != NULL) {
        argv[a++] = "--heartbeat-timeout";
        argv[a++] = o->heartbeat;
    }
    if (o->job_id != NULL) {
        argv[a++] = "--job-id";
        argv[a++] = o->job_id;
    }
    a = security_args(o, argv, a);
    for (size_t i = 0; i < o->npargs; i++)
        argv[a++] = o->pargs[i];
    argv[a] = NULL;
    size_t idx;
    int rc =
        fl_launch_procs_spawn(j->procs, "flodl-ps", "[ps] ", path, (char *const *)argv, -1, &idx);
    free(argv);
    if (rc != FL_OK) {
        fprintf(stderr, "flodl-launch: cannot start flodl-ps: %s\n", fl_last_error());
        j->code = 1;
        return;
    }
    j->started = 1;
}

/* With more local processes than CPUs, process p stays on the (p mod ncpus)-th CPU we may use:
 * the ranks of a ring then take turns on each core instead of migrating (~10-15% faster
 * measured with 4 ranks on 2 cores). */
static int pin_cpu(const fl_launch_opts_t *o, long p)
{
    cpu_set_t allowed;
    if (!o->pin || sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return -1;
    long n = CPU_COUNT(&allowed);
    if (o->nlocal <= n || n <= 0)
        return -1;
    long want = p % n;
    for (int c = 0, seen = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed) && seen++ == want)
            return c;
    return -1;
}

/* With --hosts, local process p is on host p / per_host, whose identity is 127.0.0.(h+1): what
 * its ranks advertise, bind and group by. Otherwise FLODL_HOST stays the user's. */
static void host_env(const fl_launch_opts_t *o, long p)
{
    if (o->hosts <= 0)
        return;
    char v[32];
    snprintf(v, sizeof v, "127.0.0.%ld", p / o->per_host + 1);
    setenv("FLODL_HOST", v, 1);
}

/* The variables a program's flodl.init() (or fl_comm_opts_from_env) reads, for local process p;
 * the launcher is single-threaded here, and each child takes its copy of the environment at
 * fork. */
static void program_env(const fl_launch_opts_t *o, long p, const char *ep)
{
    char v[24];
    snprintf(v, sizeof v, "%ld", o->first_rank + p);
    setenv("FLODL_RANK", v, 1);
    snprintf(v, sizeof v, "%ld", p % o->per_host);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%ld", o->world);
    setenv("FLODL_WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%ld", o->per_host);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    setenv("FLODL_COORDINATOR", ep, 1);
    host_env(o, p);
    if (o->insecure) {
        setenv("FLODL_INSECURE", "1", 1);
        unsetenv("FLODL_CURVE_DIR");
    } else {
        setenv("FLODL_CURVE_DIR", o->curve_dir, 1);
        unsetenv("FLODL_INSECURE");
    }
    if (o->job_id != NULL)
        setenv("FLODL_JOB_ID", o->job_id, 1);
}

/* Local process p, run as path with argv (its rank already in it); false after saying why. */
static bool spawn_rank(job_t *j, const fl_launch_opts_t *o, long p, const char *path,
                       char *const *argv)
{
    long rank = o->first_rank + p;
    char name[32];
    char prefix[32];
    snprintf(name, sizeof name, "rank %ld", rank);
    snprintf(prefix, sizeof prefix, "[rank %ld] ", rank);
    size_t idx;
    if (fl_launch_procs_spawn(j->procs, name, prefix, path, argv, pin_cpu(o, p), &idx) != FL_OK) {
        fprintf(stderr, "flodl-launch: cannot start rank %ld: %s; stopping the others\n", rank,
                fl_last_error());
        j->code = 1;
        stop_all(j, SIGTERM);
        return false;
    }
    j->started++;
    return true;
}

static void start_workers(job_t *j, const fl_launch_opts_t *o, const char *path, const char *ep)
{
    if (o->prog != NULL) {
        for (long p = 0; p < o->nlocal && !j->stopping; p++) {
            program_env(o, p, ep);
            if (!spawn_rank(j, o, p, path, o->prog))
                break;
        }
        return;
    }
    const char **argv = calloc(o->nwargs + 12, sizeof *argv);
    if (argv == NULL) {
        fprintf(stderr, "flodl-launch: no memory for the workers' arguments\n");
        j->code = 1;
        stop_all(j, SIGTERM);
        return;
    }
    char rank[24];
    char world[24];
    snprintf(world, sizeof world, "%ld", o->world);
    size_t a = 0;
    argv[a++] = path;
    argv[a++] = "--rank";
    argv[a++] = rank; /* filled per worker; fork gives each child its own copy */
    argv[a++] = "--world-size";
    argv[a++] = world;
    argv[a++] = "--coordinator";
    argv[a++] = ep;
    a = security_args(o, argv, a);
    for (size_t i = 0; i < o->nwargs; i++)
        argv[a++] = o->wargs[i];
    argv[a] = NULL;
    for (long p = 0; p < o->nlocal && !j->stopping; p++) {
        snprintf(rank, sizeof rank, "%ld", o->first_rank + p);
        host_env(o, p);
        if (!spawn_rank(j, o, p, path, (char *const *)argv))
            break;
    }
    free(argv);
}

/* A directory of the job's own: flodl-ps's endpoint file and, unless the job has keys or runs
 * in plain text, its throw-away keys. */
typedef struct jobdir {
    char dir[PATH_MAX];
    char epfile[PATH_MAX + 8];
    char keys[PATH_MAX + 8]; /* "" when none were made */
} jobdir_t;

static void jobdir_remove(jobdir_t *d)
{
    unlink(d->epfile);
    if (d->keys[0] != '\0')
        remove_keys(d->keys);
    rmdir(d->dir);
}

/* 0, or 1 after saying why. */
static int jobdir_make(const fl_launch_opts_t *o, jobdir_t *d)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0')
        tmp = "/tmp";
    memset(d, 0, sizeof *d);
    int w = snprintf(d->dir, sizeof d->dir, "%s/flodl-launch-XXXXXX", tmp);
    if (w < 0 || (size_t)w >= sizeof d->dir || mkdtemp(d->dir) == NULL) {
        fprintf(stderr, "flodl-launch: cannot create a directory for the endpoint file in %s\n",
                tmp);
        return 1;
    }
    snprintf(d->epfile, sizeof d->epfile, "%s/ep", d->dir);
    if (o->insecure || o->curve_dir != NULL || make_keys(d->dir, d->keys, sizeof d->keys) == FL_OK)
        return 0;
    fprintf(stderr, "flodl-launch: throw-away keys: %s\n", fl_last_error());
    jobdir_remove(d);
    return 1;
}

/* Starts flodl-ps (unless this node leaves that to node 0) and the ranks; ep gets the endpoint
 * the ranks dial. */
static void start_job(job_t *j, const fl_launch_opts_t *o, const char *ps_path, const char *wk_path,
                      const jobdir_t *d)
{
    char ep[512];
    if (j->has_ps) {
        start_ps(j, o, ps_path, d->epfile);
        if (j->started != 1 || !wait_endpoint(j, d->epfile, ep, sizeof ep))
            return;
    }
    /* Every node's ranks dial the endpoint as given, node 0's too: one address for the job. */
    if (o->coordinator != NULL)
        snprintf(ep, sizeof ep, "%s", o->coordinator);
    start_workers(j, o, wk_path, ep);
}

static int run_job(const fl_launch_opts_t *given, const char *ps_path, const char *wk_path)
{
    jobdir_t d;
    if (jobdir_make(given, &d) != 0)
        return 1;
    fl_launch_opts_t o = *given;
    if (d.keys[0] != '\0')
        o.curve_dir = d.keys;
    job_t j = {.has_ps = o.run_ps,
               .first = o.run_ps ? 1 : 0,
               .ps_grace_ms = o.world > o.nlocal ? NODES_GRACE_MS : GRACE_MS,
               .nworkers = (size_t)o.nlocal,
               .code = -1,
               .deadline = INT64_MAX};
    if (fl_launch_procs_create((size_t)o.nlocal + j.first, &j.procs) != FL_OK) {
        fprintf(stderr, "flodl-launch: %s\n", fl_last_error());
        jobdir_remove(&d);
        return 1;
    }
    start_job(&j, &o, ps_path, wk_path, &d);
    while (fl_launch_procs_running(j.procs) > 0 && !j.gave_up)
        step(&j, 1000);
    fl_launch_procs_drain(j.procs, fl_deadline_in(DRAIN_MS));
    fl_launch_procs_destroy(&j.procs);
    jobdir_remove(&d);
    return j.code < 0 ? 0 : j.code;
}

/* flodl-ps, and flodl-worker or the program, to run. */
static int find_binaries(const fl_launch_opts_t *o, char *ps_path, char *wk_path, size_t cap)
{
    int rc = find_binary("--ps", o->ps_path, "flodl-ps", "server", ps_path, cap);
    if (rc != FL_OK)
        return rc;
    if (o->prog != NULL && o->nwargs > 0)
        return fl_fail(FL_EINVAL, "'%s': a flodl-worker flag, but the job runs the program '%s'",
                       o->wargs[0], o->prog[0]);
    if (o->prog != NULL)
        return find_program(o->prog[0], wk_path, cap);
    return find_binary("--worker", o->worker_path, "flodl-worker", "worker", wk_path, cap);
}

int main(int argc, char **argv)
{
    fl_launch_opts_t o;
    int rc = fl_launch_opts_parse(argc, argv, &o);
    if (rc == FL_OK && (o.help || o.version)) {
        if (o.help)
            fl_launch_opts_help(stdout);
        else
            fl_cli_version("flodl-launch");
        fl_launch_opts_deinit(&o);
        return 0;
    }
    char ps_path[PATH_MAX];
    char wk_path[PATH_MAX];
    if (rc == FL_OK)
        rc = find_binaries(&o, ps_path, wk_path, PATH_MAX);
    if (rc != FL_OK) {
        fprintf(stderr, "flodl-launch: %s\n", fl_last_error());
        fl_launch_opts_deinit(&o);
        return rc == FL_EINVAL ? 2 : 1;
    }
    rc = run_job(&o, ps_path, wk_path);
    fl_launch_opts_deinit(&o);
    return rc;
}
