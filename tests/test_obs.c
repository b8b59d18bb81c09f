/* observe/: the metrics registry and its exposition text (every line valid, counters that only
 * go up, labels, refusals), the HTTP endpoint (/metrics, /healthz 200 and 503, 404, scraped
 * while other threads update), and the timeline (a JSON array of trace events). */
#include <arpa/inet.h>
#include <check.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "fl_obs.h"
#include "obsutil.h"
#include "testutil.h"

START_TEST(test_render_format)
{
    fl_obs_t *o = NULL;
    ck_assert(fl_obs_create(&o) == FL_OK);
    int steps = fl_obs_add(o, "flodl_steps_total", "Optimizer steps", FL_OBS_COUNTER, NULL);
    int bad0 = fl_obs_add(o, "flodl_bad_messages_total", "Messages refused", FL_OBS_COUNTER,
                          "kind=\"bad_magic\"");
    int bad1 = fl_obs_add(o, "flodl_bad_messages_total", "Messages refused", FL_OBS_COUNTER,
                          "kind=\"oversized\"");
    int rate = fl_obs_add(o, "flodl_samples_per_second", "Rate", FL_OBS_GAUGE, "rank=\"0\"");
    ck_assert(steps >= 0 && bad0 >= 0 && bad1 >= 0 && rate >= 0);
    /* The same name and labels: the same series. */
    ck_assert_int_eq(fl_obs_add(o, "flodl_steps_total", "x", FL_OBS_COUNTER, ""), steps);
    fl_obs_inc(o, steps, 3);
    fl_obs_inc(o, bad1, 1);
    fl_obs_set(o, rate, 1234.5);
    size_t len = 0;
    char *text = fl_obs_render(o, &len);
    ck_assert(text != NULL && len == strlen(text));
    char err[256];
    ck_assert_msg(fl_test_exposition_valid(text, err, sizeof err), "%s\n%s", err, text);
    ck_assert_msg(strstr(text, "# TYPE flodl_steps_total counter\nflodl_steps_total 3\n"), "%s",
                  text);
    ck_assert_msg(strstr(text, "flodl_bad_messages_total{kind=\"bad_magic\"} 0\n"
                               "flodl_bad_messages_total{kind=\"oversized\"} 1\n"),
                  "%s", text);
    ck_assert_int_eq(count_lines(text, "# HELP flodl_bad_messages_total"), 1);
    ck_assert_msg(strstr(text, "flodl_samples_per_second{rank=\"0\"} 1234.5\n"), "%s", text);
    free(text);
    fl_obs_destroy(&o);
}
END_TEST

/* A histogram renders Prometheus' way: cumulative buckets up to +Inf, _sum and _count that
 * agree; bad bounds are refused. */
START_TEST(test_histogram)
{
    fl_obs_t *o = NULL;
    ck_assert(fl_obs_create(&o) == FL_OK);
    static const double b[] = {0.01, 0.1, 1.0};
    int h = fl_obs_add_histogram(o, "flodl_step_seconds", "Step time", "rank=\"1\"", b, 3);
    ck_assert_int_ge(h, 0);
    static const double v[] = {0.005, 0.01, 0.05, 0.5, 0.7, 3.0};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        fl_obs_observe(o, h, v[i]);
    ck_assert(fl_obs_get(o, h) == 6.0);
    char *text = fl_obs_render(o, NULL);
    char err[256];
    ck_assert_msg(fl_test_exposition_valid(text, err, sizeof err), "%s\n%s", err, text);
    ck_assert_msg(strstr(text, "# TYPE flodl_step_seconds histogram\n"
                               "flodl_step_seconds_bucket{rank=\"1\",le=\"0.01\"} 2\n"
                               "flodl_step_seconds_bucket{rank=\"1\",le=\"0.1\"} 3\n"
                               "flodl_step_seconds_bucket{rank=\"1\",le=\"1\"} 5\n"
                               "flodl_step_seconds_bucket{rank=\"1\",le=\"+Inf\"} 6\n"
                               "flodl_step_seconds_sum{rank=\"1\"} 4.26"),
                  "%s", text);
    ck_assert_msg(strstr(text, "\nflodl_step_seconds_count{rank=\"1\"} 6\n"), "%s", text);
    free(text);
    static const double down[] = {1.0, 0.5};
    ck_assert_int_eq(fl_obs_add_histogram(o, "h2", "", NULL, down, 2), FL_EINVAL);
    ck_assert_int_eq(fl_obs_add_histogram(o, "h3", "", NULL, b, 0), FL_EINVAL);
    ck_assert_int_eq(fl_obs_add(o, "flodl_step_seconds", "", FL_OBS_GAUGE, NULL), FL_EINVAL);
    fl_obs_destroy(&o);
}
END_TEST

/* The process's own series and the build info, with values that make sense. */
START_TEST(test_process_series)
{
    fl_obs_t *o = NULL;
    ck_assert(fl_obs_create(&o) == FL_OK);
    ck_assert_int_eq(fl_obs_add_process(o), FL_OK);
    char *text = fl_obs_render(o, NULL);
    char err[256];
    ck_assert_msg(fl_test_exposition_valid(text, err, sizeof err), "%s\n%s", err, text);
    ck_assert_msg(fl_test_metric_value(text, "process_resident_memory_bytes") > 1e6, "%s", text);
    ck_assert_msg(fl_test_metric_value(text, "process_open_fds") >= 3, "%s", text);
    ck_assert_msg(fl_test_metric_value(text, "process_max_fds") >= 64, "%s", text);
    ck_assert_msg(fl_test_metric_value(text, "process_cpu_seconds_total") >= 0, "%s", text);
    double start = fl_test_metric_value(text, "process_start_time_seconds");
    ck_assert_msg(start > (double)time(NULL) - 3600 && start <= (double)time(NULL) + 1, "%s", text);
    char info[128];
    snprintf(info, sizeof info, "flodl_build_info{version=\"%s\",features=\"", fl_version());
    ck_assert_msg(strstr(text, info) != NULL, "%s", text);
    ck_assert_msg(strstr(text, "# TYPE process_cpu_seconds_total counter\n") != NULL, "%s", text);
    free(text);
    fl_obs_destroy(&o);
}
END_TEST

START_TEST(test_bad_registrations_refused)
{
    fl_obs_t *o = NULL;
    ck_assert(fl_obs_create(&o) == FL_OK);
    ck_assert_int_eq(fl_obs_add(o, "9lives", "", FL_OBS_GAUGE, NULL), FL_EINVAL);
    ck_assert_int_eq(fl_obs_add(o, "a-b", "", FL_OBS_GAUGE, NULL), FL_EINVAL);
    ck_assert_int_eq(fl_obs_add(o, "ok", "", FL_OBS_GAUGE, "rank=0"), FL_EINVAL);
    ck_assert_int_eq(fl_obs_add(o, "ok", "", FL_OBS_GAUGE, "rank=\"a\"b\""), FL_EINVAL);
    ck_assert_int_eq(fl_obs_add(o, "ok", "", FL_OBS_GAUGE, "ra nk=\"0\""), FL_EINVAL);
    ck_assert(fl_obs_add(o, "ok", "", FL_OBS_GAUGE, NULL) >= 0);
    ck_assert_int_eq(fl_obs_add(o, "ok", "", FL_OBS_COUNTER, "x=\"1\""), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "gauge already") != NULL, "%s", fl_last_error());
    /* Updates of a failed registration are ignored, not a crash. */
    fl_obs_inc(o, FL_EINVAL, 1);
    fl_obs_set(o, 9999, 1);
    fl_obs_destroy(&o);
}
END_TEST

/* ---- HTTP ---- */

typedef struct hammer {
    fl_obs_t *o;
    int id;
    volatile int stop;
} hammer_t;

static void *hammer_main(void *p)
{
    hammer_t *h = p;
    while (!h->stop)
        fl_obs_inc(h->o, h->id, 1);
    return NULL;
}

static bool health_flag(void *ud, char *why, size_t cap)
{
    if (*(int *)ud)
        return true;
    snprintf(why, cap, "no step for 42 s");
    return false;
}

START_TEST(test_http_endpoint)
{
    fl_obs_t *o = NULL;
    ck_assert(fl_obs_create(&o) == FL_OK);
    hammer_t h = {o, fl_obs_add(o, "flodl_spins_total", "Spins", FL_OBS_COUNTER, NULL), 0};
    int healthy = 1;
    fl_obs_http_t *srv = NULL;
    ck_assert_msg(fl_obs_http_start(o, "127.0.0.1", 0, health_flag, &healthy, &srv) == FL_OK, "%s",
                  fl_last_error());
    int port = fl_obs_http_port(srv);
    ck_assert(port > 0);
    pthread_t th;
    ck_assert(pthread_create(&th, NULL, hammer_main, &h) == 0);
    double last = -1;
    for (int i = 0; i < 5; i++) {
        char *body = NULL;
        ck_assert_int_eq(fl_test_http_get(port, "/metrics", &body), 200);
        char err[256];
        ck_assert_msg(fl_test_exposition_valid(body, err, sizeof err), "%s", err);
        double v = fl_test_metric_value(body, "flodl_spins_total");
        ck_assert_msg(v >= last, "counter went from %g to %g", last, v);
        last = v;
        free(body);
        usleep(2000);
    }
    h.stop = 1;
    pthread_join(th, NULL);
    ck_assert(last > 0);
    char *body = NULL;
    ck_assert_int_eq(fl_test_http_get(port, "/healthz", &body), 200);
    ck_assert_str_eq(body, "ok\n");
    free(body);
    healthy = 0;
    ck_assert_int_eq(fl_test_http_get(port, "/healthz", &body), 503);
    ck_assert_msg(strstr(body, "no step for 42 s") != NULL, "%s", body);
    free(body);
    ck_assert_int_eq(fl_test_http_get(port, "/secrets", &body), 404);
    free(body);
    /* A second server on the same port: refused, naming it. */
    fl_obs_http_t *dup = NULL;
    ck_assert_int_eq(fl_obs_http_start(o, "127.0.0.1", port, NULL, NULL, &dup), FL_EIO);
    char want[32];
    snprintf(want, sizeof want, "%d", port);
    ck_assert_msg(strstr(fl_last_error(), want) != NULL, "%s", fl_last_error());
    ck_assert_int_eq(fl_obs_http_start(o, "localhost", 0, NULL, NULL, &dup), FL_EINVAL);
    fl_obs_http_stop(&srv);
    ck_assert(srv == NULL);
    fl_obs_destroy(&o);
}
END_TEST

/* The health listener: 200 ok, 503 with the reason, HEAD without a body, 404 and 405, a request
 * whose headers never end cut with 431; a silent connection is cut (reset) at its deadline; a
 * second listener on the port refused naming it. */
START_TEST(test_healthz_listener)
{
    int healthy = 1;
    fl_obs_healthz_t *srv = NULL;
    ck_assert_msg(fl_obs_healthz_start("127.0.0.1", 0, health_flag, &healthy, &srv) == FL_OK, "%s",
                  fl_last_error());
    int port = fl_obs_healthz_port(srv);
    ck_assert(port > 0);
    char *body = NULL;
    ck_assert_int_eq(fl_test_http_get(port, "/healthz", &body), 200);
    ck_assert_str_eq(body, "ok\n");
    free(body);
    ck_assert_int_eq(fl_test_http_get(port, "/healthz?verbose=1", &body), 200);
    free(body);
    healthy = 0;
    ck_assert_int_eq(fl_test_http_get(port, "/healthz", &body), 503);
    ck_assert_msg(strstr(body, "no step for 42 s") != NULL, "%s", body);
    free(body);
    ck_assert_int_eq(fl_test_http_get(port, "/metrics", &body), 404);
    free(body);
    /* Raw requests: HEAD, POST, endless headers, and silence. */
    static const struct {
        const char *req;
        const char *want;
    } raw[] = {
        {"HEAD /healthz HTTP/1.1\r\n\r\n", "HTTP/1.1 503 "},
        {"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 405 "},
        {NULL, "HTTP/1.1 431 "},
        {"", ""},
    };
    for (size_t k = 0; k < sizeof raw / sizeof raw[0]; k++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        struct timeval tv = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ck_assert(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
        char big[4096];
        memset(big, 'a', sizeof big);
        memcpy(big, "GET /healthz HTTP/1.1\r\nX: ", 26);
        const char *req = raw[k].req != NULL ? raw[k].req : big;
        size_t len = raw[k].req != NULL ? strlen(req) : sizeof big;
        ck_assert(send(fd, req, len, MSG_NOSIGNAL) == (ssize_t)len || raw[k].req == NULL);
        char got[1024] = "";
        int64_t t0 = fl_now_ms();
        ssize_t n = recv(fd, got, sizeof got - 1, 0);
        int64_t took = fl_now_ms() - t0;
        close(fd);
        got[n > 0 ? n : 0] = '\0';
        ck_assert_msg(strncmp(got, raw[k].want, strlen(raw[k].want)) == 0, "case %zu: '%s'", k,
                      got);
        if (k == 0)
            ck_assert_msg(strstr(got, "\r\n\r\n")[4] == '\0', "HEAD with a body: '%s'", got);
        if (raw[k].req != NULL && raw[k].req[0] == '\0')
            ck_assert_msg(n <= 0 && took < 4500, "silence: %zd bytes, closed after %lld ms", n,
                          (long long)took);
    }
    fl_obs_healthz_t *dup = NULL;
    ck_assert_int_eq(fl_obs_healthz_start("127.0.0.1", port, NULL, NULL, &dup), FL_EIO);
    char want[32];
    snprintf(want, sizeof want, "%d", port);
    ck_assert_msg(strstr(fl_last_error(), want) != NULL, "%s", fl_last_error());
    ck_assert_int_eq(fl_obs_healthz_start("localhost", 0, NULL, NULL, &dup), FL_EINVAL);
    fl_obs_healthz_stop(&srv);
    ck_assert(srv == NULL);
    fl_obs_healthz_stop(&srv);
}
END_TEST

/* ---- the timeline ---- */

typedef struct span_arg {
    fl_obs_timeline_t *t;
    int tid;
} span_arg_t;

static void *spans_main(void *p)
{
    span_arg_t *a = p;
    for (int i = 0; i < 100; i++) {
        int64_t t0 = fl_now_ns();
        fl_obs_timeline_span(a->t, a->tid, i % 2 ? "compute" : "exchange", "step", t0, t0 + 1000);
    }
    return NULL;
}

START_TEST(test_timeline_is_a_trace)
{
    char path[] = "/tmp/flodl-timeline-XXXXXX";
    int fd = mkstemp(path);
    ck_assert(fd >= 0);
    close(fd);
    fl_obs_timeline_t *t = NULL;
    ck_assert(fl_obs_timeline_open(path, 7, &t) == FL_OK);
    fl_obs_timeline_track(t, 0, "device 0");
    fl_obs_timeline_track(t, 1, "exchange \"0\"");
    span_arg_t a[2] = {{t, 0}, {t, 1}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ck_assert(pthread_create(&th[i], NULL, spans_main, &a[i]) == 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    ck_assert(fl_obs_timeline_close(&t) == FL_OK);
    FILE *f = fopen(path, "r");
    ck_assert(f != NULL);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    ck_assert_msg(j != NULL && cJSON_IsArray(j), "not a JSON array");
    ck_assert_int_eq(cJSON_GetArraySize(j), 203); /* the process name, 2 tracks, 200 spans */
    int compute = 0;
    int names = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, j)
    {
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph"));
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(e, "name"));
        ck_assert(ph != NULL && name != NULL);
        ck_assert_int_eq((int)cJSON_GetNumberValue(cJSON_GetObjectItem(e, "pid")), 7);
        if (strcmp(ph, "M") == 0) {
            names++;
            continue;
        }
        ck_assert_str_eq(ph, "X");
        ck_assert(cJSON_GetNumberValue(cJSON_GetObjectItem(e, "dur")) == 1.0);
        compute += strcmp(name, "compute") == 0;
    }
    ck_assert_int_eq(compute, 100);
    ck_assert_int_eq(names, 3);
    cJSON_Delete(j);
    unlink(path);
    ck_assert_int_eq(fl_obs_timeline_open("/nonexistent/dir/t.json", 1, &t), FL_EIO);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("obs");
    TCase *t = tcase_create("obs");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_render_format);
    tcase_add_test(t, test_histogram);
    tcase_add_test(t, test_process_series);
    tcase_add_test(t, test_bad_registrations_refused);
    tcase_add_test(t, test_http_endpoint);
    tcase_add_test(t, test_healthz_listener);
    tcase_add_test(t, test_timeline_is_a_trace);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
