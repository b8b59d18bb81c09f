/* proto's decoder on header bytes crafted by hand in protobuf wire format: valid ones decoded,
 * a body with every field at its default still present, and every hostile variant refused
 * with the right fault and a detail naming the problem. Run under ASan to catch reads outside
 * the buffers and leaked welcome tables. */
#include <stdlib.h>
#include <string.h>

#include "fl_msg.h"
#include "msgutil.h"

static void pb_frame(pb_t *p, uint64_t bytes, uint64_t dtype, uint64_t codec, uint64_t raw)
{
    pb_t f = {0};
    pb_uint(&f, 1, bytes);
    pb_uint(&f, 2, dtype);
    pb_uint(&f, 3, codec);
    pb_uint(&f, 4, raw);
    pb_sub(p, 9, &f);
}

static void pb_barrier_body(pb_t *p)
{
    pb_t b = {0};
    pb_uint(&b, 1, 5);
    pb_uint(&b, 2, 2);
    pb_sub(p, 18, &b);
}

/* A valid barrier header, the base most hostile variants start from. */
static void pb_barrier(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_BARRIER, 4);
}

static void pb_peer(pb_t *w, int32_t rank, const char *host, int neps, const char *ep)
{
    pb_t q = {0};
    pb_int(&q, 1, rank);
    pb_str(&q, 2, host);
    for (int i = 0; i < neps; i++)
        pb_str(&q, 3, ep);
    pb_int(&q, 4, 100 + rank);
    pb_sub(w, 1, &q);
}

START_TEST(test_crafted_valid)
{
    /* The hand encoder agrees with the library: its valid messages decode as written. */
    pb_t p = {0};
    pb_barrier(&p);
    pb_frame(&p, 400, FL_FLOAT32, FL_CODEC_RAW, 400);
    pb_frame(&p, 10, FL_BFLOAT16, FL_CODEC_LZ4, 64);
    pb_barrier_body(&p);
    fl_msg_hdr_t out;
    fl_msg_fault_t fault;
    ck_assert_int_eq(decode_exact(p.b, p.n, &out, &fault), FL_OK);
    ck_assert_uint_eq(out.version, 1);
    ck_assert_str_eq(out.job_id, "job-x");
    ck_assert_uint_eq(out.generation, 9);
    ck_assert_int_eq(out.type, FL_MSG_BARRIER);
    ck_assert_int_eq(out.sender, 4);
    ck_assert_uint_eq(out.seq, 77);
    ck_assert_uint_eq(out.step, 88);
    ck_assert_uint_eq(out.nframes, 2);
    ck_assert_uint_eq(out.frames[1].bytes, 10);
    ck_assert_uint_eq(out.frames[1].dtype, FL_BFLOAT16);
    ck_assert_uint_eq(out.frames[1].codec, FL_CODEC_LZ4);
    ck_assert_uint_eq(out.frames[1].raw_bytes, 64);
    ck_assert_uint_eq(out.u.barrier.id, 5);
    ck_assert_uint_eq(out.u.barrier.round, 2);
    fl_msg_hdr_deinit(&out);
    free(p.b);

    /* A welcome from the coordinator (sender -1, a ten-byte varint). */
    p = (pb_t){0};
    pb_header(&p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_WELCOME, -1);
    pb_t w = {0};
    pb_peer(&w, 0, "a", 1, "tcp://a:1");
    pb_peer(&w, 1, "b", 2, "tcp://b:1");
    pb_uint(&w, 2, 250);
    pb_sub(&p, 17, &w);
    ck_assert_int_eq(decode_exact(p.b, p.n, &out, &fault), FL_OK);
    ck_assert_int_eq(out.sender, -1);
    ck_assert_uint_eq(out.u.welcome.npeers, 2);
    ck_assert_str_eq(out.u.welcome.peers[1].host, "b");
    ck_assert_uint_eq(out.u.welcome.peers[1].nendpoints, 2);
    ck_assert_str_eq(out.u.welcome.peers[1].endpoints[1], "tcp://b:1");
    ck_assert_int_eq(out.u.welcome.peers[1].pid, 101);
    ck_assert_uint_eq(out.u.welcome.heartbeat_ms, 250);
    fl_msg_hdr_deinit(&out);
    free(p.b);
}
END_TEST

/* A body whose fields are all at their defaults is still a body: its tag and a zero length.
 * The encoder sends it that way and the decoder takes it, for every type. */
START_TEST(test_empty_body_is_present)
{
    for (int t = FL_MSG_REGISTER; t <= FL_MSG_PULL_REPLY; t++) {
        pb_t p = {0};
        pb_header(&p, FL_MSG_MAGIC, FL_MSG_VERSION, (uint64_t)t, 0);
        pb_bytes(&p, 15 + (unsigned)t, "", 0);
        fl_msg_hdr_t out;
        fl_msg_fault_t fault = FL_FAULT_NONE;
        int rc = decode_exact(p.b, p.n, &out, &fault);
        ck_assert_msg(rc == FL_OK, "%s with an empty body: %s", fl_msg_type_name(t),
                      fl_last_error());
        ck_assert_int_eq(out.type, t);
        fl_msg_hdr_deinit(&out);
        free(p.b);
    }
    /* Shutdown code 0 with no text: the header ends with field 21, length 0. */
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, 0);
    enc_t e;
    encode_ok(&h, &e);
    ck_assert_uint_ge(e.len, 3);
    ck_assert_msg(e.buf[e.len - 3] == 0xaa && e.buf[e.len - 2] == 0x01 && e.buf[e.len - 1] == 0,
                  "ends with %02x %02x %02x", e.buf[e.len - 3], e.buf[e.len - 2], e.buf[e.len - 1]);
    free(e.buf);
}
END_TEST

typedef void (*craft_fn)(pb_t *p);

static void c_bad_magic(pb_t *p)
{
    pb_header(p, 0x12345678u, FL_MSG_VERSION, FL_MSG_BARRIER, 1);
    pb_barrier_body(p);
}

static void c_no_magic(pb_t *p)
{
    pb_uint(p, 2, FL_MSG_VERSION);
    pb_uint(p, 5, FL_MSG_BARRIER);
    pb_barrier_body(p);
}

static void c_unknown_type(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, 99, 1);
    pb_barrier_body(p);
}

static void c_type_none(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_NONE, 1);
    pb_barrier_body(p);
}

static void c_no_body(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_CHUNK, 1);
}

static void c_wrong_body(pb_t *p)
{
    pb_barrier(p);
    pb_chunk_body(p);
}

static void c_two_bodies(pb_t *p)
{
    pb_barrier(p);
    pb_barrier_body(p);
    pb_chunk_body(p);
}

static void c_17_frames(pb_t *p)
{
    pb_barrier(p);
    for (int i = 0; i < FL_MSG_MAX_FRAMES + 1; i++)
        pb_frame(p, 8, FL_FLOAT32, FL_CODEC_RAW, 8);
    pb_barrier_body(p);
}

static void c_unknown_dtype(pb_t *p)
{
    pb_barrier(p);
    pb_frame(p, 8, FL_FLOAT32, FL_CODEC_RAW, 8);
    pb_frame(p, 8, 8, FL_CODEC_RAW, 8);
    pb_barrier_body(p);
}

static void c_unknown_codec(pb_t *p)
{
    pb_barrier(p);
    pb_frame(p, 8, FL_FLOAT32, 3, 64); /* 2 is FL_CODEC_SPARSE */
    pb_barrier_body(p);
}

static void c_raw_size_lies(pb_t *p)
{
    pb_barrier(p);
    pb_frame(p, 96, FL_UINT8, FL_CODEC_RAW, 100);
    pb_barrier_body(p);
}

static void c_f32_partial(pb_t *p)
{
    pb_barrier(p);
    pb_frame(p, 50, FL_FLOAT32, FL_CODEC_LZ4, 4098);
    pb_barrier_body(p);
}

static void c_f64_partial_raw(pb_t *p)
{
    pb_barrier(p);
    pb_frame(p, 12, FL_FLOAT64, FL_CODEC_RAW, 12);
    pb_barrier_body(p);
}

static void c_long_job(pb_t *p)
{
    pb_barrier(p);
    pb_str(p, 3, long_str('j', FL_JOB_MAX)); /* the last value of a field wins */
    pb_barrier_body(p);
}

static void c_long_host(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_REGISTER, 2);
    pb_register_body(p, long_str('h', FL_HOST_MAX), 1, "tcp://a:1", "seg=1");
}

static void c_long_endpoint(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_REGISTER, 2);
    pb_register_body(p, "host", 2, long_str('e', FL_ENDPOINT_MAX), "seg=1");
}

static void c_nine_endpoints(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_REGISTER, 2);
    pb_register_body(p, "host", FL_MSG_MAX_STRIPES + 1, "tcp://a:1", "seg=1");
}

static void c_long_tuning(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_REGISTER, 2);
    pb_register_body(p, "host", 1, "tcp://a:1", long_str('t', FL_MSG_TUNING_MAX));
}

/* A register body declaring settings (field 18). */
static void pb_register_settings(pb_t *p, const char *settings)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_REGISTER, 2);
    pb_t r = {0};
    pb_int(&r, 1, 2);
    pb_int(&r, 2, 4);
    pb_str(&r, 3, "host");
    pb_str(&r, 4, "tcp://a:1");
    pb_str(&r, 18, settings);
    pb_sub(p, 16, &r);
}

static void c_settings_not_pairs(pb_t *p)
{
    pb_register_settings(p, "lr=0.1;batch 64");
}

static void c_settings_bad_name(pb_t *p)
{
    pb_register_settings(p, "lr=0.1;Batch=64");
}

static void c_long_settings(pb_t *p)
{
    pb_register_settings(p, long_str('s', FL_MSG_SETTINGS_MAX));
}

static void c_long_peer_host(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_WELCOME, -1);
    pb_t w = {0};
    pb_peer(&w, 0, "a", 1, "tcp://a:1");
    pb_peer(&w, 1, long_str('h', FL_HOST_MAX), 1, "tcp://b:1");
    pb_peer(&w, 2, "c", 1, "tcp://c:1");
    pb_sub(p, 17, &w);
}

static void c_long_peer_endpoint(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_WELCOME, -1);
    pb_t w = {0};
    pb_peer(&w, 0, "a", 1, "tcp://a:1");
    pb_peer(&w, 1, "b", 3, long_str('e', FL_ENDPOINT_MAX + 10));
    pb_sub(p, 17, &w);
}

static void c_peer_nine_endpoints(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_WELCOME, -1);
    pb_t w = {0};
    pb_peer(&w, 0, "a", FL_MSG_MAX_STRIPES + 1, "tcp://a:1");
    pb_sub(p, 17, &w);
}

static void c_too_many_peers(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_WELCOME, -1);
    pb_t w = {0};
    static const uint8_t empty_peer[] = {0x0a, 0x00}; /* field 1, length 0 */
    for (int i = 0; i < FL_MSG_MAX_PEERS + 1; i++)
        pb_raw(&w, empty_peer, sizeof empty_peer);
    pb_sub(p, 17, &w);
}

static void c_not_protobuf(pb_t *p)
{
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff};
    pb_raw(p, junk, sizeof junk);
}

static void c_wrong_wire_type(pb_t *p)
{
    pb_tag(p, 1, WT_LEN); /* magic as a string */
    pb_varint(p, 4);
    pb_raw(p, "FLDL", 4);
    pb_uint(p, 2, FL_MSG_VERSION);
    pb_uint(p, 5, FL_MSG_BARRIER);
    pb_barrier_body(p);
}

static void c_length_past_end(pb_t *p)
{
    pb_barrier(p);
    pb_tag(p, 3, WT_LEN);
    pb_varint(p, 1000); /* a job id said to be 1000 bytes, with 3 present */
    pb_raw(p, "abc", 3);
}

/* Strings that break the wire-text rule: not UTF-8, a control character, a NUL inside. */
static void c_host_not_utf8(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_REGISTER, 2);
    pb_register_body(p, "node-\xff\xfe", 1, "tcp://a:1", "seg=1");
}

static void c_host_newline(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_REGISTER, 2);
    pb_register_body(p, "evil\n[0.000 ps] error: rank 1 (host-1) declared dead", 1, "tcp://a:1",
                     "seg=1");
}

static void c_shutdown_newline(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_SHUTDOWN, 2);
    pb_t b = {0};
    pb_str(&b, 2, "bye\n[0.000 ps] error: rank 1 (host-1) declared dead");
    pb_sub(p, 21, &b);
}

static void c_job_nul(pb_t *p)
{
    pb_barrier(p);
    pb_bytes(p, 3, "flodl\0evil", 10); /* the last value of a field wins */
    pb_barrier_body(p);
}

static void c_endpoint_overlong(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_REGISTER, 2);
    pb_register_body(p, "host", 2, "tcp://\xc0\xaf:1", "seg=1");
}

static void c_tuning_c1(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_REGISTER, 2);
    pb_register_body(p, "host", 1, "tcp://a:1",
                     "seg=1\xc2\x9b"
                     "2J");
}

static void c_peer_host_escape(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_WELCOME, -1);
    pb_t w = {0};
    pb_peer(&w, 0, "a", 1, "tcp://a:1");
    pb_peer(&w, 1, "b\x1b[2J", 1, "tcp://b:1");
    pb_sub(p, 17, &w);
}

static void c_error_text_surrogate(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_ERROR, -1);
    pb_t b = {0};
    pb_int(&b, 1, FL_EIO);
    pb_str(&b, 4, "bad \xed\xa0\x80 text");
    pb_sub(p, 20, &b);
}

static void c_error_host_nul(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_ERROR, -1);
    pb_t b = {0};
    pb_bytes(&b, 3, "h\0", 2);
    pb_sub(p, 20, &b);
}

static void c_missing_tab(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_HEARTBEAT, -1);
    pb_t b = {0};
    pb_str(&b, 6, "1,2\t3");
    pb_sub(p, 19, &b);
}

static void c_text_after_cap(pb_t *p)
{
    /* Free text is cut to its field, but all of it must obey the rule. */
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_SHUTDOWN, 2);
    char text[FL_MSG_TEXT_MAX + 8];
    memset(text, 'x', sizeof text);
    text[FL_MSG_TEXT_MAX + 4] = '\x7f';
    pb_t b = {0};
    pb_bytes(&b, 2, text, sizeof text);
    pb_sub(p, 21, &b);
}

static const struct {
    const char *name;
    craft_fn craft;
    fl_msg_fault_t fault;
    const char *says;
} refusals[] = {
    {"bad magic", c_bad_magic, FL_FAULT_MAGIC, "magic 0x12345678"},
    {"no magic", c_no_magic, FL_FAULT_MAGIC, "magic 0x00000000"},
    {"unknown type", c_unknown_type, FL_FAULT_HEADER, "unknown message type 99"},
    {"type none", c_type_none, FL_FAULT_HEADER, "unknown message type 0"},
    {"no body", c_no_body, FL_FAULT_HEADER, "chunk message without its body"},
    {"wrong body", c_wrong_body, FL_FAULT_HEADER, "barrier message with a chunk body"},
    {"two bodies", c_two_bodies, FL_FAULT_HEADER, "barrier message with 2 bodies"},
    {"17 frames", c_17_frames, FL_FAULT_FRAMES, "17 frames"},
    {"unknown dtype", c_unknown_dtype, FL_FAULT_FRAMES, "unknown dtype 8"},
    {"unknown codec", c_unknown_codec, FL_FAULT_FRAMES, "unknown codec 3"},
    {"raw size lies", c_raw_size_lies, FL_FAULT_FRAMES, "raw frame declares 100 decoded bytes"},
    {"float32 partial", c_f32_partial, FL_FAULT_FRAMES, "float32 frame of 4098 bytes"},
    {"float64 partial", c_f64_partial_raw, FL_FAULT_FRAMES, "float64 frame of 12 bytes"},
    {"long job id", c_long_job, FL_FAULT_HEADER, "job id of 64 bytes"},
    {"long host", c_long_host, FL_FAULT_HEADER, "host of 256 bytes"},
    {"long endpoint", c_long_endpoint, FL_FAULT_HEADER, "endpoint of 256 bytes"},
    {"nine endpoints", c_nine_endpoints, FL_FAULT_HEADER, "endpoint list of 9 entries"},
    {"long tuning", c_long_tuning, FL_FAULT_HEADER, "tuning of 512 bytes"},
    {"settings not pairs", c_settings_not_pairs, FL_FAULT_HEADER, "'batch 64' is not name=value"},
    {"settings bad name", c_settings_bad_name, FL_FAULT_HEADER, "'Batch=64' is not name=value"},
    {"long settings", c_long_settings, FL_FAULT_HEADER, "settings of 2048 bytes"},
    {"long peer host", c_long_peer_host, FL_FAULT_HEADER, "peer host of 256 bytes"},
    {"long peer endpoint", c_long_peer_endpoint, FL_FAULT_HEADER, "endpoint of 266 bytes"},
    {"peer nine endpoints", c_peer_nine_endpoints, FL_FAULT_HEADER, "endpoint list of 9"},
    {"too many peers", c_too_many_peers, FL_FAULT_HEADER, "peer table of 65537 entries"},
    {"not protobuf", c_not_protobuf, FL_FAULT_HEADER, "4 bytes do not parse"},
    {"wrong wire type", c_wrong_wire_type, FL_FAULT_HEADER, "do not parse"},
    {"length past end", c_length_past_end, FL_FAULT_HEADER, "do not parse"},
    {"host not UTF-8", c_host_not_utf8, FL_FAULT_HEADER,
     "Register.host has bytes that are not UTF-8 at byte 5 of 7"},
    {"newline in host", c_host_newline, FL_FAULT_HEADER,
     "Register.host has a control character at byte 4"},
    {"newline in shutdown text", c_shutdown_newline, FL_FAULT_HEADER,
     "Shutdown.text has a control character at byte 3"},
    {"NUL in job id", c_job_nul, FL_FAULT_HEADER, "Header.job_id has a NUL byte at byte 5 of 10"},
    {"overlong in endpoint", c_endpoint_overlong, FL_FAULT_HEADER,
     "Register.endpoints has bytes that are not UTF-8 at byte 6"},
    {"C1 control in tuning", c_tuning_c1, FL_FAULT_HEADER,
     "Register.tuning has a control character at byte 5"},
    {"escape in peer host", c_peer_host_escape, FL_FAULT_HEADER,
     "Peer.host has a control character at byte 1"},
    {"surrogate in error text", c_error_text_surrogate, FL_FAULT_HEADER,
     "Error.text has bytes that are not UTF-8 at byte 4"},
    {"NUL in error host", c_error_host_nul, FL_FAULT_HEADER, "Error.host has a NUL byte at byte 1"},
    {"tab in missing", c_missing_tab, FL_FAULT_HEADER,
     "Heartbeat.missing has a control character at byte 3"},
    {"DEL past the text cap", c_text_after_cap, FL_FAULT_HEADER,
     "Shutdown.text has a control character at byte 516"},
};

START_TEST(test_decode_refusals)
{
    size_t i = (size_t)_i;
    pb_t p = {0};
    refusals[i].craft(&p);
    fl_msg_hdr_t out;
    fl_msg_fault_t fault = FL_FAULT_NONE;
    fl_error_clear();
    int rc = decode_exact(p.b, p.n, &out, &fault);
    free(p.b);
    ck_assert_msg(rc == FL_EPROTO, "%s: rc %d (%s)", refusals[i].name, rc, fl_last_error());
    ck_assert_msg(fault == refusals[i].fault, "%s: fault %d, expected %d (%s)", refusals[i].name,
                  (int)fault, (int)refusals[i].fault, fl_last_error());
    ck_assert_msg(strstr(fl_last_error(), refusals[i].says) != NULL,
                  "%s: detail '%s' does not say '%s'", refusals[i].name, fl_last_error(),
                  refusals[i].says);
    /* A refused welcome keeps no half-built peer table. */
    if (out.type == FL_MSG_WELCOME)
        ck_assert_msg(out.u.welcome.peers == NULL && out.u.welcome.npeers == 0,
                      "%s: peer table left behind", refusals[i].name);
    fl_msg_hdr_deinit(&out);
}
END_TEST

Suite *msg_decode_suite(void);
Suite *msg_decode_suite(void)
{
    Suite *s = suite_create("msg_decode");
    TCase *t = tcase_create("decode_refusals");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_crafted_valid);
    tcase_add_test(t, test_empty_body_is_present);
    tcase_add_loop_test(t, test_decode_refusals, 0, (int)NELEM(refusals));
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(msg_decode_suite());
}
