/* core/fanout.c: n jobs at once (a barrier only they can pass proves it), each once per run,
 * job j on the same thread every run and job 0 on the caller's when it is the caller's, the
 * lowest failed job's code and text, and a run waited for in steps while the caller works. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#define MAXJ 8

typedef struct jobs {
    pthread_barrier_t *bar; /* when set, every job waits there: all n must run at once */
    atomic_int count[MAXJ]; /* runs of job j */
    pthread_t self[MAXJ];   /* the thread job j ran on last */
    int fail_code[MAXJ];    /* FL_OK: job j succeeds */
    atomic_bool release;    /* when hold is set, jobs wait for this */
    bool hold;
} jobs_t;

static int job(int j, void *ud)
{
    jobs_t *s = ud;
    atomic_fetch_add(&s->count[j], 1);
    s->self[j] = pthread_self();
    if (s->bar != NULL)
        pthread_barrier_wait(s->bar);
    while (s->hold && !atomic_load(&s->release))
        usleep(1000);
    if (s->fail_code[j] != FL_OK)
        return fl_fail(s->fail_code[j], "job %d failed", j);
    return FL_OK;
}

START_TEST(test_once_runs_all_at_once)
{
    jobs_t s;
    memset(&s, 0, sizeof s);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 5);
    s.bar = &bar;
    ck_assert_int_eq(fl_fanout_once(5, job, &s, "test jobs"), FL_OK);
    pthread_barrier_destroy(&bar);
    for (int j = 0; j < 5; j++) {
        ck_assert_int_eq(atomic_load(&s.count[j]), 1);
        ck_assert(!pthread_equal(s.self[j], pthread_self()));
    }
}
END_TEST

START_TEST(test_lowest_failed_job)
{
    jobs_t s;
    memset(&s, 0, sizeof s);
    s.fail_code[3] = FL_ETIMEDOUT;
    s.fail_code[1] = FL_EPEER;
    fl_error_clear();
    ck_assert_int_eq(fl_fanout_once(5, job, &s, "test jobs"), FL_EPEER);
    ck_assert_str_eq(fl_last_error(), "job 1 failed");
    for (int j = 0; j < 5; j++)
        ck_assert_int_eq(atomic_load(&s.count[j]), 1);
}
END_TEST

START_TEST(test_pool_threads_stay)
{
    jobs_t s;
    memset(&s, 0, sizeof s);
    fl_fanout_t *f = NULL;
    ck_assert_int_eq(fl_fanout_create(4, 1, job, &s, "test jobs", &f), FL_OK);
    pthread_t first[MAXJ];
    for (int run = 0; run < 3; run++) {
        ck_assert_int_eq(fl_fanout_run(f), FL_OK);
        ck_assert(pthread_equal(s.self[0], pthread_self()));
        for (int j = 1; j < 4; j++) {
            ck_assert(!pthread_equal(s.self[j], pthread_self()));
            if (run == 0)
                first[j] = s.self[j];
            ck_assert(pthread_equal(s.self[j], first[j]));
        }
    }
    for (int j = 0; j < 4; j++)
        ck_assert_int_eq(atomic_load(&s.count[j]), 3);
    /* The caller's job fails first in the order; a later run without failures is clean. */
    s.fail_code[0] = FL_EINVAL;
    s.fail_code[2] = FL_EIO;
    ck_assert_int_eq(fl_fanout_run(f), FL_EINVAL);
    ck_assert_str_eq(fl_last_error(), "job 0 failed");
    s.fail_code[0] = FL_OK;
    s.fail_code[2] = FL_OK;
    ck_assert_int_eq(fl_fanout_run(f), FL_OK);
    fl_fanout_destroy(&f);
    ck_assert_ptr_null(f);
    fl_fanout_destroy(&f);
    fl_fanout_destroy(NULL);
}
END_TEST

START_TEST(test_steps_while_the_caller_works)
{
    jobs_t s;
    memset(&s, 0, sizeof s);
    s.hold = true;
    s.fail_code[0] = FL_EIO; /* the caller's: begin and end never run it */
    s.fail_code[2] = FL_ENONFINITE;
    fl_fanout_t *f = NULL;
    ck_assert_int_eq(fl_fanout_create(3, 1, job, &s, "test jobs", &f), FL_OK);
    fl_fanout_begin(f);
    ck_assert(!fl_fanout_poll(f, 0));
    int64_t t0 = fl_now_ms();
    ck_assert(!fl_fanout_poll(f, 30));
    ck_assert_int_ge(fl_now_ms() - t0, 25);
    atomic_store(&s.release, true);
    ck_assert(fl_fanout_poll(f, -1));
    ck_assert(fl_fanout_poll(f, 0));
    ck_assert_int_eq(fl_fanout_end(f), FL_ENONFINITE);
    ck_assert_str_eq(fl_last_error(), "job 2 failed");
    ck_assert_int_eq(atomic_load(&s.count[0]), 0);
    ck_assert_int_eq(atomic_load(&s.count[1]), 1);
    ck_assert_int_eq(atomic_load(&s.count[2]), 1);
    fl_fanout_destroy(&f);
}
END_TEST

START_TEST(test_one_job_on_the_caller)
{
    jobs_t s;
    memset(&s, 0, sizeof s);
    fl_fanout_t *f = NULL;
    ck_assert_int_eq(fl_fanout_create(1, 1, job, &s, "test jobs", &f), FL_OK);
    fl_fanout_begin(f);
    ck_assert(fl_fanout_poll(f, 0)); /* no thread of its own to wait for */
    ck_assert_int_eq(fl_fanout_end(f), FL_OK);
    ck_assert_int_eq(fl_fanout_run(f), FL_OK);
    ck_assert_int_eq(atomic_load(&s.count[0]), 1);
    ck_assert(pthread_equal(s.self[0], pthread_self()));
    fl_fanout_destroy(&f);
}
END_TEST

Suite *fanout_suite(void);
Suite *fanout_suite(void)
{
    Suite *s = suite_create("fanout");
    TCase *t = tcase_create("fanout");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_once_runs_all_at_once);
    tcase_add_test(t, test_lowest_failed_job);
    tcase_add_test(t, test_pool_threads_stay);
    tcase_add_test(t, test_steps_while_the_caller_works);
    tcase_add_test(t, test_one_job_on_the_caller);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(fanout_suite());
}
