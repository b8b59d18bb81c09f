/* flodl-launch's child processes: fork/exec with pipes and optional CPU pinning, the relay that
 * copies each child's stdout/stderr to ours one whole prefixed line per write, reaping, and the
 * signals the launcher takes through a signalfd. Policy (who to stop, exit codes) is left to
 * launch_main.c. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fl_core.h"
#include "launch_int.h"

/* Longest line relayed whole; a longer one is cut into several prefixed lines, which keeps
 * memory bounded and still never interleaves two children's text on one line. */
#define LINE_CAP ((size_t)16 << 10)
#define READ_CAP ((size_t)64 << 10)
#define PREFIX_CAP 32

typedef struct stream {
    int fd;     /* read end of the child's pipe; -1 at EOF */
    int out;    /* where its lines go: 1 or 2 */
    char *line; /* the prefix, then the partial line; PREFIX_CAP + LINE_CAP + 1 bytes */
    size_t len; /* bytes held, prefix included; 0 when no line is open */
    size_t kid; /* the child it belongs to */
} stream_t;

typedef struct child {
    char name[32];
    char prefix[PREFIX_CAP];
    size_t plen;
    pid_t pid;
    bool reaped;
    int status;
    stream_t s[2];
} child_t;

struct fl_launch_procs {
    child_t *kids;
    size_t n;
    size_t cap;
    size_t *exits; /* indices of reaped children, in reaping order */
    size_t nexit;
    size_t nexit_read;
    int sigfd;
    sigset_t oldmask; /* restored in the children and by destroy */
    struct pollfd *pfd;
    stream_t **pfd_stream;
    char *rbuf;
    bool out_broken[3]; /* a write to fd 1 or 2 failed for good: drop what would go there */
};

int fl_launch_procs_create(size_t cap, fl_launch_procs_t **out)
{
    *out = NULL;
    if (cap == 0)
        return fl_fail(FL_EINVAL, "launch: a process group needs room for one child");
    /* fds 0-2 must be open, or a pipe could land on one of them and be closed by dup2's
     * cloexec rules in the child. */
    int fd;
    while ((fd = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0 && fd <= 2)
        fcntl(fd, F_SETFD, 0);
    if (fd > 2)
        close(fd);
    fl_launch_procs_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return fl_fail(FL_ENOMEM, "launch: no memory for a process group");
    p->cap = cap;
    p->sigfd = -1;
    p->kids = calloc(cap, sizeof *p->kids);
    p->exits = calloc(cap, sizeof *p->exits);
    p->pfd = calloc(2 * cap + 1, sizeof *p->pfd);
    p->pfd_stream = calloc(2 * cap + 1, sizeof *p->pfd_stream);
    p->rbuf = malloc(READ_CAP);
    if (p->kids == NULL || p->exits == NULL || p->pfd == NULL || p->pfd_stream == NULL ||
        p->rbuf == NULL) {
        fl_launch_procs_destroy(&p);
        return fl_fail(FL_ENOMEM, "launch: no memory for %zu children", cap);
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &mask, &p->oldmask) != 0) {
        fl_launch_procs_destroy(&p);
        return fl_fail(FL_EIO, "launch: sigprocmask: %s", strerror(errno));
    }
    if ((p->sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)) < 0) {
        int e = errno;
        sigprocmask(SIG_SETMASK, &p->oldmask, NULL);
        fl_launch_procs_destroy(&p);
        return fl_fail(FL_EIO, "launch: signalfd: %s", strerror(e));
    }
    struct sigaction ign = {.sa_handler = SIG_IGN};
    sigaction(SIGPIPE, &ign, NULL);
    *out = p;
    return FL_OK;
}

/* Writes all of buf to fd 1 or 2 unless that stream broke (EPIPE, a closed terminal): the job
 * goes on without its output rather than dying with its children still running. */
static void write_all(fl_launch_procs_t *p, int fd, const char *buf, size_t len)
{
    int64_t deadline = fl_deadline_in(10000);
    while (len > 0 && !p->out_broken[fd]) {
        ssize_t w = write(fd, buf, len);
        if (w > 0) {
            buf += w;
            len -= (size_t)w;
        } else if (w < 0 && errno == EAGAIN && fl_deadline_left_ms(deadline) > 0) {
            struct pollfd pw = {fd, POLLOUT, 0};
            poll(&pw, 1, 100); /* someone made our stdout non-blocking; wait, bounded */
        } else if (!(w < 0 && errno == EINTR)) {
            p->out_broken[fd] = true;
        }
    }
}

static void emit(fl_launch_procs_t *p, stream_t *s)
{
    write_all(p, s->out, s->line, s->len);
    s->len = 0;
}

/* Appends data to the stream's open line, writing each line once it is whole (or full). */
static void relay(fl_launch_procs_t *p, const child_t *c, stream_t *s, const char *data, size_t n)
{
    while (n > 0) {
        if (s->len == 0) {
            memcpy(s->line, c->prefix, c->plen);
            s->len = c->plen;
        }
        const char *nl = memchr(data, '\n', n);
        size_t take = nl != NULL ? (size_t)(nl - data) + 1 : n;
        size_t room = c->plen + LINE_CAP - s->len;
        if (take > room)
            take = room;
        memcpy(s->line + s->len, data, take);
        s->len += take;
        data += take;
        n -= take;
        if (s->line[s->len - 1] == '\n') {
            emit(p, s);
        } else if (s->len == c->plen + LINE_CAP) {
            s->line[s->len++] = '\n';
            emit(p, s);
        }
    }
}

/* Closes the stream at EOF, writing a last line that lacked its newline. */
static void stream_close(fl_launch_procs_t *p, stream_t *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    if (s->len > 0) {
        s->line[s->len++] = '\n';
        emit(p, s);
    }
}

static void child_free(fl_launch_procs_t *p, child_t *c)
{
    for (int k = 0; k < 2; k++) {
        if (c->s[k].line != NULL)
            stream_close(p, &c->s[k]);
        free(c->s[k].line);
        c->s[k].line = NULL;
    }
}

void fl_launch_procs_destroy(fl_launch_procs_t **procs)
{
    fl_launch_procs_t *p = *procs;
    if (p == NULL)
        return;
    *procs = NULL;
    if (p->sigfd >= 0 && p->kids != NULL) {
        for (size_t i = 0; i < p->n; i++)
            fl_launch_procs_kill(p, i, SIGKILL);
        int64_t deadline = fl_deadline_in(5000); /* SIGKILL is reaped within this */
        int signo;
        while (fl_launch_procs_running(p) > 0 && fl_deadline_left_ms(deadline) > 0)
            fl_launch_procs_pump(p, 100, &signo);
        fl_launch_procs_drain(p, fl_deadline_in(1000));
    }
    for (size_t i = 0; p->kids != NULL && i < p->n; i++)
        child_free(p, &p->kids[i]);
    if (p->sigfd >= 0) {
        close(p->sigfd);
        sigprocmask(SIG_SETMASK, &p->oldmask, NULL);
    }
    free(p->kids);
    free(p->exits);
    free(p->pfd);
    free(p->pfd_stream);
    free(p->rbuf);
    free(p);
}

/* Runs in the forked child until exec: async-signal-safe calls only. */
static _Noreturn void child_exec(const fl_launch_procs_t *p, pid_t parent, int devnull,
                                 const int out[2], const int err[2], const cpu_set_t *cpu,
                                 const char *path, char *const argv[])
{
    /* A launcher that dies (even by SIGKILL) takes its job down with it. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
        _exit(127);
    if (dup2(devnull, 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0)
        _exit(127);
    /* Ignored and blocked signals survive exec: give the child the defaults back. */
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigaction(SIGPIPE, &dfl, NULL);
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGTERM, &dfl, NULL);
    sigaction(SIGCHLD, &dfl, NULL);
    sigprocmask(SIG_SETMASK, &p->oldmask, NULL);
    if (cpu != NULL && sched_setaffinity(0, sizeof *cpu, cpu) != 0) {
        static const char warn[] = "flodl-launch: sched_setaffinity failed; running unpinned\n";
        (void)!write(2, warn, sizeof warn - 1);
    }
    execv(path, argv);
    static const char msg[] = "flodl-launch: cannot execute ";
    struct iovec iov[3] = {{(void *)msg, sizeof msg - 1},
                           {(void *)path, strlen(path)},
                           {(void *)"\n", 1}};
    (void)!writev(2, iov, 3);
    _exit(127);
}

/* Child n's record, before it runs: its name, prefix and line buffers. */
static int child_init(fl_launch_procs_t *p, const char *name, const char *prefix)
{
    child_t *c = &p->kids[p->n];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->prefix, sizeof c->prefix, "%s", prefix);
    c->plen = strlen(c->prefix);
    c->pid = -1;
    for (int k = 0; k < 2; k++) {
        c->s[k].fd = -1;
        c->s[k].out = 1 + k;
        c->s[k].kid = p->n;
        c->s[k].line = malloc(PREFIX_CAP + LINE_CAP + 1);
    }
    if (c->s[0].line == NULL || c->s[1].line == NULL)
        return fl_fail(FL_ENOMEM, "launch: %s: no memory for its output buffers", name);
    return FL_OK;
}

/* Undoes a spawn that failed: closes what was opened and frees the line buffers. */
static void spawn_undo(child_t *c, const int out[2], const int err[2], int devnull)
{
    for (int k = 0; k < 2; k++) {
        if (out[k] >= 0)
            close(out[k]);
        if (err[k] >= 0)
            close(err[k]);
        free(c->s[k].line);
        c->s[k].line = NULL;
    }
    if (devnull >= 0)
        close(devnull);
}

int fl_launch_procs_spawn(fl_launch_procs_t *p, const char *name, const char *prefix,
                          const char *path, char *const argv[], int cpu, size_t *index)
{
    if (p->n == p->cap)
        return fl_fail(FL_EIO, "launch: %s: the process group is full (%zu)", name, p->cap);
    child_t *c = &p->kids[p->n];
    int out[2] = {-1, -1};
    int err[2] = {-1, -1};
    int devnull = -1;
    int rc = child_init(p, name, prefix);
    if (rc == FL_OK && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 ||
                        (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0))
        rc = fl_fail(FL_EIO, "launch: %s: pipe: %s", name, strerror(errno));
    if (rc != FL_OK) {
        spawn_undo(c, out, err, devnull);
        return rc;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    if (cpu >= 0 && cpu < CPU_SETSIZE)
        CPU_SET(cpu, &one);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0)
        child_exec(p, parent, devnull, out, err, CPU_COUNT(&one) > 0 ? &one : NULL, path, argv);
    if (pid < 0) {
        rc = fl_fail(FL_EIO, "launch: %s: fork: %s", name, strerror(errno));
        spawn_undo(c, out, err, devnull);
        return rc;
    }
    close(out[1]);
    close(err[1]);
    close(devnull);
    c->pid = pid;
    c->s[0].fd = out[0];
    c->s[1].fd = err[0];
    *index = p->n++;
    return FL_OK;
}

static void reap(fl_launch_procs_t *p)
{
    for (size_t i = 0; i < p->n; i++) {
        child_t *c = &p->kids[i];
        if (c->reaped)
            continue;
        pid_t r = waitpid(c->pid, &c->status, WNOHANG);
        if (r == c->pid || (r < 0 && errno == ECHILD)) {
            if (r < 0)
                c->status = 255 << 8; /* gone without a status: report it as a failure */
            c->reaped = true;
            p->exits[p->nexit++] = i;
        }
    }
}

static void read_signals(fl_launch_procs_t *p, int *signo)
{
    struct signalfd_siginfo si;
    while (read(p->sigfd, &si, sizeof si) == (ssize_t)sizeof si)
        if ((si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM) && *signo == 0)
            *signo = (int)si.ssi_signo;
}

void fl_launch_procs_pump(fl_launch_procs_t *p, int timeout_ms, int *signo)
{
    *signo = 0;
    nfds_t nfd = 0;
    p->pfd[nfd++] = (struct pollfd){p->sigfd, POLLIN, 0};
    for (size_t i = 0; i < p->n; i++) {
        for (int k = 0; k < 2; k++) {
            stream_t *s = &p->kids[i].s[k];
            if (s->fd < 0)
                continue;
            p->pfd_stream[nfd] = s;
            p->pfd[nfd++] = (struct pollfd){s->fd, POLLIN, 0};
        }
    }
    if (poll(p->pfd, nfd, timeout_ms) > 0) {
        if (p->pfd[0].revents != 0)
            read_signals(p, signo);
        /* One read per stream per round keeps a chatty child from starving the others. */
        for (nfds_t j = 1; j < nfd; j++) {
            if (p->pfd[j].revents == 0)
                continue;
            stream_t *s = p->pfd_stream[j];
            const child_t *c = &p->kids[s->kid];
            ssize_t r = read(s->fd, p->rbuf, READ_CAP);
            if (r > 0)
                relay(p, c, s, p->rbuf, (size_t)r);
            else if (r == 0 || (errno != EINTR && errno != EAGAIN))
                stream_close(p, s);
        }
    }
    reap(p);
}

bool fl_launch_procs_next_exit(fl_launch_procs_t *p, size_t *index, int *status)
{
    if (p->nexit_read == p->nexit)
        return false;
    *index = p->exits[p->nexit_read++];
    *status = p->kids[*index].status;
    return true;
}

void fl_launch_procs_kill(fl_launch_procs_t *p, size_t index, int sig)
{
    /* Only unreaped children: a reaped PID may already belong to someone else. */
    if (index < p->n && p->kids[index].pid > 0 && !p->kids[index].reaped)
        kill(p->kids[index].pid, sig);
}

size_t fl_launch_procs_running(const fl_launch_procs_t *p)
{
    size_t n = 0;
    for (size_t i = 0; i < p->n; i++)
        n += !p->kids[i].reaped;
    return n;
}

const char *fl_launch_procs_name(const fl_launch_procs_t *p, size_t index)
{
    return index < p->n ? p->kids[index].name : "?";
}

void fl_launch_procs_drain(fl_launch_procs_t *p, int64_t deadline_ms)
{
    for (;;) {
        bool any_open = false;
        for (size_t i = 0; i < p->n; i++)
            any_open = any_open || p->kids[i].s[0].fd >= 0 || p->kids[i].s[1].fd >= 0;
        int left = fl_deadline_left_ms(deadline_ms);
        if (!any_open || left == 0)
            break;
        int signo;
        fl_launch_procs_pump(p, left < 100 ? left : 100, &signo);
    }
    for (size_t i = 0; i < p->n; i++)
        for (int k = 0; k < 2; k++)
            if (p->kids[i].s[k].fd >= 0)
                stream_close(p, &p->kids[i].s[k]);
}

void fl_launch_status_describe(int status, char *out, size_t cap)
{
    if (WIFEXITED(status))
        snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(out, cap, "ended with wait status %#x", (unsigned)status);
}
