/* Helpers shared by the fault suites: the rank children's side and the parent's. */
#include "faultutil.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>

void send_event(int fd, char ev)
{
    ssize_t w;
    do {
        w = write(fd, &ev, 1);
    } while (w < 0 && errno == EINTR);
}

static void send_report(int fd, const rank_report_t *rep)
{
    send_event(fd, 'R');
    const char *p = (const char *)rep;
    size_t left = sizeof *rep;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        left -= (size_t)w;
    }
}

/* Reads the coordinator endpoint line (30 s at most). */
static bool read_endpoint(int fd, char *out, size_t cap)
{
    size_t n = 0;
    int64_t deadline = fl_deadline_in(30000);
    while (n + 1 < cap) {
        struct pollfd p = {fd, POLLIN, 0};
        int left = fl_deadline_left_ms(deadline);
        if (left == 0 || poll(&p, 1, left) <= 0)
            return false;
        ssize_t r = read(fd, out + n, 1);
        if (r <= 0)
            return false;
        if (out[n] == '\n') {
            out[n] = '\0';
            return n > 0;
        }
        n++;
    }
    return false;
}

/* Checks an exact float32 SUM of the drill's data: the pattern repeats every 64 elements. */
static int count_mismatches(const float *buf, size_t count, int world, int step)
{
    float want[64];
    for (size_t j = 0; j < 64; j++)
        want[j] = (float)fl_wk_drill_expected(j, world, step, FL_SUM);
    int bad = 0;
    for (size_t i = 0; i < count; i++)
        bad += buf[i] != want[i % 64];
    return bad;
}

int step_allreduce(fl_comm_t *comm, float *buf, size_t count, int s, rank_report_t *rep)
{
    fl_wk_drill_fill(buf, count, FL_FLOAT32, fl_comm_rank(comm), s);
    int64_t t0 = fl_now_ms();
    int rc = fl_allreduce(comm, buf, buf, count, FL_FLOAT32, FL_SUM);
    int64_t t1 = fl_now_ms();
    if (rc != FL_OK) {
        rep->rc = rc;
        rep->fail_ms = t1;
        rep->call_ms = t1 - t0;
        snprintf(rep->err, sizeof rep->err, "%s", fl_last_error());
        return rc;
    }
    rep->mismatches += count_mismatches(buf, count, fl_comm_size(comm), s);
    rep->steps++;
    return FL_OK;
}

void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        continue;
}

static void rank_main(int rank, const scenario_t *sc, const char *ipc, int cmd_fd, int res_fd)
{
    rank_report_t rep;
    memset(&rep, 0, sizeof rep);
    rep.rank = rank;
    rep.rc_next = FL_OK;
    char ep[FL_ENDPOINT_MAX];
    if (!read_endpoint(cmd_fd, ep, sizeof ep)) {
        rep.rc = FL_EIO;
        snprintf(rep.err, sizeof rep.err, "no coordinator endpoint from the parent");
        send_report(res_fd, &rep);
        return;
    }
    fl_comm_opts_t o;
    fl_comm_opts_init(&o);
    o.rank = rank;
    o.world_size = sc->world;
    o.coordinator = ep;
    o.host = "127.0.0.1";
    o.timeout_ms = sc->timeout_ms;
    o.rendezvous_timeout_ms = 20000;
    o.algo = sc->algo;
    o.segment_bytes = sc->segment;
    o.log_level = FL_LOG_OFF;
    if (rank == sc->special && ipc[0] != '\0')
        o.bind = ipc;
    fl_comm_t *comm = NULL;
    int rc = fl_comm_init(&o, &comm);
    if (rc != FL_OK) {
        rep.rc = rc;
        snprintf(rep.err, sizeof rep.err, "init: %s", fl_last_error());
        send_report(res_fd, &rep);
        return;
    }
    send_event(res_fd, 'J');
    sc->body(comm, sc, &rep, res_fd);
    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    rep.bad_msgs = st.bad_msgs;
    int64_t t0 = fl_now_ms();
    fl_comm_destroy(&comm);
    rep.destroy_ms = fl_now_ms() - t0;
    send_report(res_fd, &rep);
}

bool job_fork(job_t *job, const scenario_t *sc, bool ipc_special)
{
    memset(job, 0, sizeof *job);
    job->n = sc->world;
    if (ipc_special)
        snprintf(job->ipc, sizeof job->ipc, "ipc:///tmp/flodl-faults-%d-%d", (int)getpid(),
                 sc->special);
    pid_t parent = getpid();
    for (int r = 0; r < job->n; r++) {
        child_t *c = &job->ch[r];
        int cmd[2];
        int res[2];
        pid_t pid = -1;
        if (pipe2(cmd, O_CLOEXEC) != 0)
            cmd[0] = cmd[1] = res[0] = res[1] = -1;
        else if (pipe2(res, O_CLOEXEC) != 0)
            res[0] = res[1] = -1;
        else
            pid = fork();
        if (pid < 0) {
            for (int k = 0; k < 2; k++) {
                if (cmd[k] >= 0)
                    close(cmd[k]);
                if (res[k] >= 0)
                    close(res[k]);
            }
            job->n = r;
            return false;
        }
        if (pid == 0) {
            /* Dies with the test process, even when Check kills it on a timeout. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(99);
            signal(SIGPIPE, SIG_IGN);
            for (int q = 0; q < r; q++) {
                close(job->ch[q].cmd_fd);
                close(job->ch[q].res_fd);
            }
            close(cmd[1]);
            close(res[0]);
            rank_main(r, sc, job->ipc, cmd[0], res[1]);
            _exit(0); /* never return into Check's test runner */
        }
        close(cmd[0]);
        close(res[1]);
        c->pid = pid;
        c->cmd_fd = cmd[1];
        c->res_fd = res[0];
    }
    return true;
}

void job_send_endpoint(job_t *job, const char *ep)
{
    char line[FL_ENDPOINT_MAX + 2];
    int n = snprintf(line, sizeof line, "%s\n", ep);
    for (int r = 0; r < job->n; r++)
        if (write(job->ch[r].cmd_fd, line, (size_t)n) != n)
            fprintf(stderr, "could not pass the endpoint to rank %d\n", r);
}

/* Index of the report marker in a child's stream, or -1. */
static long report_at(const child_t *c)
{
    for (size_t i = 0; i < c->len; i++)
        if (c->buf[i] == 'R')
            return (long)i;
    return -1;
}

static bool has_report(const child_t *c)
{
    long at = report_at(c);
    return at >= 0 && c->len >= (size_t)at + 1 + sizeof(rank_report_t);
}

static bool has_event(const child_t *c, char ev)
{
    long at = report_at(c);
    size_t end = at >= 0 ? (size_t)at : c->len;
    return memchr(c->buf, ev, end) != NULL;
}

static const rank_report_t *report_of(const child_t *c, rank_report_t *out)
{
    if (!has_report(c))
        return NULL;
    memcpy(out, c->buf + report_at(c) + 1, sizeof *out);
    return out;
}

/* Reads what the children sent, waiting up to timeout_ms, and reaps those that ended. */
static void job_pump(job_t *job, int timeout_ms)
{
    struct pollfd p[MAX_RANKS];
    int who[MAX_RANKS];
    nfds_t n = 0;
    for (int r = 0; r < job->n; r++) {
        if (job->ch[r].res_fd >= 0) {
            p[n] = (struct pollfd){job->ch[r].res_fd, POLLIN, 0};
            who[n++] = r;
        }
    }
    if (n > 0 && poll(p, n, timeout_ms) > 0) {
        for (nfds_t i = 0; i < n; i++) {
            if (p[i].revents == 0)
                continue;
            child_t *c = &job->ch[who[i]];
            ssize_t got = c->len < sizeof c->buf
                              ? read(c->res_fd, c->buf + c->len, sizeof c->buf - c->len)
                              : 0;
            if (got > 0) {
                c->len += (size_t)got;
            } else if (got == 0 || errno != EINTR) {
                close(c->res_fd);
                c->res_fd = -1;
            }
        }
    } else if (n == 0 && timeout_ms > 0) {
        sleep_ms(timeout_ms < 20 ? timeout_ms : 20);
    }
    for (int r = 0; r < job->n; r++) {
        child_t *c = &job->ch[r];
        if (c->pid > 0 && !c->reaped && waitpid(c->pid, &c->status, WNOHANG) == c->pid)
            c->reaped = true;
    }
}

bool job_wait_event(job_t *job, int r, char ev, int64_t deadline)
{
    for (;;) {
        if (has_event(&job->ch[r], ev))
            return true;
        if (job->ch[r].res_fd < 0 || fl_deadline_left_ms(deadline) == 0)
            return false;
        job_pump(job, 20);
    }
}

bool job_wait_reports(job_t *job, unsigned mask, int64_t deadline)
{
    for (;;) {
        bool all = true;
        for (int r = 0; r < job->n; r++)
            if ((mask & (1u << r)) && !has_report(&job->ch[r]) && job->ch[r].res_fd >= 0)
                all = false;
        if (all)
            return true;
        if (fl_deadline_left_ms(deadline) == 0)
            return false;
        job_pump(job, 20);
    }
}

void job_stop(job_t *job)
{
    job_pump(job, 0);
    for (int r = 0; r < job->n; r++) {
        if (job->ch[r].pid > 0 && !job->ch[r].reaped) {
            job->ch[r].stopped = !has_report(&job->ch[r]);
            kill(job->ch[r].pid, SIGKILL);
        }
    }
    int64_t deadline = fl_deadline_in(10000);
    for (;;) {
        bool all = true;
        for (int r = 0; r < job->n; r++)
            all = all && (job->ch[r].pid <= 0 || job->ch[r].reaped);
        if (all || fl_deadline_left_ms(deadline) == 0)
            break;
        job_pump(job, 20);
    }
    for (int r = 0; r < job->n; r++) {
        if (job->ch[r].cmd_fd >= 0)
            close(job->ch[r].cmd_fd);
        if (job->ch[r].res_fd >= 0)
            close(job->ch[r].res_fd);
        job->ch[r].cmd_fd = job->ch[r].res_fd = -1;
    }
    if (job->ipc[0] != '\0')
        unlink(job->ipc + strlen("ipc://"));
}

const char *child_end(const child_t *c, char *buf, size_t cap)
{
    if (!c->reaped)
        snprintf(buf, cap, "not reaped");
    else if (c->stopped)
        snprintf(buf, cap, "still running at the deadline; killed by the test");
    else if (WIFSIGNALED(c->status))
        snprintf(buf, cap, "killed by signal %d", WTERMSIG(c->status));
    else
        snprintf(buf, cap, "exit %d", WEXITSTATUS(c->status));
    return buf;
}

const char *job_status(const job_t *job, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < job->n && used + 1 < cap; r++) {
        char how[64];
        rank_report_t rep;
        const rank_report_t *p = report_of(&job->ch[r], &rep);
        int w = snprintf(buf + used, cap - used, "\n  rank %d: joined %s, %s (%s)%s%s", r,
                         has_event(&job->ch[r], 'J') ? "yes" : "no", p ? "reported" : "no report",
                         child_end(&job->ch[r], how, sizeof how), p ? ": " : "", p ? p->err : "");
        if (w < 0)
            break;
        used += (size_t)w < cap - used ? (size_t)w : cap - used - 1;
    }
    return buf;
}

rank_report_t get_report(const job_t *job, int r)
{
    rank_report_t rep;
    char how[64];
    if (report_of(&job->ch[r], &rep) == NULL)
        ck_abort_msg("rank %d sent no report (%s, joined: %s)", r,
                     child_end(&job->ch[r], how, sizeof how),
                     has_event(&job->ch[r], 'J') ? "yes" : "no");
    return rep;
}

fl_coord_t *make_coord(int world)
{
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = "tcp://127.0.0.1:0";
    o.world_size = world;
    o.heartbeat_timeout_ms = HB_TIMEOUT_MS;
    o.rendezvous_timeout_ms = 30000;
    o.log_level = FL_LOG_OFF;
    fl_coord_t *c = NULL;
    if (fl_coord_create(&o, &c) != FL_OK)
        return NULL;
    if (fl_coord_start(c) != FL_OK)
        fl_coord_destroy(&c);
    return c;
}
