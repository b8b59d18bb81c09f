/* A harness for tests that run the real binaries as child processes: start with a clean
 * launcher environment, capture stdout and stderr, wait with deadlines, kill and reap by PID. */
#include "testproc.h"

#include <check.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fl_core.h"

#define PS_BIN FLODL_BIN_DIR "/server/flodl-ps"
#define OUT_CAP ((size_t)128 << 10)

static const char *const launcher_vars[] = {
    "FLODL_RANK",
    "FLODL_WORLD_SIZE",
    "FLODL_COORDINATOR",
    "FLODL_HOST",
    "FLODL_JOB_ID",
    "FLODL_LOG",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "JOB_COMPLETION_INDEX",
    "FLODL_CURVE_DIR",
    "FLODL_INSECURE",
    "FLODL_IPC",
    NULL,
};

/* Starts path with argv (NULL-terminated) and env ("NAME=value" strings, NULL-terminated or
 * NULL) on top of this environment minus every launcher variable. */
void proc_start(proc_t *p, const char *path, const char *const *argv, const char *const *env)
{
    memset(p, 0, sizeof *p);
    p->fd[0] = p->fd[1] = -1;
    p->pid = -1; /* stays so when the start fails: the caller's checks then fail, after cleanup */
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
    pid_t pid = fork();
    if (pid == 0) {
        /* Dies with the test process even when Check kills it on a timeout. */
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
        for (size_t i = 0; launcher_vars[i] != NULL; i++)
            unsetenv(launcher_vars[i]);
        /* Plain text unless the test says otherwise (its env comes on top): the security tests
         * give keys or unset it. */
        putenv((char *)"FLODL_INSECURE=1");
        for (size_t i = 0; env != NULL && env[i] != NULL; i++)
            putenv((char *)env[i]);
        execv(path, (char *const *)argv);
        dprintf(2, "exec %s: %s\n", path, strerror(errno));
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
    if (n > OUT_CAP)
        n = OUT_CAP; /* a single read is at most 4 KiB; kept for safety */
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

/* Reads what the children printed (waiting up to timeout_ms for something) and reaps those
 * that exited. */
void procs_pump(proc_t *ps, size_t n, int timeout_ms)
{
    struct pollfd pfd[16];
    int who[16];
    int which[16];
    nfds_t nfd = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 2; k++)
            if (ps[i].pid > 0 && ps[i].fd[k] >= 0 && nfd < 16) {
                pfd[nfd] = (struct pollfd){ps[i].fd[k], POLLIN, 0};
                who[nfd] = (int)i;
                which[nfd] = k;
                nfd++;
            }
    if (nfd > 0 && poll(pfd, nfd, timeout_ms) > 0) {
        for (nfds_t j = 0; j < nfd; j++) {
            if (pfd[j].revents == 0)
                continue;
            proc_t *p = &ps[who[j]];
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
        usleep((useconds_t)(timeout_ms > 50 ? 50 : timeout_ms) * 1000);
    }
    for (size_t i = 0; i < n; i++) {
        proc_t *p = &ps[i];
        if (p->pid > 0 && !p->reaped && waitpid(p->pid, &p->status, WNOHANG) == p->pid) {
            p->reaped = true;
            p->end_ms = fl_now_ms();
        }
    }
}

bool proc_done(const proc_t *p)
{
    return p->pid <= 0 || (p->reaped && p->fd[0] < 0 && p->fd[1] < 0);
}

/* Waits until every child exited and closed its output, or the deadline. True when all did. */
bool procs_wait(proc_t *ps, size_t n, int64_t deadline)
{
    for (;;) {
        bool all = true;
        for (size_t i = 0; i < n; i++)
            all = all && proc_done(&ps[i]);
        if (all)
            return true;
        int left = fl_deadline_left_ms(deadline);
        if (left == 0)
            return false;
        procs_pump(ps, n, left < 50 ? left : 50);
    }
}

int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *s = strstr(hay, needle); s != NULL; s = strstr(s + 1, needle))
        n++;
    return n;
}

/* Waits until stream k of ps[i] holds `times` copies of text, the child ends, or the
 * deadline. */
bool proc_wait_text(proc_t *ps, size_t n, size_t i, int k, const char *text, int times,
                    int64_t deadline)
{
    for (;;) {
        if (count_of(ps[i].buf[k], text) >= times)
            return true;
        if (proc_done(&ps[i]) || fl_deadline_left_ms(deadline) == 0)
            return false;
        procs_pump(ps, n, 50);
    }
}

/* Kills (SIGKILL, by PID) every child still running and reaps it; keeps the output. Bounded:
 * a SIGKILLed child is reaped within seconds. */
void procs_stop(proc_t *ps, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ps[i].pid > 0 && !ps[i].reaped)
            kill(ps[i].pid, SIGKILL);
    procs_wait(ps, n, fl_deadline_in(10000));
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            if (ps[i].fd[k] >= 0)
                close(ps[i].fd[k]);
            ps[i].fd[k] = -1;
        }
    }
}

void procs_free(proc_t *ps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(ps[i].buf[0]);
        free(ps[i].buf[1]);
        ps[i].buf[0] = ps[i].buf[1] = NULL;
    }
}

/* Exit code, or 128 + signal, or -1 when the child was not reaped. */
int proc_code(const proc_t *p)
{
    if (!p->reaped)
        return -1;
    if (WIFEXITED(p->status))
        return WEXITSTATUS(p->status);
    if (WIFSIGNALED(p->status))
        return 128 + WTERMSIG(p->status);
    return -1;
}

/* Runs one binary to completion (10 s at most). */
void run_sync(proc_t *p, const char *path, const char *const *argv, const char *const *env)
{
    proc_start(p, path, argv, env);
    procs_wait(p, 1, fl_deadline_in(10000));
    procs_stop(p, 1);
}

pid_t proc_dead_pid(void)
{
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0)
        _exit(0);
    int st = 0;
    ck_assert(waitpid(pid, &st, 0) == pid);
    return pid;
}

/* A TCP port that was free a moment ago (bound on 127.0.0.1:0, then closed). */
int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert(s >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ck_assert(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    ck_assert(getsockname(s, (struct sockaddr *)&a, &len) == 0);
    close(s);
    return ntohs(a.sin_port);
}

void epfile_path(char *out, size_t cap, int n)
{
    snprintf(out, cap, "/tmp/flodl-test-%d-%d.ep", (int)getpid(), n);
}

/* Reads the endpoint flodl-ps wrote (a whole line), waiting while it runs. */
bool read_epfile(proc_t *ps, const char *path, char *out, size_t cap, int64_t deadline)
{
    for (;;) {
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            bool ok = fgets(out, (int)cap, f) != NULL && strchr(out, '\n') != NULL;
            fclose(f);
            if (ok) {
                out[strcspn(out, "\n")] = '\0';
                return true;
            }
        }
        if (proc_done(ps) || fl_deadline_left_ms(deadline) == 0)
            return false;
        procs_pump(ps, 1, 20);
    }
}

/* Starts flodl-ps on an ephemeral port; fills ep. extra: more flags (NULL-terminated). */
bool start_ps(proc_t *ps, int world, const char *const *extra, const char *const *env, char *ep,
              size_t cap, int n)
{
    char path[128];
    char ws[16];
    epfile_path(path, sizeof path, n);
    unlink(path);
    snprintf(ws, sizeof ws, "%d", world);
    const char *argv[MAX_ARGS] = {PS_BIN, "--bind", "tcp://127.0.0.1:0", "--endpoint-file", path};
    size_t a = 5;
    if (world > 0) {
        argv[a++] = "--world-size";
        argv[a++] = ws;
    }
    for (size_t i = 0; extra != NULL && extra[i] != NULL && a + 1 < MAX_ARGS; i++)
        argv[a++] = extra[i];
    argv[a] = NULL;
    proc_start(ps, PS_BIN, argv, env);
    bool ok = read_epfile(ps, path, ep, cap, fl_deadline_in(10000));
    unlink(path);
    return ok;
}

void show(const proc_t *ps, size_t n, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && used + 1 < cap; i++) {
        int w = snprintf(out + used, cap - used,
                         "\n[%zu] exit %d\n  stdout: %.600s\n  stderr: "
                         "%.900s",
                         i, proc_code(&ps[i]), ps[i].buf[0] ? ps[i].buf[0] : "",
                         ps[i].buf[1] ? ps[i].buf[1] : "");
        if (w < 0)
            break;
        used += (size_t)w < cap - used ? (size_t)w : cap - used - 1;
    }
}

/* Runs each case: exit 2, nothing on stdout, exactly one line on stderr holding every want. */
void check_bad(const char *bin, const bad_case_t *cases, size_t ncases)
{
    for (size_t c = 0; c < ncases; c++) {
        const char *argv[MAX_ARGS] = {bin};
        size_t a = 1;
        for (size_t i = 0; cases[c].argv[i] != NULL; i++)
            argv[a++] = cases[c].argv[i];
        argv[a] = NULL;
        proc_t p;
        run_sync(&p, bin, argv, cases[c].env);
        char cmd[512] = "";
        for (size_t i = 1; i < a; i++)
            snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " %s", argv[i]);
        for (size_t i = 0; cases[c].env[i] != NULL; i++)
            snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " [%s]", cases[c].env[i]);
        const char *err = p.buf[1];
        size_t len = p.len[1];
        bool one_line = len > 0 && err[len - 1] == '\n' && count_of(err, "\n") == 1;
        bool has_all = true;
        for (size_t i = 0; cases[c].want[i] != NULL; i++)
            has_all = has_all && strstr(err, cases[c].want[i]) != NULL;
        if (proc_code(&p) != 2 || p.len[0] != 0 || !one_line || !has_all)
            ck_abort_msg("%s%s: exit %d (want 2), stdout '%s', stderr '%s' (want one line "
                         "with '%s' '%s')",
                         bin, cmd, proc_code(&p), p.buf[0], err, cases[c].want[0],
                         cases[c].want[1] ? cases[c].want[1] : "");
        procs_free(&p, 1);
    }
}
