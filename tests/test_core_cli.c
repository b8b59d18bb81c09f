/* core's flag values (longs, sizes), byte counts for people, the settings every rank must
 * share (built, compared and refused) and rate-limited warnings. */
#include <string.h>

#include "testutil.h"

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
        {"11", "11"},       {"-1", "-1"},     {"abc", "'abc'"},
        {"5x", "'5x'"},     {"", "missing"},  {"99999999999999999999999", "not an integer"},
        {"0x10", "'0x10'"}, {"1e3", "'1e3'"},
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
            ck_abort_msg("'%s': rc %d value %zu, expected %zu (%s)", ok[i].val, rc, v, ok[i].want,
                         fl_last_error());
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
    static const char *const bad[] = {"lr",   "=1",      "lr=1;",     "lr=1;;x=2",
                                      "LR=1", "lr=a\tb", "lr=1;x y=2"};
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

/* One line per period; the next line said counts those held back, in the text that tests and
 * operators grep for. */
START_TEST(test_ratelog)
{
    fl_ratelog_t r = {0};
    char more[64] = "untouched";
    ck_assert(fl_ratelog_say(&r, 5000, 10000, more, sizeof more));
    ck_assert_str_eq(more, "");
    for (int i = 0; i < 7; i++)
        ck_assert(!fl_ratelog_say(&r, 5001 + i, 10000, more, sizeof more));
    ck_assert(!fl_ratelog_say(&r, 14999, 10000, more, sizeof more));
    ck_assert(fl_ratelog_say(&r, 15000, 10000, more, sizeof more));
    ck_assert_str_eq(more, "; 8 more since the last report");
    ck_assert(fl_ratelog_say(&r, 25000, 10000, more, sizeof more));
    ck_assert_str_eq(more, ""); /* nothing held back since */
    char tiny[8];
    ck_assert(!fl_ratelog_say(&r, 25001, 10000, tiny, sizeof tiny));
    ck_assert(fl_ratelog_say(&r, 35001, 10000, tiny, sizeof tiny));
    ck_assert_str_eq(tiny, "; 1 mor"); /* cut to its buffer, never past it */
}
END_TEST

Suite *core_cli_suite(void);
Suite *core_cli_suite(void)
{
    Suite *s = suite_create("core_cli");
    TCase *t = tcase_create("cli");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_cli_long);
    tcase_add_test(t, test_cli_size);
    tcase_add_test(t, test_fmt_bytes);
    tcase_add_test(t, test_settings_build_and_compare);
    tcase_add_test(t, test_settings_refusals);
    tcase_add_test(t, test_ratelimit);
    tcase_add_test(t, test_ratelog);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(core_cli_suite());
}
