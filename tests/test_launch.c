/* flodl-launch run as a child process with captured output: bad flags (exit 2, one line), a
 * real job (every line prefixed, every rank's summary), hosts on loopback and two nodes (each
 * rank's variables), the relay itself against stand-in scripts (long, partial and stderr
 * lines, the arguments each child gets), and the failures: a worker refusing its flags, a
 * worker SIGKILLed mid-job, SIGTERM/SIGINT to the launcher, flodl-ps failing or never
 * starting. Each job carries a unique --job-id, which flodl-launch
 * also gives flodl-ps, so the test can see that no process of the job outlives the launcher. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#define LAUNCH_BIN FLODL_BIN_DIR "/launch/flodl-launch"
#define OUT_CAP ((size_t)1 << 20)
#define MAX_ARGS 40

/* The launcher and what it printed. Output beyond OUT_CAP drops the older half, so a chatty
 * job never blocks on a full pipe. */
typedef struct proc {
    pid_t pid;
    int fd[2]; /* read ends of stdout and stderr; -1 once closed */
    char *buf[2];
    size_t len[2];
    bool reaped;
    int status;
    int64_t start_ms;
    int64_t end_ms;
} proc_t;

static void proc_start(proc_t *p, const char *const *argv)
{
    memset(p, 0, sizeof *p);
    p->fd[0] = p->fd[1] = -1;
    p->pid = -1; /* stays so when the start fails: the caller's checks then fail */
    p->buf[0] = calloc(1, OUT_CAP + 1);
    p->buf[1] = calloc(1, OUT_CAP + 1);
    int out[2] = {-1, -1};
    int err[2] = {-1, -1};
    if (p->buf[0] == NULL || p->buf[1] == NULL || pipe2(out, O_CLOEXEC) != 0 ||
        pipe2(err, O_CLOEXEC) != 0) {
        for (int k = 0; k < 2; k++) {
            if (out[k] >= 0)
                close(out[k]);
            if (err[k] >= 0)
                close(err[k]);
        }
        return;
    }
    pid_t parent = getpid();
    p->start_ms = fl_now_ms();
    pid_t pid = fork();
    if (pid == 0) {
        /* Dies with the test process even when Check kills it on a timeout; its own children
         * then get SIGTERM from flodl-launch's death signal. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        execv(argv[0], (char *const *)argv);
        dprintf(2, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        return;
    }
    p->pid = pid;
    p->fd[0] = out[0];
    p->fd[1] = err[0];
}

static void append(proc_t *p, int k, const char *data, size_t n)
{
    if (p->len[k] + n > OUT_CAP) {
        size_t drop = p->len[k] / 2 + n;
        if (drop > p->len[k])
            drop = p->len[k];
        memmove(p->buf[k], p->buf[k] + drop, p->len[k] - drop);
        p->len[k] -= drop;
    }
    memcpy(p->buf[k] + p->len[k], data, n);
    p->len[k] += n;
    p->buf[k][p->len[k]] = '\0';
}

/* Reads what the launcher printed (waiting up to timeout_ms) and reaps it once it exited. */
static void proc_pump(proc_t *p, int timeout_ms)
{
    struct pollfd pfd[2];
    int which[2];
    nfds_t nfd = 0;
    for (int k = 0; k < 2; k++)
        if (p->pid > 0 && p->fd[k] >= 0) {
            pfd[nfd] = (struct pollfd){p->fd[k], POLLIN, 0};
            which[nfd++] = k;
        }
    if (nfd > 0 && poll(pfd, nfd, timeout_ms) > 0) {
        for (nfds_t j = 0; j < nfd; j++) {
            if (pfd[j].revents == 0)
                continue;
            char tmp[4096];
            ssize_t r = read(pfd[j].fd, tmp, sizeof tmp);
            if (r > 0) {
                append(p, which[j], tmp, (size_t)r);
            } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
                close(p->fd[which[j]]);
                p->fd[which[j]] = -1;
            }
        }
    } else if (nfd == 0 && timeout_ms > 0) {
        usleep((useconds_t)(timeout_ms > 20 ? 20 : timeout_ms) * 1000);
    }
    if (p->pid > 0 && !p->reaped && waitpid(p->pid, &p->status, WNOHANG) == p->pid) {
        p->reaped = true;
        p->end_ms = fl_now_ms();
    }
}

static bool proc_done(const proc_t *p)
{
    return p->pid <= 0 || (p->reaped && p->fd[0] < 0 && p->fd[1] < 0);
}

/* Waits until the launcher exited and closed its output, or the deadline. */
static bool proc_wait(proc_t *p, int64_t deadline)
{
    while (!proc_done(p)) {
        int left = fl_deadline_left_ms(deadline);
        if (left == 0)
            return false;
        proc_pump(p, left < 50 ? left : 50);
    }
    return true;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *s = strstr(hay, needle); s != NULL; s = strstr(s + 1, needle))
        n++;
    return n;
}

/* Waits until stdout holds `times` copies of text, the launcher ends, or the deadline. */
static bool proc_wait_text(proc_t *p, const char *text, int times, int64_t deadline)
{
    for (;;) {
        if (count_of(p->buf[0], text) >= times)
            return true;
        if (proc_done(p) || fl_deadline_left_ms(deadline) == 0)
            return false;
        proc_pump(p, 50);
    }
}

/* SIGKILLs the launcher if it still runs and reaps it (its children get SIGTERM from their
 * death signal); keeps the output. */
static void proc_stop(proc_t *p)
{
    if (p->pid > 0 && !p->reaped)
        kill(p->pid, SIGKILL);
    proc_wait(p, fl_deadline_in(10000));
    for (int k = 0; k < 2; k++) {
        if (p->fd[k] >= 0)
            close(p->fd[k]);
        p->fd[k] = -1;
    }
}

static void proc_free(proc_t *p)
{
    free(p->buf[0]);
    free(p->buf[1]);
    p->buf[0] = p->buf[1] = NULL;
}

/* Exit code, or 128 + signal, or -1 when the launcher was not reaped. */
static int proc_code(const proc_t *p)
{
    if (!p->reaped)
        return -1;
    if (WIFEXITED(p->status))
        return WEXITSTATUS(p->status);
    if (WIFSIGNALED(p->status))
        return 128 + WTERMSIG(p->status);
    return -1;
}

static int64_t proc_ms(const proc_t *p)
{
    return p->reaped ? p->end_ms - p->start_ms : -1;
}

/* Runs flodl-launch with args (after the program name, NULL-terminated) to its end, within
 * limit_ms. */
static void run_launch(proc_t *p, const char *const *args, int limit_ms)
{
    const char *argv[MAX_ARGS] = {LAUNCH_BIN};
    size_t a = 1;
    for (size_t i = 0; args[i] != NULL && a + 1 < MAX_ARGS; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    proc_start(p, argv);
    proc_wait(p, fl_deadline_in(limit_ms));
    proc_stop(p);
}

static void show(const proc_t *p, char *out, size_t cap)
{
    snprintf(out, cap, "exit %d after %lld ms\n  stdout: ...%.1500s\n  stderr: %.2500s",
             proc_code(p), (long long)proc_ms(p),
             p->len[0] > 1500 ? p->buf[0] + p->len[0] - 1500 : p->buf[0], p->buf[1]);
}

/* Lines of text that do not start with "[rank " or "[ps] ". */
static int unprefixed_lines(const char *text)
{
    int bad = 0;
    for (const char *s = text; *s != '\0';) {
        if (strncmp(s, "[rank ", 6) != 0 && strncmp(s, "[ps] ", 5) != 0)
            bad++;
        const char *nl = strchr(s, '\n');
        s = nl != NULL ? nl + 1 : s + strlen(s);
    }
    return bad;
}

/* Processes whose command line holds marker (a job's unique --job-id). Zombies have none. */
static int count_marked(const char *marker)
{
    DIR *d = opendir("/proc");
    if (d == NULL)
        return -1;
    int n = 0;
    size_t mlen = strlen(marker);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char path[64];
        char buf[4096];
        snprintf(path, sizeof path, "/proc/%.20s/cmdline", e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t r = read(fd, buf, sizeof buf);
        close(fd);
        if (r > 0 && memmem(buf, (size_t)r, marker, mlen) != NULL)
            n++;
    }
    closedir(d);
    return n;
}

/* The PID of a child of parent whose command line holds want (wlen bytes, NULs included), or
 * -1. */
static pid_t find_child(pid_t parent, const char *want, size_t wlen)
{
    DIR *d = opendir("/proc");
    if (d == NULL)
        return -1;
    pid_t found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char path[64];
        char buf[4096];
        snprintf(path, sizeof path, "/proc/%.20s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        size_t r = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[r] = '\0';
        const char *rp = strrchr(buf, ')');
        int ppid = 0;
        if (rp == NULL || sscanf(rp + 1, " %*c %d", &ppid) != 1 || ppid != parent)
            continue;
        snprintf(path, sizeof path, "/proc/%.20s/cmdline", e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, buf, sizeof buf);
        close(fd);
        if (n > 0 && memmem(buf, (size_t)n, want, wlen) != NULL)
            found = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return found;
}

/* The PID of the child of parent started with "--rank R", or -1. */
static pid_t find_rank(pid_t parent, int rank)
{
    char want[32];
    int wlen = snprintf(want, sizeof want, "--rank%c%d%c", '\0', rank, '\0');
    return find_child(parent, want, (size_t)wlen);
}

static void marker_for(char *out, size_t cap, int n)
{
    snprintf(out, cap, "launchtest-%d-%d", (int)getpid(), n);
}

/* ---- flags ---- */

START_TEST(test_bad_flags)
{
    static const struct {
        const char *argv[12];
        const char *want[4];
    } cases[] = {
        {{"--workers", "0", NULL}, {"--workers", "out of range", NULL}},
        {{"--workers", "x", NULL}, {"--workers", "'x' is not an integer", NULL}},
        {{"--size", "1M", "--workers", NULL}, {"--workers", "missing", NULL}},
        {{"--workers=-3", NULL}, {"--workers", "out of range", NULL}},
        {{"--workers", "2", "--heartbeat-timeout", "5", NULL},
         {"--heartbeat-timeout", "out of range", NULL}},
        {{"--ps", "/nonexistent/flodl-ps", NULL}, {"--ps", "not an executable", NULL}},
        {{"--worker", NULL}, {"--worker", "missing", NULL}},
        {{"--workers", "2", "--rank", "1", NULL}, {"--rank", "set by flodl-launch", NULL}},
        {{"--", "--coordinator=tcp://127.0.0.1:1", NULL}, {"--coordinator", "remove it", NULL}},
        {{"--size", "1M", "--", "sh", NULL}, {"'--size'", "runs the program 'sh'", NULL}},
        {{"--", "/nonexistent/prog", NULL}, {"/nonexistent/prog", "not an executable", NULL}},
        {{"--", "no-such-program-x", NULL}, {"no-such-program-x", "not found in PATH", NULL}},
        /* The layouts: one way to say how many per host, and the flags each needs. */
        {{"--workers", "2", "--nproc-per-host", "2", NULL},
         {"--workers and --nproc-per-host", "choose one", NULL}},
        {{"--hosts", "2", NULL}, {"--hosts needs --nproc-per-host", NULL}},
        {{"--hosts", "2", "--workers", "2", NULL}, {"--hosts needs --nproc-per-host", NULL}},
        {{"--hosts", "255", "--nproc-per-host", "1", NULL}, {"--hosts", "out of range 1..254"}},
        {{"--hosts", "3", "--nproc-per-host", "400", NULL},
         {"1200 processes", "above the limit of 1024", NULL}},
        {{"--nnodes", "2", "--node-rank", "0", "--coordinator", "tcp://127.0.0.1:29600",
          "--nproc-per-host", "2", NULL},
         {"--nnodes 2: give --curve-dir DIR", "--insecure", "throw-away keys cannot be shared"}},
        {{"--nnodes", "2", "--node-rank", "2", "--coordinator", "tcp://127.0.0.1:29600",
          "--nproc-per-host", "2", "--insecure", NULL},
         {"--node-rank 2 is not below --nnodes 2", NULL}},
        {{"--nnodes", "2", "--nproc-per-host", "2", "--insecure", NULL},
         {"--nnodes needs --node-rank", "--coordinator", NULL}},
        {{"--nnodes", "2", "--node-rank", "1", "--coordinator", "tcp://127.0.0.1:29600",
          "--insecure", NULL},
         {"--nnodes needs --nproc-per-host", NULL}},
        {{"--nnodes", "2", "--node-rank", "1", "--coordinator", "tcp://127.0.0.1:0",
          "--nproc-per-host", "2", "--insecure", NULL},
         {"--coordinator 'tcp://127.0.0.1:0'", "tcp://ADDR:PORT", NULL}},
        {{"--nnodes", "2", "--hosts", "2", "--nproc-per-host", "1", NULL},
         {"--hosts and --nnodes", "choose one", NULL}},
        {{"--node-rank", "1", NULL}, {"--node-rank needs --nnodes", NULL}},
        {{"--workers", "2", "--coordinator", "tcp://127.0.0.1:29600", NULL},
         {"--coordinator needs --nnodes", NULL}},
    };
    char failures[4096] = "";
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        proc_t p;
        run_launch(&p, cases[c].argv, 10000);
        const char *err = p.buf[1];
        bool one_line = p.len[1] > 0 && err[p.len[1] - 1] == '\n' && count_of(err, "\n") == 1;
        bool has_all = strncmp(err, "flodl-launch: ", 14) == 0;
        for (size_t i = 0; cases[c].want[i] != NULL; i++)
            has_all = has_all && strstr(err, cases[c].want[i]) != NULL;
        if (proc_code(&p) != 2 || p.len[0] != 0 || !one_line || !has_all)
            snprintf(failures + strlen(failures), sizeof failures - strlen(failures),
                     "case %zu (%s ...): exit %d, stdout '%.100s', stderr '%.300s'\n", c,
                     cases[c].argv[0], proc_code(&p), p.buf[0], err);
        proc_free(&p);
    }
    ck_assert_msg(failures[0] == '\0', "want exit 2 and one line naming the flag:\n%s", failures);
}
END_TEST

START_TEST(test_help)
{
    static const char *const args[] = {"--help", NULL};
    proc_t p;
    run_launch(&p, args, 10000);
    ck_assert_msg(proc_code(&p) == 0 && strncmp(p.buf[0], "usage: flodl-launch", 19) == 0 &&
                      p.len[1] == 0,
                  "exit %d, stdout '%s', stderr '%s'", proc_code(&p), p.buf[0], p.buf[1]);
    static const char *const listed[] = {"\n  --hosts H ",     "\n  --nproc-per-host N ",
                                         "\n  --nnodes M ",    "\n  --node-rank I ",
                                         "\n  --coordinator ", "FLODL_HOST=127.0.0.(h+1)"};
    for (size_t i = 0; i < NELEM(listed); i++)
        ck_assert_msg(strstr(p.buf[0], listed[i]) != NULL, "--help does not show '%s': %s",
                      listed[i] + (listed[i][0] == '\n'), p.buf[0]);
    proc_free(&p);
}
END_TEST

/* ---- jobs ---- */

static void write_script(const char *path, const char *body)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    fputs(body, f);
    ck_assert(fclose(f) == 0);
    ck_assert(chmod(path, 0755) == 0);
}

START_TEST(test_small_job)
{
    static const char *const args[] = {
        "--workers", "3",       "--timeout", "20000", "--rendezvous-timeout",
        "20000",     "--",      "--mode",    "drill", "--size",
        "1M",        "--steps", "3",         NULL};
    proc_t p;
    run_launch(&p, args, 40000);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(proc_code(&p) == 0, "%s", info);
    ck_assert_msg(unprefixed_lines(p.buf[0]) == 0 && unprefixed_lines(p.buf[1]) == 0,
                  "every line should carry [rank K] or [ps]: %s", info);
    ck_assert_msg(count_of(p.buf[0], "[rank 0] step ") == 3 &&
                      count_of(p.buf[0], "verified\n") >= 3,
                  "rank 0 should print 3 verified steps: %s", info);
    int summaries = 0;
    for (int r = 0; r < 3; r++) {
        char line[96];
        snprintf(line, sizeof line, "[rank %d] rank %d summary: 3 steps of 1 MiB verified", r, r);
        summaries += count_of(p.buf[0], line);
    }
    ck_assert_msg(summaries == 3, "each rank should print its summary: %s", info);
    proc_free(&p);
}
END_TEST

/* A word after "--" that is not a flag is a program, run as it is with the rank variables in
 * its environment: here a shell that prints them, then becomes a flodl-worker, which reads
 * them as any program's flodl.init() would (security included: the throw-away keys). */
START_TEST(test_program)
{
    static const char *const args[] = {
        "--workers",
        "2",
        "--",
        "sh",
        "-c",
        "echo env $FLODL_RANK/$FLODL_WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE "
        "${FLODL_CURVE_DIR:+curve}${FLODL_INSECURE:+insecure}; "
        "exec \"$0\" --mode drill --size 1M --steps 2",
        FLODL_BIN_DIR "/worker/flodl-worker",
        NULL};
    proc_t p;
    run_launch(&p, args, 40000);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(proc_code(&p) == 0, "%s", info);
    ck_assert_msg(count_of(p.buf[0], "[rank 0] env 0/2 0/2 curve\n") == 1 &&
                      count_of(p.buf[0], "[rank 1] env 1/2 1/2 curve\n") == 1,
                  "each rank should see its variables: %s", info);
    ck_assert_msg(count_of(p.buf[0], "[rank 1] rank 1 summary: 2 steps of 1 MiB verified") == 1,
                  "the program should run as rank 1 of 2: %s", info);
    proc_free(&p);
}
END_TEST

/* What each rank prints before it runs the drill as that rank: its variables, as a program's
 * flodl.init() reads them. */
#define ENV_SCRIPT                                                                                 \
    "echo env $FLODL_RANK/$FLODL_WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE ${FLODL_HOST:-nohost} "  \
    "${FLODL_INSECURE:+insecure}${FLODL_CURVE_DIR:+curve}; "                                       \
    "exec \"$0\" --mode drill --size 1M --steps 2"

/* Whether out holds, for each rank of first..first+n-1, its env line and its drill summary;
 * host: whether FLODL_HOST is 127.0.0.(h+1) for the rank's host h, or unset. */
static bool ranks_saw(const char *out, int first, int n, int world, int per_host, bool host,
                      const char *security, char *why, size_t cap)
{
    for (int r = first; r < first + n; r++) {
        char line[160];
        char where[32] = "nohost";
        if (host)
            snprintf(where, sizeof where, "127.0.0.%d", r / per_host + 1);
        snprintf(line, sizeof line, "[rank %d] env %d/%d %d/%d %s %s\n", r, r, world, r % per_host,
                 per_host, where, security);
        if (count_of(out, line) != 1) {
            snprintf(why, cap, "no line '%.*s'", (int)strlen(line) - 1, line);
            return false;
        }
        snprintf(line, sizeof line, "[rank %d] rank %d summary: 2 steps of 1 MiB verified", r, r);
        if (count_of(out, line) != 1) {
            snprintf(why, cap, "no line '%s'", line);
            return false;
        }
    }
    return true;
}

/* --hosts 2 --nproc-per-host 2 (_i = 0): rank h*2+k is process k of host h, whose ranks say
 * FLODL_HOST=127.0.0.(h+1); the drill then runs across those addresses. --nproc-per-host 3
 * alone (_i = 1) is --workers 3: one host, FLODL_HOST left unset. */
START_TEST(test_hosts_program)
{
    unsetenv("FLODL_HOST");
    const char *args[12];
    size_t a = 0;
    if (_i == 0) {
        args[a++] = "--hosts";
        args[a++] = "2";
    }
    args[a++] = "--nproc-per-host";
    args[a++] = _i == 0 ? "2" : "3";
    args[a++] = "--";
    args[a++] = "sh";
    args[a++] = "-c";
    args[a++] = ENV_SCRIPT;
    args[a++] = FLODL_BIN_DIR "/worker/flodl-worker";
    args[a] = NULL;
    proc_t p;
    run_launch(&p, args, 40000);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(proc_code(&p) == 0, "%s", info);
    char why[256] = "";
    bool ok = _i == 0 ? ranks_saw(p.buf[0], 0, 4, 4, 2, true, "curve", why, sizeof why)
                      : ranks_saw(p.buf[0], 0, 3, 3, 3, false, "curve", why, sizeof why);
    ck_assert_msg(ok, "%s: %s", why, info);
    proc_free(&p);
}
END_TEST

/* flodl-worker ranks of --hosts get FLODL_HOST too (they read it as --host), and flodl-ps
 * waits for every host's ranks. */
START_TEST(test_hosts_workers)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/flodl-lt-%d", (int)getpid());
    ck_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    char ps[96];
    char wk[96];
    snprintf(ps, sizeof ps, "%s/hosts-ps", dir);
    snprintf(wk, sizeof wk, "%s/hosts-worker", dir);
    write_script(ps, "#!/bin/sh\n"
                     "echo \"args: $*\"\n"
                     "while [ $# -gt 0 ]; do\n"
                     "  [ \"$1\" = --endpoint-file ] && ep=$2\n"
                     "  shift\n"
                     "done\n"
                     "printf 'tcp://127.0.0.1:1\\n' > \"$ep\"\n"
                     "sleep 1\n");
    write_script(wk, "#!/bin/sh\necho \"args: $* host ${FLODL_HOST:-nohost}\"\n");
    const char *args[] = {"--ps", ps,           "--worker", wk, "--hosts", "3", "--nproc-per-host",
                          "2",    "--insecure", NULL};
    proc_t p;
    run_launch(&p, args, 20000);
    unlink(ps);
    unlink(wk);
    rmdir(dir);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(proc_code(&p) == 0, "%s", info);
    ck_assert_msg(count_of(p.buf[0], "[ps] args: --bind tcp://127.0.0.1:0 --world-size 6 ") == 1,
                  "%s", info);
    for (int r = 0; r < 6; r++) {
        char line[160];
        snprintf(line, sizeof line,
                 "[rank %d] args: --rank %d --world-size 6 --coordinator tcp://127.0.0.1:1 "
                 "--insecure host 127.0.0.%d\n",
                 r, r, r / 2 + 1);
        ck_assert_msg(count_of(p.buf[0], line) == 1, "no line '%s': %s", line, info);
    }
    proc_free(&p);
}
END_TEST

/* A port nothing listens on now, on 127.0.0.1. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* Two nodes on this machine, as torchrun's --nnodes 2 would run on two: node 1 starts first
 * (its ranks wait for the coordinator), node 0 runs flodl-ps on the given port for all 4
 * ranks. Each node's ranks see their global rank, the local one, the whole world and the
 * endpoint as given, and FLODL_HOST stays unset; only node 0 runs flodl-ps. */
START_TEST(test_two_nodes)
{
    unsetenv("FLODL_HOST");
    int port = free_port();
    ck_assert_msg(port > 0, "no free port on 127.0.0.1");
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    proc_t node[2];
    for (int i = 1; i >= 0; i--) {
        const char *argv[] = {LAUNCH_BIN,
                              "--nnodes",
                              "2",
                              "--node-rank",
                              i == 0 ? "0" : "1",
                              "--nproc-per-host",
                              "2",
                              "--coordinator",
                              ep,
                              "--insecure",
                              "--",
                              "sh",
                              "-c",
                              "echo at $FLODL_COORDINATOR; " ENV_SCRIPT,
                              FLODL_BIN_DIR "/worker/flodl-worker",
                              NULL};
        proc_start(&node[i], argv);
    }
    int64_t deadline = fl_deadline_in(40000);
    while ((!proc_done(&node[0]) || !proc_done(&node[1])) && fl_deadline_left_ms(deadline) > 0) {
        proc_pump(&node[0], 25);
        proc_pump(&node[1], 25);
    }
    proc_stop(&node[0]);
    proc_stop(&node[1]);
    char info[2][6000];
    show(&node[0], info[0], sizeof info[0]);
    show(&node[1], info[1], sizeof info[1]);
    for (int i = 0; i < 2; i++) {
        char why[256] = "";
        ck_assert_msg(proc_code(&node[i]) == 0, "node %d: %s\nthe other: %s", i, info[i],
                      info[1 - i]);
        ck_assert_msg(ranks_saw(node[i].buf[0], 2 * i, 2, 4, 2, false, "insecure", why, sizeof why),
                      "node %d: %s: %s", i, why, info[i]);
        char at[96];
        snprintf(at, sizeof at, "] at %s\n", ep);
        ck_assert_msg(count_of(node[i].buf[0], at) == 2, "node %d's ranks should dial %s: %s", i,
                      ep, info[i]);
    }
    ck_assert_msg(strstr(node[0].buf[0], "[rank 0] flodl-worker: 4 ranks") != NULL, "%s", info[0]);
    ck_assert_msg(strstr(node[0].buf[1], "[ps] ") != NULL ||
                      strstr(node[0].buf[0], "[ps] ") != NULL,
                  "node 0 should run flodl-ps: %s", info[0]);
    ck_assert_msg(strstr(node[1].buf[0], "[ps] ") == NULL &&
                      strstr(node[1].buf[1], "[ps] ") == NULL,
                  "node 1 should run no flodl-ps: %s", info[1]);
    proc_free(&node[0]);
    proc_free(&node[1]);
}
END_TEST

/* Launcher options anywhere before "--", in both spellings; the rest goes to the workers. */
START_TEST(test_flags_anywhere)
{
    static const char *const args[] = {"--mode",    "drill",       "--size",
                                       "64K",       "--workers=2", "--steps",
                                       "2",         "--no-pin",    "--heartbeat-timeout=3000",
                                       "--timeout", "20000",       NULL};
    proc_t p;
    run_launch(&p, args, 40000);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(proc_code(&p) == 0, "%s", info);
    ck_assert_msg(count_of(p.buf[0], "summary: 2 steps of 64 KiB verified") == 2, "%s", info);
    proc_free(&p);
}
END_TEST

/* A stand-in flodl-ps that writes an endpoint and lingers, and stand-in workers printing a
 * line far longer than the relay's buffer, a stderr line and a last line without newline. */
START_TEST(test_relay)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/flodl-lt-%d", (int)getpid());
    ck_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    char ps[96];
    char wk[96];
    snprintf(ps, sizeof ps, "%s/fake-ps", dir);
    snprintf(wk, sizeof wk, "%s/fake-worker", dir);
    write_script(ps, "#!/bin/sh\n"
                     "echo \"args: $*\"\n"
                     "while [ $# -gt 0 ]; do\n"
                     "  [ \"$1\" = --endpoint-file ] && ep=$2\n"
                     "  shift\n"
                     "done\n"
                     "printf 'tcp://127.0.0.1:1\\n' > \"$ep\"\n"
                     "sleep 1\n");
    write_script(wk, "#!/bin/sh\n"
                     "echo \"args: $*\"\n"
                     "echo 'to stderr' >&2\n"
                     "head -c 40000 /dev/zero | tr '\\0' x\n"
                     "echo\n"
                     "printf 'no newline'\n");
    const char *args[] = {
        "--ps", ps,      "--worker", wk,         "--workers", "2", "--heartbeat-timeout",
        "700",  "--foo", "bar",      "--job-id", "J7",        NULL};
    proc_t p;
    run_launch(&p, args, 20000);
    unlink(ps);
    unlink(wk);
    rmdir(dir);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(proc_code(&p) == 0, "%s", info);
    ck_assert_msg(unprefixed_lines(p.buf[0]) == 0 && unprefixed_lines(p.buf[1]) == 0, "%s", info);
    /* Each rank's x's arrive whole, on lines holding nothing else. */
    int xs = 0;
    int mixed = 0;
    for (const char *s = strstr(p.buf[0], "] x"); s != NULL; s = strstr(s + 1, "] x")) {
        size_t run = strspn(s + 2, "x");
        xs += (int)run;
        mixed += s[2 + run] != '\n';
    }
    ck_assert_msg(xs == 80000 && mixed == 0, "%d x's (want 80000), %d mixed lines: %s", xs, mixed,
                  info);
    /* The job's throw-away keys go to every process, before the user's flags. */
    const char *w1 = strstr(p.buf[0], "[rank 1] args: --rank 1 --world-size 2 --coordinator "
                                      "tcp://127.0.0.1:1 --curve-dir /");
    ck_assert_msg(w1 != NULL && strstr(w1, "/keys --foo bar --job-id J7\n") != NULL, "%s", info);
    ck_assert_msg(count_of(p.buf[0], "[rank 0] no newline\n") == 1 &&
                      count_of(p.buf[0], "[rank 1] no newline\n") == 1,
                  "%s", info);
    ck_assert_msg(count_of(p.buf[1], "[rank 0] to stderr\n") == 1 &&
                      count_of(p.buf[1], "[rank 1] to stderr\n") == 1 &&
                      count_of(p.buf[0], "to stderr") == 0,
                  "%s", info);
    ck_assert_msg(count_of(p.buf[0], "[ps] args: --bind tcp://127.0.0.1:0 --world-size 2 ") == 1 &&
                      strstr(p.buf[0], "--heartbeat-timeout 700 --job-id J7 --curve-dir /") != NULL,
                  "%s", info);
    proc_free(&p);
}
END_TEST

/* ---- failures ---- */

START_TEST(test_worker_bad_flag)
{
    char marker[64];
    marker_for(marker, sizeof marker, 1);
    const char *args[] = {"--workers", "2",    "--",       "--mode", "drill",
                          "--dtype",   "int8", "--job-id", marker,   NULL};
    proc_t p;
    run_launch(&p, args, 20000);
    int left = count_marked(marker);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(proc_code(&p) == 1 && proc_ms(&p) < 10000, "%s", info);
    ck_assert_msg(strstr(p.buf[1], "exited with status 2; stopping the others\n") != NULL &&
                      count_of(p.buf[1], "flodl-launch: rank ") == 1,
                  "one line should name the failing rank and its status: %s", info);
    ck_assert_msg(strstr(p.buf[1], "] flodl-worker: --dtype: 'int8'") != NULL, "%s", info);
    ck_assert_msg(left == 0, "%d processes of the job outlived the launcher: %s", left, info);
    proc_free(&p);
}
END_TEST

/* Whether rank r's CPU affinity is what flodl-launch promises for `workers` ranks. */
static bool pinned_as_promised(pid_t pid, int r, int workers)
{
    cpu_set_t mine;
    cpu_set_t its;
    if (pid <= 0 || sched_getaffinity(0, sizeof mine, &mine) != 0 ||
        sched_getaffinity(pid, sizeof its, &its) != 0)
        return false;
    int n = CPU_COUNT(&mine);
    if (workers <= n)
        return CPU_EQUAL(&mine, &its);
    int want = r % n;
    for (int c = 0, seen = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mine) && seen++ == want)
            return CPU_COUNT(&its) == 1 && CPU_ISSET(c, &its);
    return false;
}

/* SIGKILL to rank 1 (_i = 0) or to flodl-ps (_i = 1) mid-job: the launcher names it and stops
 * the rest at once, without waiting for the heartbeat timeout. */
START_TEST(test_killed)
{
    static const char *const victims[] = {"rank 1", "flodl-ps"};
    char marker[64];
    marker_for(marker, sizeof marker, 2 + _i);
    const char *argv[] = {LAUNCH_BIN,
                          "--workers",
                          "3",
                          "--heartbeat-timeout",
                          "1500",
                          "--",
                          "--mode",
                          "drill",
                          "--size",
                          "1M",
                          "--steps",
                          "100000000",
                          "--timeout",
                          "30000",
                          "--rendezvous-timeout",
                          "20000",
                          "--job-id",
                          marker,
                          NULL};
    proc_t p;
    proc_start(&p, argv);
    bool running = proc_wait_text(&p, "verified\n", 3, fl_deadline_in(30000));
    bool pinned = true;
    for (int r = 0; r < 3; r++)
        pinned = pinned && pinned_as_promised(find_rank(p.pid, r), r, 3);
    pid_t victim = -1;
    if (running && _i == 0)
        victim = find_rank(p.pid, 1);
    else if (running)
        victim = find_child(p.pid, "--endpoint-file", 15);
    int64_t killed = fl_now_ms();
    if (victim > 0)
        kill(victim, SIGKILL);
    bool ended = victim > 0 && proc_wait(&p, fl_deadline_in(5000));
    int64_t took = fl_now_ms() - killed;
    proc_stop(&p);
    int left = count_marked(marker);
    char info[6000];
    show(&p, info, sizeof info);
    char want[96];
    snprintf(want, sizeof want, "flodl-launch: %s was killed by signal 9", victims[_i]);
    ck_assert_msg(running, "the job never got going: %s", info);
    ck_assert_msg(victim > 0, "no child of the launcher runs %s: %s", victims[_i], info);
    ck_assert_msg(pinned, "workers are not pinned as promised: %s", info);
    ck_assert_msg(ended, "the launcher still ran %lld ms after %s was killed: %s", (long long)took,
                  victims[_i], info);
    ck_assert_msg(proc_code(&p) == 1, "%s", info);
    ck_assert_msg(strstr(p.buf[1], want) != NULL && count_of(p.buf[1], "flodl-launch: ") == 1,
                  "one line should say '%s': %s", want, info);
    ck_assert_msg(left == 0, "%d processes of the job outlived the launcher: %s", left, info);
    proc_free(&p);
}
END_TEST

static const int stop_signals[] = {SIGTERM, SIGINT};

START_TEST(test_signal)
{
    int sig = stop_signals[_i];
    char marker[64];
    marker_for(marker, sizeof marker, 4 + _i);
    const char *argv[] = {LAUNCH_BIN,  "--workers", "2",        "--",      "--mode",
                          "drill",     "--size",    "1M",       "--steps", "100000000",
                          "--timeout", "30000",     "--job-id", marker,    NULL};
    proc_t p;
    proc_start(&p, argv);
    bool running = proc_wait_text(&p, "verified\n", 3, fl_deadline_in(30000));
    int64_t sent = fl_now_ms();
    if (running)
        kill(p.pid, sig);
    bool ended = running && proc_wait(&p, fl_deadline_in(12000));
    int64_t took = fl_now_ms() - sent;
    proc_stop(&p);
    int left = count_marked(marker);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(running, "the job never got going: %s", info);
    ck_assert_msg(ended, "the launcher still ran %lld ms after signal %d: %s", (long long)took, sig,
                  info);
    ck_assert_msg(proc_code(&p) == 128 + sig, "want exit %d: %s", 128 + sig, info);
    ck_assert_msg(strstr(p.buf[1], "flodl-launch: got signal") != NULL, "%s", info);
    ck_assert_msg(left == 0, "%d processes of the job outlived the launcher: %s", left, info);
    proc_free(&p);
}
END_TEST

START_TEST(test_ps_fails)
{
    static const char *const args[] = {"--ps", "/bin/false", "--workers", "2", NULL};
    proc_t p;
    run_launch(&p, args, 20000);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(proc_code(&p) == 1 && proc_ms(&p) < 5000, "%s", info);
    ck_assert_msg(strstr(p.buf[1], "flodl-launch: flodl-ps exited with status 1\n") != NULL &&
                      count_of(p.buf[1], "\n") == 1,
                  "%s", info);
    proc_free(&p);
}
END_TEST

/* A flodl-ps that never writes its endpoint is stopped after the launcher's 10 s wait. */
START_TEST(test_ps_silent)
{
    char dir[64];
    char ps[96];
    snprintf(dir, sizeof dir, "/tmp/flodl-lt-%d", (int)getpid());
    snprintf(ps, sizeof ps, "%s/silent-ps", dir);
    ck_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    char body[64];
    char marker[32];
    snprintf(marker, sizeof marker, "60.%d", (int)getpid()); /* a unique sleep time */
    snprintf(body, sizeof body, "#!/bin/sh\nexec sleep %s\n", marker);
    write_script(ps, body);
    const char *args[] = {"--ps", ps, "--workers", "2", NULL};
    proc_t p;
    run_launch(&p, args, 30000);
    int left = count_marked(marker);
    unlink(ps);
    rmdir(dir);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(proc_code(&p) == 1 && proc_ms(&p) < 15000, "%s", info);
    ck_assert_msg(strstr(p.buf[1], "flodl-ps wrote no endpoint") != NULL, "%s", info);
    ck_assert_msg(left == 0, "the stand-in flodl-ps outlived the launcher: %s", info);
    proc_free(&p);
}
END_TEST

/* Workers that ignore SIGTERM are SIGKILLed after the launcher's 10 s grace period. */
START_TEST(test_stubborn)
{
    char dir[64];
    char ps[96];
    char wk[96];
    char marker[32];
    char body[256];
    snprintf(dir, sizeof dir, "/tmp/flodl-lt-%d", (int)getpid());
    snprintf(ps, sizeof ps, "%s/stub-ps", dir);
    snprintf(wk, sizeof wk, "%s/stubborn-worker", dir);
    snprintf(marker, sizeof marker, "61.%d", (int)getpid()); /* a unique sleep time */
    ck_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    snprintf(body, sizeof body,
             "#!/bin/sh\n"
             "while [ $# -gt 0 ]; do [ \"$1\" = --endpoint-file ] && ep=$2; shift; done\n"
             "printf 'tcp://127.0.0.1:1\\n' > \"$ep\"\n"
             "exec sleep %s\n",
             marker);
    write_script(ps, body);
    snprintf(body, sizeof body, "#!/bin/sh\ntrap '' TERM INT\necho up\nexec sleep %s\n", marker);
    write_script(wk, body);
    const char *argv[] = {LAUNCH_BIN, "--ps", ps, "--worker", wk, "--workers", "2", NULL};
    proc_t p;
    proc_start(&p, argv);
    bool running = proc_wait_text(&p, "] up\n", 2, fl_deadline_in(10000));
    int64_t sent = fl_now_ms();
    if (running)
        kill(p.pid, SIGTERM);
    bool ended = running && proc_wait(&p, fl_deadline_in(20000));
    int64_t took = fl_now_ms() - sent;
    proc_stop(&p);
    int left = count_marked(marker);
    unlink(ps);
    unlink(wk);
    rmdir(dir);
    char info[6000];
    show(&p, info, sizeof info);
    ck_assert_msg(running, "the stand-ins never started: %s", info);
    ck_assert_msg(ended && took >= 9000 && took < 16000,
                  "the launcher should end 10-15 s after SIGTERM (took %lld ms): %s",
                  (long long)took, info);
    ck_assert_msg(proc_code(&p) == 128 + SIGTERM, "%s", info);
    ck_assert_msg(strstr(p.buf[1], "2 process(es) still running 10 s after the stop signal; "
                                   "killing them") != NULL,
                  "%s", info);
    ck_assert_msg(left == 0, "%d stand-ins outlived the launcher: %s", left, info);
    proc_free(&p);
}
END_TEST

Suite *launch_suite(void);
Suite *launch_suite(void)
{
    Suite *s = suite_create("launch");
    TCase *t = tcase_create("flags");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_bad_flags);
    tcase_add_test(t, test_help);
    suite_add_tcase(s, t);
    t = tcase_create("jobs");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_small_job);
    tcase_add_test(t, test_program);
    tcase_add_loop_test(t, test_hosts_program, 0, 2);
    tcase_add_test(t, test_hosts_workers);
    tcase_add_test(t, test_two_nodes);
    tcase_add_test(t, test_flags_anywhere);
    tcase_add_test(t, test_relay);
    suite_add_tcase(s, t);
    t = tcase_create("failures");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_worker_bad_flag);
    tcase_add_loop_test(t, test_killed, 0, 2);
    tcase_add_loop_test(t, test_signal, 0, 2);
    tcase_add_test(t, test_ps_fails);
    tcase_add_test(t, test_ps_silent);
    tcase_add_test(t, test_stubborn);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(launch_suite());
}
