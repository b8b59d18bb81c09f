/* proto's encoder: refusals, free text escaped where it breaks the wire-text rule and sent
 * whatever it holds, running out of memory; the frame check; type names, header init and
 * deinit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_msg.h"
#include "msgutil.h"

/* ---- encode helpers ---- */

static void *alloc_null(size_t n, void *ud)
{
    (void)n;
    ((enc_t *)ud)->calls++;
    return NULL;
}

/* ---- encode refusals ---- */

static void expect_encode_refused(const fl_msg_hdr_t *h, const char *says)
{
    enc_t e;
    memset(&e, 0, sizeof e);
    size_t len = 12345;
    fl_error_clear();
    int rc = fl_msg_encode(h, alloc_malloc, &e, &len);
    free(e.buf);
    ck_assert_msg(rc == FL_EINVAL, "%s: rc %d", says, rc);
    ck_assert_msg(e.calls == 0, "%s: alloc called on a refusal", says);
    ck_assert_msg(len == 12345, "%s: *len written on a refusal", says);
    ck_assert_msg(strstr(fl_last_error(), says) != NULL, "detail '%s' does not say '%s'",
                  fl_last_error(), says);
}

START_TEST(test_encode_refusals)
{
    fl_msg_hdr_t h;

    make_barrier(&h);
    memset(h.job_id, 'j', sizeof h.job_id);
    expect_encode_refused(&h, "job id");

    make_barrier(&h);
    h.nframes = FL_MSG_MAX_FRAMES + 1;
    expect_encode_refused(&h, "17 frames");

    make_register(&h);
    memset(h.u.reg.host, 'h', sizeof h.u.reg.host);
    expect_encode_refused(&h, "host");
    make_register(&h);
    memset(h.u.reg.endpoints[2], 'e', FL_ENDPOINT_MAX);
    expect_encode_refused(&h, "endpoint");
    make_register(&h);
    h.u.reg.nendpoints = FL_MSG_MAX_STRIPES + 1;
    expect_encode_refused(&h, "9 endpoints");
    make_register(&h);
    memset(h.u.reg.tuning, 't', sizeof h.u.reg.tuning);
    expect_encode_refused(&h, "tuning");
    make_register(&h);
    memset(h.u.reg.model_shapes, 's', sizeof h.u.reg.model_shapes);
    expect_encode_refused(&h, "model shapes");

    make_heartbeat(&h);
    memset(h.u.heartbeat.missing, '1', sizeof h.u.heartbeat.missing);
    expect_encode_refused(&h, "missing");
    make_error(&h);
    memset(h.u.error.host, 'h', sizeof h.u.error.host);
    expect_encode_refused(&h, "error host");
    make_error(&h);
    memset(h.u.error.text, 'x', sizeof h.u.error.text);
    expect_encode_refused(&h, "error text");
    make_shutdown(&h);
    memset(h.u.shutdown.text, 'x', sizeof h.u.shutdown.text);
    expect_encode_refused(&h, "shutdown text");

    make_welcome(&h, 4);
    memset(h.u.welcome.peers[3].host, 'h', FL_HOST_MAX);
    expect_encode_refused(&h, "peer host");
    fl_msg_hdr_deinit(&h);
    make_welcome(&h, 4);
    h.u.welcome.peers[1].nendpoints = FL_MSG_MAX_STRIPES + 1;
    expect_encode_refused(&h, "9 endpoints");
    fl_msg_hdr_deinit(&h);
    make_welcome(&h, 2);
    h.u.welcome.npeers = FL_MSG_MAX_PEERS + 1; /* refused before the table is read */
    expect_encode_refused(&h, "65537 peers");
    h.u.welcome.npeers = 2;
    fl_msg_hdr_deinit(&h);

    /* Identifiers that break the wire-text rule are refused, not sent for a receiver to
     * refuse. */
    make_barrier(&h);
    snprintf(h.job_id, sizeof h.job_id, "job\xff");
    expect_encode_refused(&h, "job id has bytes that are not UTF-8 at byte 3");
    make_register(&h);
    snprintf(h.u.reg.host, sizeof h.u.reg.host, "evil\nline");
    expect_encode_refused(&h, "host has a control character at byte 4");
    make_register(&h);
    snprintf(h.u.reg.endpoints[1], FL_ENDPOINT_MAX, "tcp://\x1b:1");
    expect_encode_refused(&h, "endpoint has a control character");
    make_register(&h);
    snprintf(h.u.reg.tuning, sizeof h.u.reg.tuning, "seg=1\t");
    expect_encode_refused(&h, "tuning has a control character");
    make_error(&h);
    snprintf(h.u.error.host, sizeof h.u.error.host, "h\xc3");
    expect_encode_refused(&h, "error host has bytes that are not UTF-8");
    make_welcome(&h, 3);
    snprintf(h.u.welcome.peers[2].host, FL_HOST_MAX, "p\x7f");
    expect_encode_refused(&h, "peer host has a control character");
    fl_msg_hdr_deinit(&h);

    fl_msg_hdr_init(&h, (fl_msg_type_t)42, 0);
    expect_encode_refused(&h, "42");
    fl_msg_hdr_init(&h, FL_MSG_NONE, 0);
    expect_encode_refused(&h, "type");
}
END_TEST

/* Free text (an error's or a goodbye's text, the missing ranks) is sent whatever it holds: a
 * goodbye must not be lost for a file name that is not UTF-8. The encoder escapes what breaks
 * the rule instead, and text that obeys it goes as it is. */
START_TEST(test_encode_escapes_free_text)
{
    static const char bad[] = "failed: /data/\xff.bin\n[0.000 ps] error: forged\x1b[2J\xc3";
    static const char want[] = "failed: /data/\\xff.bin\\n[0.000 ps] error: forged\\x1b[2J\\xc3";
    static const fl_msg_type_t types[] = {FL_MSG_SHUTDOWN, FL_MSG_ERROR, FL_MSG_HEARTBEAT};
    for (size_t t = 0; t < NELEM(types); t++) {
        fl_msg_hdr_t h;
        fl_msg_hdr_init(&h, types[t], 1);
        char *text = types[t] == FL_MSG_SHUTDOWN ? h.u.shutdown.text
                     : types[t] == FL_MSG_ERROR  ? h.u.error.text
                                                 : h.u.heartbeat.missing;
        snprintf(text, 64, "%s", bad);
        enc_t e;
        encode_ok(&h, &e);
        fl_msg_hdr_t out;
        fl_msg_fault_t fault;
        int rc = decode_exact(e.buf, e.len, &out, &fault);
        free(e.buf);
        ck_assert_msg(rc == FL_OK, "%s: %s", fl_msg_type_name(types[t]), fl_last_error());
        const char *got = types[t] == FL_MSG_SHUTDOWN ? out.u.shutdown.text
                          : types[t] == FL_MSG_ERROR  ? out.u.error.text
                                                      : out.u.heartbeat.missing;
        ck_assert_str_eq(got, want);
        fl_msg_hdr_deinit(&out);
    }
    /* A text that fills its field and grows when escaped is cut to fit, between escapes. */
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, 1);
    memset(h.u.shutdown.text, '\n', FL_MSG_TEXT_MAX - 1);
    enc_t e;
    encode_ok(&h, &e);
    fl_msg_hdr_t out;
    fl_msg_fault_t fault;
    ck_assert_int_eq(decode_exact(e.buf, e.len, &out, &fault), FL_OK);
    free(e.buf);
    ck_assert_uint_eq(strlen(out.u.shutdown.text), FL_MSG_TEXT_MAX - 1 - 1);
    ck_assert_int_eq(strncmp(out.u.shutdown.text, "\\n\\n", 4), 0);
    fl_msg_hdr_deinit(&out);
}
END_TEST

START_TEST(test_encode_no_memory)
{
    for (size_t m = 0; m < NELEM(makers); m++) {
        fl_msg_hdr_t h;
        makers[m](&h);
        enc_t e;
        memset(&e, 0, sizeof e);
        size_t len = 777;
        fl_error_clear();
        int rc = fl_msg_encode(&h, alloc_null, &e, &len);
        if (rc != FL_ENOMEM || e.calls != 1 || len != 777 || fl_last_error()[0] == '\0')
            ck_abort_msg("%s: rc %d, %d alloc calls, len %zu", fl_msg_type_name(h.type), rc,
                         e.calls, len);
        fl_msg_hdr_deinit(&h);
    }
    /* A large welcome: its temporary tables must be freed on this path too (ASan). */
    fl_msg_hdr_t h;
    make_welcome(&h, 1000);
    enc_t e;
    memset(&e, 0, sizeof e);
    size_t len;
    ck_assert_int_eq(fl_msg_encode(&h, alloc_null, &e, &len), FL_ENOMEM);
    ck_assert_ptr_nonnull(strstr(fl_last_error(), "header"));
    fl_msg_hdr_deinit(&h);
}
END_TEST

/* ---- frame check ---- */

START_TEST(test_check_frames)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, 1);
    h.nframes = 2;
    h.frames[0] = (fl_msg_frame_t){100, FL_FLOAT32, FL_CODEC_RAW, 100};
    h.frames[1] = (fl_msg_frame_t){50, FL_FLOAT32, FL_CODEC_LZ4, 400};
    size_t sizes[3] = {100, 50, 7};
    fl_msg_fault_t fault = FL_FAULT_SIZE;

    ck_assert_int_eq(fl_msg_check_frames(&h, sizes, 2, 1000, &fault), FL_OK);
    ck_assert_int_eq(fault, FL_FAULT_NONE);
    ck_assert_int_eq(fl_msg_check_frames(&h, sizes, 2, 400, &fault), FL_OK); /* limit inclusive */

    ck_assert_int_eq(fl_msg_check_frames(&h, sizes, 1, 1000, &fault), FL_EPROTO);
    ck_assert_int_eq(fault, FL_FAULT_FRAMES);
    ck_assert_msg(strstr(fl_last_error(), "chunk message declares 2 payload frames but 1"), "%s",
                  fl_last_error());
    ck_assert_int_eq(fl_msg_check_frames(&h, sizes, 3, 1000, &fault), FL_EPROTO);
    ck_assert_int_eq(fault, FL_FAULT_FRAMES);
    ck_assert_msg(strstr(fl_last_error(), "but 3 arrived"), "%s", fl_last_error());

    sizes[1] = 51;
    ck_assert_int_eq(fl_msg_check_frames(&h, sizes, 2, 1000, &fault), FL_EPROTO);
    ck_assert_int_eq(fault, FL_FAULT_FRAMES);
    ck_assert_msg(strstr(fl_last_error(), "frame 1 declares 50 bytes but 51 arrived"), "%s",
                  fl_last_error());
    sizes[1] = 50;

    /* Wire size over the limit. */
    ck_assert_int_eq(fl_msg_check_frames(&h, sizes, 2, 99, &fault), FL_EPROTO);
    ck_assert_int_eq(fault, FL_FAULT_SIZE);
    ck_assert_msg(strstr(fl_last_error(), "frame 0 of 100 bytes") &&
                      strstr(fl_last_error(), "99-byte limit"),
                  "%s", fl_last_error());
    /* Decoded size over the limit while the wire size is under it. */
    ck_assert_int_eq(fl_msg_check_frames(&h, sizes, 2, 399, &fault), FL_EPROTO);
    ck_assert_int_eq(fault, FL_FAULT_SIZE);
    ck_assert_msg(strstr(fl_last_error(), "frame 1") && strstr(fl_last_error(), "400 decoded"),
                  "%s", fl_last_error());

    /* No frames declared, none arrived. */
    fl_msg_hdr_init(&h, FL_MSG_BARRIER, 1);
    ck_assert_int_eq(fl_msg_check_frames(&h, NULL, 0, 1, &fault), FL_OK);
    ck_assert_int_eq(fl_msg_check_frames(&h, sizes, 1, 1000, &fault), FL_EPROTO);
    ck_assert_int_eq(fault, FL_FAULT_FRAMES);
}
END_TEST

/* ---- names, init, deinit ---- */

START_TEST(test_type_names)
{
    static const char *const names[] = {"register", "welcome",  "barrier", "heartbeat",
                                        "error",    "shutdown", "chunk"};
    for (int t = FL_MSG_REGISTER; t <= FL_MSG_CHUNK; t++)
        if (strcmp(fl_msg_type_name(t), names[t - 1]) != 0)
            ck_abort_msg("type %d is named '%s'", t, fl_msg_type_name(t));
    ck_assert_str_eq(fl_msg_type_name(FL_MSG_NONE), "unknown");
    ck_assert_str_eq(fl_msg_type_name(12), "unknown");
    ck_assert_str_eq(fl_msg_type_name(-1), "unknown");
}
END_TEST

START_TEST(test_hdr_init_defaults)
{
    for (int t = FL_MSG_NONE; t <= FL_MSG_CHUNK; t++) {
        fl_msg_hdr_t h;
        memset(&h, 0xab, sizeof h);
        fl_msg_hdr_init(&h, (fl_msg_type_t)t, 12);
        if (h.version != FL_MSG_VERSION || (int)h.type != t || h.sender != 12 ||
            h.job_id[0] != '\0' || h.generation != 0 || h.seq != 0 || h.step != 0 ||
            h.nframes != 0 || h.frames[0].bytes != 0)
            ck_abort_msg("type %d: header fields not at their defaults", t);
        /* The body is zero apart from the "none" markers. */
        fl_msg_hdr_t zero;
        memset(&zero, 0, sizeof zero);
        if (t == FL_MSG_HEARTBEAT) {
            ck_assert_int_eq(h.u.heartbeat.waiting_on, -1);
            h.u.heartbeat.waiting_on = 0;
        }
        if (t == FL_MSG_ERROR) {
            ck_assert_int_eq(h.u.error.about_rank, -1);
            h.u.error.about_rank = 0;
        }
        if (memcmp(&h.u, &zero.u, sizeof h.u) != 0)
            ck_abort_msg("type %d: body not zeroed", t);
    }
}
END_TEST

START_TEST(test_hdr_deinit)
{
    fl_msg_hdr_deinit(NULL);

    /* A decoded 1000-peer table is freed by deinit (ASan's leak check sees it otherwise). */
    fl_msg_hdr_t h;
    make_welcome(&h, 1000);
    enc_t e;
    encode_ok(&h, &e);
    fl_msg_hdr_deinit(&h);
    ck_assert_ptr_null(h.u.welcome.peers);
    ck_assert_int_eq(h.type, FL_MSG_NONE);

    fl_msg_hdr_t out;
    fl_msg_fault_t fault;
    ck_assert_int_eq(decode_exact(e.buf, e.len, &out, &fault), FL_OK);
    ck_assert_uint_eq(out.u.welcome.npeers, 1000);
    ck_assert_str_eq(out.u.welcome.peers[999].host, "host-999");
    fl_msg_hdr_deinit(&out);
    ck_assert_ptr_null(out.u.welcome.peers);
    ck_assert_uint_eq(out.u.welcome.npeers, 0);
    ck_assert_int_eq(out.type, FL_MSG_NONE);
    fl_msg_hdr_deinit(&out); /* twice is harmless: the header is zeroed */
    free(e.buf);

    /* Non-welcome headers: deinit zeroes them and frees nothing. */
    make_chunk(&h);
    fl_msg_hdr_deinit(&h);
    ck_assert_uint_eq(h.nframes, 0);
    ck_assert_uint_eq(h.u.chunk.total, 0);

    /* welcome_alloc with zero peers leaves no table. */
    fl_msg_hdr_init(&h, FL_MSG_WELCOME, -1);
    ck_assert_int_eq(fl_msg_welcome_alloc(&h, 0), FL_OK);
    ck_assert_ptr_null(h.u.welcome.peers);
    ck_assert_uint_eq(h.u.welcome.npeers, 0);
    fl_msg_hdr_deinit(&h);
}
END_TEST

Suite *msg_encode_suite(void);
Suite *msg_encode_suite(void)
{
    Suite *s = suite_create("msg_encode");
    TCase *t = tcase_create("encode_refusals");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_encode_refusals);
    tcase_add_test(t, test_encode_escapes_free_text);
    tcase_add_test(t, test_encode_no_memory);
    suite_add_tcase(s, t);

    t = tcase_create("frames_and_lifetime");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_check_frames);
    tcase_add_test(t, test_type_names);
    tcase_add_test(t, test_hdr_init_defaults);
    tcase_add_test(t, test_hdr_deinit);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(msg_encode_suite());
}
