/* Collectives called wrongly: mismatched calls across ranks (order, count, root, dtype) and
 * argument errors, each with its code and its text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collutil.h"

/* ---- mismatched calls ---- */

typedef enum mm_kind {
    MM_ORDER,      /* rank 0 broadcasts while the others allreduce */
    MM_COUNT,      /* rank 0 allreduces 1235 elements, the others 1234 (recursive doubling) */
    MM_COUNT_RING, /* the same with 100001 against 100000 (ring) */
    MM_ROOT,       /* rank 2 broadcasts from root 1, the others from root 0 */
    MM_DTYPE_INT,  /* rank 0 allreduces int32, the others float32 */
    MM_DTYPE_HALF, /* rank 0 allreduces float16, the others float32 */
    MM_BARRIER,    /* rank 0 enters a barrier while the others allreduce */
} mm_kind_t;

typedef struct mm_arg {
    mm_kind_t kind;
    int rc[MAX_WORLD];
    char text[MAX_WORLD][1024];
    int rc2[MAX_WORLD];
    char text2[MAX_WORLD][1024];
} mm_arg_t;

static int mm_rank(fl_comm_t *comm, void *arg)
{
    mm_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    float *buf = calloc(100001, sizeof *buf);
    if (buf == NULL)
        return bad("out of memory");
    int rc = FL_OK;
    switch (a->kind) {
    case MM_ORDER:
        rc = r == 0 ? fl_broadcast(comm, buf, 1000, FL_FLOAT32, 0)
                    : fl_allreduce(comm, buf, buf, 1000, FL_FLOAT32, FL_SUM);
        break;
    case MM_COUNT:
        rc = fl_allreduce(comm, buf, buf, r == 0 ? 1235 : 1234, FL_FLOAT32, FL_SUM);
        break;
    case MM_COUNT_RING:
        rc = fl_allreduce(comm, buf, buf, r == 0 ? 100001 : 100000, FL_FLOAT32, FL_SUM);
        break;
    case MM_ROOT: rc = fl_broadcast(comm, buf, 1000, FL_FLOAT32, r == 2 ? 1 : 0); break;
    case MM_DTYPE_INT:
        rc = fl_allreduce(comm, buf, buf, 1000, r == 0 ? FL_INT32 : FL_FLOAT32, FL_SUM);
        break;
    case MM_DTYPE_HALF:
        rc = fl_allreduce(comm, buf, buf, 1000, r == 0 ? FL_FLOAT16 : FL_FLOAT32, FL_SUM);
        break;
    case MM_BARRIER:
        rc = r == 0 ? fl_barrier(comm) : fl_allreduce(comm, buf, buf, 100, FL_FLOAT32, FL_SUM);
        break;
    }
    a->rc[r] = rc;
    snprintf(a->text[r], sizeof a->text[r], "%s", rc == FL_OK ? "" : fl_last_error());
    if (rc != FL_OK) {
        /* The failure broke the communicator: the next call must say so at once. */
        a->rc2[r] = fl_barrier(comm);
        snprintf(a->text2[r], sizeof a->text2[r], "%s", fl_last_error());
    }
    free(buf);
    return FL_OK;
}

/* Runs a mismatch on world ranks with 1 s deadlines: every rank returns, none with anything but
 * OK / EPROTO / ETIMEDOUT / EPEER; some rank reports EPROTO with all of `must` in its text;
 * every failed rank's next call returns FL_ECLOSED with the original cause. */
static void mm_run(int world, mm_kind_t kind, const char *const *must)
{
    mm_arg_t *a = calloc(1, sizeof *a);
    ck_assert(a != NULL);
    a->kind = kind;
    fl_comm_opts_t o;
    opts_base(&o);
    o.timeout_ms = 1000;
    o.log_level = FL_LOG_OFF;
    int64_t t0 = fl_now_ms();
    run_world(world, &o, mm_rank, a);
    int64_t took = fl_now_ms() - t0;
    char all[2048] = "";
    size_t len = 0;
    int found = -1;
    for (int r = 0; r < world; r++) {
        len += (size_t)snprintf(all + len, len < sizeof all ? sizeof all - len : 0,
                                " [rank %d: %s: %.200s]", r, fl_strerror(a->rc[r]), a->text[r]);
        if (len >= sizeof all)
            len = sizeof all - 1;
        int rc = a->rc[r];
        if (rc != FL_OK && rc != FL_EPROTO && rc != FL_ETIMEDOUT && rc != FL_EPEER)
            ck_abort_msg("mismatch %d, %d ranks: rank %d returned %d (%s): %s", kind, world, r, rc,
                         fl_strerror(rc), a->text[r]);
        bool names_all = rc == FL_EPROTO;
        for (int k = 0; must[k] != NULL; k++)
            names_all = names_all && strstr(a->text[r], must[k]) != NULL;
        if (names_all && found < 0)
            found = r;
        if (rc != FL_OK && a->rc2[r] != FL_ECLOSED)
            ck_abort_msg("mismatch %d: rank %d's call after the failure returned %d (%s): %s", kind,
                         r, a->rc2[r], fl_strerror(a->rc2[r]), a->text2[r]);
        if (rc != FL_OK && (strstr(a->text2[r], "broken by an earlier failure") == NULL ||
                            strstr(a->text2[r], a->text[r]) == NULL))
            ck_abort_msg("mismatch %d: rank %d's FL_ECLOSED text '%s' does not carry the cause "
                         "'%s'",
                         kind, r, a->text2[r], a->text[r]);
    }
    ck_assert_msg(found >= 0,
                  "mismatch %d, %d ranks: no rank reported FL_EPROTO naming "
                  "'%s'%s%s:%s",
                  kind, world, must[0], must[1] ? ", " : "", must[1] ? must[1] : "", all);
    /* Blocked ranks give up at their 1 s deadline; setup and teardown take the rest. */
    ck_assert_msg(took < 10000, "mismatch %d, %d ranks took %lld ms", kind, world, (long long)took);
    free(a);
}

START_TEST(test_mismatch_order)
{
    static const char *const must[] = {"different order", "broadcast", "allreduce", NULL};
    mm_run(_i + 2, MM_ORDER, must);
}
END_TEST

START_TEST(test_mismatch_count)
{
    static const char *const small[] = {"1235", "1234", NULL};
    static const char *const large[] = {"100001", "100000", NULL};
    mm_run(3, MM_COUNT, small);
    mm_run(2, MM_COUNT, small);
    mm_run(4, MM_COUNT_RING, large);
}
END_TEST

START_TEST(test_mismatch_root)
{
    static const char *const must[] = {"root 0", "root", NULL};
    mm_run(3, MM_ROOT, must);
}
END_TEST

START_TEST(test_mismatch_barrier)
{
    static const char *const must[] = {"barrier", "allreduce", NULL};
    mm_run(3, MM_BARRIER, must);
}
END_TEST

START_TEST(test_mismatch_dtype_int)
{
    static const char *const must[] = {"int32", "float32", NULL};
    mm_run(2, MM_DTYPE_INT, must);
}
END_TEST

/* float16 and float32 both send float32 partial sums: only a dtype check in the header can
 * tell them apart. */
START_TEST(test_mismatch_dtype_half)
{
    static const char *const must[] = {"float16", NULL};
    mm_run(2, MM_DTYPE_HALF, must);
}
END_TEST

/* ---- argument errors ---- */

static int expect_einval(int rc, const char *call, const char *a, const char *b)
{
    const char *t = fl_last_error();
    if (rc != FL_EINVAL)
        return bad("%s returned %d (%s), want FL_EINVAL; detail '%s'", call, rc, fl_strerror(rc),
                   t);
    if (strstr(t, a) == NULL || (b != NULL && strstr(t, b) == NULL))
        return bad("%s: detail '%s' does not name '%s' and '%s'", call, t, a, b ? b : "");
    return FL_OK;
}

#define EXPECT_EINVAL(call, a, b)                                                                  \
    do {                                                                                           \
        int rc_ = expect_einval((call), #call, (a), (b));                                          \
        if (rc_ != FL_OK)                                                                          \
            return rc_;                                                                            \
    } while (0)

static int args_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    float buf[64];
    float out[64];
    int32_t ibuf[64];
    uint8_t ubuf[64];
    char me[32];
    char top[32];
    memset(ibuf, 0, sizeof ibuf);
    memset(ubuf, 0, sizeof ubuf);
    for (int i = 0; i < 64; i++)
        buf[i] = (float)(r + i);
    snprintf(me, sizeof me, "rank %d", r);
    snprintf(top, sizeof top, "root %d", n);

    EXPECT_EINVAL(fl_allreduce(comm, buf, buf, 10, (fl_dtype_t)99, FL_SUM), "unknown dtype 99", me);
    EXPECT_EINVAL(fl_allgather(comm, buf, buf, 10, (fl_dtype_t)0), "unknown dtype 0", me);
    EXPECT_EINVAL(fl_broadcast(comm, buf, 10, (fl_dtype_t)-3, 0), "unknown dtype -3", me);
    EXPECT_EINVAL(fl_allreduce(comm, ibuf, ibuf, 10, FL_INT32, FL_AVG), "avg", "int32");
    EXPECT_EINVAL(fl_reduce_scatter(comm, ibuf, ibuf, 10, FL_INT32, FL_AVG), "avg", "int32");
    EXPECT_EINVAL(fl_allreduce(comm, ubuf, ubuf, 10, FL_UINT8, FL_MAX), "max", "uint8");
    EXPECT_EINVAL(fl_allreduce(comm, buf, buf, 10, FL_FLOAT32, (fl_op_t)9), "operator", "float32");
    EXPECT_EINVAL(fl_broadcast(comm, buf, 10, FL_FLOAT32, -1), "root -1", "out of range");
    EXPECT_EINVAL(fl_broadcast(comm, buf, 10, FL_FLOAT32, n), top, "out of range");
    EXPECT_EINVAL(fl_allreduce(comm, NULL, buf, 10, FL_FLOAT32, FL_SUM), "NULL buffer",
                  "10 elements");
    EXPECT_EINVAL(fl_allreduce(comm, buf, NULL, 10, FL_FLOAT32, FL_SUM), "NULL buffer", me);
    EXPECT_EINVAL(fl_reduce_scatter(comm, NULL, buf, 64, FL_FLOAT32, FL_SUM), "NULL buffer",
                  "reduce-scatter");
    EXPECT_EINVAL(fl_reduce_scatter(comm, buf, NULL, 64, FL_FLOAT32, FL_SUM), "NULL recvbuf",
                  "reduce-scatter");
    EXPECT_EINVAL(fl_allgather(comm, NULL, buf, 64, FL_FLOAT32), "NULL sendbuf", "all-gather");
    EXPECT_EINVAL(fl_allgather(comm, buf, NULL, 64, FL_FLOAT32), "NULL buffer", "all-gather");
    EXPECT_EINVAL(fl_broadcast(comm, NULL, 5, FL_FLOAT32, 0), "NULL buffer", "broadcast");
    EXPECT_EINVAL(fl_allreduce(comm, buf, buf, SIZE_MAX / 8 + 1, FL_FLOAT32, FL_SUM), "too large",
                  me);

    fl_comm_stats_t st;
    fl_comm_get_stats(comm, &st);
    if (st.ops != 0)
        return bad("rank %d: %llu ops counted after refused calls only", r,
                   (unsigned long long)st.ops);

    /* NULL is fine where no element would be touched. */
    EXPECT_OK(fl_allreduce(comm, NULL, NULL, 0, FL_FLOAT32, FL_SUM));
    EXPECT_OK(fl_reduce_scatter(comm, NULL, NULL, 0, FL_FLOAT32, FL_SUM));
    EXPECT_OK(fl_allgather(comm, NULL, NULL, 0, FL_FLOAT32));
    EXPECT_OK(fl_broadcast(comm, NULL, 0, FL_FLOAT32, n - 1));
    /* One element: only rank 0 has a shard, the others may pass NULL for theirs. */
    out[0] = -1;
    EXPECT_OK(fl_reduce_scatter(comm, buf, r == 0 ? out : NULL, 1, FL_FLOAT32, FL_SUM));
    if (r == 0 && out[0] != (float)(n * (n - 1) / 2))
        return bad("reduce-scatter of one element: %g, want %d", out[0], n * (n - 1) / 2);
    out[0] = -1;
    EXPECT_OK(fl_allgather(comm, r == 0 ? buf : NULL, out, 1, FL_FLOAT32));
    if (out[0] != 0.0f)
        return bad("rank %d: all-gather of one element: %g, want 0", r, out[0]);

    /* The communicator still works. */
    EXPECT_OK(fl_allreduce(comm, buf, out, 64, FL_FLOAT32, FL_SUM));
    for (int i = 0; i < 64; i++)
        if (out[i] != (float)(n * i + n * (n - 1) / 2))
            return bad("rank %d: allreduce after refused calls: element %d is %g", r, i, out[i]);
    fl_comm_get_stats(comm, &st);
    if (st.ops != 7)
        return bad("rank %d: %llu ops counted, want 7", r, (unsigned long long)st.ops);
    return FL_OK;
}

START_TEST(test_argument_errors)
{
    fl_comm_opts_t o;
    opts_base(&o);
    o.log_level = FL_LOG_OFF;
    run_world(_i + 1, &o, args_rank, NULL);
}
END_TEST

Suite *collectives_errors_suite(void);
Suite *collectives_errors_suite(void)
{
    Suite *s = suite_create("collectives_errors");
    TCase *t = tcase_create("mismatch");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_mismatch_order, 0, 4);
    tcase_add_test(t, test_mismatch_count);
    tcase_add_test(t, test_mismatch_root);
    tcase_add_test(t, test_mismatch_barrier);
    tcase_add_test(t, test_mismatch_dtype_int);
    tcase_add_test(t, test_mismatch_dtype_half);
    suite_add_tcase(s, t);
    t = tcase_create("arguments");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_argument_errors, 0, 3);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(collectives_errors_suite());
}
