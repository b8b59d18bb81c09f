/* proto's decoder on hostile bytes: every truncated prefix of each message, garbage, and valid
 * encodings with one byte changed at every position never crash, and a header decode accepts
 * holds only what decode promises. Run under ASan to catch reads outside the buffers. */
#include <stdlib.h>
#include <string.h>

#include "fl_msg.h"
#include "msgutil.h"

/* A decoded header that claims success must hold only what decode promises. */
static void check_consistent(const fl_msg_hdr_t *h, const char *what)
{
    if (h->version != FL_MSG_VERSION || h->type < FL_MSG_REGISTER || h->type > FL_MSG_CHUNK ||
        h->nframes > FL_MSG_MAX_FRAMES || strnlen(h->job_id, FL_JOB_MAX) >= FL_JOB_MAX)
        ck_abort_msg("%s: accepted version %u type %d with %u frames", what, h->version,
                     (int)h->type, h->nframes);
    for (uint32_t i = 0; i < h->nframes; i++) {
        const fl_msg_frame_t *f = &h->frames[i];
        if ((f->dtype != 0 && !fl_dtype_is_valid((int)f->dtype)) || f->codec > FL_CODEC_LZ4 ||
            (f->codec == FL_CODEC_RAW && f->raw_bytes != f->bytes))
            ck_abort_msg("%s: accepted frame %u (dtype %u codec %u)", what, i, f->dtype, f->codec);
    }
    if (h->type == FL_MSG_WELCOME && (h->u.welcome.npeers == 0) != (h->u.welcome.peers == NULL))
        ck_abort_msg("%s: welcome with %u peers and table %p", what, h->u.welcome.npeers,
                     (void *)h->u.welcome.peers);
    /* Everything decode accepts, encode must accept too (every bound holds). */
    enc_t e;
    memset(&e, 0, sizeof e);
    int rc = fl_msg_encode(h, alloc_malloc, &e, &e.len);
    if (rc != FL_OK)
        ck_abort_msg("%s: decoded header does not re-encode: %s", what, fl_last_error());
    free(e.buf);
}

START_TEST(test_decode_truncated_prefixes)
{
    for (size_t m = 0; m < NELEM(makers); m++) {
        fl_msg_hdr_t h;
        makers[m](&h);
        enc_t e;
        encode_ok(&h, &e);
        long refused = 0;
        for (size_t len = 0; len < e.len; len++) {
            fl_msg_hdr_t out;
            fl_msg_fault_t fault = FL_FAULT_NONE;
            int rc = decode_exact(e.buf, len, &out, &fault);
            if (rc == FL_OK) {
                check_consistent(&out, fl_msg_type_name(h.type));
            } else {
                if (rc != FL_EPROTO || fault == FL_FAULT_NONE || fl_last_error()[0] == '\0')
                    ck_abort_msg("%s cut to %zu of %zu bytes: rc %d fault %d",
                                 fl_msg_type_name(h.type), len, e.len, rc, (int)fault);
                refused++;
            }
            fl_msg_hdr_deinit(&out);
        }
        /* Most cuts land inside a field or before the body: refusals must dominate. */
        if (refused < (long)e.len / 2)
            ck_abort_msg("%s: only %ld of %zu prefixes refused", fl_msg_type_name(h.type), refused,
                         e.len);
        free(e.buf);
        fl_msg_hdr_deinit(&h);
    }
}
END_TEST

START_TEST(test_decode_garbage)
{
    uint8_t buf[512];
    long accepted = 0;
    for (uint64_t seed = 1; seed <= 20000; seed++) {
        uint64_t s = seed;
        size_t len = (size_t)(fl_test_rand(&s) % sizeof buf);
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)fl_test_rand(&s);
        if (seed % 2 == 0 && len >= 8) {
            /* Half start with a valid magic and version, to get past the first checks. */
            static const uint8_t prefix[] = {0x0d, 0x46, 0x4c, 0x44, 0x4c, 0x10, 0x01};
            memcpy(buf, prefix, sizeof prefix);
        }
        fl_msg_hdr_t out;
        fl_msg_fault_t fault = FL_FAULT_NONE;
        int rc = decode_exact(buf, len, &out, &fault);
        if (rc == FL_OK) {
            check_consistent(&out, "garbage");
            accepted++;
        } else if (rc != FL_EPROTO || fault == FL_FAULT_NONE) {
            ck_abort_msg("seed %llu (%zu bytes): rc %d fault %d", (unsigned long long)seed, len, rc,
                         (int)fault);
        }
        fl_msg_hdr_deinit(&out);
    }
    ck_assert_int_lt(accepted, 100);
}
END_TEST

START_TEST(test_decode_mutations)
{
    /* Valid encodings with one byte changed at every position: the wire format's own checks
     * and decode's bounds must hold for near-valid input too. */
    for (size_t m = 0; m < NELEM(makers); m++) {
        fl_msg_hdr_t h;
        makers[m](&h);
        enc_t e;
        encode_ok(&h, &e);
        static const uint8_t xors[] = {0x01, 0x80, 0xff, 0x7f};
        for (size_t pos = 0; pos < e.len; pos++) {
            for (size_t k = 0; k < NELEM(xors); k++) {
                e.buf[pos] ^= xors[k];
                fl_msg_hdr_t out;
                fl_msg_fault_t fault = FL_FAULT_NONE;
                int rc = decode_exact(e.buf, e.len, &out, &fault);
                if (rc == FL_OK)
                    check_consistent(&out, "mutation");
                else if (rc != FL_EPROTO || fault == FL_FAULT_NONE)
                    ck_abort_msg("%s, byte %zu ^ 0x%02x: rc %d fault %d", fl_msg_type_name(h.type),
                                 pos, xors[k], rc, (int)fault);
                fl_msg_hdr_deinit(&out);
                e.buf[pos] ^= xors[k];
            }
        }
        free(e.buf);
        fl_msg_hdr_deinit(&h);
    }
}
END_TEST

/* A byte buffer grown by the wire writers below. */
typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
} wbuf_t;

static void put(wbuf_t *b, const void *data, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_varint(wbuf_t *b, uint64_t v)
{
    uint8_t one[10];
    size_t n = 0;
    do {
        one[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v > 0);
    put(b, one, n);
}

/* A heartbeat header's first fields (magic, version, job, type) and nframes frame
 * descriptions of one byte each. */
static void frame_flood(wbuf_t *b, size_t nframes)
{
    static const uint8_t head[] = {0x0d, 0x46, 0x4c, 0x44, 0x4c, 0x10, 0x01, 0x1a,
                                   0x05, 'f',  'l',  'o',  'd',  'l',  0x28, 0x04};
    static const uint8_t frame[] = {0x4a, 0x04, 0x08, 0x01, 0x20, 0x01}; /* bytes 1, raw 1 */
    put(b, head, sizeof head);
    for (size_t i = 0; i < nframes; i++)
        put(b, frame, sizeof frame);
}

/* The frame count is refused on the raw bytes, at the 17th frame, before protobuf-c unpacks
 * (and allocates for) the rest: a header with 17 frames and bytes that do not parse after
 * them is refused for its frames, which only a walk ahead of unpacking can see; and one of
 * 400,000 frames the same way. */
START_TEST(test_decode_frame_count_before_unpack)
{
    wbuf_t b = {NULL, 0, 0};
    frame_flood(&b, FL_MSG_MAX_FRAMES + 1);
    static const uint8_t past_end[] = {0x62, 0x7f}; /* a body of 127 bytes, none there */
    put(&b, past_end, sizeof past_end);
    fl_msg_hdr_t out;
    fl_msg_fault_t fault = FL_FAULT_NONE;
    ck_assert_int_eq(fl_msg_decode(b.p, b.len, &out, &fault), FL_EPROTO);
    ck_assert_msg(fault == FL_FAULT_FRAMES, "fault %d (%s): the frames were not counted first",
                  (int)fault, fl_last_error());
    ck_assert_msg(strstr(fl_last_error(), "17 frames or more") != NULL, "%s", fl_last_error());
    fl_msg_hdr_deinit(&out);

    b.len = 0;
    frame_flood(&b, 400000);
    ck_assert_int_eq(fl_msg_decode(b.p, b.len, &out, &fault), FL_EPROTO);
    ck_assert_int_eq(fault, FL_FAULT_FRAMES);
    fl_msg_hdr_deinit(&out);
    free(b.p);
}
END_TEST

/* Every other list the same way: a register with 17 checkpoint steps (a packed list) and
 * bytes that do not parse after them is refused for the list. */
START_TEST(test_decode_list_count_before_unpack)
{
    wbuf_t b = {NULL, 0, 0};
    static const uint8_t head[] = {0x0d, 0x46, 0x4c, 0x44, 0x4c, 0x10, 0x01, 0x1a,
                                   0x05, 'f',  'l',  'o',  'd',  'l',  0x28, 0x01};
    put(&b, head, sizeof head);
    wbuf_t reg = {NULL, 0, 0};
    put_varint(&reg, (13 << 3) | 2); /* Register.checkpoints, packed */
    put_varint(&reg, FL_MSG_MAX_CHECKPOINTS + 1);
    for (int i = 0; i <= FL_MSG_MAX_CHECKPOINTS; i++)
        put_varint(&reg, (uint64_t)i + 1);
    put_varint(&b, (16 << 3) | 2); /* Header.reg */
    put_varint(&b, reg.len);
    put(&b, reg.p, reg.len);
    static const uint8_t past_end[] = {0x1a, 0x7f}; /* a job id of 127 bytes, none there */
    put(&b, past_end, sizeof past_end);
    fl_msg_hdr_t out;
    fl_msg_fault_t fault = FL_FAULT_NONE;
    ck_assert_int_eq(fl_msg_decode(b.p, b.len, &out, &fault), FL_EPROTO);
    ck_assert_msg(strstr(fl_last_error(), "checkpoint list of 17 entries or more") != NULL, "%s",
                  fl_last_error());
    fl_msg_hdr_deinit(&out);
    free(reg.p);
    free(b.p);
}
END_TEST

Suite *msg_hostile_suite(void);
Suite *msg_hostile_suite(void)
{
    Suite *s = suite_create("msg_hostile");
    TCase *t = tcase_create("decode_hostile");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_decode_truncated_prefixes);
    tcase_add_test(t, test_decode_garbage);
    tcase_add_test(t, test_decode_mutations);
    tcase_add_test(t, test_decode_frame_count_before_unpack);
    tcase_add_test(t, test_decode_list_count_before_unpack);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(msg_hostile_suite());
}
