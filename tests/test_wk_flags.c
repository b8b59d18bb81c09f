/* flodl-worker's flag table (worker/trainer/worker_flags.c) against what users see: every row is
 * in --help and every flag --help names is a row; the rows that hand their value to another
 * table (the communicator's, the optimizer's) match its names; the parser takes every row,
 * refusing a word it does not know with the line that lists the words it takes; the binary
 * prints that --help. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testproc.h"
#include "testutil.h"
#include "worker_args.h"

#define WK_BIN FLODL_BIN_DIR "/worker/flodl-worker"

/* --help as the table writes it (about 4 KiB). */
static const char *help_text(void)
{
    static char text[32768];
    memset(text, 0, sizeof text);
    FILE *f = fmemopen(text, sizeof text - 1, "w");
    ck_assert_ptr_nonnull(f);
    fl_wk_args_help(f);
    ck_assert(ftell(f) < (long)sizeof text - 1);
    fclose(f);
    return text;
}

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
}

/* "--name" in text as a whole flag, not the start of a longer one. */
static bool names_flag(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = strstr(text, "--"); p != NULL; p = strstr(p + 2, "--"))
        if (strncmp(p + 2, name, n) == 0 && !is_name_char(p[2 + n]))
            return true;
    return false;
}

static const wflag_t *row_named(const char *name, size_t len)
{
    size_t n;
    const wflag_t *flags = fl_wk_flags(&n);
    for (size_t i = 0; i < n; i++)
        if (strlen(flags[i].name) == len && strncmp(flags[i].name, name, len) == 0)
            return &flags[i];
    return NULL;
}

START_TEST(test_rows_and_help_agree)
{
    const char *help = help_text();
    size_t n;
    const wflag_t *flags = fl_wk_flags(&n);
    ck_assert_uint_gt(n, 60);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(row_named(flags[i].name, strlen(flags[i].name)) == &flags[i],
                      "--%s: two rows", flags[i].name);
        if (flags[i].kind == WF_HELP || flags[i].kind == WF_VERSION)
            continue;
        ck_assert_msg(names_flag(help, flags[i].name), "--%s is not in --help", flags[i].name);
    }
    /* Every flag --help names, in any row's text, is one the worker has. */
    for (const char *p = strstr(help, "--"); p != NULL; p = strstr(p + 2, "--")) {
        size_t len = 0;
        while (is_name_char(p[2 + len]))
            len++;
        if (len > 0 && p[2] >= 'a' && p[2] <= 'z')
            ck_assert_msg(row_named(p + 2, len) != NULL, "--help names --%.*s, not a flag",
                          (int)len, p + 2);
    }
}
END_TEST

/* The rows that pass their value on by name cover the names the other side takes, and take a
 * value as it does (every optimizer flag but --nesterov). */
START_TEST(test_shared_names)
{
    for (size_t i = 0; fl_comm_opt_names[i] != NULL; i++) {
        const wflag_t *f = row_named(fl_comm_opt_names[i], strlen(fl_comm_opt_names[i]));
        ck_assert_msg(f != NULL && f->kind == WF_COMM, "--%s: no communicator row",
                      fl_comm_opt_names[i]);
        ck_assert(fl_wk_flag_takes_value(f));
    }
    for (size_t i = 0; fl_cli_optim_names[i] != NULL; i++) {
        const wflag_t *f = row_named(fl_cli_optim_names[i], strlen(fl_cli_optim_names[i]));
        ck_assert_msg(f != NULL && f->kind == WF_OPTIM, "--%s: no optimizer row",
                      fl_cli_optim_names[i]);
        ck_assert_msg(fl_wk_flag_takes_value(f) == (strcmp(f->name, "nesterov") != 0),
                      "--%s takes a value the wrong way", f->name);
    }
    size_t n;
    const wflag_t *flags = fl_wk_flags(&n);
    for (size_t i = 0; i < n; i++) {
        bool comm = false;
        for (size_t k = 0; fl_comm_opt_names[k] != NULL; k++)
            comm = comm || strcmp(fl_comm_opt_names[k], flags[i].name) == 0;
        ck_assert_msg(comm == (flags[i].kind == WF_COMM), "--%s: communicator's or not?",
                      flags[i].name);
        ck_assert_msg(fl_cli_is_optim_flag(flags[i].name) == (flags[i].kind == WF_OPTIM),
                      "--%s: optimizer's or not?", flags[i].name);
    }
}
END_TEST

/* Parses flodl-worker and the arguments (NULL-terminated) into *a with the parser the binary
 * runs, in this process. */
static int parse_raw(wargs_t *a, const char *const *args, wargs_what_t *what)
{
    char *argv[8] = {"flodl-worker"};
    int argc = 1;
    while (args[argc - 1] != NULL && argc < 7) {
        argv[argc] = (char *)args[argc - 1];
        argc++;
    }
    argv[argc] = NULL;
    fl_wk_args_init(a);
    optind = 0; /* glibc: start over, as in a new process */
    return fl_wk_args_parse(a, argc, argv, what);
}

/* ... a command line of known flags: FL_OK, or FL_EINVAL for a value, with one line naming
 * the flag. */
static int parse(wargs_t *a, const char *const *args)
{
    wargs_what_t what;
    int rc = parse_raw(a, args, &what);
    ck_assert_msg(rc == FL_OK || rc == FL_EINVAL, "%s: %s", args[0], fl_strerror(rc));
    ck_assert_msg(rc == FL_OK || strstr(fl_last_error(), "unknown or incomplete") == NULL, "%s: %s",
                  args[0], fl_last_error());
    ck_assert_msg(rc != FL_OK || what == WARGS_RUN, "%s", args[0]);
    return rc;
}

START_TEST(test_parser_takes_every_row)
{
    size_t n;
    const wflag_t *flags = fl_wk_flags(&n);
    wargs_t a;
    char arg[96];
    for (size_t i = 0; i < n; i++) {
        const wflag_t *f = &flags[i];
        if (f->kind == WF_HELP || f->kind == WF_VERSION)
            continue;
        snprintf(arg, sizeof arg, fl_wk_flag_takes_value(f) ? "--%s=x" : "--%s", f->name);
        const char *args[] = {arg, NULL};
        if (parse(&a, args) == FL_OK || f->words == NULL)
            continue;
        /* A word list: each word taken, any other refused naming them all. */
        char list[160] = "";
        for (size_t w = 0; f->words[w].word != NULL; w++) {
            snprintf(arg, sizeof arg, "--%s", f->name);
            const char *word[] = {arg, f->words[w].word, NULL};
            ck_assert_int_eq(parse(&a, word), FL_OK);
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, "%s%s", w > 0 ? "|" : "", f->words[w].word);
        }
        char want[256];
        snprintf(want, sizeof want, "--%s: 'x' is not one of %s", f->name, list);
        snprintf(arg, sizeof arg, "--%s=x", f->name);
        ck_assert_int_eq(parse(&a, args), FL_EINVAL);
        ck_assert_str_eq(fl_last_error(), want);
    }
    /* The optimizer's flags share one getopt code, so an abbreviation only they share is the
     * first of them, as it always was: --be is --beta1, --lr-s is --lr-schedule. */
    const char *be[] = {"--be", "0.5", "--lr-s", "step", NULL};
    ck_assert_int_eq(parse(&a, be), FL_OK);
    ck_assert(a.to.opt.beta1 == 0.5 && a.to.lr.kind == FL_LR_STEP);
}
END_TEST

/* Unknown, ambiguous and incomplete flags, stray words; --help and --version. */
START_TEST(test_refusals_and_actions)
{
    static const struct {
        const char *args[4];
        const char *error;
    } bad[] = {
        {{"--frobnicate", NULL}, "unknown or incomplete flag '--frobnicate' (see --help)"},
        {{"--m", "1", NULL}, "unknown or incomplete flag '--m' (see --help)"},
        {{"--epochs", NULL}, "unknown or incomplete flag '--epochs' (see --help)"},
        {{"--lz4=1", NULL}, "unknown or incomplete flag '--lz4=1' (see --help)"},
        {{"--epochs", "2", "stray", NULL}, "unexpected argument 'stray' (see --help)"},
    };
    wargs_t a;
    wargs_what_t what;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(parse_raw(&a, bad[i].args, &what), FL_EINVAL);
        ck_assert_str_eq(fl_last_error(), bad[i].error);
    }
    const char *help[] = {"--epochs", "2", "-h", "--frobnicate", NULL};
    ck_assert_int_eq(parse_raw(&a, help, &what), FL_OK);
    ck_assert_int_eq(what, WARGS_HELP);
    const char *version[] = {"--vers", NULL};
    ck_assert_int_eq(parse_raw(&a, version, &what), FL_OK);
    ck_assert_int_eq(what, WARGS_VERSION);
}
END_TEST

/* The binary prints the table's --help. */
START_TEST(test_binary_help)
{
    const char *argv[] = {WK_BIN, "--help", NULL};
    proc_t p;
    run_sync(&p, WK_BIN, argv, NULL);
    ck_assert_int_eq(proc_code(&p), 0);
    ck_assert_str_eq(p.buf[0] != NULL ? p.buf[0] : "", help_text());
    procs_free(&p, 1);
}
END_TEST

Suite *wk_flags_suite(void);
Suite *wk_flags_suite(void)
{
    Suite *s = suite_create("wk_flags");
    TCase *t = tcase_create("table");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_rows_and_help_agree);
    tcase_add_test(t, test_shared_names);
    tcase_add_test(t, test_parser_takes_every_row);
    tcase_add_test(t, test_refusals_and_actions);
    tcase_add_test(t, test_binary_help);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(wk_flags_suite());
}
