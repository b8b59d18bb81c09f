/* The options structs a program hands libflodl carry their size (struct_size, first field, set
 * by the *_opts_init functions) so that later versions can add fields without breaking
 * binaries; the library refuses a size it does not know, naming both sizes, before it reads
 * any other field. */
#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "flodl/flodl.h"
#include "testutil.h"

/* FL_EINVAL, and the detail names the struct, the size given and the size expected. */
static void expect_refused(int rc, const char *type, size_t given, size_t want)
{
    char g[64];
    char w[64];
    snprintf(g, sizeof g, "struct_size is %zu", given);
    snprintf(w, sizeof w, "expects %zu", want);
    const char *e = fl_last_error();
    ck_assert_msg(rc == FL_EINVAL, "%s of size %zu: rc %d (%s), want FL_EINVAL", type, given, rc,
                  e);
    ck_assert_msg(strstr(e, type) != NULL && strstr(e, g) != NULL && strstr(e, w) != NULL,
                  "%s of size %zu: the detail should name both sizes: %s", type, given, e);
}

START_TEST(test_opts_init_sets_size)
{
    ck_assert_uint_eq(offsetof(fl_comm_opts_t, struct_size), 0);
    ck_assert_uint_eq(offsetof(fl_ps_client_opts_t, struct_size), 0);
    ck_assert_uint_eq(offsetof(fl_coord_opts_t, struct_size), 0);
    fl_comm_opts_t c;
    fl_comm_opts_init(&c);
    ck_assert_uint_eq(c.struct_size, sizeof c);
    fl_ps_client_opts_t p;
    fl_ps_client_opts_init(&p);
    ck_assert_uint_eq(p.struct_size, sizeof p);
    fl_coord_opts_t k;
    fl_coord_opts_init(&k);
    ck_assert_uint_eq(k.struct_size, sizeof k);
}
END_TEST

/* Sizes a program built against another libflodl (or one that skipped *_opts_init) passes. */
static const long deltas[] = {-(long)sizeof(void *), (long)sizeof(void *), 0};

START_TEST(test_comm_refuses_unknown_size)
{
    for (size_t i = 0; i < sizeof deltas / sizeof deltas[0]; i++) {
        fl_comm_opts_t o;
        fl_comm_opts_init(&o);
        o.rank = 0;
        o.world_size = 1;
        o.coordinator = "tcp://127.0.0.1:1";
        o.struct_size = deltas[i] ? sizeof o + (size_t)deltas[i] : 0;
        fl_comm_t *comm = (fl_comm_t *)&o;
        int rc = fl_comm_init(&o, &comm);
        ck_assert_ptr_null(comm);
        expect_refused(rc, "fl_comm_opts_t", o.struct_size, sizeof o);
    }
}
END_TEST

START_TEST(test_coord_refuses_unknown_size)
{
    for (size_t i = 0; i < sizeof deltas / sizeof deltas[0]; i++) {
        fl_coord_opts_t o;
        fl_coord_opts_init(&o);
        o.bind = "tcp://127.0.0.1:0";
        o.world_size = 1;
        o.struct_size = deltas[i] ? sizeof o + (size_t)deltas[i] : 0;
        fl_coord_t *coord = (fl_coord_t *)&o;
        int rc = fl_coord_create(&o, &coord);
        ck_assert_ptr_null(coord);
        expect_refused(rc, "fl_coord_opts_t", o.struct_size, sizeof o);
    }
}
END_TEST

START_TEST(test_ps_client_refuses_unknown_size)
{
    for (size_t i = 0; i < sizeof deltas / sizeof deltas[0]; i++) {
        fl_ps_client_opts_t o;
        fl_ps_client_opts_init(&o);
        o.rank = 0;
        o.world_size = 1;
        o.coordinator = "tcp://127.0.0.1:1";
        o.param_count = 10;
        o.struct_size = deltas[i] ? sizeof o + (size_t)deltas[i] : 0;
        fl_ps_client_t *cl = (fl_ps_client_t *)&o;
        int rc = fl_ps_client_create(&o, &cl);
        ck_assert_ptr_null(cl);
        expect_refused(rc, "fl_ps_client_opts_t", o.struct_size, sizeof o);
    }
}
END_TEST

/* The right size still works end to end: a one-rank job through an embedded coordinator. */
START_TEST(test_known_size_accepted)
{
    fl_coord_t *coord = fl_test_coord(1, 0);
    fl_comm_opts_t o;
    fl_test_comm_opts(&o, coord, 0, 1);
    ck_assert_uint_eq(o.struct_size, sizeof o);
    fl_comm_t *comm;
    ck_assert_msg(fl_comm_init(&o, &comm) == FL_OK, "%s", fl_last_error());
    float x[3] = {1, 2, 3};
    ck_assert_int_eq(fl_allreduce(comm, x, x, 3, FL_FLOAT32, FL_SUM), FL_OK);
    ck_assert(x[0] == 1 && x[1] == 2 && x[2] == 3);
    fl_comm_destroy(&comm);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
}
END_TEST

Suite *api_abi_suite(void);
Suite *api_abi_suite(void)
{
    Suite *s = suite_create("api_abi");
    TCase *t = tcase_create("struct_size");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_opts_init_sets_size);
    tcase_add_test(t, test_comm_refuses_unknown_size);
    tcase_add_test(t, test_coord_refuses_unknown_size);
    tcase_add_test(t, test_ps_client_refuses_unknown_size);
    tcase_add_test(t, test_known_size_accepted);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(api_abi_suite());
}
