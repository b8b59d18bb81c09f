/* The public headers document each option's default ("(default 300000)", "1 (default)"); the
 * options the library's *_opts_init functions return must say the same, so the headers
 * cannot drift from the code. Each checked field's comment is read from the header itself. */
#include <check.h>
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flodl/flodl.h"
#include "testutil.h"

static char *slurp(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/include/flodl/%s", FLODL_SOURCE_DIR, name);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    static char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

/* The documented default of field `field` of struct `type` in header text: the number in
 * "(default N[ KiB| MiB])" or "N (default)" within the field's comment. -1 when none. */
static long long doc_default(const char *text, const char *type, const char *field)
{
    char open[96];
    snprintf(open, sizeof open, "typedef struct %s {", type);
    const char *s = strstr(text, open);
    ck_assert_msg(s != NULL, "struct %s not found", type);
    const char *end = strstr(s, "} ");
    char decl[96];
    snprintf(decl, sizeof decl, " %s;", field);
    const char *d = strstr(s, decl);
    ck_assert_msg(d != NULL && d < end, "%s.%s not found", type, field);
    const char *c = strstr(d, "/*");
    const char *ce = c ? strstr(c, "*/") : NULL;
    ck_assert_msg(c != NULL && ce != NULL, "%s.%s has no comment", type, field);
    char comment[1024];
    snprintf(comment, sizeof comment, "%.*s", (int)(ce - c), c);
    const char *p = strstr(comment, "(default ");
    if (p != NULL && isdigit((unsigned char)p[9])) {
        char *unit = NULL;
        long long v = strtoll(p + 9, &unit, 10);
        if (strncmp(unit, " KiB", 4) == 0)
            v <<= 10;
        else if (strncmp(unit, " MiB", 4) == 0)
            v <<= 20;
        return v;
    }
    p = strstr(comment, " (default)");
    if (p != NULL) {
        const char *q = p;
        while (q > comment && isdigit((unsigned char)q[-1]))
            q--;
        if (q < p)
            return strtoll(q, NULL, 10);
    }
    return -1;
}

#define CHECK_DEFAULT(text, type, opts, field)                                                     \
    do {                                                                                           \
        long long doc_ = doc_default(text, #type, #field);                                         \
        ck_assert_msg(doc_ >= 0, #type "." #field ": no documented default");                      \
        ck_assert_msg((long long)(opts).field == doc_,                                             \
                      #type "." #field ": the header documents %lld, the library gives %lld",      \
                      doc_, (long long)(opts).field);                                              \
    } while (0)

START_TEST(test_comm_defaults_documented)
{
    char *h = slurp("comm.h");
    fl_comm_opts_t o;
    fl_comm_opts_init(&o);
    CHECK_DEFAULT(h, fl_comm_opts, o, timeout_ms);
    CHECK_DEFAULT(h, fl_comm_opts, o, rendezvous_timeout_ms);
    CHECK_DEFAULT(h, fl_comm_opts, o, stripes);
    CHECK_DEFAULT(h, fl_comm_opts, o, segment_bytes);
    CHECK_DEFAULT(h, fl_comm_opts, o, small_bytes);
    CHECK_DEFAULT(h, fl_comm_opts, o, tune_malloc);
    CHECK_DEFAULT(h, fl_comm_opts, o, ipc);
    free(h);
}
END_TEST

START_TEST(test_ps_client_defaults_documented)
{
    char *h = slurp("ps.h");
    fl_ps_client_opts_t o;
    fl_ps_client_opts_init(&o);
    CHECK_DEFAULT(h, fl_ps_client_opts, o, timeout_ms);
    CHECK_DEFAULT(h, fl_ps_client_opts, o, rendezvous_timeout_ms);
    CHECK_DEFAULT(h, fl_ps_client_opts, o, reconnect_timeout_ms);
    CHECK_DEFAULT(h, fl_ps_client_opts, o, lz4);
    CHECK_DEFAULT(h, fl_ps_client_opts, o, tune_malloc);
    free(h);
}
END_TEST

START_TEST(test_coordinator_defaults_documented)
{
    char *h = slurp("coordinator.h");
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    CHECK_DEFAULT(h, fl_coord_opts, o, heartbeat_timeout_ms);
    CHECK_DEFAULT(h, fl_coord_opts, o, rendezvous_timeout_ms);
    free(h);
}
END_TEST

Suite *api_docs_suite(void);
Suite *api_docs_suite(void)
{
    Suite *s = suite_create("api_docs");
    TCase *t = tcase_create("defaults");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_comm_defaults_documented);
    tcase_add_test(t, test_ps_client_defaults_documented);
    tcase_add_test(t, test_coordinator_defaults_documented);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(api_docs_suite());
}
