/* core's launcher-environment resolution, from a table standing for the environment: nothing
 * set, which variable wins, the coordinator and the rest, ipc endpoints, torchrun's local rank
 * and size (also through fl_comm_opts_from_env), and bad values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

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
    ck_assert_int_eq(li.local_rank, -1);
    ck_assert_int_eq(li.local_size, -1);
}
END_TEST

/* torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE, which flodl-launch sets too; each alone, or
 * empty (unset). */
START_TEST(test_launch_local)
{
    static const struct {
        const char *rank, *size;
        int want_rank, want_size;
    } cases[] = {
        {"3", "4", 3, 4}, {"0", NULL, 0, -1}, {NULL, "2", -1, 2},
        {"", "", -1, -1}, {"0", "1", 0, 1},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        env_var_t env[3] = {{NULL, NULL}, {NULL, NULL}, {NULL, NULL}};
        size_t n = 0;
        if (cases[i].rank != NULL)
            env[n++] = (env_var_t){"LOCAL_RANK", cases[i].rank};
        if (cases[i].size != NULL)
            env[n++] = (env_var_t){"LOCAL_WORLD_SIZE", cases[i].size};
        fl_launch_info_t li;
        int rc = launch(env, &li);
        if (rc != FL_OK || li.local_rank != cases[i].want_rank ||
            li.local_size != cases[i].want_size)
            ck_abort_msg("LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s: rc %d (%s), local %d of %d, want %d "
                         "of %d",
                         cases[i].rank ? cases[i].rank : "(unset)",
                         cases[i].size ? cases[i].size : "(unset)", rc, fl_last_error(),
                         li.local_rank, li.local_size, cases[i].want_rank, cases[i].want_size);
    }
}
END_TEST

/* A local rank or size that is no integer in range, or a local rank not below the local size,
 * is refused naming the variable (and, for the pair, both values). */
START_TEST(test_launch_local_bad)
{
    static const struct {
        const char *rank, *size;
        const char *named[2];
    } cases[] = {
        {"x", "4", {"LOCAL_RANK='x'", NULL}},
        {"-1", NULL, {"LOCAL_RANK='-1'", NULL}},
        {"1.5", NULL, {"LOCAL_RANK='1.5'", NULL}},
        {NULL, "0", {"LOCAL_WORLD_SIZE='0'", NULL}},
        {"0", "two", {"LOCAL_WORLD_SIZE='two'", NULL}},
        {"2", "2", {"LOCAL_RANK='2'", "LOCAL_WORLD_SIZE='2'"}},
        {"7", "4", {"LOCAL_RANK='7'", "LOCAL_WORLD_SIZE='4'"}},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        env_var_t env[3] = {{NULL, NULL}, {NULL, NULL}, {NULL, NULL}};
        size_t n = 0;
        if (cases[i].rank != NULL)
            env[n++] = (env_var_t){"LOCAL_RANK", cases[i].rank};
        if (cases[i].size != NULL)
            env[n++] = (env_var_t){"LOCAL_WORLD_SIZE", cases[i].size};
        fl_launch_info_t li;
        fl_error_clear();
        int rc = launch(env, &li);
        bool named = true;
        for (size_t k = 0; k < 2 && cases[i].named[k] != NULL; k++)
            named = named && strstr(fl_last_error(), cases[i].named[k]) != NULL;
        if (rc != FL_EINVAL || !named)
            ck_abort_msg("LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s: rc %d, detail '%s'",
                         cases[i].rank ? cases[i].rank : "(unset)",
                         cases[i].size ? cases[i].size : "(unset)", rc, fl_last_error());
    }
}
END_TEST

/* fl_comm_opts_from_env reads the real environment through the same resolver: a bad local rank
 * is refused there too, and a good one leaves the options' rank alone. Check forks each case,
 * so setenv stays in this child. */
START_TEST(test_comm_opts_local)
{
    fl_comm_opts_t o;
    fl_comm_opts_init(&o);
    ck_assert_int_eq(setenv("FLODL_RANK", "5", 1), 0);
    ck_assert_int_eq(setenv("LOCAL_RANK", "1", 1), 0);
    ck_assert_int_eq(setenv("LOCAL_WORLD_SIZE", "2", 1), 0);
    int rc = fl_comm_opts_from_env(&o);
    ck_assert_msg(rc == FL_OK && o.rank == 5, "rc %d (%s), rank %d", rc, fl_last_error(), o.rank);
    ck_assert_int_eq(setenv("LOCAL_RANK", "one", 1), 0);
    fl_error_clear();
    rc = fl_comm_opts_from_env(&o);
    ck_assert_msg(rc == FL_EINVAL && strstr(fl_last_error(), "LOCAL_RANK='one'") != NULL,
                  "rc %d, detail '%s'", rc, fl_last_error());
    ck_assert_int_eq(setenv("LOCAL_RANK", "2", 1), 0);
    fl_error_clear();
    rc = fl_comm_opts_from_env(&o);
    ck_assert_msg(rc == FL_EINVAL && strstr(fl_last_error(), "LOCAL_WORLD_SIZE='2'") != NULL,
                  "rc %d, detail '%s'", rc, fl_last_error());
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

    const env_var_t rest[] = {{"FLODL_HOST", "node-17"}, {"FLODL_JOB_ID", "job-2024-x"},
                              {"FLODL_LOG", "DEBUG"},    {"FLODL_RANK", "0"},
                              {"WORLD_SIZE", "1"},       {NULL, NULL}};
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
    } cases[] = {{"0", FL_OK, 0},
                 {"1", FL_OK, 1},
                 {"", FL_OK, -1},
                 {"yes", FL_EINVAL, -1},
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

Suite *core_launch_env_suite(void);
Suite *core_launch_env_suite(void)
{
    Suite *s = suite_create("core_launch_env");
    TCase *t = tcase_create("launch_env");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_launch_nothing_set);
    tcase_add_test(t, test_launch_precedence);
    tcase_add_test(t, test_launch_coordinator_and_more);
    tcase_add_test(t, test_launch_bad_values);
    tcase_add_test(t, test_launch_ipc);
    tcase_add_test(t, test_launch_local);
    tcase_add_test(t, test_launch_local_bad);
    tcase_add_test(t, test_comm_opts_local);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(core_launch_env_suite());
}
