/* proto/: the parameter-server messages (push, push-ack, pull, pull-reply) and the parts of
 * register and welcome the parameter server uses (server role, shard endpoints, checkpoints,
 * shard map): round trips, the tables' ownership, and refusals of what a receiver must never
 * see (unknown role, consistency or push kind, oversized tables). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flodl.pb-c.h"
#include "fl_msg.h"
#include "testutil.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* The encoder hands out memory through alloc(len, ud); keep it in a struct. */
typedef struct enc {
    void *buf;
    size_t len;
} enc_t;

static void *alloc_enc(size_t len, void *ud)
{
    enc_t *e = ud;
    e->buf = malloc(len ? len : 1);
    return e->buf;
}

static void round_trip(const fl_msg_hdr_t *h, fl_msg_hdr_t *out)
{
    enc_t e = {NULL, 0};
    int rc = fl_msg_encode(h, alloc_enc, &e, &e.len);
    ck_assert_msg(rc == FL_OK, "encode %s: %s", fl_msg_type_name(h->type), fl_last_error());
    fl_msg_fault_t fault = FL_FAULT_SIZE;
    rc = fl_msg_decode(e.buf, e.len, out, &fault);
    ck_assert_msg(rc == FL_OK, "decode %s: %s", fl_msg_type_name(h->type), fl_last_error());
    ck_assert_int_eq(fault, FL_FAULT_NONE);
    ck_assert_int_eq(out->type, h->type);
    ck_assert_int_eq(out->sender, h->sender);
    free(e.buf);
}

static void make_server_register(fl_msg_hdr_t *h, uint32_t nshards, uint32_t nckpt)
{
    fl_msg_hdr_init(h, FL_MSG_REGISTER, FL_MSG_SENDER_SERVER);
    snprintf(h->job_id, sizeof h->job_id, "job-ps");
    fl_msg_register_t *r = &h->u.reg;
    r->role = FL_ROLE_SERVER;
    r->rank = 4;
    snprintf(r->host, sizeof r->host, "ps-1.cluster.local");
    r->pid = 4242;
    snprintf(r->tuning, sizeof r->tuning, "opt=adamw,lr=0.001,wd=0.01");
    r->param_count = 0x1234567890ULL;
    r->shard_count = nshards;
    r->num_shards = 4 + nshards;
    ck_assert_int_eq(fl_msg_register_alloc_shards(r, nshards), FL_OK);
    for (uint32_t i = 0; i < nshards; i++)
        snprintf(r->shard_eps[i], FL_ENDPOINT_MAX, "tcp://10.1.2.3:%u", 50000 + i);
    r->ncheckpoints = nckpt;
    for (uint32_t i = 0; i < nckpt; i++)
        r->checkpoints[i] = 1000 - 100 * (uint64_t)i;
    r->consistency = 2;
    r->staleness = 3;
    r->ckpt_every_steps = 500;
    r->ckpt_every_ms = 60000;
}

START_TEST(test_server_register_round_trip)
{
    static const uint32_t counts[] = {0, 1, 7, 300};
    for (size_t c = 0; c < NELEM(counts); c++) {
        fl_msg_hdr_t h, out;
        make_server_register(&h, counts[c], counts[c] % (FL_MSG_MAX_CHECKPOINTS + 1));
        round_trip(&h, &out);
        const fl_msg_register_t *a = &h.u.reg, *b = &out.u.reg;
        ck_assert_int_eq(b->role, FL_ROLE_SERVER);
        ck_assert_int_eq(b->rank, 4);
        ck_assert_str_eq(b->host, a->host);
        ck_assert_str_eq(b->tuning, a->tuning);
        ck_assert_uint_eq(b->param_count, a->param_count);
        ck_assert_uint_eq(b->shard_count, a->shard_count);
        ck_assert_uint_eq(b->num_shards, a->num_shards);
        ck_assert_uint_eq(b->nshard_eps, a->nshard_eps);
        int eps_differ = 0;
        for (uint32_t i = 0; i < a->nshard_eps; i++)
            eps_differ += strcmp(a->shard_eps[i], b->shard_eps[i]) != 0;
        ck_assert_int_eq(eps_differ, 0);
        ck_assert_uint_eq(b->ncheckpoints, a->ncheckpoints);
        ck_assert_int_eq(memcmp(a->checkpoints, b->checkpoints,
                                a->ncheckpoints * sizeof a->checkpoints[0]),
                         0);
        ck_assert_uint_eq(b->consistency, 2);
        ck_assert_uint_eq(b->staleness, 3);
        ck_assert_uint_eq(b->ckpt_every_steps, 500);
        ck_assert_uint_eq(b->ckpt_every_ms, 60000);
        if (counts[c] == 0)
            ck_assert_ptr_null(b->shard_eps);
        fl_msg_hdr_deinit(&out);
        fl_msg_hdr_deinit(&h);
        ck_assert_ptr_null(h.u.reg.shard_eps);
    }
}
END_TEST

START_TEST(test_worker_register_keeps_ps_fields)
{
    fl_msg_hdr_t h, out;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, 3);
    h.u.reg.rank = 3;
    h.u.reg.world_size = 8;
    h.u.reg.param_count = 203530;
    h.u.reg.nendpoints = 1;
    snprintf(h.u.reg.endpoints[0], FL_ENDPOINT_MAX, "tcp://127.0.0.1:4000");
    round_trip(&h, &out);
    ck_assert_int_eq(out.u.reg.role, FL_ROLE_WORKER);
    ck_assert_uint_eq(out.u.reg.param_count, 203530);
    ck_assert_uint_eq(out.u.reg.nshard_eps, 0);
    ck_assert_ptr_null(out.u.reg.shard_eps);
    fl_msg_hdr_deinit(&out);
}
END_TEST

static void make_ps_welcome(fl_msg_hdr_t *h, uint32_t npeers, uint32_t nshards)
{
    fl_msg_hdr_init(h, FL_MSG_WELCOME, -1);
    ck_assert_int_eq(fl_msg_welcome_alloc(h, npeers), FL_OK);
    for (uint32_t i = 0; i < npeers; i++) {
        h->u.welcome.peers[i].rank = (int32_t)i;
        snprintf(h->u.welcome.peers[i].host, FL_HOST_MAX, "w%u", i);
    }
    ck_assert_int_eq(fl_msg_welcome_alloc_shards(h, nshards), FL_OK);
    for (uint32_t i = 0; i < nshards; i++) {
        fl_msg_shard_t *s = &h->u.welcome.shards[i];
        s->index = i;
        s->offset = (uint64_t)i * 0x100000000ULL; /* beyond 32 bits */
        s->count = i % 3 == 2 ? 0 : 1000 + i;     /* empty shards included */
        snprintf(s->endpoint, sizeof s->endpoint, "tcp://ps-%u:%u", i % 4, 6000 + i);
        snprintf(s->host, sizeof s->host, "ps-%u", i % 4);
    }
    h->u.welcome.heartbeat_ms = 100;
    h->u.welcome.heartbeat_timeout_ms = 1000;
    h->u.welcome.param_count = 0x7fffffffffULL;
    h->u.welcome.consistency = 1;
    h->u.welcome.staleness = 9;
    h->u.welcome.resume = true;
    h->u.welcome.resume_step = 77;
    h->u.welcome.ckpt_every_steps = 10;
    h->u.welcome.ckpt_every_ms = 30000;
}

START_TEST(test_welcome_shard_map_round_trip)
{
    static const uint32_t shards[] = {0, 1, 5, FL_MSG_MAX_SHARDS};
    for (size_t c = 0; c < NELEM(shards); c++) {
        fl_msg_hdr_t h, out;
        make_ps_welcome(&h, 3, shards[c]);
        round_trip(&h, &out);
        const fl_msg_welcome_t *a = &h.u.welcome, *b = &out.u.welcome;
        ck_assert_uint_eq(b->npeers, 3);
        ck_assert_str_eq(b->peers[2].host, "w2");
        ck_assert_uint_eq(b->nshards, a->nshards);
        int differ = 0;
        for (uint32_t i = 0; i < a->nshards; i++) {
            const fl_msg_shard_t *x = &a->shards[i], *y = &b->shards[i];
            differ += x->index != y->index || x->offset != y->offset || x->count != y->count ||
                      strcmp(x->endpoint, y->endpoint) != 0 || strcmp(x->host, y->host) != 0;
        }
        ck_assert_int_eq(differ, 0);
        ck_assert_uint_eq(b->param_count, a->param_count);
        ck_assert_uint_eq(b->consistency, 1);
        ck_assert_uint_eq(b->staleness, 9);
        ck_assert(b->resume);
        ck_assert_uint_eq(b->resume_step, 77);
        ck_assert_uint_eq(b->ckpt_every_steps, 10);
        ck_assert_uint_eq(b->ckpt_every_ms, 30000);
        fl_msg_hdr_deinit(&out);
        fl_msg_hdr_deinit(&h);
    }
}
END_TEST

START_TEST(test_push_pull_round_trip)
{
    fl_msg_hdr_t h, out;

    fl_msg_hdr_init(&h, FL_MSG_PUSH, 7);
    h.nframes = 1;
    h.frames[0] = (fl_msg_frame_t){4000, FL_FLOAT16, FL_CODEC_LZ4, 8192};
    h.u.push = (fl_msg_push_t){3, 0x200000000ULL, 4096, 123456789012ULL, 64, FL_PUSH_INIT, true};
    round_trip(&h, &out);
    ck_assert_uint_eq(out.u.push.shard, 3);
    ck_assert_uint_eq(out.u.push.offset, 0x200000000ULL);
    ck_assert_uint_eq(out.u.push.count, 4096);
    ck_assert_uint_eq(out.u.push.step, 123456789012ULL);
    ck_assert_uint_eq(out.u.push.batch, 64);
    ck_assert_int_eq(out.u.push.kind, FL_PUSH_INIT);
    ck_assert(out.u.push.checkpoint);
    ck_assert_uint_eq(out.nframes, 1);
    ck_assert_uint_eq(out.frames[0].raw_bytes, 8192);
    fl_msg_hdr_deinit(&out);

    fl_msg_hdr_init(&h, FL_MSG_PUSH_ACK, FL_MSG_SENDER_SERVER);
    h.u.push_ack = (fl_msg_push_ack_t){5, 99, 1000, true};
    round_trip(&h, &out);
    ck_assert_uint_eq(out.u.push_ack.shard, 5);
    ck_assert_uint_eq(out.u.push_ack.step, 99);
    ck_assert_uint_eq(out.u.push_ack.version, 1000);
    ck_assert(out.u.push_ack.ignored);
    ck_assert_int_eq(out.sender, FL_MSG_SENDER_SERVER);

    fl_msg_hdr_init(&h, FL_MSG_PULL, 0);
    h.u.pull = (fl_msg_pull_t){1, 16, 32, 5, true, 120000, true};
    round_trip(&h, &out);
    ck_assert_uint_eq(out.u.pull.shard, 1);
    ck_assert_uint_eq(out.u.pull.offset, 16);
    ck_assert_uint_eq(out.u.pull.count, 32);
    ck_assert_uint_eq(out.u.pull.step, 5);
    ck_assert(out.u.pull.latest);
    ck_assert_uint_eq(out.u.pull.wait_ms, 120000);
    ck_assert(out.u.pull.lz4);

    fl_msg_hdr_init(&h, FL_MSG_PULL_REPLY, FL_MSG_SENDER_SERVER);
    h.nframes = 1;
    h.frames[0] = (fl_msg_frame_t){128, FL_FLOAT32, FL_CODEC_RAW, 128};
    h.u.pull_reply = (fl_msg_pull_reply_t){2, 64, 32, 17, 6, 4};
    round_trip(&h, &out);
    ck_assert_uint_eq(out.u.pull_reply.shard, 2);
    ck_assert_uint_eq(out.u.pull_reply.offset, 64);
    ck_assert_uint_eq(out.u.pull_reply.count, 32);
    ck_assert_uint_eq(out.u.pull_reply.version, 17);
    ck_assert_uint_eq(out.u.pull_reply.step, 6);
    ck_assert_uint_eq(out.u.pull_reply.min_step, 4);
}
END_TEST

START_TEST(test_copy_is_deep)
{
    fl_msg_hdr_t h, c;
    make_ps_welcome(&h, 4, 6);
    ck_assert_int_eq(fl_msg_hdr_copy(&c, &h), FL_OK);
    ck_assert_ptr_ne(c.u.welcome.peers, h.u.welcome.peers);
    ck_assert_ptr_ne(c.u.welcome.shards, h.u.welcome.shards);
    fl_msg_hdr_deinit(&h); /* the copy must survive the original */
    ck_assert_str_eq(c.u.welcome.peers[3].host, "w3");
    ck_assert_str_eq(c.u.welcome.shards[5].host, "ps-1");
    ck_assert_uint_eq(c.u.welcome.resume_step, 77);
    fl_msg_hdr_deinit(&c);

    make_server_register(&h, 3, 2);
    ck_assert_int_eq(fl_msg_hdr_copy(&c, &h), FL_OK);
    ck_assert_ptr_ne(c.u.reg.shard_eps, h.u.reg.shard_eps);
    fl_msg_hdr_deinit(&h);
    ck_assert_str_eq(c.u.reg.shard_eps[2], "tcp://10.1.2.3:50002");
    fl_msg_hdr_deinit(&c);
}
END_TEST

/* ---- refusals: headers built with protobuf-c directly, as a hostile peer would ---- */

static int decode_pb(Flodl__Header *ph, fl_msg_hdr_t *out, fl_msg_fault_t *fault)
{
    size_t n = protobuf_c_message_get_packed_size(&ph->base);
    uint8_t *buf = malloc(n ? n : 1);
    protobuf_c_message_pack(&ph->base, buf);
    int rc = fl_msg_decode(buf, n, out, fault);
    free(buf);
    return rc;
}

static void pb_header(Flodl__Header *ph, Flodl__MsgType type)
{
    flodl__header__init(ph);
    ph->magic = FL_MSG_MAGIC;
    ph->version = FL_MSG_VERSION;
    ph->job_id = "j";
    ph->type = type;
}

static void expect_refused(Flodl__Header *ph, const char *needle)
{
    fl_msg_hdr_t out;
    fl_msg_fault_t fault = FL_FAULT_NONE;
    int rc = decode_pb(ph, &out, &fault);
    ck_assert_int_eq(rc, FL_EPROTO);
    ck_assert_int_eq(fault, FL_FAULT_HEADER);
    ck_assert_msg(strstr(fl_last_error(), needle) != NULL, "'%s' lacks '%s'", fl_last_error(),
                  needle);
    /* Nothing allocated survives a refusal. */
    ck_assert_ptr_null(out.u.welcome.shards);
    fl_msg_hdr_deinit(&out);
}

START_TEST(test_refusals)
{
    Flodl__Header ph;

    /* Unknown push kind. */
    Flodl__Push push;
    flodl__push__init(&push);
    push.kind = (Flodl__PushKind)7;
    pb_header(&ph, FLODL__MSG_TYPE__MSG_PUSH);
    ph.body_case = FLODL__HEADER__BODY_PUSH;
    ph.push = &push;
    expect_refused(&ph, "push kind");

    /* A push type with a pull body. */
    Flodl__Pull pull;
    flodl__pull__init(&pull);
    pb_header(&ph, FLODL__MSG_TYPE__MSG_PUSH);
    ph.body_case = FLODL__HEADER__BODY_PULL;
    ph.pull = &pull;
    expect_refused(&ph, "push message with a pull body");

    /* A push type without a body. */
    pb_header(&ph, FLODL__MSG_TYPE__MSG_PUSH);
    expect_refused(&ph, "push message without its body");

    /* Two bodies: a body is a oneof, so protobuf-c packs one; two packed headers back to back
     * are one header on the wire (fields repeat, the last value wins) with both bodies. */
    {
        Flodl__Header second;
        pb_header(&ph, FLODL__MSG_TYPE__MSG_PULL);
        ph.body_case = FLODL__HEADER__BODY_PULL;
        ph.pull = &pull;
        pb_header(&second, FLODL__MSG_TYPE__MSG_PULL);
        flodl__push__init(&push);
        second.body_case = FLODL__HEADER__BODY_PUSH;
        second.push = &push;
        size_t n1 = protobuf_c_message_get_packed_size(&ph.base);
        size_t n2 = protobuf_c_message_get_packed_size(&second.base);
        uint8_t *buf = malloc(n1 + n2);
        ck_assert_ptr_nonnull(buf);
        protobuf_c_message_pack(&ph.base, buf);
        protobuf_c_message_pack(&second.base, buf + n1);
        fl_msg_hdr_t out;
        fl_msg_fault_t fault = FL_FAULT_NONE;
        ck_assert_int_eq(fl_msg_decode(buf, n1 + n2, &out, &fault), FL_EPROTO);
        ck_assert_int_eq(fault, FL_FAULT_HEADER);
        ck_assert_msg(strstr(fl_last_error(), "pull message with 2 bodies") != NULL, "%s",
                      fl_last_error());
        fl_msg_hdr_deinit(&out);
        /* The same body twice is two bodies too. */
        second.body_case = FLODL__HEADER__BODY_PULL;
        second.pull = &pull;
        n2 = protobuf_c_message_get_packed_size(&second.base);
        protobuf_c_message_pack(&second.base, buf + n1);
        ck_assert_int_eq(fl_msg_decode(buf, n1 + n2, &out, &fault), FL_EPROTO);
        ck_assert_msg(strstr(fl_last_error(), "2 bodies") != NULL, "%s", fl_last_error());
        fl_msg_hdr_deinit(&out);
        free(buf);
    }

    /* Unknown role and consistency in a registration. */
    Flodl__Register reg;
    flodl__register__init(&reg);
    reg.role = (Flodl__Role)5;
    pb_header(&ph, FLODL__MSG_TYPE__MSG_REGISTER);
    ph.body_case = FLODL__HEADER__BODY_REG;
    ph.reg = &reg;
    expect_refused(&ph, "role");
    reg.role = FLODL__ROLE__ROLE_SERVER;
    reg.consistency = (Flodl__Consistency)3;
    expect_refused(&ph, "consistency");

    /* Too many checkpoints, too many shard endpoints. */
    reg.consistency = FLODL__CONSISTENCY__CONSISTENCY_SYNC;
    uint64_t ck[FL_MSG_MAX_CHECKPOINTS + 1] = {0};
    reg.n_checkpoints = FL_MSG_MAX_CHECKPOINTS + 1;
    reg.checkpoints = ck;
    expect_refused(&ph, "checkpoint list");
    reg.n_checkpoints = 0;
    size_t many = FL_MSG_MAX_SHARDS + 1;
    char **eps = calloc(many, sizeof *eps);
    for (size_t i = 0; i < many; i++)
        eps[i] = "tcp://h:1";
    reg.n_shard_endpoints = many;
    reg.shard_endpoints = eps;
    expect_refused(&ph, "shard endpoint list");
    /* An endpoint too long to be one. */
    char *longep = malloc(FL_ENDPOINT_MAX + 10);
    memset(longep, 'a', FL_ENDPOINT_MAX + 9);
    longep[FL_ENDPOINT_MAX + 9] = '\0';
    eps[0] = longep;
    reg.n_shard_endpoints = 1;
    expect_refused(&ph, "shard endpoint");
    free(longep);
    free(eps);

    /* A welcome with too many shards, or a shard host too long. */
    Flodl__Welcome w;
    flodl__welcome__init(&w);
    Flodl__Shard sh;
    flodl__shard__init(&sh);
    sh.endpoint = "tcp://h:1";
    sh.host = "h";
    Flodl__Shard **table = calloc(many, sizeof *table);
    for (size_t i = 0; i < many; i++)
        table[i] = &sh;
    w.n_shards = many;
    w.shards = table;
    pb_header(&ph, FLODL__MSG_TYPE__MSG_WELCOME);
    ph.body_case = FLODL__HEADER__BODY_WELCOME;
    ph.welcome = &w;
    expect_refused(&ph, "shard table");
    char host[FL_HOST_MAX + 1];
    memset(host, 'h', FL_HOST_MAX);
    host[FL_HOST_MAX] = '\0';
    sh.host = host;
    w.n_shards = 3;
    expect_refused(&ph, "shard host");
    sh.host = "h";
    w.consistency = (Flodl__Consistency)9;
    expect_refused(&ph, "consistency");
    free(table);
}
END_TEST

START_TEST(test_encode_refuses_oversized_tables)
{
    fl_msg_hdr_t h;
    make_server_register(&h, 2, 0);
    h.u.reg.ncheckpoints = FL_MSG_MAX_CHECKPOINTS + 1;
    size_t len;
    enc_t e = {NULL, 0};
    ck_assert_int_eq(fl_msg_encode(&h, alloc_enc, &e, &len), FL_EINVAL);
    ck_assert_ptr_null(e.buf);
    h.u.reg.ncheckpoints = 0;
    memset(h.u.reg.shard_eps[1], 'x', FL_ENDPOINT_MAX); /* not terminated */
    ck_assert_int_eq(fl_msg_encode(&h, alloc_enc, &e, &len), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "shard endpoint") != NULL, "%s", fl_last_error());
    fl_msg_hdr_deinit(&h);
}
END_TEST

START_TEST(test_type_names)
{
    ck_assert_str_eq(fl_msg_type_name(FL_MSG_PUSH), "push");
    ck_assert_str_eq(fl_msg_type_name(FL_MSG_PUSH_ACK), "push-ack");
    ck_assert_str_eq(fl_msg_type_name(FL_MSG_PULL), "pull");
    ck_assert_str_eq(fl_msg_type_name(FL_MSG_PULL_REPLY), "pull-reply");
    ck_assert_str_eq(fl_msg_type_name(12), "unknown");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("msg_ps");
    TCase *t = tcase_create("round trip");
    tcase_add_test(t, test_server_register_round_trip);
    tcase_add_test(t, test_worker_register_keeps_ps_fields);
    tcase_add_test(t, test_welcome_shard_map_round_trip);
    tcase_add_test(t, test_push_pull_round_trip);
    tcase_add_test(t, test_copy_is_deep);
    suite_add_tcase(s, t);
    t = tcase_create("refusals");
    tcase_add_test(t, test_refusals);
    tcase_add_test(t, test_encode_refuses_oversized_tables);
    tcase_add_test(t, test_type_names);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
