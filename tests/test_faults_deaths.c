/* Failures across processes (ranks are forked children reporting through pipes): a rank killed
 * mid-allreduce under each algorithm (FL_EPEER naming it), a rank stalling past timeout_ms
 * (FL_ETIMEDOUT naming the rank waited for), the coordinator killed; after each failure
 * FL_ECLOSED at once and a bounded fl_comm_destroy. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord_int.h"
#include "fl_wk.h"
#include "faultutil.h"

#define PS_BIN FLODL_BIN_DIR "/server/flodl-ps"

/* ---- rank side ---- */

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

/* ---- parent side ---- */

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
                     rep->rank, fl_strerror(rep->rc_next), (long long)rep->next_ms, rep->err_next);
    if (rep->destroy_ms > 5000)
        ck_abort_msg("rank %d: fl_comm_destroy took %lld ms after the failure", rep->rank,
                     (long long)rep->destroy_ms);
    if (rep->mismatches != 0)
        ck_abort_msg("rank %d: %d wrong elements before the failure", rep->rank, rep->mismatches);
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
            ck_abort_msg("rank %d: %s %lld ms after the kill (want FL_EPEER within %d ms): %s", r,
                         fl_strerror(rep.rc), (long long)after, HB_TIMEOUT_MS + 2000, rep.err);
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
    } runs[] = {{FL_ALGO_DIRECT, 1024}, /* 4 KiB */
                {FL_ALGO_RD, 16384},    /* 64 KiB */
                {FL_ALGO_RING, 65536},  /* 256 KiB, one segment a chunk */
                {FL_ALGO_AUTO, 1024},   /* AUTO's one-shot */
                {FL_ALGO_AUTO, 16384}}; /* AUTO's recursive doubling */
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
    ck_assert_msg(reported, "ranks did not report within 30 s:%s", job_status(&job, st, sizeof st));
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
              "--world-size", ws, "--heartbeat-timeout", hb, "--log-level", "error", "--insecure",
              (char *)NULL);
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
            ck_abort_msg("rank %d: %s %lld ms after the kill (want FL_EPEER within %d ms): %s", r,
                         fl_strerror(rep.rc), (long long)after, HB_TIMEOUT_MS + 2000, rep.err);
        if (strstr(rep.err, "coordinator") == NULL || strstr(rep.err, "silent") == NULL ||
            strstr(rep.err, ep) == NULL)
            ck_abort_msg("rank %d: the error should say coordinator %s is silent: %s", r, ep,
                         rep.err);
        check_after_failure(&rep);
    }
}
END_TEST

Suite *faults_deaths_suite(void);
Suite *faults_deaths_suite(void)
{
    Suite *s = suite_create("faults_deaths");
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
    return s;
}

int main(void)
{
    return fl_test_run(faults_deaths_suite());
}
