/* proto: every message type through encode and decode with every field set, the welcome's peer
 * table, empty and edge values, and text with percent signs arriving as sent. Run under ASan to
 * catch reads outside the buffers and leaked welcome tables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_msg.h"
#include "msgutil.h"

#define SAME(field)                                                                                \
    do {                                                                                           \
        if (a->field != b->field)                                                                  \
            ck_abort_msg("%s: " #field " %lld != %lld", what, (long long)a->field,                 \
                         (long long)b->field);                                                     \
    } while (0)
#define SAME_STR(field)                                                                            \
    do {                                                                                           \
        if (strcmp(a->field, b->field) != 0)                                                       \
            ck_abort_msg("%s: " #field " '%s' != '%s'", what, a->field, b->field);                 \
    } while (0)

static void same_peer(const fl_msg_peer_t *a, const fl_msg_peer_t *b, const char *what)
{
    SAME(rank);
    SAME_STR(host);
    SAME(nendpoints);
    for (uint32_t i = 0; i < a->nendpoints; i++)
        SAME_STR(endpoints[i]);
    SAME(pid);
}

static void same_hdr(const fl_msg_hdr_t *a, const fl_msg_hdr_t *b)
{
    const char *what = fl_msg_type_name(a->type);
    SAME(version);
    SAME_STR(job_id);
    SAME(generation);
    SAME(type);
    SAME(sender);
    SAME(seq);
    SAME(step);
    SAME(nframes);
    for (uint32_t i = 0; i < a->nframes; i++) {
        SAME(frames[i].bytes);
        SAME(frames[i].dtype);
        SAME(frames[i].codec);
        SAME(frames[i].raw_bytes);
    }
    switch (a->type) {
    case FL_MSG_REGISTER:
        SAME(u.reg.rank);
        SAME(u.reg.world_size);
        SAME_STR(u.reg.host);
        SAME(u.reg.nendpoints);
        for (uint32_t i = 0; i < a->u.reg.nendpoints; i++)
            SAME_STR(u.reg.endpoints[i]);
        SAME(u.reg.pid);
        SAME(u.reg.model_signature);
        SAME_STR(u.reg.tuning);
        SAME_STR(u.reg.model_shapes);
        break;
    case FL_MSG_WELCOME:
        SAME(u.welcome.npeers);
        SAME(u.welcome.heartbeat_ms);
        SAME(u.welcome.heartbeat_timeout_ms);
        if ((a->u.welcome.peers == NULL) != (b->u.welcome.peers == NULL))
            ck_abort_msg("welcome: peer table present on one side only");
        for (uint32_t i = 0; i < a->u.welcome.npeers; i++)
            same_peer(&a->u.welcome.peers[i], &b->u.welcome.peers[i], "welcome peer");
        break;
    case FL_MSG_BARRIER:
        SAME(u.barrier.id);
        SAME(u.barrier.round);
        break;
    case FL_MSG_HEARTBEAT:
        SAME(u.heartbeat.op);
        SAME(u.heartbeat.op_seq);
        SAME(u.heartbeat.op_step);
        SAME(u.heartbeat.waiting_on);
        SAME(u.heartbeat.registered);
        SAME_STR(u.heartbeat.missing);
        break;
    case FL_MSG_ERROR:
        SAME(u.error.code);
        SAME(u.error.about_rank);
        SAME_STR(u.error.host);
        SAME_STR(u.error.text);
        break;
    case FL_MSG_SHUTDOWN:
        SAME(u.shutdown.code);
        SAME_STR(u.shutdown.text);
        break;
    case FL_MSG_CHUNK:
        SAME(u.chunk.coll);
        SAME(u.chunk.phase);
        SAME(u.chunk.step);
        SAME(u.chunk.seg);
        SAME(u.chunk.offset);
        SAME(u.chunk.count);
        SAME(u.chunk.op);
        SAME(u.chunk.total);
        break;
    default: ck_abort_msg("unexpected type %d", (int)a->type);
    }
}

static void round_trip(const fl_msg_hdr_t *h)
{
    enc_t e;
    encode_ok(h, &e);
    fl_msg_hdr_t out;
    fl_msg_fault_t fault = FL_FAULT_SIZE;
    int rc = decode_exact(e.buf, e.len, &out, &fault);
    ck_assert_msg(rc == FL_OK, "decode %s: rc %d: %s", fl_msg_type_name(h->type), rc,
                  fl_last_error());
    ck_assert_int_eq(fault, FL_FAULT_NONE);
    same_hdr(h, &out);
    fl_msg_hdr_deinit(&out);
    free(e.buf);
}

START_TEST(test_round_trip_all_types)
{
    for (size_t i = 0; i < NELEM(makers); i++) {
        fl_msg_hdr_t h;
        makers[i](&h);
        round_trip(&h);
        fl_msg_hdr_deinit(&h);
    }
}
END_TEST

START_TEST(test_round_trip_welcome)
{
    static const uint32_t counts[] = {0, 1, 1000};
    for (size_t i = 0; i < NELEM(counts); i++) {
        fl_msg_hdr_t h;
        make_welcome(&h, counts[i]);
        round_trip(&h);
        fl_msg_hdr_deinit(&h);
        ck_assert_ptr_null(h.u.welcome.peers);
    }
}
END_TEST

START_TEST(test_round_trip_empty_and_edge_values)
{
    /* Defaults only: empty strings, no frames, no endpoints. */
    for (int t = FL_MSG_REGISTER; t <= FL_MSG_CHUNK; t++) {
        fl_msg_hdr_t h;
        fl_msg_hdr_init(&h, (fl_msg_type_t)t, 0);
        round_trip(&h);
    }
    /* Longest strings that fit, most endpoints, negative numbers, a missing text. */
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, -1);
    memset(h.job_id, 'j', FL_JOB_MAX - 1);
    memset(h.u.reg.host, 'h', FL_HOST_MAX - 1);
    memset(h.u.reg.tuning, 't', FL_MSG_TUNING_MAX - 1);
    h.u.reg.nendpoints = FL_MSG_MAX_STRIPES;
    for (int i = 0; i < FL_MSG_MAX_STRIPES; i++)
        memset(h.u.reg.endpoints[i], 'a' + i, FL_ENDPOINT_MAX - 1);
    h.u.reg.rank = -2147483647 - 1;
    h.u.reg.world_size = 2147483647;
    h.u.reg.pid = -1;
    h.u.reg.model_signature = UINT64_MAX;
    round_trip(&h);

    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, 4);
    memset(h.u.heartbeat.missing, '9', FL_MSG_MISSING_MAX - 1);
    round_trip(&h);
    fl_msg_hdr_init(&h, FL_MSG_ERROR, 4);
    memset(h.u.error.text, 'e', FL_MSG_TEXT_MAX - 1);
    memset(h.u.error.host, 'h', FL_HOST_MAX - 1);
    h.u.error.code = FL_ENONFINITE;
    round_trip(&h);
}
END_TEST

/* Text fields are data, never formats: '%' must arrive as sent. */
START_TEST(test_round_trip_percent_signs)
{
    static const char text[] = "100%% of %d ranks (%x) at 50% %lu";
    fl_msg_hdr_t h;
    fl_msg_hdr_t out;
    fl_msg_fault_t fault;
    enc_t e;
    char failures[2048] = "";
    static const fl_msg_type_t types[] = {FL_MSG_HEARTBEAT, FL_MSG_ERROR, FL_MSG_SHUTDOWN};
    for (size_t t = 0; t < NELEM(types); t++) {
        fl_msg_hdr_init(&h, types[t], 1);
        snprintf(h.job_id, sizeof h.job_id, "job-%%d-%%x");
        if (types[t] == FL_MSG_HEARTBEAT)
            snprintf(h.u.heartbeat.missing, sizeof h.u.heartbeat.missing, "%s", text);
        if (types[t] == FL_MSG_ERROR) {
            snprintf(h.u.error.host, sizeof h.u.error.host, "host%%d");
            snprintf(h.u.error.text, sizeof h.u.error.text, "%s", text);
        }
        if (types[t] == FL_MSG_SHUTDOWN)
            snprintf(h.u.shutdown.text, sizeof h.u.shutdown.text, "%s", text);
        encode_ok(&h, &e);
        ck_assert_int_eq(decode_exact(e.buf, e.len, &out, &fault), FL_OK);
        free(e.buf);
        const char *sent[2] = {h.job_id, NULL};
        const char *got[2] = {out.job_id, NULL};
        switch (types[t]) {
        case FL_MSG_HEARTBEAT:
            sent[1] = h.u.heartbeat.missing;
            got[1] = out.u.heartbeat.missing;
            break;
        case FL_MSG_ERROR:
            sent[1] = h.u.error.text;
            got[1] = out.u.error.text;
            if (strcmp(h.u.error.host, out.u.error.host) != 0)
                snprintf(failures + strlen(failures), sizeof failures - strlen(failures),
                         " error host '%s' arrived as '%s';", h.u.error.host, out.u.error.host);
            break;
        default:
            sent[1] = h.u.shutdown.text;
            got[1] = out.u.shutdown.text;
            break;
        }
        for (int k = 0; k < 2; k++)
            if (strcmp(sent[k], got[k]) != 0)
                snprintf(failures + strlen(failures), sizeof failures - strlen(failures),
                         " %s %s '%s' arrived as '%s';", fl_msg_type_name(types[t]),
                         k == 0 ? "job id" : "text", sent[k], got[k]);
        fl_msg_hdr_deinit(&out);
    }
    ck_assert_msg(failures[0] == '\0', "text used as a format:%s", failures);
}
END_TEST

Suite *msg_round_trip_suite(void);
Suite *msg_round_trip_suite(void)
{
    Suite *s = suite_create("msg_round_trip");
    TCase *t = tcase_create("round_trip");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_round_trip_all_types);
    tcase_add_test(t, test_round_trip_welcome);
    tcase_add_test(t, test_round_trip_empty_and_edge_values);
    tcase_add_test(t, test_round_trip_percent_signs);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(msg_round_trip_suite());
}
