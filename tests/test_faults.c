/* Failures across processes: ranks are forked children (before the parent makes any ZeroMQ
 * context) reporting through pipes. A rank killed mid-allreduce (FL_EPEER naming it), a rank
 * stalling past timeout_ms (FL_ETIMEDOUT naming the rank waited for), the coordinator killed,
 * garbage and printf-format job ids on a data socket (results exact, all counted in bad_msgs);
 * after each failure FL_ECLOSED at once and a bounded fl_comm_destroy. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coord_int.h"
#include "fl_tp.h"
#include "fl_wk.h"
#include "testutil.h"

#define MAX_RANKS 4
#define HB_TIMEOUT_MS 1000
#define PS_BIN FLODL_BIN_DIR "/server/flodl-ps"

/* What a rank child sends back, after the event bytes 'J' (joined) and 'P' (progress). */
typedef struct rank_report {
    int rank;
    int rc;          /* the collective that failed, or FL_OK */
    int64_t fail_ms; /* monotonic clock when it returned */
    int64_t call_ms; /* how long that call took */
    int steps;       /* allreduces completed and verified */
    int mismatches;  /* elements that differed from the exact sum */
    int rc_next;     /* the call after the failure */
    int64_t next_ms;
    int64_t destroy_ms;
    uint64_t bad_msgs;
    char err[1024];
    char err_next[1024];
} rank_report_t;

struct scenario;
typedef void (*body_fn)(fl_comm_t *comm, const struct scenario *sc, rank_report_t *rep,
                        int res_fd);

typedef struct scenario {
    int world;
    size_t count;    /* float32 elements per allreduce */
    int timeout_ms;  /* fl_comm_opts_t.timeout_ms */
    fl_algo_t algo;
    size_t segment;  /* segment_bytes */
    int special;     /* the rank killed, stalled or attacked; -1: none */
    int progress_at; /* steps after which rank `progress_rank` sends 'P' */
    int progress_rank;
    int expect_bad;  /* garbage: messages the attacked rank must count */
    body_fn body;
} scenario_t;

/* One rank child, as the parent sees it. */
typedef struct child {
    pid_t pid;
    int cmd_fd; /* parent writes the coordinator endpoint */
    int res_fd; /* parent reads events and the report */
    uint8_t buf[sizeof(rank_report_t) + 64];
    size_t len;
    bool reaped;
    bool stopped; /* still running at cleanup, killed there */
    int status;
} child_t;

typedef struct job {
    int n;
    child_t ch[MAX_RANKS];
    char ipc[128]; /* data endpoint of the special rank, when it binds ipc */
} job_t;

/* ---- rank side ---- */

static void send_event(int fd, char ev)
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

/* One verified allreduce of step s; records a failure in rep. */
static int step_allreduce(fl_comm_t *comm, float *buf, size_t count, int s, rank_report_t *rep)
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

/* The call after a failure must refuse at once. */
static void call_after_failure(fl_comm_t *comm, rank_report_t *rep)
{
    float x = 1.0f;
    int64_t t0 = fl_now_ms();
    rep->rc_next = fl_allreduce(comm, &x, &x, 1, FL_FLOAT32, FL_SUM);
    rep->next_ms = fl_now_ms() - t0;
    snprintf(rep->err_next, sizeof rep->err_next, "%s", fl_last_error());
}

/* Allreduces until one fails (or 40 s pass); then one more call. */
static void body_until_failure(fl_comm_t *comm, const scenario_t *sc, rank_report_t *rep,
                               int res_fd)
{
    float *buf = malloc(sc->count * sizeof *buf);
    if (buf == NULL) {
        rep->rc = FL_ENOMEM;
        return;
    }
    int64_t stop = fl_deadline_in(40000);
    for (int s = 0;; s++) {
        if (fl_deadline_left_ms(stop) == 0) {
            snprintf(rep->err, sizeof rep->err, "no failure within 40 s");
            break;
        }
        if (step_allreduce(comm, buf, sc->count, s, rep) != FL_OK)
            break;
        if (rep->rank == sc->progress_rank && rep->steps == sc->progress_at)
            send_event(res_fd, 'P');
    }
    free(buf);
    if (rep->rc != FL_OK)
        call_after_failure(comm, rep);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        continue;
}

/* Two allreduces, then the special rank sleeps 4 s while the others run the third. */
static void body_stall(fl_comm_t *comm, const scenario_t *sc, rank_report_t *rep, int res_fd)
{
    (void)res_fd;
    float *buf = malloc(sc->count * sizeof *buf);
    if (buf == NULL) {
        rep->rc = FL_ENOMEM;
        return;
    }
    for (int s = 0; s < 2 && rep->rc == FL_OK; s++)
        step_allreduce(comm, buf, sc->count, s, rep);
    if (rep->rc == FL_OK) {
        if (rep->rank == sc->special)
            sleep_ms(4000);
        if (step_allreduce(comm, buf, sc->count, 2, rep) != FL_OK)
            call_after_failure(comm, rep);
    }
    free(buf);
}

/* Verified allreduces while the parent sends garbage to the special rank, which keeps the job
 * going (through a one-element flag allreduce) until it counted expect_bad refused messages
 * and two more steps ran, or 300 steps / 20 s passed. */
static void body_garbage(fl_comm_t *comm, const scenario_t *sc, rank_report_t *rep, int res_fd)
{
    float *buf = malloc(sc->count * sizeof *buf);
    if (buf == NULL) {
        rep->rc = FL_ENOMEM;
        return;
    }
    int64_t stop = fl_deadline_in(20000);
    int after = 0;
    for (int s = 0; s < 300; s++) {
        if (step_allreduce(comm, buf, sc->count, s, rep) != FL_OK)
            break;
        if (rep->rank == sc->progress_rank && rep->steps == sc->progress_at)
            send_event(res_fd, 'P');
        int32_t more = 0;
        if (rep->rank == sc->special) {
            fl_comm_stats_t st;
            fl_comm_get_stats(comm, &st);
            if (st.bad_msgs >= (uint64_t)sc->expect_bad)
                after++;
            more = after < 3 && fl_deadline_left_ms(stop) > 0;
        }
        int64_t t0 = fl_now_ms();
        int rc = fl_allreduce(comm, &more, &more, 1, FL_INT32, FL_SUM);
        if (rc != FL_OK) {
            rep->rc = rc;
            rep->fail_ms = fl_now_ms();
            rep->call_ms = rep->fail_ms - t0;
            snprintf(rep->err, sizeof rep->err, "flag: %s", fl_last_error());
            break;
        }
        if (more == 0)
            break;
    }
    free(buf);
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

/* ---- parent side ---- */

/* Forks sc->world rank children. No ZeroMQ context may exist in this process yet. False
 * when a pipe or fork failed (job->n then counts the children started). */
static bool job_fork(job_t *job, const scenario_t *sc, bool ipc_special)
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

static void job_send_endpoint(job_t *job, const char *ep)
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

/* Waits until rank r sent event ev (or ended), or the deadline. */
static bool job_wait_event(job_t *job, int r, char ev, int64_t deadline)
{
    for (;;) {
        if (has_event(&job->ch[r], ev))
            return true;
        if (job->ch[r].res_fd < 0 || fl_deadline_left_ms(deadline) == 0)
            return false;
        job_pump(job, 20);
    }
}

/* Waits until every rank in mask reported (or ended), or the deadline. */
static bool job_wait_reports(job_t *job, unsigned mask, int64_t deadline)
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

/* Kills (SIGKILL, by PID) every child still running, reaps all, closes the pipes. */
static void job_stop(job_t *job)
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

/* How child r ended, for messages. */
static const char *child_end(const child_t *c, char *buf, size_t cap)
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

/* One line per rank: joined, reported, how it ended; for failure messages. */
static const char *job_status(const job_t *job, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < job->n && used + 1 < cap; r++) {
        char how[64];
        rank_report_t rep;
        const rank_report_t *p = report_of(&job->ch[r], &rep);
        int w = snprintf(buf + used, cap - used, "\n  rank %d: joined %s, %s (%s)%s%s", r,
                         has_event(&job->ch[r], 'J') ? "yes" : "no",
                         p ? "reported" : "no report", child_end(&job->ch[r], how, sizeof how),
                         p ? ": " : "", p ? p->err : "");
        if (w < 0)
            break;
        used += (size_t)w < cap - used ? (size_t)w : cap - used - 1;
    }
    return buf;
}

/* Report of rank r, or a failed assertion saying why there is none. */
static rank_report_t get_report(const job_t *job, int r)
{
    rank_report_t rep;
    char how[64];
    if (report_of(&job->ch[r], &rep) == NULL)
        ck_abort_msg("rank %d sent no report (%s, joined: %s)", r,
                     child_end(&job->ch[r], how, sizeof how),
                     has_event(&job->ch[r], 'J') ? "yes" : "no");
    return rep;
}

static fl_coord_t *make_coord(int world)
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

/* A word-bounded "rank K" in text. */
static bool names_rank(const char *text, int k)
{
    char want[32];
    snprintf(want, sizeof want, "rank %d", k);
    size_t n = strlen(want);
    for (const char *s = strstr(text, want); s != NULL; s = strstr(s + 1, want))
        if (s[n] < '0' || s[n] > '9')
            return true;
    return false;
}

/* The checks every survivor of a failure must pass: FL_ECLOSED at once, destroy bounded, no
 * wrong result before the failure. */
static void check_after_failure(const rank_report_t *rep)
{
    if (rep->rc_next != FL_ECLOSED || rep->next_ms > 1000)
        ck_abort_msg("rank %d: the call after the failure returned %s after %lld ms (want "
                     "FL_ECLOSED at once): %s",
                     rep->rank, fl_strerror(rep->rc_next), (long long)rep->next_ms,
                     rep->err_next);
    if (rep->destroy_ms > 5000)
        ck_abort_msg("rank %d: fl_comm_destroy took %lld ms after the failure", rep->rank,
                     (long long)rep->destroy_ms);
    if (rep->mismatches != 0)
        ck_abort_msg("rank %d: %d wrong elements before the failure", rep->rank,
                     rep->mismatches);
}

/* ---- tests ---- */

/* Rank 2 of 4 killed (SIGKILL) in the middle of allreduces of count float32 with algo: every
 * survivor fails with FL_EPEER naming it, its host and the operation, within the heartbeat
 * timeout, and the coordinator reports the death. */
static void rank_killed(fl_algo_t algo, size_t count)
{
    const scenario_t sc = {.world = 4,
                           .count = count,
                           .timeout_ms = 30000,
                           .algo = algo,
                           .segment = (size_t)1 << 20,
                           .special = 2,
                           .progress_at = 2,
                           .progress_rank = 2,
                           .body = body_until_failure};
    job_t job;
    bool forked = job_fork(&job, &sc, false);
    fl_coord_t *coord = forked ? make_coord(sc.world) : NULL;
    if (coord != NULL)
        job_send_endpoint(&job, fl_coord_endpoint(coord));
    bool going = coord != NULL && job_wait_event(&job, sc.special, 'P', fl_deadline_in(30000));
    int64_t killed = fl_now_ms();
    if (going)
        kill(job.ch[sc.special].pid, SIGKILL);
    bool reported = going && job_wait_reports(&job, 0xBu, fl_deadline_in(HB_TIMEOUT_MS + 15000));
    job_stop(&job);
    int coord_rc = FL_OK;
    char coord_text[1024] = "";
    if (coord != NULL) {
        coord_rc = fl_coord_wait(coord, 5000);
        snprintf(coord_text, sizeof coord_text, "%s", fl_last_error());
        fl_coord_stop(coord);
        fl_coord_destroy(&coord);
    }

    ck_assert_msg(forked, "could not fork the ranks");
    ck_assert_msg(going, "rank 2 never completed 2 allreduces");
    char st[4096];
    ck_assert_msg(reported, "survivors did not report within %d ms:%s", HB_TIMEOUT_MS + 15000,
                  job_status(&job, st, sizeof st));
    for (int r = 0; r < sc.world; r++) {
        if (r == sc.special)
            continue;
        rank_report_t rep = get_report(&job, r);
        int64_t after = rep.fail_ms - killed;
        if (rep.rc != FL_EPEER || after > HB_TIMEOUT_MS + 2000)
            ck_abort_msg("rank %d: %s %lld ms after the kill (want FL_EPEER within %d ms): %s",
                         r, fl_strerror(rep.rc), (long long)after, HB_TIMEOUT_MS + 2000,
                         rep.err);
        if (!names_rank(rep.err, sc.special) || strstr(rep.err, "127.0.0.1") == NULL ||
            strstr(rep.err, "allreduce") == NULL || strstr(rep.err, "dead") == NULL)
            ck_abort_msg("rank %d: the error should name dead rank 2, its host and the "
                         "operation: %s",
                         r, rep.err);
        if (!names_rank(rep.err_next, sc.special))
            ck_abort_msg("rank %d: FL_ECLOSED should carry the original cause: %s", r,
                         rep.err_next);
        check_after_failure(&rep);
    }
    char how[64];
    ck_assert_msg(job.ch[sc.special].reaped && WIFSIGNALED(job.ch[sc.special].status) &&
                      WTERMSIG(job.ch[sc.special].status) == SIGKILL,
                  "rank 2: %s", child_end(&job.ch[sc.special], how, sizeof how));
    ck_assert_msg(coord_rc == FL_EPEER && names_rank(coord_text, sc.special) &&
                      strstr(coord_text, "dead") != NULL,
                  "fl_coord_wait: %s: %s", fl_strerror(coord_rc), coord_text);
}

START_TEST(test_rank_killed)
{
    rank_killed(FL_ALGO_RING, (size_t)2 << 20); /* 8 MiB of float32 */
}
END_TEST

/* The same death under each algorithm the size switch can pick, at sizes it picks them for. */
START_TEST(test_rank_killed_each_algo)
{
    static const struct {
        fl_algo_t algo;
        size_t count;
    } runs[] = {{FL_ALGO_DIRECT, 1024},        /* 4 KiB */
                {FL_ALGO_RD, 16384},           /* 64 KiB */
                {FL_ALGO_RING, 65536},         /* 256 KiB, one segment a chunk */
                {FL_ALGO_AUTO, 1024},          /* AUTO's one-shot */
                {FL_ALGO_AUTO, 16384}};        /* AUTO's recursive doubling */
    rank_killed(runs[_i].algo, runs[_i].count);
}
END_TEST

START_TEST(test_rank_stalls)
{
    const scenario_t sc = {.world = 3,
                           .count = (size_t)256 << 10,
                           .timeout_ms = 1500,
                           .algo = FL_ALGO_RING,
                           .segment = (size_t)256 << 10,
                           .special = 2,
                           .progress_rank = -1,
                           .body = body_stall};
    job_t job;
    bool forked = job_fork(&job, &sc, false);
    fl_coord_t *coord = forked ? make_coord(sc.world) : NULL;
    if (coord != NULL)
        job_send_endpoint(&job, fl_coord_endpoint(coord));
    bool have_coord = coord != NULL;
    bool reported = have_coord && job_wait_reports(&job, 0x7u, fl_deadline_in(30000));
    job_stop(&job);
    if (have_coord) {
        fl_coord_stop(coord);
        fl_coord_destroy(&coord);
    }

    ck_assert_msg(forked, "could not fork the ranks");
    ck_assert_msg(have_coord, "coordinator did not start");
    char st[4096];
    ck_assert_msg(reported, "ranks did not report within 30 s:%s",
                  job_status(&job, st, sizeof st));
    for (int r = 0; r < sc.special; r++) {
        rank_report_t rep = get_report(&job, r);
        int left = (r + sc.world - 1) % sc.world; /* the ring receives from rank - 1 */
        char want[64];
        snprintf(want, sizeof want, "no data from rank %d ", left);
        if (rep.steps != 2 || rep.rc != FL_ETIMEDOUT || rep.call_ms > sc.timeout_ms + 1000 ||
            rep.call_ms < sc.timeout_ms - 50)
            ck_abort_msg("rank %d: %d steps, then %s after %lld ms (want FL_ETIMEDOUT after "
                         "%d..%d ms): %s",
                         r, rep.steps, fl_strerror(rep.rc), (long long)rep.call_ms,
                         sc.timeout_ms - 50, sc.timeout_ms + 1000, rep.err);
        if (strstr(rep.err, want) == NULL)
            ck_abort_msg("rank %d: the error should say '%s': %s", r, want, rep.err);
        check_after_failure(&rep);
    }
    /* Rank 0 receives from the stalled rank itself. */
    rank_report_t rep0 = get_report(&job, 0);
    ck_assert_msg(strstr(rep0.err, "no data from rank 2 (127.0.0.1)") != NULL, "%s", rep0.err);
    rank_report_t stalled = get_report(&job, sc.special);
    ck_assert_msg(stalled.steps == 2 && stalled.rc != FL_OK,
                  "the stalled rank cannot complete a third allreduce alone: %d steps, %s",
                  stalled.steps, fl_strerror(stalled.rc));
}
END_TEST

/* Starts flodl-ps as a child (after the ranks were forked) and reads its endpoint. */
static pid_t start_ps(int world, char *ep, size_t cap)
{
    char path[128];
    char ws[16];
    char hb[16];
    snprintf(path, sizeof path, "/tmp/flodl-faults-%d.ep", (int)getpid());
    snprintf(ws, sizeof ws, "%d", world);
    snprintf(hb, sizeof hb, "%d", HB_TIMEOUT_MS);
    unlink(path);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) {
            dup2(devnull, 0);
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execl(PS_BIN, PS_BIN, "--bind", "tcp://127.0.0.1:0", "--endpoint-file", path,
              "--world-size", ws, "--heartbeat-timeout", hb, "--log-level", "error",
              "--insecure", (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    int64_t deadline = fl_deadline_in(10000);
    while (fl_deadline_left_ms(deadline) > 0) {
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            bool ok = fgets(ep, (int)cap, f) != NULL && strchr(ep, '\n') != NULL;
            fclose(f);
            if (ok) {
                ep[strcspn(ep, "\n")] = '\0';
                unlink(path);
                return pid;
            }
        }
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return -1;
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    unlink(path);
    return -1;
}

START_TEST(test_coordinator_killed)
{
    const scenario_t sc = {.world = 3,
                           .count = (size_t)1 << 20,
                           .timeout_ms = 30000,
                           .algo = FL_ALGO_RING,
                           .segment = (size_t)1 << 20,
                           .special = -1,
                           .progress_at = 2,
                           .progress_rank = 0,
                           .body = body_until_failure};
    job_t job;
    bool forked = job_fork(&job, &sc, false);
    char ep[FL_ENDPOINT_MAX] = "";
    pid_t ps = forked ? start_ps(sc.world, ep, sizeof ep) : -1;
    if (ps > 0)
        job_send_endpoint(&job, ep);
    bool going = ps > 0 && job_wait_event(&job, 0, 'P', fl_deadline_in(30000));
    int64_t killed = fl_now_ms();
    int ps_status = 0;
    if (ps > 0) {
        kill(ps, SIGKILL);
        waitpid(ps, &ps_status, 0); /* SIGKILL: the wait is short */
    }
    bool reported = going && job_wait_reports(&job, 0x7u, fl_deadline_in(HB_TIMEOUT_MS + 15000));
    job_stop(&job);

    ck_assert_msg(forked, "could not fork the ranks");
    ck_assert_msg(ps > 0, "flodl-ps did not start");
    ck_assert_msg(going, "rank 0 never completed 2 allreduces");
    char st[4096];
    ck_assert_msg(reported, "ranks did not report within %d ms:%s", HB_TIMEOUT_MS + 15000,
                  job_status(&job, st, sizeof st));
    for (int r = 0; r < sc.world; r++) {
        rank_report_t rep = get_report(&job, r);
        int64_t after = rep.fail_ms - killed;
        if (rep.rc != FL_EPEER || after > HB_TIMEOUT_MS + 2000)
            ck_abort_msg("rank %d: %s %lld ms after the kill (want FL_EPEER within %d ms): %s",
                         r, fl_strerror(rep.rc), (long long)after, HB_TIMEOUT_MS + 2000,
                         rep.err);
        if (strstr(rep.err, "coordinator") == NULL || strstr(rep.err, "silent") == NULL ||
            strstr(rep.err, ep) == NULL)
            ck_abort_msg("rank %d: the error should say coordinator %s is silent: %s", r, ep,
                         rep.err);
        check_after_failure(&rep);
    }
}
END_TEST

/* ---- garbage on a data socket ---- */

typedef struct enc_buf {
    uint8_t data[4096];
    size_t len;
} enc_buf_t;

static void *enc_alloc(size_t len, void *ud)
{
    enc_buf_t *b = ud;
    if (len > sizeof b->data)
        return NULL;
    b->len = len;
    return b->data;
}

/* A chunk header of allreduce #seq as rank `sender` of job/generation would send it. */
static void chunk_hdr(fl_msg_hdr_t *h, const char *job, uint64_t gen, int sender, uint64_t seq,
                      size_t total)
{
    fl_msg_hdr_init(h, FL_MSG_CHUNK, sender);
    snprintf(h->job_id, sizeof h->job_id, "%s", job);
    h->generation = gen;
    h->seq = seq;
    h->u.chunk.coll = FL_COLL_ALLREDUCE;
    h->u.chunk.phase = FL_PHASE_RS;
    h->u.chunk.count = 4;
    h->u.chunk.op = FL_SUM;
    h->u.chunk.total = total;
    h->frames[0].dtype = FL_FLOAT32;
    h->frames[0].codec = FL_CODEC_RAW;
}

/* Sends h (unstamped: job, generation and sender as given) with one 16-byte payload. */
static int send_chunk(fl_tp_sock_t *s, fl_msg_hdr_t *h)
{
    float payload[4] = {1e30f, -1e30f, 12345.0f, 7.0f};
    fl_buf_t b = {payload, sizeof payload, NULL, NULL};
    return fl_tp_send(s, NULL, h, &b, 1, fl_deadline_in(2000));
}

/* Encodes h as is (any version) and sends it raw with the given payload frames. */
static int send_encoded(fl_tp_sock_t *s, const fl_msg_hdr_t *h, bool break_magic, size_t nextra,
                        size_t extra_bytes)
{
    enc_buf_t b;
    if (fl_msg_encode(h, enc_alloc, &b, &b.len) != FL_OK)
        return FL_EINVAL;
    if (break_magic) {
        /* Field 1, fixed32: tag byte 0x0d, then the magic little-endian. */
        static const uint8_t magic[5] = {0x0d, 'F', 'L', 'D', 'L'};
        uint8_t *m = memmem(b.data, b.len, magic, sizeof magic);
        if (m == NULL)
            return FL_EINVAL;
        m[1] = 'X';
    }
    static const uint8_t junk[256] = {0};
    const void *parts[32] = {b.data};
    size_t sizes[32] = {b.len};
    for (size_t i = 0; i < nextra && i + 1 < 32; i++) {
        parts[i + 1] = junk;
        sizes[i + 1] = extra_bytes;
    }
    return fl_tp_send_raw(s, parts, sizes, 1 + (nextra < 31 ? nextra : 31));
}

/* Counts a send that worked; keeps the first failure. */
static void tally(int r, int *rc, int *n)
{
    if (r == FL_OK)
        (*n)++;
    else if (*rc == FL_OK)
        *rc = r;
}

/* The garbage set: every message is refused and counted exactly once by the receiver. */
static int attack_garbage(fl_tp_sock_t *s, const char *job, uint64_t gen, int target,
                          int world, size_t total, int *sent)
{
    uint64_t seed = 42;
    uint8_t noise[200];
    for (size_t i = 0; i < sizeof noise; i++)
        noise[i] = (uint8_t)fl_test_rand(&seed);
    int rc = FL_OK;
    int n = 0;
    {
        /* Random bytes as a header, alone and with payload frames; an empty frame. */
        const void *p1[] = {noise};
        size_t s1[] = {37};
        tally(fl_tp_send_raw(s, p1, s1, 1), &rc, &n);
        const void *p2[] = {noise, noise + 50, noise + 100};
        size_t s2[] = {120, 64, 80};
        tally(fl_tp_send_raw(s, p2, s2, 3), &rc, &n);
        const void *p3[] = {noise};
        size_t s3[] = {0};
        tally(fl_tp_send_raw(s, p3, s3, 1), &rc, &n);
    }
    fl_msg_hdr_t h;
    /* Wrong magic, wrong version. */
    chunk_hdr(&h, job, gen, (target + world - 1) % world, 3, total);
    h.version = FL_MSG_VERSION;
    tally(send_encoded(s, &h, true, 0, 0), &rc, &n);
    h.version = FL_MSG_VERSION + 1;
    tally(send_encoded(s, &h, false, 0, 0), &rc, &n);
    /* Another job id, another generation of this job. */
    chunk_hdr(&h, "intruder", gen, 0, 3, total);
    tally(send_chunk(s, &h), &rc, &n);
    chunk_hdr(&h, job, gen + 1, 0, 3, total);
    tally(send_chunk(s, &h), &rc, &n);
    /* Frames unlike the header: one declared, 16 bytes promised, 8 sent; 20 frames. */
    chunk_hdr(&h, job, gen, 0, 3, total);
    h.version = FL_MSG_VERSION;
    h.nframes = 1;
    h.frames[0].bytes = 16;
    h.frames[0].raw_bytes = 16;
    tally(send_encoded(s, &h, false, 1, 8), &rc, &n);
    h.nframes = 0;
    tally(send_encoded(s, &h, false, 20, 4), &rc, &n);
    /* Well-formed, right job and generation, impossible senders: out of range, the target
     * itself, the coordinator's -1. */
    chunk_hdr(&h, job, gen, world + 3, 3, total);
    tally(send_chunk(s, &h), &rc, &n);
    chunk_hdr(&h, job, gen, target, 3, total);
    tally(send_chunk(s, &h), &rc, &n);
    chunk_hdr(&h, job, gen, -1, 3, total);
    tally(send_chunk(s, &h), &rc, &n);
    /* A real peer's name on a message that has no place on a data socket, and on a chunk of a
     * collective long finished (sequence numbers start at 1). */
    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, 0);
    snprintf(h.job_id, sizeof h.job_id, "%s", job);
    h.generation = gen;
    tally(fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(2000)), &rc, &n);
    chunk_hdr(&h, job, gen, (target + world - 1) % world, 0, total);
    tally(send_chunk(s, &h), &rc, &n);
    *sent = n;
    return rc;
}

/* One chunk header whose job id is a printf format: must be refused like any other job. */
static int attack_format(fl_tp_sock_t *s, const char *job, uint64_t gen, int target, int world,
                         size_t total, int *sent)
{
    (void)job;
    char fmt[FL_JOB_MAX] = "";
    for (int i = 0; i < 30; i++)
        strcat(fmt, "%s");
    fl_msg_hdr_t h;
    chunk_hdr(&h, fmt, gen, (target + world - 1) % world, 3, total);
    int rc = send_chunk(s, &h);
    *sent = rc == FL_OK ? 1 : 0;
    return rc;
}

typedef int (*attack_fn)(fl_tp_sock_t *s, const char *job, uint64_t gen, int target, int world,
                         size_t total, int *sent);

static void run_garbage(attack_fn attack, int expect)
{
    const scenario_t sc = {.world = 3,
                           .count = 300007,
                           .timeout_ms = 10000,
                           .algo = FL_ALGO_RING,
                           .segment = (size_t)64 << 10,
                           .special = 1,
                           .progress_at = 2,
                           .progress_rank = 1,
                           .expect_bad = expect,
                           .body = body_garbage};
    job_t job;
    bool forked = job_fork(&job, &sc, true);
    fl_coord_t *coord = forked ? make_coord(sc.world) : NULL;
    if (coord != NULL)
        job_send_endpoint(&job, fl_coord_endpoint(coord));
    bool going = coord != NULL && job_wait_event(&job, sc.special, 'P', fl_deadline_in(30000));
    int sent = 0;
    int arc = FL_EIO;
    char aerr[1024] = "";
    if (going) {
        /* The attacker knows the job's generation, as a confused peer of this job would. */
        uint64_t gen = coord->generation;
        fl_ctx_opts_t co;
        fl_ctx_opts_init(&co);
        co.log_level = FL_LOG_OFF;
        fl_ctx_t *ctx = NULL;
        fl_tp_sock_t *s = NULL;
        fl_tp_opts_t to;
        fl_tp_opts_init(&to);
        to.linger_ms = 3000;
        arc = fl_ctx_create(&co, &ctx);
        if (arc == FL_OK)
            arc = fl_tp_sock_create(ctx, FL_TP_PUSH, &to, "attacker", &s);
        if (arc == FL_OK)
            arc = fl_tp_sock_connect(s, job.ipc);
        if (arc == FL_OK)
            arc = attack(s, "flodl", gen, sc.special, sc.world, sc.count, &sent);
        if (arc != FL_OK)
            snprintf(aerr, sizeof aerr, "%s", fl_last_error());
        fl_tp_sock_destroy(&s); /* lingers until the messages left */
        fl_ctx_destroy(&ctx);
    }
    bool reported = going && job_wait_reports(&job, 0x7u, fl_deadline_in(30000));
    job_stop(&job);
    if (coord != NULL) {
        fl_coord_stop(coord);
        fl_coord_destroy(&coord);
    }

    ck_assert_msg(forked, "could not fork the ranks");
    ck_assert_msg(going, "rank 1 never completed 2 allreduces");
    ck_assert_msg(arc == FL_OK && sent == expect, "attacker: sent %d of %d: %s", sent, expect,
                  aerr);
    char st[4096];
    ck_assert_msg(reported, "ranks did not report within 30 s:%s",
                  job_status(&job, st, sizeof st));
    /* The attacked rank first: when it crashed, that is the news, not its peers' errors. */
    for (int k = 0; k < sc.world; k++) {
        int r = (sc.special + k) % sc.world;
        rank_report_t rep = get_report(&job, r);
        if (rep.rc != FL_OK || rep.mismatches != 0 || rep.steps < 5)
            ck_abort_msg("rank %d: %s after %d steps, %d wrong elements: %s", r,
                         fl_strerror(rep.rc), rep.steps, rep.mismatches, rep.err);
        uint64_t want = r == sc.special ? (uint64_t)expect : 0;
        if (rep.bad_msgs != want)
            ck_abort_msg("rank %d counted %llu bad messages, want %llu", r,
                         (unsigned long long)rep.bad_msgs, (unsigned long long)want);
    }
}

START_TEST(test_garbage_on_data_socket)
{
    run_garbage(attack_garbage, 14);
}
END_TEST

START_TEST(test_format_string_job_id)
{
    run_garbage(attack_format, 1);
}
END_TEST

Suite *faults_suite(void);
Suite *faults_suite(void)
{
    Suite *s = suite_create("faults");
    TCase *t = tcase_create("deaths");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_rank_killed);
    tcase_add_loop_test(t, test_rank_killed_each_algo, 0, 5);
    tcase_add_test(t, test_coordinator_killed);
    suite_add_tcase(s, t);
    t = tcase_create("stall");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_rank_stalls);
    suite_add_tcase(s, t);
    t = tcase_create("garbage");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_garbage_on_data_socket);
    tcase_add_test(t, test_format_string_job_id);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(faults_suite());
}
