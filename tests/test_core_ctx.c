/* core: error codes and the per-thread detail text, clock and deadlines, log levels, and the
 * context (validation, counters under contention, stat names, log lines). */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

/* ---- errors ---- */

START_TEST(test_strerror)
{
    static const int codes[] = {FL_OK,        FL_EINVAL,     FL_ENOMEM, FL_EIO,
                                FL_ETIMEDOUT, FL_EPEER,      FL_EPROTO, FL_EGPU,
                                FL_ECLOSED,   FL_ENONFINITE, FL_ERESYNC};
    for (size_t i = 0; i < NELEM(codes); i++) {
        const char *s = fl_strerror(codes[i]);
        if (s == NULL || s[0] == '\0' || strcmp(s, "unknown error") == 0)
            ck_abort_msg("code %d: no text of its own (%s)", codes[i], s ? s : "NULL");
        for (size_t j = 0; j < i; j++)
            if (strcmp(s, fl_strerror(codes[j])) == 0)
                ck_abort_msg("codes %d and %d share the text '%s'", codes[i], codes[j], s);
    }
    ck_assert_str_eq(fl_strerror(FL_EPROTO), "protocol error");
    ck_assert_str_eq(fl_strerror(FL_ETIMEDOUT), "timed out");
    static const int unknown[] = {1, 2, -11, -100, INT_MAX, INT_MIN};
    for (size_t i = 0; i < NELEM(unknown); i++) {
        const char *s = fl_strerror(unknown[i]);
        if (s == NULL || strcmp(s, "unknown error") != 0)
            ck_abort_msg("code %d: '%s', expected 'unknown error'", unknown[i], s ? s : "NULL");
    }
}
END_TEST

START_TEST(test_fail_sets_text)
{
    ck_assert_ptr_nonnull(fl_last_error());
    ck_assert_int_eq(fl_fail(FL_EPEER, "rank %d: connect %s: %s", 3, "tcp://h:1", "refused"),
                     FL_EPEER);
    ck_assert_str_eq(fl_last_error(), "rank 3: connect tcp://h:1: refused");
    ck_assert_int_eq(fl_fail(FL_EIO, "second"), FL_EIO);
    ck_assert_str_eq(fl_last_error(), "second");
    fl_error_clear();
    ck_assert_str_eq(fl_last_error(), "");

    /* An over-long detail is truncated but stays terminated. */
    char big[4000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ck_assert_int_eq(fl_fail(FL_EINVAL, "%s", big), FL_EINVAL);
    size_t n = strlen(fl_last_error());
    ck_assert_msg(n > 500 && n < sizeof big - 1, "detail of %zu bytes", n);
}
END_TEST

START_TEST(test_fail_ctx)
{
    fl_error_clear();
    ck_assert_int_eq(fl_fail_ctx(FL_ETIMEDOUT, "allreduce #%d", 3), FL_ETIMEDOUT);
    ck_assert_str_eq(fl_last_error(), "allreduce #3: timed out");

    fl_fail(FL_EPEER, "rank 2 on host-b died");
    ck_assert_int_eq(fl_fail_ctx(FL_EPEER, "barrier %d", 7), FL_EPEER);
    ck_assert_str_eq(fl_last_error(), "barrier 7: rank 2 on host-b died");
    ck_assert_int_eq(fl_fail_ctx(FL_EPEER, "step %d", 5), FL_EPEER);
    ck_assert_str_eq(fl_last_error(), "step 5: barrier 7: rank 2 on host-b died");

    /* A long old text: the prefix survives, the whole stays terminated and bounded. */
    char big[1500];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    fl_fail(FL_EIO, "%s", big);
    fl_fail_ctx(FL_EIO, "op");
    const char *e = fl_last_error();
    ck_assert_msg(strncmp(e, "op: yyy", 7) == 0, "got '%.20s...'", e);
    ck_assert_uint_lt(strlen(e), sizeof big - 1);
}
END_TEST

/* A cleanup between keep_begin and keep_end fails on its own text and leaves the caller's: the
 * failure that made it clean up is the one reported. Nested keeps end at the outermost. */
START_TEST(test_error_kept_through_cleanup)
{
    fl_fail(FL_EPEER, "rank 1 died in allreduce #4");
    fl_error_keep_begin();
    ck_assert_int_eq(fl_fail(FL_EIO, "closing the socket: %s", "broken pipe"), FL_EIO);
    ck_assert_str_eq(fl_last_error(), "closing the socket: broken pipe");
    fl_fail_ctx(FL_EIO, "destroy");
    ck_assert_str_eq(fl_last_error(), "destroy: closing the socket: broken pipe");
    fl_error_keep_begin();
    fl_fail(FL_EGPU, "device sim:0: stream failed");
    fl_error_keep_end();
    ck_assert_str_eq(fl_last_error(), "device sim:0: stream failed");
    fl_error_keep_end();
    ck_assert_str_eq(fl_last_error(), "rank 1 died in allreduce #4");
    /* A keep starts with an empty text of its own, and an unmatched end changes nothing. */
    fl_error_keep_begin();
    ck_assert_str_eq(fl_last_error(), "");
    fl_error_keep_end();
    fl_error_keep_end();
    fl_fail(FL_EIO, "after");
    ck_assert_str_eq(fl_last_error(), "after");
}
END_TEST

typedef struct err_thread {
    pthread_barrier_t *bar;
    int id;
    int bad; /* iterations where the thread saw another text than its own */
} err_thread_t;

static void *err_worker(void *p)
{
    err_thread_t *t = p;
    char mine[64];
    for (int i = 0; i < 200; i++) {
        snprintf(mine, sizeof mine, "thread %d iteration %d", t->id, i);
        /* Thread 0 writes first, then thread 1; both read after both wrote. */
        if (t->id == 0)
            fl_fail(FL_EIO, "%s", mine);
        pthread_barrier_wait(t->bar);
        if (t->id == 1)
            fl_fail(FL_EPEER, "%s", mine);
        pthread_barrier_wait(t->bar);
        if (strcmp(fl_last_error(), mine) != 0)
            t->bad++;
        pthread_barrier_wait(t->bar);
    }
    return NULL;
}

START_TEST(test_error_text_per_thread)
{
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    err_thread_t t[2] = {{&bar, 0, 0}, {&bar, 1, 0}};
    pthread_t th[2];
    fl_fail(FL_EINVAL, "main thread text");
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, err_worker, &t[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    ck_assert_int_eq(t[0].bad, 0);
    ck_assert_int_eq(t[1].bad, 0);
    ck_assert_str_eq(fl_last_error(), "main thread text");
}
END_TEST

/* ---- clock ---- */

START_TEST(test_deadlines)
{
    ck_assert(fl_deadline_in(-1) == INT64_MAX);
    ck_assert(fl_deadline_in(-5000) == INT64_MAX);
    ck_assert_int_eq(fl_deadline_left_ms(INT64_MAX), INT32_MAX);
    ck_assert_int_eq(fl_deadline_left_ms(fl_deadline_in(-1)), INT32_MAX);
    /* Far but finite: clamped to INT32_MAX. */
    ck_assert_int_eq(fl_deadline_left_ms(fl_now_ms() + (int64_t)INT32_MAX * 4), INT32_MAX);

    int64_t now = fl_now_ms();
    ck_assert_int_eq(fl_deadline_left_ms(now - 1), 0);
    ck_assert_int_eq(fl_deadline_left_ms(now - 100000), 0);
    ck_assert_int_eq(fl_deadline_left_ms(0), 0);
    ck_assert_int_eq(fl_deadline_left_ms(fl_deadline_in(0)), 0);

    int64_t before = fl_now_ms();
    int64_t d = fl_deadline_in(1000);
    int64_t after = fl_now_ms();
    ck_assert(d >= before + 1000 && d <= after + 1000);
    int left = fl_deadline_left_ms(d);
    ck_assert_msg(left > 500 && left <= 1000, "left %d", left); /* slack for a loaded host */

    d = fl_deadline_in(30);
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    ck_assert_int_eq(fl_deadline_left_ms(d), 0);
}
END_TEST

START_TEST(test_clock_monotonic)
{
    int64_t prev = fl_now_ns();
    long backwards = 0;
    for (int i = 0; i < 200000; i++) {
        int64_t t = fl_now_ns();
        if (t < prev)
            backwards++;
        prev = t;
    }
    ck_assert_int_eq(backwards, 0);

    int64_t ms0 = fl_now_ms();
    int64_t ns0 = fl_now_ns();
    ck_assert_msg(ns0 / 1000000 - ms0 >= 0 && ns0 / 1000000 - ms0 <= 1, "ms %lld ns %lld",
                  (long long)ms0, (long long)ns0);
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
    int64_t ms1 = fl_now_ms();
    ck_assert_msg(ms1 - ms0 >= 20 && ms1 - ms0 < 2000, "slept 20 ms, clock moved %lld",
                  (long long)(ms1 - ms0));
}
END_TEST

/* ---- log levels, context, counters ---- */

START_TEST(test_log_level_parse)
{
    static const struct {
        const char *s;
        fl_log_level_t want;
    } ok[] = {
        {"debug", FL_LOG_DEBUG},  {"DEBUG", FL_LOG_DEBUG},  {"info", FL_LOG_INFO},
        {"Info", FL_LOG_INFO},    {"warn", FL_LOG_WARN},    {"WaRn", FL_LOG_WARN},
        {"warning", FL_LOG_WARN}, {"WARNING", FL_LOG_WARN}, {"error", FL_LOG_ERROR},
        {"ERROR", FL_LOG_ERROR},  {"off", FL_LOG_OFF},      {"Off", FL_LOG_OFF},
    };
    for (size_t i = 0; i < NELEM(ok); i++) {
        fl_log_level_t l = (fl_log_level_t)99;
        int rc = fl_log_level_parse(ok[i].s, &l);
        if (rc != FL_OK || l != ok[i].want)
            ck_abort_msg("'%s': rc %d level %d, expected %d", ok[i].s, rc, (int)l, (int)ok[i].want);
    }
    static const char *const bad[] = {"verbose", "", "warn ", "debugx", "4", "err"};
    for (size_t i = 0; i < NELEM(bad); i++) {
        fl_log_level_t l = FL_LOG_INFO;
        fl_error_clear();
        int rc = fl_log_level_parse(bad[i], &l);
        if (rc != FL_EINVAL || l != FL_LOG_INFO)
            ck_abort_msg("'%s': rc %d level %d", bad[i], rc, (int)l);
        char quoted[32];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        if (strstr(fl_last_error(), quoted) == NULL)
            ck_abort_msg("'%s': detail '%s' does not name the value", bad[i], fl_last_error());
    }
    fl_log_level_t l;
    ck_assert_int_eq(fl_log_level_parse(NULL, &l), FL_EINVAL);
    ck_assert_ptr_nonnull(strstr(fl_last_error(), "missing"));

    for (int i = FL_LOG_DEBUG; i <= FL_LOG_OFF; i++) {
        if (fl_log_level_parse(fl_log_level_name((fl_log_level_t)i), &l) != FL_OK || (int)l != i)
            ck_abort_msg("level %d does not round-trip through its name", i);
    }
    ck_assert_str_eq(fl_log_level_name(FL_LOG_WARN), "warn");
    ck_assert_str_eq(fl_log_level_name((fl_log_level_t)7), "unknown");
}
END_TEST

static void expect_ctx_refused(const fl_ctx_opts_t *o, const char *field)
{
    static char dummy;
    fl_ctx_t *c = (fl_ctx_t *)&dummy; /* any non-NULL value: create must reset it */
    fl_error_clear();
    int rc = fl_ctx_create(o, &c);
    ck_assert_msg(rc == FL_EINVAL, "%s: rc %d", field, rc);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(fl_last_error(), field) != NULL, "%s: detail '%s'", field,
                  fl_last_error());
}

START_TEST(test_ctx_validation)
{
    fl_ctx_opts_t o;
    fl_ctx_opts_init(&o);
    ck_assert_int_eq(o.log_level, FL_LOG_WARN);
    ck_assert_str_eq(o.log_name, "flodl");
    ck_assert_int_eq(o.io_threads, 1);
    ck_assert_uint_eq(o.max_msg_bytes, (size_t)256 << 20);
    ck_assert_uint_eq(o.max_frames, 16);

    o.io_threads = 0;
    expect_ctx_refused(&o, "io_threads");
    o.io_threads = 65;
    expect_ctx_refused(&o, "io_threads");
    o.io_threads = -3;
    expect_ctx_refused(&o, "io_threads");
    fl_ctx_opts_init(&o);
    o.max_msg_bytes = 1023;
    expect_ctx_refused(&o, "max_msg_bytes");
    o.max_msg_bytes = 0;
    expect_ctx_refused(&o, "max_msg_bytes");
    fl_ctx_opts_init(&o);
    o.max_frames = 0;
    expect_ctx_refused(&o, "max_frames");
    o.max_frames = 1025;
    expect_ctx_refused(&o, "max_frames");
    fl_ctx_opts_init(&o);
    ck_assert_uint_eq(o.held_max_bytes, (size_t)256 << 20);
    o.held_max_bytes = ((size_t)1 << 20) - 1;
    expect_ctx_refused(&o, "held_max_bytes");
    /* Set after creation (flodl-ps --held-max for the coordinator's context): the same rule. */
    fl_ctx_opts_init(&o);
    fl_ctx_t *held = NULL;
    ck_assert_int_eq(fl_ctx_create(&o, &held), FL_OK);
    ck_assert_int_eq(fl_ctx_set_held_max(held, ((size_t)1 << 20) - 1), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "held_max_bytes"), "detail '%s'", fl_last_error());
    ck_assert_uint_eq(fl_ctx_held_max(held), (uint64_t)256 << 20);
    ck_assert_int_eq(fl_ctx_set_held_max(held, (size_t)64 << 20), FL_OK);
    ck_assert_uint_eq(fl_ctx_held_max(held), (uint64_t)64 << 20);
    ck_assert_int_eq(fl_ctx_set_held_max(held, SIZE_MAX), FL_OK);
    ck_assert_uint_eq(fl_ctx_held_max(held), 0); /* none */
    fl_ctx_destroy(&held);
    fl_ctx_opts_init(&o);
    o.log_level = (fl_log_level_t)5;
    expect_ctx_refused(&o, "log_level");
    o.log_level = (fl_log_level_t)-1;
    expect_ctx_refused(&o, "log_level");

    /* The edges of each range are accepted. */
    fl_ctx_opts_init(&o);
    o.io_threads = 2;
    o.max_msg_bytes = 1024;
    o.max_frames = 1024;
    o.log_level = FL_LOG_OFF;
    o.log_name = NULL;
    fl_ctx_t *c = NULL;
    ck_assert_int_eq(fl_ctx_create(&o, &c), FL_OK);
    ck_assert_ptr_nonnull(c);
    ck_assert_ptr_nonnull(fl_ctx_zmq(c));
    ck_assert_uint_eq(fl_ctx_max_msg_bytes(c), 1024);
    ck_assert_uint_eq(fl_ctx_max_frames(c), 1024);
    ck_assert_int_eq(fl_ctx_log_level(c), FL_LOG_OFF);
    fl_ctx_set_log_level(c, FL_LOG_DEBUG);
    ck_assert_int_eq(fl_ctx_log_level(c), FL_LOG_DEBUG);
    fl_ctx_destroy(&c);
    ck_assert_ptr_null(c);
    fl_ctx_destroy(&c);
    fl_ctx_destroy(NULL);
}
END_TEST

#define COUNT_THREADS 4
#define COUNT_ITERS 200000

static void *count_worker(void *p)
{
    fl_ctx_t *c = p;
    for (int i = 0; i < COUNT_ITERS; i++) {
        fl_ctx_count(c, FL_STAT_MSGS_SENT, 1);
        fl_ctx_count(c, FL_STAT_BYTES_SENT, 3);
    }
    return NULL;
}

START_TEST(test_ctx_counters)
{
    fl_ctx_opts_t o;
    fl_ctx_opts_init(&o);
    fl_ctx_t *c = NULL;
    ck_assert_int_eq(fl_ctx_create(&o, &c), FL_OK);
    for (int s = 0; s < FL_STAT_COUNT; s++)
        ck_assert_uint_eq(fl_ctx_stat(c, (fl_stat_t)s), 0);

    pthread_t th[COUNT_THREADS];
    for (int i = 0; i < COUNT_THREADS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, count_worker, c), 0);
    for (int i = 0; i < COUNT_THREADS; i++)
        pthread_join(th[i], NULL);
    ck_assert_uint_eq(fl_ctx_stat(c, FL_STAT_MSGS_SENT), (uint64_t)COUNT_THREADS * COUNT_ITERS);
    ck_assert_uint_eq(fl_ctx_stat(c, FL_STAT_BYTES_SENT),
                      (uint64_t)COUNT_THREADS * COUNT_ITERS * 3);

    fl_ctx_count(c, FL_STAT_BAD_MAGIC, (uint64_t)1 << 40);
    fl_ctx_count(c, FL_STAT_BAD_MAGIC, 2);
    ck_assert_uint_eq(fl_ctx_stat(c, FL_STAT_BAD_MAGIC), ((uint64_t)1 << 40) + 2);
    /* Out-of-range counters and a NULL context are ignored, never written. */
    fl_ctx_count(c, FL_STAT_COUNT, 5);
    fl_ctx_count(NULL, FL_STAT_MSGS_RECV, 5);
    ck_assert_uint_eq(fl_ctx_stat(c, FL_STAT_COUNT), 0);
    ck_assert_uint_eq(fl_ctx_stat(NULL, FL_STAT_MSGS_SENT), 0);
    for (int s = 0; s < FL_STAT_COUNT; s++) {
        if (s == FL_STAT_MSGS_SENT || s == FL_STAT_BYTES_SENT || s == FL_STAT_BAD_MAGIC)
            continue;
        if (fl_ctx_stat(c, (fl_stat_t)s) != 0)
            ck_abort_msg("counter %s moved", fl_stat_name((fl_stat_t)s));
    }
    fl_ctx_destroy(&c);
}
END_TEST

START_TEST(test_stat_names)
{
    for (int s = 0; s < FL_STAT_COUNT; s++) {
        const char *n = fl_stat_name((fl_stat_t)s);
        if (n == NULL || n[0] == '\0' || strcmp(n, "unknown") == 0)
            ck_abort_msg("counter %d has no name", s);
        for (int t = 0; t < s; t++)
            if (strcmp(n, fl_stat_name((fl_stat_t)t)) == 0)
                ck_abort_msg("counters %d and %d share the name %s", s, t, n);
    }
    ck_assert_str_eq(fl_stat_name(FL_STAT_MSGS_SENT), "msgs_sent");
    ck_assert_str_eq(fl_stat_name(FL_STAT_ERRORS_SENT), "errors_sent");
    ck_assert_str_eq(fl_stat_name(FL_STAT_COUNT), "unknown");
    ck_assert_str_eq(fl_stat_name((fl_stat_t)1000), "unknown");
}
END_TEST

/* Runs fn with stderr redirected into a pipe and returns what it wrote. */
static void capture_stderr(void (*fn)(fl_ctx_t *), fl_ctx_t *c, char *out, size_t cap)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    dup2(fds[1], STDERR_FILENO);
    fn(c);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fds[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(fds[0]);
}

static void log_some(fl_ctx_t *c)
{
    FL_DEBUG(c, "not shown %d", 1);
    FL_INFO(c, "not shown %d", 2);
    FL_WARN(c, "peer %d is %s", 4, "slow");
    FL_ERROR(c, "gave up after %d ms", 250);
    fl_log(c, FL_LOG_OFF, "never shown");
}

START_TEST(test_log_lines)
{
    fl_ctx_opts_t o;
    fl_ctx_opts_init(&o);
    o.log_name = "rank 3 host-a";
    fl_ctx_t *c = NULL;
    ck_assert_int_eq(fl_ctx_create(&o, &c), FL_OK);
    char text[4096];
    capture_stderr(log_some, c, text, sizeof text);
    ck_assert_msg(strstr(text, "rank 3 host-a] warn: peer 4 is slow\n") != NULL, "%s", text);
    ck_assert_msg(strstr(text, "rank 3 host-a] error: gave up after 250 ms\n") != NULL, "%s", text);
    /* Wall-clock time, ISO 8601 UTC with milliseconds, so hosts' lines merge: the stamp is
     * within a second or two of now. */
    int y, mo, d, h, mi, sec, ms;
    char z = 0;
    ck_assert_msg(sscanf(text, "[%4d-%2d-%2dT%2d:%2d:%2d.%3d%c ", &y, &mo, &d, &h, &mi, &sec, &ms,
                         &z) == 8 &&
                      z == 'Z',
                  "not an ISO 8601 UTC stamp: %s", text);
    struct tm tm = {.tm_year = y - 1900,
                    .tm_mon = mo - 1,
                    .tm_mday = d,
                    .tm_hour = h,
                    .tm_min = mi,
                    .tm_sec = sec};
    time_t stamp = timegm(&tm);
    ck_assert_msg(labs((long)(time(NULL) - stamp)) <= 2, "stamp %s is not now", text);
    ck_assert_msg(strstr(text, "not shown") == NULL && strstr(text, "never") == NULL, "%s", text);
    fl_ctx_set_log_level(c, FL_LOG_DEBUG);
    fl_ctx_set_log_name(c, "ps");
    capture_stderr(log_some, c, text, sizeof text);
    ck_assert_msg(strstr(text, "ps] debug: not shown 1\n") != NULL, "%s", text);
    ck_assert_msg(strstr(text, "ps] info: not shown 2\n") != NULL, "%s", text);
    ck_assert_msg(strstr(text, "never") == NULL, "%s", text);
    fl_ctx_set_log_level(c, FL_LOG_OFF);
    capture_stderr(log_some, c, text, sizeof text);
    ck_assert_str_eq(text, "");
    capture_stderr(log_some, NULL, text, sizeof text);
    ck_assert_msg(strstr(text, "flodl] warn: peer 4 is slow\n") != NULL, "%s", text);
    ck_assert_msg(strstr(text, "not shown") == NULL, "%s", text);
    fl_ctx_destroy(&c);
}
END_TEST

Suite *core_ctx_suite(void);
Suite *core_ctx_suite(void)
{
    Suite *s = suite_create("core_ctx");
    TCase *t = tcase_create("errors");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_strerror);
    tcase_add_test(t, test_fail_sets_text);
    tcase_add_test(t, test_fail_ctx);
    tcase_add_test(t, test_error_kept_through_cleanup);
    tcase_add_test(t, test_error_text_per_thread);
    suite_add_tcase(s, t);

    t = tcase_create("clock");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_deadlines);
    tcase_add_test(t, test_clock_monotonic);
    suite_add_tcase(s, t);

    t = tcase_create("ctx");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_log_level_parse);
    tcase_add_test(t, test_ctx_validation);
    tcase_add_test(t, test_ctx_counters);
    tcase_add_test(t, test_stat_names);
    tcase_add_test(t, test_log_lines);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(core_ctx_suite());
}
