/* core: error codes and the per-thread detail text, clock and deadlines, log levels, the
 * context (validation, counters under contention, log lines), dtypes and operators, float16
 * (exhaustively, against GCC's _Float16) and bfloat16 (against an independent long double
 * reference), launcher-environment resolution from a table, and flag parsing. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---- errors ---- */

START_TEST(test_strerror)
{
    static const int codes[] = {FL_OK,       FL_EINVAL, FL_ENOMEM, FL_EIO,    FL_ETIMEDOUT,
                                FL_EPEER,    FL_EPROTO, FL_EGPU,   FL_ECLOSED, FL_ENONFINITE,
                                FL_ERESYNC};
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
        {"debug", FL_LOG_DEBUG}, {"DEBUG", FL_LOG_DEBUG}, {"info", FL_LOG_INFO},
        {"Info", FL_LOG_INFO},   {"warn", FL_LOG_WARN},   {"WaRn", FL_LOG_WARN},
        {"warning", FL_LOG_WARN}, {"WARNING", FL_LOG_WARN}, {"error", FL_LOG_ERROR},
        {"ERROR", FL_LOG_ERROR}, {"off", FL_LOG_OFF},     {"Off", FL_LOG_OFF},
    };
    for (size_t i = 0; i < NELEM(ok); i++) {
        fl_log_level_t l = (fl_log_level_t)99;
        int rc = fl_log_level_parse(ok[i].s, &l);
        if (rc != FL_OK || l != ok[i].want)
            ck_abort_msg("'%s': rc %d level %d, expected %d", ok[i].s, rc, (int)l,
                         (int)ok[i].want);
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
        if (fl_log_level_parse(fl_log_level_name((fl_log_level_t)i), &l) != FL_OK ||
            (int)l != i)
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
    ck_assert_msg(strstr(text, "rank 3 host-a] error: gave up after 250 ms\n") != NULL, "%s",
                  text);
    /* Wall-clock time, ISO 8601 UTC with milliseconds, so hosts' lines merge: the stamp is
     * within a second or two of now. */
    int y, mo, d, h, mi, sec, ms;
    char z = 0;
    ck_assert_msg(sscanf(text, "[%4d-%2d-%2dT%2d:%2d:%2d.%3d%c ", &y, &mo, &d, &h, &mi, &sec, &ms,
                         &z) == 8 &&
                      z == 'Z',
                  "not an ISO 8601 UTC stamp: %s", text);
    struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h,
                    .tm_min = mi, .tm_sec = sec};
    time_t stamp = timegm(&tm);
    ck_assert_msg(labs((long)(time(NULL) - stamp)) <= 2, "stamp %s is not now", text);
    ck_assert_msg(strstr(text, "not shown") == NULL && strstr(text, "never") == NULL, "%s",
                  text);
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

/* ---- dtypes and operators ---- */

START_TEST(test_dtypes)
{
    static const struct {
        fl_dtype_t dt;
        size_t size;
        const char *name;
    } known[] = {
        {FL_FLOAT32, 4, "float32"}, {FL_FLOAT16, 2, "float16"}, {FL_BFLOAT16, 2, "bfloat16"},
        {FL_FLOAT64, 8, "float64"}, {FL_INT32, 4, "int32"},     {FL_UINT8, 1, "uint8"},
        {FL_INT64, 8, "int64"},
    };
    for (size_t i = 0; i < NELEM(known); i++) {
        fl_dtype_t back = (fl_dtype_t)0;
        if (fl_dtype_size(known[i].dt) != known[i].size ||
            strcmp(fl_dtype_name(known[i].dt), known[i].name) != 0 ||
            !fl_dtype_is_valid((int)known[i].dt) ||
            fl_dtype_parse(known[i].name, &back) != FL_OK || back != known[i].dt)
            ck_abort_msg("dtype %d (%s): size %zu name %s", (int)known[i].dt, known[i].name,
                         fl_dtype_size(known[i].dt), fl_dtype_name(known[i].dt));
    }
    static const int invalid[] = {0, 8, 9, -1, 100};
    for (size_t i = 0; i < NELEM(invalid); i++) {
        if (fl_dtype_size((fl_dtype_t)invalid[i]) != 0 || fl_dtype_is_valid(invalid[i]) ||
            strcmp(fl_dtype_name((fl_dtype_t)invalid[i]), "unknown") != 0)
            ck_abort_msg("dtype %d should be unknown", invalid[i]);
    }

    static const struct {
        const char *s;
        fl_dtype_t dt;
    } aliases[] = {
        {"f32", FL_FLOAT32},  {"FLOAT32", FL_FLOAT32}, {"float", FL_FLOAT32},
        {"f16", FL_FLOAT16},  {"half", FL_FLOAT16},    {"Half", FL_FLOAT16},
        {"bf16", FL_BFLOAT16}, {"BFloat16", FL_BFLOAT16}, {"f64", FL_FLOAT64},
        {"double", FL_FLOAT64}, {"INT32", FL_INT32},   {"int64", FL_INT64},
        {"UInt8", FL_UINT8},
    };
    for (size_t i = 0; i < NELEM(aliases); i++) {
        fl_dtype_t dt = (fl_dtype_t)0;
        if (fl_dtype_parse(aliases[i].s, &dt) != FL_OK || dt != aliases[i].dt)
            ck_abort_msg("'%s' parsed as %d", aliases[i].s, (int)dt);
    }
    static const char *const bad[] = {"float8", "", "f 32", "int16", "bfloat"};
    for (size_t i = 0; i < NELEM(bad); i++) {
        fl_dtype_t dt = FL_INT32;
        if (fl_dtype_parse(bad[i], &dt) != FL_EINVAL || dt != FL_INT32)
            ck_abort_msg("'%s' accepted", bad[i]);
        char quoted[32];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        if (strstr(fl_last_error(), quoted) == NULL)
            ck_abort_msg("'%s': detail '%s'", bad[i], fl_last_error());
    }
    fl_dtype_t dt;
    ck_assert_int_eq(fl_dtype_parse(NULL, &dt), FL_EINVAL);

    ck_assert_str_eq(fl_op_name(FL_SUM), "sum");
    ck_assert_str_eq(fl_op_name(FL_AVG), "avg");
    ck_assert_str_eq(fl_op_name(FL_MAX), "max");
    ck_assert_str_eq(fl_op_name(FL_MIN), "min");
    ck_assert_str_eq(fl_op_name((fl_op_t)0), "unknown");
    ck_assert_str_eq(fl_op_name((fl_op_t)5), "unknown");
}
END_TEST

/* ---- float16 against GCC's _Float16, bfloat16 against a long double reference ---- */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The reference conversions; volatile keeps GCC from folding them at compile time, so the
 * run-time conversion (libgcc or F16C) is what we compare with. */
static uint16_t ref_f32_to_f16(float f)
{
    volatile float v = f;
    _Float16 h = (_Float16)v;
    uint16_t b;
    memcpy(&b, &h, sizeof b);
    return b;
}

static float ref_f16_to_f32(uint16_t b)
{
    _Float16 h;
    memcpy(&h, &b, sizeof h);
    volatile _Float16 v = h;
    return (float)v;
}

static bool f16_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

START_TEST(test_f16_exhaustive_round_trip)
{
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = fl_f16_to_f32(h);
        float r = ref_f16_to_f32(h);
        uint16_t back = fl_f32_to_f16(f);
        if (f16_is_nan(h)) {
            /* Quieted (as IEEE conversions do) but still NaN, same sign, same payload. */
            if (!isnan(f) || !isnan(r) || !signbit(f) != !signbit(r))
                ck_abort_msg("half 0x%04x: float 0x%08x, GCC 0x%08x", h, f2u(f), f2u(r));
            if (!f16_is_nan(back) || (back | 0x200u) != (h | 0x200u))
                ck_abort_msg("NaN half 0x%04x came back as 0x%04x", h, back);
            if ((h & 0x200u) != 0 && back != h)
                ck_abort_msg("quiet NaN half 0x%04x came back as 0x%04x", h, back);
            continue;
        }
        if (f2u(f) != f2u(r))
            ck_abort_msg("half 0x%04x: float 0x%08x (%.9g), GCC 0x%08x (%.9g)", h, f2u(f),
                         (double)f, f2u(r), (double)r);
        if (back != h)
            ck_abort_msg("half 0x%04x -> %.9g -> 0x%04x", h, (double)f, back);
    }
}
END_TEST

static void check_f16(float f)
{
    uint16_t got = fl_f32_to_f16(f);
    uint16_t want = ref_f32_to_f16(f);
    if (got != want)
        ck_abort_msg("float 0x%08x (%.9g): half 0x%04x, GCC 0x%04x", f2u(f), (double)f, got,
                     want);
}

START_TEST(test_f16_special_cases)
{
    /* The reference itself, pinned to known encodings. */
    ck_assert_uint_eq(ref_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(ref_f32_to_f16(65520.0f), 0x7c00);
    ck_assert_uint_eq(ref_f32_to_f16(ldexpf(1.0f, -24)), 0x0001);

    static const struct {
        float f;
        uint16_t want;
    } known[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {65504.0f, 0x7bff},            /* largest finite */
        {65519.99f, 0x7bff},           /* just below the rounding threshold */
        {65520.0f, 0x7c00},            /* the threshold itself rounds to infinity */
        {-65520.0f, 0xfc00},
        {1e10f, 0x7c00},
        {FLT_MAX, 0x7c00},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
        {0x1p-24f, 0x0001},            /* smallest subnormal */
        {0x1p-25f, 0x0000},            /* tie between 0 and 2^-24: even is 0 */
        {-0x1p-25f, 0x8000},
        {0x1.000002p-25f, 0x0001},     /* just above the tie */
        {0x1.8p-24f, 0x0002},          /* 1.5 * 2^-24: tie, even is 2 */
        {0x1.4p-23f, 0x0002},          /* 2.5 * 2^-24: tie, even is 2 */
        {0x1.cp-23f, 0x0004},          /* 3.5 * 2^-24: tie, even is 4 */
        {0x1p-26f, 0x0000},
        {FLT_TRUE_MIN, 0x0000},
        {FLT_MIN, 0x0000},
        {0x1p-14f, 0x0400},            /* smallest normal */
        {0x1.ff8p-15f, 0x03ff},        /* largest subnormal, exact */
        {0x1.ffcp-15f, 0x0400},        /* largest subnormal tie rounds up into the normals */
        {0x1.002p0f, 0x3c00},          /* 1 + 2^-11: tie, even is 1 */
        {0x1.006p0f, 0x3c02},          /* 1 + 3 * 2^-11: tie, even is 1 + 2^-9 */
        {0x1.002002p0f, 0x3c01},       /* just above the tie */
        {2049.0f, 0x6800},             /* 2048 + 1: tie, even is 2048 */
        {2051.0f, 0x6802},             /* tie, even is 2052 */
    };
    for (size_t i = 0; i < NELEM(known); i++) {
        uint16_t got = fl_f32_to_f16(known[i].f);
        if (got != known[i].want)
            ck_abort_msg("case %zu: %a -> 0x%04x, expected 0x%04x", i, (double)known[i].f, got,
                         known[i].want);
        check_f16(known[i].f);
    }
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                                    0x7fffffffu, 0x7fa00000u, 0x7fc12345u, 0xffbfe000u};
    for (size_t i = 0; i < NELEM(nans); i++) {
        uint16_t got = fl_f32_to_f16(u2f(nans[i]));
        if (!f16_is_nan(got) || (got >> 15) != (nans[i] >> 31))
            ck_abort_msg("NaN 0x%08x -> 0x%04x", nans[i], got);
        check_f16(u2f(nans[i]));
    }
}
END_TEST

START_TEST(test_f16_rounding_boundaries)
{
    /* For every finite positive half h: the midpoint to the next half (a tie) and its float
     * neighbours, both signs. This visits every rounding decision the converter makes. */
    for (uint32_t h = 0; h < 0x7c00u; h++) {
        double lo = (double)ref_f16_to_f32((uint16_t)h);
        double hi = h + 1 < 0x7c00u ? (double)ref_f16_to_f32((uint16_t)(h + 1)) : 65536.0;
        float mid = (float)((lo + hi) / 2); /* exact: halves have 11 significant bits */
        float cands[] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY), (float)lo};
        for (size_t k = 0; k < NELEM(cands); k++) {
            check_f16(cands[k]);
            check_f16(-cands[k]);
        }
    }
}
END_TEST

START_TEST(test_f16_random)
{
    uint64_t s = 0x5eed1234;
    for (int i = 0; i < 2000000; i++) {
        uint32_t bits = (uint32_t)fl_test_rand(&s);
        if (i % 2 == 1) {
            /* Concentrate half the samples on exponents a half can represent or round to. */
            uint32_t e = 96u + (uint32_t)(fl_test_rand(&s) % 50u);
            bits = (bits & 0x807fffffu) | (e << 23);
        }
        check_f16(u2f(bits));
    }
}
END_TEST

/* Value of a non-negative bfloat16 pattern; 0x7f80 stands for 2^128, the value IEEE rounding
 * treats as the next step after the largest finite number. */
static long double bf16_value(uint32_t p)
{
    if (p == 0x7f80u)
        return ldexpl(1.0L, 128);
    int e = (int)(p >> 7);
    int m = (int)(p & 0x7fu);
    if (e == 0)
        return ldexpl((long double)m, -133);
    return ldexpl((long double)(m + 128), e - 134);
}

/* Round to nearest even by comparing distances, independent of the library's bit tricks. */
static uint16_t ref_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    long double x = fabsl((long double)f);
    if (isinf(f))
        return (uint16_t)(sign | 0x7f80u);
    uint32_t lo = (u & 0x7fffffffu) >> 16; /* truncation: the neighbour toward zero */
    if ((long double)bf16_value(lo) == x)
        return (uint16_t)(sign | lo);
    long double dlo = x - bf16_value(lo);
    long double dhi = bf16_value(lo + 1) - x;
    uint32_t r;
    if (dlo < dhi)
        r = lo;
    else if (dhi < dlo)
        r = lo + 1;
    else
        r = (lo & 1u) ? lo + 1 : lo;
    return (uint16_t)(sign | r);
}

static void check_bf16(float f)
{
    uint16_t got = fl_f32_to_bf16(f);
    if (isnan(f)) {
        if ((got & 0x7f80u) != 0x7f80u || (got & 0x7fu) == 0 || (got >> 15) != (f2u(f) >> 31))
            ck_abort_msg("NaN 0x%08x -> bf16 0x%04x", f2u(f), got);
        return;
    }
    uint16_t want = ref_f32_to_bf16(f);
    if (got != want)
        ck_abort_msg("float 0x%08x (%a): bf16 0x%04x, expected 0x%04x", f2u(f), (double)f, got,
                     want);
}

START_TEST(test_bf16)
{
    static const struct {
        float f;
        uint16_t want;
    } known[] = {
        {0.0f, 0x0000},          {-0.0f, 0x8000},      {1.0f, 0x3f80},
        {0x1.01p0f, 0x3f80},     /* 1 + 2^-8: tie, even is 1 */
        {0x1.03p0f, 0x3f82},     /* 1 + 3 * 2^-8: tie, even is 1 + 2^-6 */
        {0x1.010002p0f, 0x3f81}, {INFINITY, 0x7f80},   {-INFINITY, 0xff80},
        {FLT_MAX, 0x7f80},       /* rounds past the largest finite bf16 */
        {0x1.fep127f, 0x7f7f},   /* largest finite bf16 */
        {0x1.ff00p127f, 0x7f80}, /* tie between it and "2^128": even is infinity */
        {FLT_TRUE_MIN, 0x0000},  {0x1p-133f, 0x0001}, /* smallest bf16 subnormal */
    };
    for (size_t i = 0; i < NELEM(known); i++) {
        uint16_t got = fl_f32_to_bf16(known[i].f);
        uint16_t ref = ref_f32_to_bf16(known[i].f);
        if (got != known[i].want || ref != known[i].want)
            ck_abort_msg("case %zu: %a -> 0x%04x (reference 0x%04x), expected 0x%04x", i,
                         (double)known[i].f, got, ref, known[i].want);
    }

    /* Every bfloat16 pattern comes back from float32 unchanged; NaNs stay NaN. */
    for (uint32_t p = 0; p < 65536; p++) {
        float f = fl_bf16_to_f32((uint16_t)p);
        if (f2u(f) != p << 16)
            ck_abort_msg("bf16 0x%04x -> float 0x%08x", p, f2u(f));
        check_bf16(f);
        uint16_t back = fl_f32_to_bf16(f);
        if (!isnan(f) && back != p)
            ck_abort_msg("bf16 0x%04x came back as 0x%04x", p, back);
    }
    /* Around every rounding decision: exact ties and their neighbours. */
    static const uint32_t lows[] = {0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
    for (uint32_t p = 0; p < 65536; p++)
        for (size_t k = 0; k < NELEM(lows); k++)
            check_bf16(u2f(p << 16 | lows[k]));
    /* NaNs whose payload sits only in the bits bfloat16 drops must not become infinity. */
    check_bf16(u2f(0x7f800001u));
    check_bf16(u2f(0xff80ffffu));
    ck_assert(isnan(fl_bf16_to_f32(fl_f32_to_bf16(NAN))));

    uint64_t s = 42;
    for (int i = 0; i < 1000000; i++)
        check_bf16(u2f((uint32_t)fl_test_rand(&s)));
}
END_TEST

/* ---- launcher environment ---- */

typedef struct env_var {
    const char *name;
    const char *value;
} env_var_t;

/* A table ends with a NULL name. */
static const char *table_get(const char *name, void *ud)
{
    for (const env_var_t *v = ud; v->name != NULL; v++)
        if (strcmp(v->name, name) == 0)
            return v->value;
    return NULL;
}

static int launch(const env_var_t *env, fl_launch_info_t *out)
{
    return fl_launch_from_env(table_get, (void *)env, out);
}

START_TEST(test_launch_nothing_set)
{
    const env_var_t env[] = {{"PATH", "/usr/bin"}, {NULL, NULL}};
    fl_launch_info_t li;
    memset(&li, 0x5a, sizeof li);
    ck_assert_int_eq(launch(env, &li), FL_OK);
    ck_assert_int_eq(li.rank, -1);
    ck_assert_int_eq(li.world_size, -1);
    ck_assert_str_eq(li.coordinator, "");
    ck_assert_str_eq(li.host, "");
    ck_assert_str_eq(li.job_id, "");
    ck_assert_int_eq(li.log_level, -1);
    ck_assert_int_eq(li.ipc, -1);
    ck_assert_ptr_null(li.rank_var);
    ck_assert_ptr_null(li.world_var);
}
END_TEST

START_TEST(test_launch_precedence)
{
    /* Rows are removed from the front one at a time: each run sees the next launcher. */
    const env_var_t ranks[] = {{"FLODL_RANK", "1"},
                               {"RANK", "2"},
                               {"OMPI_COMM_WORLD_RANK", "3"},
                               {"JOB_COMPLETION_INDEX", "4"},
                               {NULL, NULL}};
    for (int k = 0; k < 4; k++) {
        fl_launch_info_t li;
        ck_assert_int_eq(launch(&ranks[k], &li), FL_OK);
        if (li.rank != k + 1 || li.rank_var == NULL || strcmp(li.rank_var, ranks[k].name) != 0)
            ck_abort_msg("with %s first: rank %d from %s", ranks[k].name, li.rank,
                         li.rank_var ? li.rank_var : "NULL");
        ck_assert_int_eq(li.world_size, -1);
        ck_assert_ptr_null(li.world_var);
    }
    const env_var_t worlds[] = {{"FLODL_WORLD_SIZE", "8"},
                                {"WORLD_SIZE", "16"},
                                {"OMPI_COMM_WORLD_SIZE", "32"},
                                {NULL, NULL}};
    static const int want[] = {8, 16, 32};
    for (int k = 0; k < 3; k++) {
        fl_launch_info_t li;
        ck_assert_int_eq(launch(&worlds[k], &li), FL_OK);
        if (li.world_size != want[k] || li.world_var == NULL ||
            strcmp(li.world_var, worlds[k].name) != 0)
            ck_abort_msg("with %s first: world %d from %s", worlds[k].name, li.world_size,
                         li.world_var ? li.world_var : "NULL");
        ck_assert_int_eq(li.rank, -1);
    }
    /* Order in the environment does not matter, only the precedence; an empty value is unset. */
    const env_var_t mixed[] = {{"JOB_COMPLETION_INDEX", "9"},
                               {"OMPI_COMM_WORLD_RANK", "7"},
                               {"RANK", ""},
                               {"OMPI_COMM_WORLD_SIZE", "12"},
                               {"WORLD_SIZE", "10"},
                               {"FLODL_WORLD_SIZE", ""},
                               {NULL, NULL}};
    fl_launch_info_t li;
    ck_assert_int_eq(launch(mixed, &li), FL_OK);
    ck_assert_int_eq(li.rank, 7);
    ck_assert_str_eq(li.rank_var, "OMPI_COMM_WORLD_RANK");
    ck_assert_int_eq(li.world_size, 10);
    ck_assert_str_eq(li.world_var, "WORLD_SIZE");
}
END_TEST

START_TEST(test_launch_coordinator_and_more)
{
    fl_launch_info_t li;
    const env_var_t own[] = {{"MASTER_ADDR", "10.0.0.1"},
                             {"MASTER_PORT", "1234"},
                             {"FLODL_COORDINATOR", "tcp://coord:5555"},
                             {NULL, NULL}};
    ck_assert_int_eq(launch(own, &li), FL_OK);
    ck_assert_str_eq(li.coordinator, "tcp://coord:5555");

    const env_var_t torch[] = {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}, {NULL, NULL}};
    ck_assert_int_eq(launch(torch, &li), FL_OK);
    ck_assert_str_eq(li.coordinator, "tcp://10.0.0.1:1234");

    const env_var_t noport[] = {{"MASTER_ADDR", "head-0.svc"}, {NULL, NULL}};
    ck_assert_int_eq(launch(noport, &li), FL_OK);
    ck_assert_str_eq(li.coordinator, "tcp://head-0.svc:29500");

    const env_var_t portonly[] = {{"MASTER_PORT", "1234"}, {NULL, NULL}};
    ck_assert_int_eq(launch(portonly, &li), FL_OK);
    ck_assert_str_eq(li.coordinator, "");

    const env_var_t rest[] = {{"FLODL_HOST", "node-17"},
                              {"FLODL_JOB_ID", "job-2024-x"},
                              {"FLODL_LOG", "DEBUG"},
                              {"FLODL_RANK", "0"},
                              {"WORLD_SIZE", "1"},
                              {NULL, NULL}};
    ck_assert_int_eq(launch(rest, &li), FL_OK);
    ck_assert_str_eq(li.host, "node-17");
    ck_assert_str_eq(li.job_id, "job-2024-x");
    ck_assert_int_eq(li.log_level, FL_LOG_DEBUG);
    ck_assert_int_eq(li.rank, 0);
    ck_assert_int_eq(li.world_size, 1);
    ck_assert_str_eq(li.coordinator, "");
}
END_TEST

START_TEST(test_launch_ipc)
{
    static const struct {
        const char *v;
        int rc, want;
    } cases[] = {{"0", FL_OK, 0}, {"1", FL_OK, 1}, {"", FL_OK, -1}, {"yes", FL_EINVAL, -1},
                 {"2", FL_EINVAL, -1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const env_var_t env[] = {{"FLODL_IPC", cases[i].v}, {NULL, NULL}};
        fl_launch_info_t li;
        int rc = launch(env, &li);
        ck_assert_msg(rc == cases[i].rc, "FLODL_IPC='%s': %d", cases[i].v, rc);
        if (rc == FL_OK)
            ck_assert_int_eq(li.ipc, cases[i].want);
        else
            ck_assert_ptr_nonnull(strstr(fl_last_error(), "FLODL_IPC"));
    }
}
END_TEST

START_TEST(test_launch_bad_values)
{
    static char long_job[FL_JOB_MAX + 1];
    static char long_host[FL_HOST_MAX + 1];
    static char long_coord[FL_ENDPOINT_MAX + 1];
    static char long_addr[FL_ENDPOINT_MAX];
    memset(long_job, 'j', FL_JOB_MAX);
    memset(long_host, 'h', FL_HOST_MAX);
    memset(long_coord, 'c', FL_ENDPOINT_MAX);
    memset(long_addr, 'a', FL_ENDPOINT_MAX - 1);
    static const struct {
        const char *var;
        const char *value;
        const char *other; /* a lower-precedence variable set to a good value, or NULL */
    } bad[] = {
        {"FLODL_RANK", "abc", "RANK"},
        {"RANK", "3x", "OMPI_COMM_WORLD_RANK"},
        {"RANK", "-1", NULL},
        {"OMPI_COMM_WORLD_RANK", "99999999999", NULL},
        {"JOB_COMPLETION_INDEX", "1.5", NULL},
        {"WORLD_SIZE", "0", "OMPI_COMM_WORLD_SIZE"},
        {"FLODL_WORLD_SIZE", "-4", NULL},
        {"OMPI_COMM_WORLD_SIZE", "four", NULL},
        {"MASTER_PORT", "70000", NULL},
        {"MASTER_PORT", "0", NULL},
        {"MASTER_PORT", "http", NULL},
        {"FLODL_LOG", "loud", NULL},
    };
    for (size_t i = 0; i < NELEM(bad); i++) {
        env_var_t env[4] = {{bad[i].var, bad[i].value}, {NULL, NULL}, {NULL, NULL}};
        size_t n = 1;
        if (bad[i].other != NULL)
            env[n++] = (env_var_t){bad[i].other, "2"};
        if (strcmp(bad[i].var, "MASTER_PORT") == 0)
            env[n++] = (env_var_t){"MASTER_ADDR", "10.0.0.1"};
        fl_launch_info_t li;
        fl_error_clear();
        int rc = launch(env, &li);
        if (rc != FL_EINVAL)
            ck_abort_msg("%s='%s': rc %d", bad[i].var, bad[i].value, rc);
        char named[64];
        snprintf(named, sizeof named, "%s='%s'", bad[i].var, bad[i].value);
        if (strstr(fl_last_error(), named) == NULL)
            ck_abort_msg("%s: detail '%s' does not name it", named, fl_last_error());
    }
    static const struct {
        const char *var;
        const char *value;
    } toolong[] = {
        {"FLODL_JOB_ID", long_job},
        {"FLODL_HOST", long_host},
        {"FLODL_COORDINATOR", long_coord},
        {"MASTER_ADDR", long_addr},
    };
    for (size_t i = 0; i < NELEM(toolong); i++) {
        env_var_t env[] = {{toolong[i].var, toolong[i].value}, {NULL, NULL}};
        fl_launch_info_t li;
        fl_error_clear();
        int rc = launch(env, &li);
        if (rc != FL_EINVAL || strstr(fl_last_error(), toolong[i].var) == NULL)
            ck_abort_msg("%s of %zu bytes: rc %d, detail '%s'", toolong[i].var,
                         strlen(toolong[i].value), rc, fl_last_error());
    }
    /* One byte shorter fits. */
    long_job[FL_JOB_MAX - 1] = '\0';
    env_var_t fits[] = {{"FLODL_JOB_ID", long_job}, {NULL, NULL}};
    fl_launch_info_t li;
    ck_assert_int_eq(launch(fits, &li), FL_OK);
    ck_assert_str_eq(li.job_id, long_job);
}
END_TEST

/* ---- flag values ---- */

START_TEST(test_cli_long)
{
    long v = -7;
    ck_assert_int_eq(fl_cli_long("--rank", "5", 0, 10, &v), FL_OK);
    ck_assert_int_eq(v, 5);
    ck_assert_int_eq(fl_cli_long("--rank", "0", 0, 10, &v), FL_OK);
    ck_assert_int_eq(v, 0);
    ck_assert_int_eq(fl_cli_long("--rank", "10", 0, 10, &v), FL_OK);
    ck_assert_int_eq(v, 10);
    ck_assert_int_eq(fl_cli_long("--delta", "-42", -100, 100, &v), FL_OK);
    ck_assert_int_eq(v, -42);

    static const struct {
        const char *val;
        const char *says; /* besides the flag */
    } bad[] = {
        {"11", "11"},           {"-1", "-1"},     {"abc", "'abc'"},
        {"5x", "'5x'"},         {"", "missing"},  {"99999999999999999999999", "not an integer"},
        {"0x10", "'0x10'"},     {"1e3", "'1e3'"},
    };
    for (size_t i = 0; i < NELEM(bad); i++) {
        v = -7;
        fl_error_clear();
        int rc = fl_cli_long("--world-size", bad[i].val, 0, 10, &v);
        if (rc != FL_EINVAL || v != -7)
            ck_abort_msg("'%s': rc %d value %ld", bad[i].val, rc, v);
        const char *e = fl_last_error();
        if (strstr(e, "--world-size") == NULL || strstr(e, bad[i].says) == NULL)
            ck_abort_msg("'%s': detail '%s'", bad[i].val, e);
    }
    ck_assert_int_eq(fl_cli_long("--timeout", NULL, 0, 10, &v), FL_EINVAL);
    ck_assert_ptr_nonnull(strstr(fl_last_error(), "--timeout"));
}
END_TEST

START_TEST(test_cli_size)
{
    static const struct {
        const char *val;
        size_t want;
    } ok[] = {
        {"4096", 4096},
        {"0", 0},
        {"4K", 4096},
        {"4k", 4096},
        {"4KiB", 4096},
        {"4kb", 4096},
        {"64M", (size_t)64 << 20},
        {"2MB", (size_t)2 << 20},
        {"1G", (size_t)1 << 30},
        {"1GiB", (size_t)1 << 30},
        {"3g", (size_t)3 << 30},
    };
    for (size_t i = 0; i < NELEM(ok); i++) {
        size_t v = 1;
        int rc = fl_cli_size("--segment", ok[i].val, 0, SIZE_MAX, &v);
        if (rc != FL_OK || v != ok[i].want)
            ck_abort_msg("'%s': rc %d value %zu, expected %zu (%s)", ok[i].val, rc, v,
                         ok[i].want, fl_last_error());
    }
    static const struct {
        const char *val;
        const char *says; /* besides the flag */
    } bad[] = {
        {"4X", "suffix"},
        {"4T", "suffix"},
        {"4KQ", "'4KQ'"},
        {"4KiBs", "'4KiBs'"},
        {"4 K", "'4 K'"},
        {"K", "'K'"},
        {"-1", "negative"},
        {"-4K", "negative"},
        {"", "missing"},
        {"18446744073709551616", "'18446744073709551616'"}, /* 2^64 */
        {"17179869184G", "too large"},                      /* 2^64 bytes */
        {" -1", "' -1'"}, /* strtoull would wrap this to SIZE_MAX */
    };
    for (size_t i = 0; i < NELEM(bad); i++) {
        size_t v = 7;
        fl_error_clear();
        int rc = fl_cli_size("--segment", bad[i].val, 0, SIZE_MAX, &v);
        if (rc != FL_EINVAL || v != 7)
            ck_abort_msg("'%s': rc %d value %zu", bad[i].val, rc, v);
        const char *e = fl_last_error();
        if (strstr(e, "--segment") == NULL || strstr(e, bad[i].says) == NULL)
            ck_abort_msg("'%s': detail '%s'", bad[i].val, e);
    }
    /* Range: bounds are inclusive, and the detail names the flag and the bytes. */
    size_t v = 7;
    ck_assert_int_eq(fl_cli_size("--segment", "1K", 1024, 4096, &v), FL_OK);
    ck_assert_uint_eq(v, 1024);
    ck_assert_int_eq(fl_cli_size("--segment", "4K", 1024, 4096, &v), FL_OK);
    ck_assert_uint_eq(v, 4096);
    v = 7;
    ck_assert_int_eq(fl_cli_size("--segment", "1023", 1024, 4096, &v), FL_EINVAL);
    ck_assert_uint_eq(v, 7);
    ck_assert_msg(strstr(fl_last_error(), "--segment") && strstr(fl_last_error(), "1023"), "%s",
                  fl_last_error());
    ck_assert_int_eq(fl_cli_size("--max-msg", "5K", 1024, 4096, &v), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "--max-msg") && strstr(fl_last_error(), "5120"), "%s",
                  fl_last_error());
    ck_assert_int_eq(fl_cli_size("--max-msg", NULL, 0, 10, &v), FL_EINVAL);
    ck_assert_ptr_nonnull(strstr(fl_last_error(), "--max-msg"));
}
END_TEST

/* Model shapes: the text and its signature, the wire's cut to whole lines, and the line
 * naming the first difference (a shape, a name, a shorter model, beyond the cut). */
START_TEST(test_model_shapes)
{
    fl_model_shapes_t m;
    fl_model_shapes_init(&m);
    ck_assert_str_eq(fl_model_shapes_text(&m), "");
    const uint64_t w[2] = {256, 64}, b[1] = {256};
    ck_assert_int_eq(fl_model_shapes_add(&m, "layers.0.weight", 2, w), FL_OK);
    ck_assert_int_eq(fl_model_shapes_add(&m, "layers.0.bias", 1, b), FL_OK);
    ck_assert_int_eq(fl_model_shapes_add(&m, "scale", 0, NULL), FL_OK);
    const char *text = "layers.0.weight[256,64];layers.0.bias[256];scale[];";
    ck_assert_str_eq(fl_model_shapes_text(&m), text);
    ck_assert_uint_eq(m.ntensors, 3);
    uint64_t sig = fl_model_shapes_signature(text);
    ck_assert(sig != 0);
    ck_assert(sig != fl_model_shapes_signature("layers.0.weight[64,256];layers.0.bias[256];"
                                               "scale[];"));

    char cut[32];
    fl_model_shapes_cut(text, cut, sizeof cut);
    ck_assert_str_eq(cut, "layers.0.weight[256,64];...;");
    char whole[128];
    fl_model_shapes_cut(text, whole, sizeof whole);
    ck_assert_str_eq(whole, text);

    char why[256];
    fl_model_shapes_diff(text, "on A", "layers.0.weight[64,256];layers.0.bias[256];", "in B",
                         why, sizeof why);
    ck_assert_str_eq(why, "tensor 'layers.0.weight' is [256,64] on A, [64,256] in B");
    fl_model_shapes_diff(text, "on A", "layers.0.weight[256,64];layers.1.bias[256];", "in B",
                         why, sizeof why);
    ck_assert_str_eq(why, "tensor 1 is 'layers.0.bias' [256] on A, 'layers.1.bias' [256] in B");
    fl_model_shapes_diff(text, "on A", "layers.0.weight[256,64];layers.0.bias[256];", "in B",
                         why, sizeof why);
    ck_assert_str_eq(why, "2 tensors in B, more on A (the next is 'scale' [])");
    fl_model_shapes_diff(text, "on A", cut, "in B", why, sizeof why);
    ck_assert_msg(strstr(why, "first 1 tensors agree") != NULL, "%s", why);
    fl_model_shapes_deinit(&m);
    fl_model_shapes_deinit(NULL);
}
END_TEST

START_TEST(test_fmt_bytes)
{
    static const struct {
        size_t n;
        const char *want;
    } cases[] = {
        {0, "0 B"},
        {1, "1 B"},
        {1000, "1000 B"},
        {1023, "1023 B"},
        {1024, "1 KiB"},
        {1536, "1536 B"},
        {4096, "4 KiB"},
        {(size_t)1 << 20, "1 MiB"},
        {(size_t)64 << 20, "64 MiB"},
        {((size_t)1 << 20) + 1024, "1025 KiB"},
        {(size_t)1 << 30, "1 GiB"},
        {(size_t)3 << 30, "3 GiB"},
        {((size_t)1 << 30) + ((size_t)1 << 20), "1025 MiB"},
        {(size_t)1 << 40, "1024 GiB"},
    };
    char buf[64];
    for (size_t i = 0; i < NELEM(cases); i++) {
        fl_fmt_bytes(cases[i].n, buf, sizeof buf);
        if (strcmp(buf, cases[i].want) != 0)
            ck_abort_msg("%zu: '%s', expected '%s'", cases[i].n, buf, cases[i].want);
    }
    /* A small buffer is truncated, terminated, and nothing past cap is written. */
    char small[8];
    memset(small, '#', sizeof small);
    fl_fmt_bytes(123456789, small, 4);
    ck_assert_str_eq(small, "123");
    ck_assert_int_eq(small[4], '#');
}
END_TEST

/* ---- settings every rank must share ---- */

START_TEST(test_settings_build_and_compare)
{
    char a[FL_SETTINGS_MAX] = "";
    char b[FL_SETTINGS_MAX] = "";
    ck_assert_int_eq(fl_settings_add(a, sizeof a, "lr", "%g", 0.05), FL_OK);
    ck_assert_int_eq(fl_settings_add(a, sizeof a, "data", "%s", "x;y\nz"), FL_OK);
    ck_assert_str_eq(a, "lr=0.05;data=x,y z"); /* a value keeps its words, not separators */
    ck_assert_int_eq(fl_settings_check(a, sizeof a), FL_OK);
    ck_assert_int_eq(fl_settings_add(b, sizeof b, "data", "%s", "x;y\nz"), FL_OK);
    ck_assert_int_eq(fl_settings_add(b, sizeof b, "lr", "%g", 0.05), FL_OK);
    char name[64], va[128], vb[128];
    ck_assert(!fl_settings_differ(a, b, name, sizeof name, va, vb, sizeof va)); /* any order */
    ck_assert(!fl_settings_differ("", "", name, sizeof name, va, vb, sizeof va));

    ck_assert(fl_settings_differ("lr=0.05;seed=1", "lr=0.1;seed=1", name, sizeof name, va, vb,
                                 sizeof va));
    ck_assert_str_eq(name, "lr");
    ck_assert_str_eq(va, "0.05");
    ck_assert_str_eq(vb, "0.1");
    /* A name only one side has: "(not set)" on the other, whichever side it is. */
    ck_assert(fl_settings_differ("lr=1", "lr=1;topk=0.01", name, sizeof name, va, vb, sizeof va));
    ck_assert_str_eq(name, "topk");
    ck_assert_str_eq(va, "(not set)");
    ck_assert_str_eq(vb, "0.01");
    ck_assert(fl_settings_differ("lr=1;topk=0", "lr=1", name, sizeof name, va, vb, sizeof va));
    ck_assert_str_eq(name, "topk");
    ck_assert_str_eq(va, "0");
    ck_assert_str_eq(vb, "(not set)");
    /* A prefix of a name is another name; an empty value is a value. */
    ck_assert(fl_settings_differ("l=1", "lr=1", name, sizeof name, va, vb, sizeof va));
    ck_assert_str_eq(name, "l");
    ck_assert(fl_settings_differ("lr=", "lr=0", name, sizeof name, va, vb, sizeof va));
    ck_assert_str_eq(va, "");
}
END_TEST

START_TEST(test_settings_refusals)
{
    char small[16] = "";
    ck_assert_int_eq(fl_settings_add(small, sizeof small, "lr", "%g", 0.5), FL_OK);
    ck_assert_int_eq(fl_settings_add(small, sizeof small, "momentum", "%g", 0.9), FL_EINVAL);
    ck_assert_str_eq(small, "lr=0.5"); /* unchanged by the refusal */
    ck_assert_ptr_nonnull(strstr(fl_last_error(), "'momentum' does not fit"));
    ck_assert_int_eq(fl_settings_add(small, sizeof small, "Lr", "1"), FL_EINVAL);
    ck_assert_int_eq(fl_settings_add(small, sizeof small, "", "1"), FL_EINVAL);
    static const char *const bad[] = {"lr", "=1", "lr=1;", "lr=1;;x=2", "LR=1", "lr=a\tb",
                                      "lr=1;x y=2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(fl_settings_check(bad[i], FL_SETTINGS_MAX) == FL_EINVAL, "'%s' accepted",
                      bad[i]);
    ck_assert_int_eq(fl_settings_check("lr=1", 4), FL_EINVAL);
    ck_assert_int_eq(fl_settings_check("lr=1", 5), FL_OK);
}
END_TEST

/* ---- rate-limited warnings ---- */

START_TEST(test_ratelimit)
{
    fl_ratelimit_t r;
    fl_ratelimit_init(&r, 3, 1000);
    uint64_t held = 99;
    int passed = 0;
    for (int i = 0; i < 100; i++) {
        passed += fl_ratelimit_allow(&r, 5000 + i, &held);
        ck_assert_uint_eq(held, 0); /* the window is still open */
    }
    ck_assert_int_eq(passed, 3);
    ck_assert_uint_eq(fl_ratelimit_flush(&r, 5999), 0);  /* not over yet */
    ck_assert_uint_eq(fl_ratelimit_flush(&r, 6000), 97); /* over: the summary's count, once */
    ck_assert_uint_eq(fl_ratelimit_flush(&r, 9000), 0);
    /* A new window: the first lines pass again; a line arriving after it ended hands back the
     * count held in it. */
    ck_assert(fl_ratelimit_allow(&r, 10000, &held));
    for (int i = 0; i < 5; i++)
        fl_ratelimit_allow(&r, 10001, &held);
    ck_assert(fl_ratelimit_allow(&r, 11500, &held));
    ck_assert_uint_eq(held, 3);
}
END_TEST

/* ---- untrusted text ---- */

START_TEST(test_text_scan)
{
    static const struct {
        const char *s;
        size_t len;
        size_t at; /* == len: accepted */
        const char *why;
    } cases[] = {
        {"", 0, 0, NULL},
        {"gpu-node-05.cluster.local", 25, 25, NULL},
        {"n\xc5\x93ud-\xc3\xbc-\xe6\x97\xa5\xe6\x9c\xac-\xf0\x9f\x98\x80", 20, 20, NULL},
        {"\xef\xbf\xbf\xf4\x8f\xbf\xbf", 7, 7, NULL},           /* U+FFFF, U+10FFFF */
        {"flodl\0evil", 10, 5, "a NUL byte"},
        {"host\nforged", 11, 4, "a control character"},
        {"a\tb", 3, 1, "a control character"},
        {"a\rb", 3, 1, "a control character"},
        {"del\x7f", 4, 3, "a control character"},
        {"csi\xc2\x9b" "2J", 7, 3, "a control character"},    /* U+009B */
        {"nbsp\xc2\xa0ok", 8, 8, NULL},                        /* U+00A0 is printable */
        {"bad\xff", 4, 3, "bytes that are not UTF-8"},
        {"cont\x80", 5, 4, "bytes that are not UTF-8"},
        {"over\xc0\xaf", 6, 4, "bytes that are not UTF-8"},     /* overlong '/' */
        {"over\xe0\x80\xaf", 7, 4, "bytes that are not UTF-8"}, /* overlong, 3 bytes */
        {"sur\xed\xa0\x80", 6, 3, "bytes that are not UTF-8"},  /* U+D800 */
        {"big\xf4\x90\x80\x80", 7, 3, "bytes that are not UTF-8"}, /* U+110000 */
        {"cut\xe6\x97", 5, 3, "bytes that are not UTF-8"},      /* sequence cut short */
        {"\xe6\x97" "x", 3, 0, "bytes that are not UTF-8"},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        const char *why = "unset";
        size_t at = fl_text_scan(cases[i].s, cases[i].len, &why);
        if (at != cases[i].at || (why == NULL) != (cases[i].why == NULL) ||
            (why != NULL && strcmp(why, cases[i].why) != 0))
            ck_abort_msg("case %zu: offset %zu (%s), expected %zu (%s)", i, at,
                         why ? why : "fine", cases[i].at, cases[i].why ? cases[i].why : "fine");
    }
    ck_assert_uint_eq(fl_text_scan("abc", 3, NULL), 3);
}
END_TEST

START_TEST(test_text_escape)
{
    static const struct {
        const char *in;
        const char *out;
    } cases[] = {
        {"", ""},
        {"plain host-1.example", "plain host-1.example"},
        {"100% \\ back", "100% \\ back"},
        {"n\xc5\x93ud \xe6\x97\xa5", "n\xc5\x93ud \xe6\x97\xa5"},
        {"a\nb\r\tc", "a\\nb\\r\\tc"},
        {"esc\x1b[2J", "esc\\x1b[2J"},
        {"del\x7f", "del\\x7f"},
        {"csi\xc2\x9b", "csi\\xc2\\x9b"},
        {"bad\xff\xfe!", "bad\\xff\\xfe!"},
        {"sur\xed\xa0\x80", "sur\\xed\\xa0\\x80"},
        {"cut\xe6\x97", "cut\\xe6\\x97"},
    };
    char out[64];
    for (size_t i = 0; i < NELEM(cases); i++) {
        const char *r = fl_text_escape(cases[i].in, out, sizeof out);
        ck_assert_ptr_eq(r, out);
        if (strcmp(out, cases[i].out) != 0)
            ck_abort_msg("case %zu: '%s', expected '%s'", i, out, cases[i].out);
        ck_assert_uint_eq(fl_text_scan(out, strlen(out), NULL), strlen(out));
    }
    /* Cut to fit, never inside a character or an escape. */
    char small[6];
    fl_text_escape("ab\xe6\x97\xa5z", small, sizeof small);
    ck_assert_str_eq(small, "ab\xe6\x97\xa5");
    fl_text_escape("abc\xe6\x97\xa5", small, sizeof small);
    ck_assert_str_eq(small, "abc");
    fl_text_escape("ab\n", small, 4);
    ck_assert_str_eq(small, "ab");
    fl_text_escape("a\xff", small, 5);
    ck_assert_str_eq(small, "a");
    fl_text_escape("a\xff", small, 6);
    ck_assert_str_eq(small, "a\\xff");
    small[0] = 'x';
    fl_text_escape("abc", small, 1);
    ck_assert_str_eq(small, "");
    /* Any bytes at all come out as one line of wire text. */
    uint64_t seed = 7;
    for (int round = 0; round < 2000; round++) {
        char in[48];
        char esc[200];
        size_t n = (size_t)(fl_test_rand(&seed) % (sizeof in - 1));
        for (size_t k = 0; k < n; k++)
            in[k] = (char)(1 + fl_test_rand(&seed) % 255);
        in[n] = '\0';
        fl_text_escape(in, esc, sizeof esc);
        if (fl_text_scan(esc, strlen(esc), NULL) != strlen(esc))
            ck_abort_msg("round %d: escaped text breaks the rule", round);
        if (fl_text_scan(in, n, NULL) == n && strcmp(in, esc) != 0)
            ck_abort_msg("round %d: clean text changed", round);
    }
}
END_TEST

START_TEST(test_text_cut)
{
    ck_assert_uint_eq(fl_text_cut("abc", 10), 3);
    ck_assert_uint_eq(fl_text_cut("abc", 3), 3);
    ck_assert_uint_eq(fl_text_cut("abcd", 3), 3);
    ck_assert_uint_eq(fl_text_cut("ab\xc3\xa9", 3), 2);         /* 2-byte char split */
    ck_assert_uint_eq(fl_text_cut("ab\xc3\xa9", 4), 4);
    ck_assert_uint_eq(fl_text_cut("a\xf0\x9f\x98\x80z", 2), 1); /* 4-byte char, each cut */
    ck_assert_uint_eq(fl_text_cut("a\xf0\x9f\x98\x80z", 3), 1);
    ck_assert_uint_eq(fl_text_cut("a\xf0\x9f\x98\x80z", 4), 1);
    ck_assert_uint_eq(fl_text_cut("a\xf0\x9f\x98\x80z", 5), 5);
    ck_assert_uint_eq(fl_text_cut("\x80\x80\x80\x80\x80", 4), 4); /* not UTF-8: plain cut */
}
END_TEST

Suite *core_suite(void);
Suite *core_suite(void)
{
    Suite *s = suite_create("core");
    TCase *t = tcase_create("errors");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_strerror);
    tcase_add_test(t, test_fail_sets_text);
    tcase_add_test(t, test_fail_ctx);
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

    t = tcase_create("dtype");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_dtypes);
    tcase_add_test(t, test_f16_exhaustive_round_trip);
    tcase_add_test(t, test_f16_special_cases);
    tcase_add_test(t, test_f16_rounding_boundaries);
    tcase_add_test(t, test_f16_random);
    tcase_add_test(t, test_bf16);
    suite_add_tcase(s, t);

    t = tcase_create("launch_env");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_launch_nothing_set);
    tcase_add_test(t, test_launch_precedence);
    tcase_add_test(t, test_launch_coordinator_and_more);
    tcase_add_test(t, test_launch_bad_values);
    tcase_add_test(t, test_launch_ipc);
    suite_add_tcase(s, t);

    t = tcase_create("cli");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_cli_long);
    tcase_add_test(t, test_cli_size);
    tcase_add_test(t, test_fmt_bytes);
    tcase_add_test(t, test_settings_build_and_compare);
    tcase_add_test(t, test_settings_refusals);
    tcase_add_test(t, test_ratelimit);
    suite_add_tcase(s, t);

    t = tcase_create("text");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_text_scan);
    tcase_add_test(t, test_text_escape);
    tcase_add_test(t, test_text_cut);
    tcase_add_test(t, test_model_shapes);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(core_suite());
}
