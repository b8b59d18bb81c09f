/* core's handling of untrusted text (scan, escape, cut to whole characters) and model shapes:
 * the text and its signature, the wire's cut to whole lines. */
#include <math.h>
#include <string.h>

#include "testutil.h"

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
    fl_model_shapes_diff(text, "on A", "layers.0.weight[64,256];layers.0.bias[256];", "in B", why,
                         sizeof why);
    ck_assert_str_eq(why, "tensor 'layers.0.weight' is [256,64] on A, [64,256] in B");
    fl_model_shapes_diff(text, "on A", "layers.0.weight[256,64];layers.1.bias[256];", "in B", why,
                         sizeof why);
    ck_assert_str_eq(why, "tensor 1 is 'layers.0.bias' [256] on A, 'layers.1.bias' [256] in B");
    fl_model_shapes_diff(text, "on A", "layers.0.weight[256,64];layers.0.bias[256];", "in B", why,
                         sizeof why);
    ck_assert_str_eq(why, "2 tensors in B, more on A (the next is 'scale' [])");
    fl_model_shapes_diff(text, "on A", cut, "in B", why, sizeof why);
    ck_assert_msg(strstr(why, "first 1 tensors agree") != NULL, "%s", why);
    fl_model_shapes_deinit(&m);
    fl_model_shapes_deinit(NULL);
}
END_TEST

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
        {"\xef\xbf\xbf\xf4\x8f\xbf\xbf", 7, 7, NULL}, /* U+FFFF, U+10FFFF */
        {"flodl\0evil", 10, 5, "a NUL byte"},
        {"host\nforged", 11, 4, "a control character"},
        {"a\tb", 3, 1, "a control character"},
        {"a\rb", 3, 1, "a control character"},
        {"del\x7f", 4, 3, "a control character"},
        {"csi\xc2\x9b"
         "2J",
         7, 3, "a control character"},  /* U+009B */
        {"nbsp\xc2\xa0ok", 8, 8, NULL}, /* U+00A0 is printable */
        {"bad\xff", 4, 3, "bytes that are not UTF-8"},
        {"cont\x80", 5, 4, "bytes that are not UTF-8"},
        {"over\xc0\xaf", 6, 4, "bytes that are not UTF-8"},        /* overlong '/' */
        {"over\xe0\x80\xaf", 7, 4, "bytes that are not UTF-8"},    /* overlong, 3 bytes */
        {"sur\xed\xa0\x80", 6, 3, "bytes that are not UTF-8"},     /* U+D800 */
        {"big\xf4\x90\x80\x80", 7, 3, "bytes that are not UTF-8"}, /* U+110000 */
        {"cut\xe6\x97", 5, 3, "bytes that are not UTF-8"},         /* sequence cut short */
        {"\xe6\x97"
         "x",
         3, 0, "bytes that are not UTF-8"},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        const char *why = "unset";
        size_t at = fl_text_scan(cases[i].s, cases[i].len, &why);
        if (at != cases[i].at || (why == NULL) != (cases[i].why == NULL) ||
            (why != NULL && strcmp(why, cases[i].why) != 0))
            ck_abort_msg("case %zu: offset %zu (%s), expected %zu (%s)", i, at, why ? why : "fine",
                         cases[i].at, cases[i].why ? cases[i].why : "fine");
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
    ck_assert_uint_eq(fl_text_cut("ab\xc3\xa9", 3), 2); /* 2-byte char split */
    ck_assert_uint_eq(fl_text_cut("ab\xc3\xa9", 4), 4);
    ck_assert_uint_eq(fl_text_cut("a\xf0\x9f\x98\x80z", 2), 1); /* 4-byte char, each cut */
    ck_assert_uint_eq(fl_text_cut("a\xf0\x9f\x98\x80z", 3), 1);
    ck_assert_uint_eq(fl_text_cut("a\xf0\x9f\x98\x80z", 4), 1);
    ck_assert_uint_eq(fl_text_cut("a\xf0\x9f\x98\x80z", 5), 5);
    ck_assert_uint_eq(fl_text_cut("\x80\x80\x80\x80\x80", 4), 4); /* not UTF-8: plain cut */
}
END_TEST

Suite *core_text_suite(void);
Suite *core_text_suite(void)
{
    Suite *s = suite_create("core_text");
    TCase *t = tcase_create("text");
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
    return fl_test_run(core_text_suite());
}
