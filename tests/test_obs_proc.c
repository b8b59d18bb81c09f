/* The binaries' observability, end to end: flodl-ps and two flodl-worker ranks with
 * --metrics-port, scraped while they train (every line valid exposition format, counters that
 * increase, the coordinator's view of the ranks), the workers' --timeline files (JSON with the
 * phases), /healthz turning 503 on flodl-ps when a rank is killed, and /healthz answering
 * while hostile clients hold connections. */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_core.h"
#include "fl_msg.h"
#include "obsutil.h"
#include "testproc.h"
#include "testutil.h"

#define PS_BIN FLODL_BIN_DIR "/server/flodl-ps"
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))
#define WK_BIN FLODL_BIN_DIR "/worker/flodl-worker"

static void start_worker(proc_t *p, const char *ep, int rank, int port, int hport,
                         const char *timeline)
{
    char r[16], mp[16], hp[16];
    snprintf(r, sizeof r, "%d", rank);
    snprintf(mp, sizeof mp, "%d", port);
    snprintf(hp, sizeof hp, "%d", hport);
    const char *argv[MAX_ARGS] = {WK_BIN,      "--mode",         "ring",      "--rank",
                                  r,           "--world-size",   "2",         "--coordinator",
                                  ep,          "--host",         "127.0.0.1", "--epochs",
                                  "40",        "--topk",         "0.01",      "--progress",
                                  "1000",      "--metrics-port", mp,          "--metrics-bind",
                                  "127.0.0.1", "--timeline",     timeline,    "--timeout",
                                  "20000",     "--health-port",  hp,          NULL};
    proc_start(p, WK_BIN, argv, NULL);
}

/* promtool check metrics on an exposition (Debian's prometheus package; the test command
 * installs it). Fails naming promtool's complaint; a machine without promtool fails too, so
 * the check cannot pass unseen. */
static void promtool_check(const char *body, const char *what)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/flodl-metrics-%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(body, f);
    fclose(f);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s > %s.out 2>&1", path, path);
    int rc = system(cmd);
    char out[1024] = "";
    snprintf(cmd, sizeof cmd, "%s.out", path);
    if ((f = fopen(cmd, "r")) != NULL) {
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = '\0';
        fclose(f);
    }
    unlink(path);
    unlink(cmd);
    ck_assert_msg(rc == 0, "promtool check metrics on %s: %s", what, out);
}

/* Scrapes port until it answers a valid exposition with series (deadline 20 s). */
static char *scrape(int port)
{
    int64_t until = fl_deadline_in(20000);
    while (fl_deadline_left_ms(until) > 0) {
        char *body = NULL;
        if (fl_test_http_get(port, "/metrics", &body) == 200) {
            char err[256];
            ck_assert_msg(fl_test_exposition_valid(body, err, sizeof err), "%s\n%s", err, body);
            return body;
        }
        free(body);
        usleep(100000);
    }
    ck_abort_msg("no metrics on port %d", port);
    return NULL;
}

static void check_timeline(const char *path, const char *want)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no timeline %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ck_assert(fread(buf, 1, (size_t)n, f) == (size_t)n);
    buf[n] = '\0';
    fclose(f);
    cJSON *j = cJSON_Parse(buf);
    ck_assert_msg(j != NULL && cJSON_IsArray(j), "%s is not a JSON array", path);
    int compute = 0, exchange = 0, wait = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, j)
    {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name"));
        ck_assert(name != NULL);
        compute += strcmp(name, "compute") == 0;
        exchange += strcmp(name, want) == 0;
        wait += strcmp(name, "wait for the exchange") == 0;
    }
    ck_assert_msg(compute > 0 && exchange > 0 && wait > 0, "%s: %d compute, %d %s, %d wait", path,
                  compute, exchange, want, wait);
    cJSON_Delete(j);
    free(buf);
}

/* The k-th span named `name` of process pid in a merged trace: its start and end (us). */
static int spans_of(const cJSON *all, int pid, const char *name, double *start, double *end,
                    int cap)
{
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, all)
    {
        const char *nm = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name"));
        const cJSON *p = cJSON_GetObjectItem(e, "pid");
        const cJSON *ts = cJSON_GetObjectItem(e, "ts");
        const cJSON *dur = cJSON_GetObjectItem(e, "dur");
        if (nm == NULL || strcmp(nm, name) != 0 || !cJSON_IsNumber(p) || p->valueint != pid ||
            !cJSON_IsNumber(ts) || !cJSON_IsNumber(dur) || n >= cap)
            continue;
        start[n] = ts->valuedouble;
        end[n] = ts->valuedouble + dur->valuedouble;
        n++;
    }
    return n;
}

/* Two ranks' timelines merge into one trace (flodl-trace-merge) whose times share an origin:
 * each allreduce of rank 0 overlaps the same allreduce of rank 1 (neither can finish before
 * the other has started), and each rank is a process of its own. */
START_TEST(test_timelines_merge_on_one_clock)
{
    proc_t p[3];
    memset(p, 0, sizeof p);
    char ep[FL_ENDPOINT_MAX], out[8192];
    ck_assert(start_ps(&p[0], 2, NULL, NULL, ep, sizeof ep, 4));
    char tl[2][64];
    for (int r = 0; r < 2; r++) {
        snprintf(tl[r], sizeof tl[r], "/tmp/flodl-tlm-%d-%d.json", (int)getpid(), r);
        char rank[8];
        snprintf(rank, sizeof rank, "%d", r);
        const char *argv[] = {WK_BIN, "--rank",        rank,         "--world-size",
                              "2",    "--coordinator", ep,           "--epochs",
                              "1",    "--quiet",       "--timeline", tl[r],
                              NULL};
        proc_start(&p[1 + r], WK_BIN, argv, NULL);
    }
    bool done = procs_wait(p, 3, fl_deadline_in(90000));
    procs_stop(p, 3);
    show(p, 3, out, sizeof out);
    ck_assert_msg(done && proc_code(&p[1]) == 0 && proc_code(&p[2]) == 0, "%s", out);
    char merged[64];
    snprintf(merged, sizeof merged, "/tmp/flodl-tlm-%d.json", (int)getpid());
    const char *margv[] = {FLODL_BIN_DIR "/observe/flodl-trace-merge", merged, tl[0], tl[1], NULL};
    proc_t m;
    run_sync(&m, margv[0], margv, NULL);
    ck_assert_msg(proc_code(&m) == 0, "flodl-trace-merge: exit %d: %s", proc_code(&m), m.buf[1]);
    procs_free(&m, 1);
    FILE *f = fopen(merged, "r");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ck_assert(fread(buf, 1, (size_t)n, f) == (size_t)n);
    buf[n] = '\0';
    fclose(f);
    cJSON *all = cJSON_Parse(buf);
    free(buf);
    ck_assert_msg(cJSON_IsArray(all), "the merged trace is not a JSON array");
    enum { CAP = 4096 };
    static double s0[CAP], e0[CAP], s1[CAP], e1[CAP];
    int n0 = spans_of(all, 0, "allreduce", s0, e0, CAP);
    int n1 = spans_of(all, 1, "allreduce", s1, e1, CAP);
    ck_assert_msg(n0 > 10 && n0 == n1, "allreduce spans: %d on rank 0, %d on rank 1", n0, n1);
    int overlap = 0;
    for (int i = 0; i < n0; i++)
        overlap += s0[i] <= e1[i] && s1[i] <= e0[i];
    /* Every one should; a few microseconds of rounding may part the shortest. */
    ck_assert_msg(overlap >= n0 * 9 / 10, "%d of %d allreduces overlap across the ranks", overlap,
                  n0);
    /* Wall-clock times: within the last few minutes, not seconds since some start. */
    ck_assert_msg(s0[0] > 1.6e15, "times are not Unix-epoch microseconds: %.0f", s0[0]);
    cJSON_Delete(all);
    unlink(merged);
    for (int r = 0; r < 2; r++)
        unlink(tl[r]);
    procs_free(p, 3);
}
END_TEST

START_TEST(test_scraped_while_training)
{
    proc_t p[3];
    memset(p, 0, sizeof p);
    char ep[FL_ENDPOINT_MAX], out[8192];
    int ps_port = free_port();
    int wk_port[2] = {free_port(), free_port()};
    int wk_hport[2] = {free_port(), free_port()};
    char ps_mp[16];
    snprintf(ps_mp, sizeof ps_mp, "%d", ps_port);
    const char *extra[] = {
        "--metrics-port", ps_mp, "--metrics-bind", "127.0.0.1", "--heartbeat-timeout",
        "1500",           NULL};
    ck_assert(start_ps(&p[0], 2, extra, NULL, ep, sizeof ep, 1));
    char tl[2][64];
    for (int r = 0; r < 2; r++) {
        snprintf(tl[r], sizeof tl[r], "/tmp/flodl-tl-%d-%d.json", (int)getpid(), r);
        start_worker(&p[1 + r], ep, r, wk_port[r], wk_hport[r], tl[r]);
    }
    /* Workers: steps counted and growing, compression above 1, everything rank-labelled. */
    /* The series appear once training starts (after the rendezvous and data loading). */
    const char *steps = "flodl_steps_total{rank=\"0\"}";
    char *a = scrape(wk_port[0]);
    double s0 = fl_test_metric_value(a, steps);
    for (int64_t until = fl_deadline_in(20000); isnan(s0) && fl_deadline_left_ms(until) > 0;) {
        free(a);
        usleep(50000);
        a = scrape(wk_port[0]);
        s0 = fl_test_metric_value(a, steps);
    }
    usleep(400000);
    char *b = scrape(wk_port[0]);
    double s1 = fl_test_metric_value(b, steps);
    double ratio = fl_test_metric_value(b, "flodl_compression_ratio{rank=\"0\"}");
    ck_assert_msg(s1 > s0 && s0 >= 0, "steps %g then %g:\n%s", s0, s1, b);
    ck_assert_msg(ratio > 5, "compression %g:\n%s", ratio, b);
    ck_assert_msg(fl_test_metric_value(b, "flodl_residual_norm{rank=\"0\"}") > 0, "%s", b);
    /* Step times as histograms; the job's figures from rank 0 alone; the process's own. */
    ck_assert_msg(fl_test_metric_value(b, "flodl_step_seconds_count{rank=\"0\"}") > 0, "%s", b);
    ck_assert_msg(fl_test_metric_value(b, "flodl_job_samples_total") > 0, "%s", b);
    ck_assert_msg(fl_test_metric_value(b, "process_resident_memory_bytes") > 0, "%s", b);
    promtool_check(b, "rank 0's /metrics");
    free(a);
    free(b);
    char *w1 = scrape(wk_port[1]);
    ck_assert_msg(!isnan(fl_test_metric_value(w1, "flodl_bytes_sent_total{rank=\"1\"}")), "%s", w1);
    ck_assert_msg(strstr(w1, "flodl_job_samples") == NULL, "rank 1 repeats the job's figures");
    free(w1);
    /* The coordinator: both ranks alive, job started, healthy. */
    char *c = scrape(ps_port);
    ck_assert_msg(fl_test_metric_value(c, "flodl_ps_ranks{state=\"alive\"}") == 2, "%s", c);
    ck_assert_msg(fl_test_metric_value(c, "flodl_ps_job_started") == 1, "%s", c);
    ck_assert_msg(fl_test_metric_value(c, "flodl_ps_rank_up{rank=\"1\"}") == 1, "%s", c);
    ck_assert_msg(strstr(c, "# TYPE flodl_ps_rank_collectives_total counter\n") != NULL, "%s", c);
    promtool_check(c, "flodl-ps's /metrics");
    free(c);
    char *body = NULL;
    ck_assert_int_eq(fl_test_http_get(ps_port, "/healthz", &body), 200);
    free(body);
    ck_assert_int_eq(fl_test_http_get(wk_port[1], "/healthz", &body), 200);
    free(body);
    ck_assert_int_eq(fl_test_http_get(wk_hport[1], "/healthz", &body), 200); /* --health-port */
    free(body);
    body = NULL;

    /* Rank 1 dies: the coordinator's /healthz says so until flodl-ps ends the failed job
     * (rank 0 leaves at once, so the window is short: poll fast). */
    kill(p[2].pid, SIGKILL);
    int code = 0;
    int64_t until = fl_deadline_in(15000);
    while (fl_deadline_left_ms(until) > 0) {
        free(body);
        body = NULL;
        if ((code = fl_test_http_get(ps_port, "/healthz", &body)) == 503 || code < 0)
            break;
        usleep(5000);
    }
    procs_wait(p, 3, fl_deadline_in(20000));
    procs_stop(p, 3);
    show(p, 3, out, sizeof out);
    if (code == 503)
        ck_assert_msg(strstr(body, "rank 1 (127.0.0.1) is dead") != NULL, "healthz: %s", body);
    else /* it ended before a poll landed: it must still have said why */
        ck_assert_msg(strstr(p[0].buf[1], "rank 1") != NULL && proc_code(&p[0]) == 1,
                      "healthz %d, and flodl-ps did not report rank 1:%s", code, out);
    free(body);
    /* Rank 0 failed on the dead peer, and still closed its timeline. */
    check_timeline(tl[0], "sparse allreduce");
    check_timeline(tl[0], "compress (top-k, error feedback)");
    for (int r = 0; r < 2; r++)
        unlink(tl[r]);
    procs_free(p, 3);
}
END_TEST

/* A rank that does not arrive (slowed 1000x on a larger model: seconds per batch): the
 * coordinator's stall report names it, what the others are waiting in, and when each was last heard
 * from. */
START_TEST(test_stall_report_names_the_missing_rank)
{
    proc_t p[3];
    memset(p, 0, sizeof p);
    char ep[FL_ENDPOINT_MAX], out[16384];
    const char *extra[] = {"--stall-report", "500", NULL};
    ck_assert(start_ps(&p[0], 2, extra, NULL, ep, sizeof ep, 2));
    for (int r = 0; r < 2; r++) {
        char rank[8];
        snprintf(rank, sizeof rank, "%d", r);
        const char *argv[] = {WK_BIN,
                              "--mode",
                              "ring",
                              "--rank",
                              rank,
                              "--world-size",
                              "2",
                              "--coordinator",
                              ep,
                              "--host",
                              "127.0.0.1",
                              "--epochs",
                              "1",
                              "--progress",
                              "1000",
                              "--layers",
                              "64,1024,1024,10",
                              "--throttle",
                              r == 1 ? "0:1000" : "0:1",
                              NULL};
        proc_start(&p[1 + r], WK_BIN, argv, NULL);
    }
    bool seen = proc_wait_text(p, 3, 0, 1, "stall:", 1, fl_deadline_in(30000));
    procs_stop(p, 3);
    show(p, 3, out, sizeof out);
    ck_assert_msg(seen, "no stall report:%s", out);
    const char *rep = strstr(p[0].buf[1], "stall:");
    ck_assert_msg(strstr(rep, "rank 0 (127.0.0.1) has made no progress in collective #") != NULL,
                  "%s", rep);
    ck_assert_msg(strstr(rep, "rank 1 (127.0.0.1): not in a collective") != NULL &&
                      strstr(rep, "has not arrived") != NULL,
                  "%s", rep);
    ck_assert_msg(strstr(rep, "rank 0 (127.0.0.1): in allreduce #") != NULL &&
                      strstr(rep, "last heard") != NULL,
                  "%s", rep);
    procs_free(p, 3);
}
END_TEST

/* The coordinator's refusals by kind on flodl-ps's /metrics: a header that does not parse, one
 * with a wrong magic, and a registration for another job, each under its own `kind` label,
 * and the foreign registration named in the log. */
START_TEST(test_bad_messages_by_kind)
{
    proc_t p[1];
    memset(p, 0, sizeof p);
    char ep[FL_ENDPOINT_MAX], out[8192];
    int ps_port = free_port();
    char ps_mp[16];
    snprintf(ps_mp, sizeof ps_mp, "%d", ps_port);
    const char *extra[] = {"--metrics-port", ps_mp, "--metrics-bind", "127.0.0.1", NULL};
    ck_assert(start_ps(&p[0], 2, extra, NULL, ep, sizeof ep, 1));

    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    fl_ctx_t *ctx = NULL;
    ck_assert_int_eq(fl_ctx_create(&co, &ctx), FL_OK);
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    fl_tp_sock_t *x = NULL;
    ck_assert_int_eq(fl_tp_sock_create(ctx, FL_TP_DEALER, &t, "stranger", &x), FL_OK);
    ck_assert_int_eq(fl_tp_sock_connect(x, ep), FL_OK);
    static const uint8_t garbage[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t magic[5] = {0x0d, 0x44, 0x33, 0x22, 0x11}; /* magic 0x11223344 */
    const void *parts[1] = {garbage};
    size_t sizes[1] = {sizeof garbage};
    ck_assert_int_eq(fl_tp_send_raw(x, parts, sizes, 1), FL_OK);
    parts[0] = magic;
    sizes[0] = sizeof magic;
    ck_assert_int_eq(fl_tp_send_raw(x, parts, sizes, 1), FL_OK);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, 1);
    snprintf(h.job_id, sizeof h.job_id, "other-job");
    h.u.reg.rank = 1;
    h.u.reg.world_size = 2;
    snprintf(h.u.reg.host, sizeof h.u.reg.host, "stranger-host");
    h.u.reg.nendpoints = 1;
    snprintf(h.u.reg.endpoints[0], FL_ENDPOINT_MAX, "tcp://127.0.0.1:9");
    ck_assert_int_eq(fl_tp_send(x, NULL, &h, NULL, 0, fl_deadline_in(1000)), FL_OK);
    for (int i = 0; i < 3; i++) { /* each is answered */
        fl_tp_msg_t m;
        fl_test_expect_msg(x, FL_MSG_ERROR, 5000, &m);
        fl_tp_msg_close(&m);
    }

    static const struct {
        const char *series;
        double want;
    } kinds[] = {
        {"flodl_ps_bad_messages_total{kind=\"bad_header\"}", 1},
        {"flodl_ps_bad_messages_total{kind=\"bad_magic\"}", 1},
        {"flodl_ps_bad_messages_total{kind=\"bad_job\"}", 1},
        {"flodl_ps_bad_messages_total{kind=\"bad_version\"}", 0},
        {"flodl_ps_bad_messages_total{kind=\"bad_frames\"}", 0},
        {"flodl_ps_bad_messages_total{kind=\"oversized\"}", 0},
        {"flodl_ps_bad_messages_total{kind=\"unexpected\"}", 0},
        {"flodl_ps_bad_messages_total{kind=\"conn_cut\"}", 0},
    };
    char *c = scrape(ps_port);
    ck_assert_int_eq(count_lines(c, "flodl_ps_bad_messages_total "), 0); /* no unlabelled sum */
    ck_assert_int_eq(count_lines(c, "flodl_ps_bad_messages_total{kind="), (int)NELEM(kinds));
    for (size_t k = 0; k < NELEM(kinds); k++) {
        double v = fl_test_metric_value(c, kinds[k].series);
        ck_assert_msg(v == kinds[k].want, "%s is %g, expected %g:\n%s", kinds[k].series, v,
                      kinds[k].want, c);
    }
    free(c);
    fl_tp_sock_destroy(&x);
    fl_ctx_destroy(&ctx);
    procs_stop(p, 1);
    show(p, 1, out, sizeof out);
    ck_assert_msg(p[0].buf[1] != NULL &&
                      strstr(p[0].buf[1], "refused a registration for rank 1 from host "
                                          "stranger-host") != NULL &&
                      strstr(p[0].buf[1], "of job 'other-job'") != NULL,
                  "the foreign registration is not in the log:%s", out);
    procs_free(p, 1);
}
END_TEST

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* n probes of port's /healthz, 50 ms apart, each with a 1 s deadline: the answers that were
 * 200 in time, their median and max latency (ms) in fig. */
static int probe_many(int port, int n, char *fig, size_t cap)
{
    double ms[64];
    int ok = 0;
    for (int i = 0; i < n && i < 64; i++) {
        ok += fl_test_http_probe(port, "/healthz", 1000, &ms[i]) == 200;
        usleep(50000);
    }
    qsort(ms, (size_t)n, sizeof ms[0], cmp_double);
    snprintf(fig, cap, "%d of %d answered 200 within 1 s, median %.1f ms, max %.1f ms", ok, n,
             ms[n / 2], ms[n - 1]);
    return ok;
}

/* /healthz kept answering beside idle and slow HTTP clients: 200 on the metrics port from
 * another address (127.0.0.2: its per-address limit leaves room for the probe), and 300 on
 * the health listener (--health-port; more than its 256 slots) from 127.0.0.2 and from the
 * probe's own address, where no per-address limit could help. 20 of 20 probes from 127.0.0.1
 * must answer 200 within 1 s on each port; the latencies are printed. */
START_TEST(test_healthz_under_held_connections)
{
    proc_t p[1];
    memset(p, 0, sizeof p);
    char ep[FL_ENDPOINT_MAX], out[8192];
    int mport = free_port(), hport = free_port();
    char mp[16], hp[16];
    snprintf(mp, sizeof mp, "%d", mport);
    snprintf(hp, sizeof hp, "%d", hport);
    const char *extra[] = {"--metrics-port", mp,  "--health-port", hp, "--metrics-bind",
                           "127.0.0.1",      NULL};
    ck_assert(start_ps(&p[0], 2, extra, NULL, ep, sizeof ep, 5));
    free(scrape(mport)); /* serving */
    fl_test_hold_t *hold[3] = {fl_test_hold_start("127.0.0.2", mport, 200),
                               fl_test_hold_start("127.0.0.2", hport, 150),
                               fl_test_hold_start("127.0.0.1", hport, 150)};
    ck_assert(hold[0] != NULL && hold[1] != NULL && hold[2] != NULL);
    int64_t until = fl_deadline_in(5000); /* until the clients have their connections */
    while (fl_test_hold_open(hold[0]) < 100 && fl_deadline_left_ms(until) > 0)
        usleep(20000);
    usleep(1000000);
    char mfig[160], hfig[160];
    int mok = probe_many(mport, 20, mfig, sizeof mfig);
    int hok = probe_many(hport, 20, hfig, sizeof hfig);
    long opened[3], closed[3];
    for (int i = 0; i < 3; i++)
        fl_test_hold_stop(hold[i], &opened[i], &closed[i]);
    procs_stop(p, 1);
    show(p, 1, out, sizeof out);
    fprintf(stderr,
            "healthz beside held connections: metrics port (200): %s; health port (300): %s "
            "(its clients opened %ld and %ld connections, it closed %ld and %ld)\n",
            mfig, hfig, opened[1], opened[2], closed[1], closed[2]);
    ck_assert_msg(mok == 20, "the metrics port's /healthz beside 200 clients of 127.0.0.2: %s%s",
                  mfig, out);
    ck_assert_msg(hok == 20, "the health port's /healthz beside 300 clients: %s%s", hfig, out);
    /* The slow ones were cut too, not only the idle ones. */
    ck_assert_msg(closed[1] >= 100 && closed[2] >= 100,
                  "the health listener closed only %ld and %ld of its clients' connections",
                  closed[1], closed[2]);
    procs_free(p, 1);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("obs_proc");
    TCase *t = tcase_create("obs_proc");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_timelines_merge_on_one_clock);
    tcase_add_test(t, test_scraped_while_training);
    tcase_add_test(t, test_stall_report_names_the_missing_rank);
    tcase_add_test(t, test_bad_messages_by_kind);
    tcase_add_test(t, test_healthz_under_held_connections);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
