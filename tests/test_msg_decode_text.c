/* proto's decoder on versions and text, from bytes crafted by hand: another protocol version
 * refused naming it (through the encoder too, leaving no peer table), free text longer than its
 * field cut and terminated, and text in any script carried as it is and cut between
 * characters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_msg.h"
#include "msgutil.h"

START_TEST(test_decode_version)
{
    /* By hand, version 2 and version 0. */
    static const uint64_t versions[] = {2, 0, 7};
    for (size_t k = 0; k < NELEM(versions); k++) {
        pb_t p = {0};
        pb_header(&p, FL_MSG_MAGIC, versions[k], FL_MSG_CHUNK, 6);
        pb_chunk_body(&p);
        fl_msg_hdr_t out;
        fl_msg_fault_t fault;
        int rc = decode_exact(p.b, p.n, &out, &fault);
        free(p.b);
        ck_assert_int_eq(rc, FL_EPROTO);
        ck_assert_int_eq(fault, FL_FAULT_VERSION);
        char says[48];
        snprintf(says, sizeof says, "protocol version %llu", (unsigned long long)versions[k]);
        ck_assert_msg(strstr(fl_last_error(), says) != NULL, "%s", fl_last_error());
        ck_assert_uint_eq(out.version, versions[k]);
        ck_assert_int_eq(out.type, FL_MSG_CHUNK);
        ck_assert_int_eq(out.sender, 6);
        fl_msg_hdr_deinit(&out);
    }
    /* Through the encoder, which sends whatever version it is given: a welcome, so the refusal
     * path that must not leave a peer table is covered too. */
    fl_msg_hdr_t h;
    make_welcome(&h, 5);
    h.version = 2;
    enc_t e;
    encode_ok(&h, &e);
    fl_msg_hdr_t out;
    fl_msg_fault_t fault;
    ck_assert_int_eq(decode_exact(e.buf, e.len, &out, &fault), FL_EPROTO);
    ck_assert_int_eq(fault, FL_FAULT_VERSION);
    ck_assert_msg(strstr(fl_last_error(), "version 2") != NULL, "%s", fl_last_error());
    ck_assert_uint_eq(out.version, 2);
    ck_assert_int_eq(out.type, FL_MSG_WELCOME);
    ck_assert_int_eq(out.sender, -1);
    ck_assert_ptr_null(out.u.welcome.peers);
    fl_msg_hdr_deinit(&out);
    fl_msg_hdr_deinit(&h);
    free(e.buf);
}
END_TEST

START_TEST(test_decode_free_text_truncated)
{
    /* Free text longer than its field arrives truncated and terminated, not refused. */
    pb_t p = {0};
    pb_header(&p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_ERROR, -1);
    pb_t b = {0};
    pb_int(&b, 1, FL_EIO);
    pb_int(&b, 2, -1);
    pb_str(&b, 4, long_str('x', FL_MSG_TEXT_MAX + 100));
    pb_sub(&p, 20, &b);
    fl_msg_hdr_t out;
    fl_msg_fault_t fault;
    ck_assert_int_eq(decode_exact(p.b, p.n, &out, &fault), FL_OK);
    free(p.b);
    ck_assert_uint_eq(strlen(out.u.error.text), FL_MSG_TEXT_MAX - 1);
    ck_assert_int_eq(out.u.error.code, FL_EIO);
    ck_assert_int_eq(out.u.error.about_rank, -1);
    fl_msg_hdr_deinit(&out);

    p = (pb_t){0};
    pb_header(&p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_HEARTBEAT, -1);
    pb_str(&b, 6, long_str('7', FL_MSG_MISSING_MAX + 1));
    pb_sub(&p, 19, &b);
    ck_assert_int_eq(decode_exact(p.b, p.n, &out, &fault), FL_OK);
    free(p.b);
    ck_assert_uint_eq(strlen(out.u.heartbeat.missing), FL_MSG_MISSING_MAX - 1);
    fl_msg_hdr_deinit(&out);
}
END_TEST

START_TEST(test_decode_utf8_text)
{
    /* Text in any script travels as it is, in identifiers and in free text. */
    static const char host[] = "n\xc5\x93ud-\xc3\xbc-\xe6\x97\xa5\xe6\x9c\xac-\xf0\x9f\x98\x80";
    pb_t p = {0};
    pb_header(&p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_REGISTER, 2);
    pb_register_body(&p, host, 1, "tcp://\xc3\xa9:1", "seg=1,note=\xe2\x82\xac");
    fl_msg_hdr_t out;
    fl_msg_fault_t fault;
    ck_assert_int_eq(decode_exact(p.b, p.n, &out, &fault), FL_OK);
    free(p.b);
    ck_assert_str_eq(out.u.reg.host, host);
    ck_assert_str_eq(out.u.reg.endpoints[0], "tcp://\xc3\xa9:1");
    fl_msg_hdr_deinit(&out);

    /* Free text longer than its field is cut between characters, never inside one, so what
     * arrives still obeys the rule (and can be sent on). 300 two-byte characters: 510 bytes
     * fit in 511, not 511. */
    char text[601];
    for (int i = 0; i < 300; i++)
        memcpy(text + 2 * i, "\xc3\xa9", 2);
    text[600] = '\0';
    p = (pb_t){0};
    pb_header(&p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_SHUTDOWN, 2);
    pb_t b = {0};
    pb_str(&b, 2, text);
    pb_sub(&p, 21, &b);
    ck_assert_int_eq(decode_exact(p.b, p.n, &out, &fault), FL_OK);
    free(p.b);
    size_t n = strlen(out.u.shutdown.text);
    ck_assert_uint_eq(n, 510);
    ck_assert_uint_eq(fl_text_scan(out.u.shutdown.text, n, NULL), n);
    fl_msg_hdr_deinit(&out);
}
END_TEST

Suite *msg_decode_text_suite(void);
Suite *msg_decode_text_suite(void)
{
    Suite *s = suite_create("msg_decode_text");
    TCase *t = tcase_create("decode_refusals");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_decode_version);
    tcase_add_test(t, test_decode_free_text_truncated);
    tcase_add_test(t, test_decode_utf8_text);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(msg_decode_text_suite());
}
