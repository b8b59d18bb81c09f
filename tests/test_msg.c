/* proto: every message type through encode and decode with every field set; hostile header
 * bytes crafted by hand in protobuf wire format (this file must not include the generated
 * code) and refused with the right fault and a detail naming the problem; garbage and every
 * truncated prefix never crash; encode refusals; the frame check; header init and deinit.
 * Run under ASan to catch reads outside the buffers and leaked welcome tables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_msg.h"
#include "testutil.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---- encode helpers ---- */

typedef struct enc {
    uint8_t *buf;
    size_t len;
    int calls;
} enc_t;

static void *alloc_malloc(size_t n, void *ud)
{
    enc_t *e = ud;
    e->calls++;
    e->buf = malloc(n > 0 ? n : 1);
    return e->buf;
}

static void *alloc_null(size_t n, void *ud)
{
    (void)n;
    ((enc_t *)ud)->calls++;
    return NULL;
}

/* Encodes h; the caller frees e->buf. */
static void encode_ok(const fl_msg_hdr_t *h, enc_t *e)
{
    memset(e, 0, sizeof *e);
    int rc = fl_msg_encode(h, alloc_malloc, e, &e->len);
    ck_assert_msg(rc == FL_OK, "encode %s: rc %d: %s", fl_msg_type_name(h->type), rc,
                  fl_last_error());
    ck_assert_int_eq(e->calls, 1);
    ck_assert_uint_gt(e->len, 0);
}

/* Decodes from a heap copy of exactly len bytes, so ASan sees any read past the end. */
static int decode_exact(const void *data, size_t len, fl_msg_hdr_t *out, fl_msg_fault_t *fault)
{
    uint8_t *copy = malloc(len > 0 ? len : 1);
    ck_assert_ptr_nonnull(copy);
    if (len > 0)
        memcpy(copy, data, len);
    int rc = fl_msg_decode(len > 0 ? copy : NULL, len, out, fault);
    free(copy);
    return rc;
}

/* ---- sample messages with every field set ---- */

static void set_common(fl_msg_hdr_t *h)
{
    snprintf(h->job_id, sizeof h->job_id, "job-2024-11-resnet50");
    h->generation = 0x1122334455667788ULL;
    h->seq = 0xfedcba9876543210ULL;
    h->step = 123456789012ULL;
    h->nframes = 3;
    h->frames[0] = (fl_msg_frame_t){4096, FL_FLOAT32, FL_CODEC_RAW, 4096};
    h->frames[1] = (fl_msg_frame_t){1000, FL_FLOAT16, FL_CODEC_LZ4, 65536};
    h->frames[2] = (fl_msg_frame_t){77, 0, FL_CODEC_RAW, 77};
}

static void fill_endpoints(char (*eps)[FL_ENDPOINT_MAX], uint32_t n, int salt)
{
    for (uint32_t i = 0; i < n; i++)
        snprintf(eps[i], FL_ENDPOINT_MAX, "tcp://10.%d.%u.7:%u", salt % 250, i, 40000u + i);
}

static void make_register(fl_msg_hdr_t *h)
{
    fl_msg_hdr_init(h, FL_MSG_REGISTER, 5);
    set_common(h);
    h->u.reg.rank = 5;
    h->u.reg.world_size = 64;
    snprintf(h->u.reg.host, sizeof h->u.reg.host, "gpu-node-05.cluster.local");
    h->u.reg.nendpoints = 4;
    fill_endpoints(h->u.reg.endpoints, 4, 5);
    h->u.reg.pid = 31337;
    h->u.reg.model_signature = 0xdeadbeefcafef00dULL;
    snprintf(h->u.reg.tuning, sizeof h->u.reg.tuning, "seg=262144,algo=ring,stripes=4");
    snprintf(h->u.reg.model_shapes, sizeof h->u.reg.model_shapes,
             "layers.0.weight[256,64];layers.0.bias[256];");
}

static void make_welcome(fl_msg_hdr_t *h, uint32_t npeers)
{
    fl_msg_hdr_init(h, FL_MSG_WELCOME, -1);
    set_common(h);
    ck_assert_int_eq(fl_msg_welcome_alloc(h, npeers), FL_OK);
    for (uint32_t i = 0; i < npeers; i++) {
        fl_msg_peer_t *p = &h->u.welcome.peers[i];
        p->rank = (int32_t)i;
        snprintf(p->host, sizeof p->host, "host-%u", i);
        p->nendpoints = i % (FL_MSG_MAX_STRIPES + 1); /* 0..8, zero included */
        fill_endpoints(p->endpoints, p->nendpoints, (int)i);
        p->pid = 1000 + (int32_t)i;
    }
    h->u.welcome.heartbeat_ms = 500;
    h->u.welcome.heartbeat_timeout_ms = 15000;
}

static void make_barrier(fl_msg_hdr_t *h)
{
    fl_msg_hdr_init(h, FL_MSG_BARRIER, 3);
    set_common(h);
    h->u.barrier.id = 0x0102030405060708ULL;
    h->u.barrier.round = 6;
}

static void make_heartbeat(fl_msg_hdr_t *h)
{
    fl_msg_hdr_init(h, FL_MSG_HEARTBEAT, -1);
    set_common(h);
    h->u.heartbeat.op = 2;
    h->u.heartbeat.op_seq = 0x100000001ULL;
    h->u.heartbeat.op_step = 17;
    h->u.heartbeat.waiting_on = 12;
    h->u.heartbeat.registered = 61;
    snprintf(h->u.heartbeat.missing, sizeof h->u.heartbeat.missing, "3,17,40-41");
}

static void make_error(fl_msg_hdr_t *h)
{
    fl_msg_hdr_init(h, FL_MSG_ERROR, -1);
    set_common(h);
    h->u.error.code = FL_EPEER;
    h->u.error.about_rank = 9;
    snprintf(h->u.error.host, sizeof h->u.error.host, "gpu-node-09");
    snprintf(h->u.error.text, sizeof h->u.error.text,
             "rank 9 on gpu-node-09: no heartbeat for 15000 ms during allreduce #42");
}

static void make_shutdown(fl_msg_hdr_t *h)
{
    fl_msg_hdr_init(h, FL_MSG_SHUTDOWN, 7);
    set_common(h);
    h->u.shutdown.code = FL_ETIMEDOUT;
    snprintf(h->u.shutdown.text, sizeof h->u.shutdown.text, "leaving: training finished");
}

static void make_chunk(fl_msg_hdr_t *h)
{
    fl_msg_hdr_init(h, FL_MSG_CHUNK, 2);
    set_common(h);
    static const uint32_t dts[] = {FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16, FL_FLOAT64,
                                   FL_INT32,   FL_UINT8,   FL_INT64,    0};
    h->nframes = FL_MSG_MAX_FRAMES;
    for (uint32_t i = 0; i < FL_MSG_MAX_FRAMES; i++) {
        uint64_t raw = (uint64_t)(i + 1) * 8 * 1024 * 1024 * 1024; /* over 4 GiB: 64 bits */
        uint32_t codec = i % 2 ? FL_CODEC_LZ4 : FL_CODEC_RAW;
        h->frames[i] = (fl_msg_frame_t){codec == FL_CODEC_RAW ? raw : 1000 + i, dts[i % 8],
                                        codec, raw};
    }
    h->u.chunk.coll = 1;
    h->u.chunk.phase = 2;
    h->u.chunk.step = 3;
    h->u.chunk.seg = 4;
    h->u.chunk.offset = 0x123456789ULL;
    h->u.chunk.count = 0x987654321ULL;
    h->u.chunk.op = FL_AVG;
    h->u.chunk.total = 0xffffffffffffULL;
}

/* ---- comparison ---- */

#define SAME(field)                                                                            \
    do {                                                                                       \
        if (a->field != b->field)                                                              \
            ck_abort_msg("%s: " #field " %lld != %lld", what, (long long)a->field,             \
                         (long long)b->field);                                                 \
    } while (0)
#define SAME_STR(field)                                                                        \
    do {                                                                                       \
        if (strcmp(a->field, b->field) != 0)                                                   \
            ck_abort_msg("%s: " #field " '%s' != '%s'", what, a->field, b->field);             \
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
    default:
        ck_abort_msg("unexpected type %d", (int)a->type);
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

typedef void (*make_fn)(fl_msg_hdr_t *h);

static void make_welcome3(fl_msg_hdr_t *h)
{
    make_welcome(h, 3);
}

static const make_fn makers[] = {make_register,  make_welcome3, make_barrier, make_heartbeat,
                                 make_error,     make_shutdown, make_chunk};

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

/* ---- hand-made protobuf bytes ---- */

typedef struct pb {
    uint8_t *b;
    size_t n;
    size_t cap;
} pb_t;

static void pb_raw(pb_t *p, const void *d, size_t n)
{
    if (p->n + n > p->cap) {
        size_t cap = p->cap ? p->cap : 256;
        while (cap < p->n + n)
            cap *= 2;
        p->b = realloc(p->b, cap);
        ck_assert_ptr_nonnull(p->b);
        p->cap = cap;
    }
    if (n > 0)
        memcpy(p->b + p->n, d, n);
    p->n += n;
}

static void pb_varint(pb_t *p, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v != 0)
            tmp[n] |= 0x80;
        n++;
    } while (v != 0);
    pb_raw(p, tmp, n);
}

enum { WT_VARINT = 0, WT_LEN = 2, WT_FIXED32 = 5 };

static void pb_tag(pb_t *p, unsigned field, unsigned wt)
{
    pb_varint(p, (uint64_t)field << 3 | wt);
}

static void pb_uint(pb_t *p, unsigned field, uint64_t v)
{
    pb_tag(p, field, WT_VARINT);
    pb_varint(p, v);
}

/* int32 fields: negative values are sign-extended to ten bytes. */
static void pb_int(pb_t *p, unsigned field, int64_t v)
{
    pb_uint(p, field, (uint64_t)v);
}

static void pb_fixed32(pb_t *p, unsigned field, uint32_t v)
{
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    pb_tag(p, field, WT_FIXED32);
    pb_raw(p, le, sizeof le);
}

static void pb_bytes(pb_t *p, unsigned field, const void *d, size_t n)
{
    pb_tag(p, field, WT_LEN);
    pb_varint(p, n);
    pb_raw(p, d, n);
}

static void pb_str(pb_t *p, unsigned field, const char *s)
{
    pb_bytes(p, field, s, strlen(s));
}

/* Appends sub as a nested message and frees it. */
static void pb_sub(pb_t *p, unsigned field, pb_t *sub)
{
    pb_bytes(p, field, sub->b, sub->n);
    free(sub->b);
    memset(sub, 0, sizeof *sub);
}

/* A string of n copies of c (static storage, one at a time). */
static const char *long_str(char c, size_t n)
{
    static char s[4096];
    ck_assert_uint_lt(n, sizeof s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

/* Header fields (Header: 1 magic, 2 version, 3 job_id, 4 generation, 5 type, 6 sender, 7 seq,
 * 8 step, 9 frames; bodies 16..22). */
static void pb_header(pb_t *p, uint32_t magic, uint64_t version, uint64_t type, int32_t sender)
{
    pb_fixed32(p, 1, magic);
    pb_uint(p, 2, version);
    pb_str(p, 3, "job-x");
    pb_uint(p, 4, 9);
    pb_uint(p, 5, type);
    pb_int(p, 6, sender);
    pb_uint(p, 7, 77);
    pb_uint(p, 8, 88);
}

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

static void pb_chunk_body(pb_t *p)
{
    pb_t c = {0};
    pb_uint(&c, 1, 1);
    pb_uint(&c, 6, 100);
    pb_sub(p, 22, &c);
}

/* A valid barrier header, the base most hostile variants start from. */
static void pb_barrier(pb_t *p)
{
    pb_header(p, FL_MSG_MAGIC, FL_MSG_VERSION, FL_MSG_BARRIER, 4);
}

/* Register body with host, endpoints and tuning as given. */
static void pb_register_body(pb_t *p, const char *host, int neps, const char *ep,
                             const char *tuning)
{
    pb_t r = {0};
    pb_int(&r, 1, 2);
    pb_int(&r, 2, 4);
    pb_str(&r, 3, host);
    for (int i = 0; i < neps; i++)
        pb_str(&r, 4, ep);
    pb_int(&r, 5, 999);
    pb_str(&r, 7, tuning);
    pb_sub(p, 16, &r);
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
                  "ends with %02x %02x %02x", e.buf[e.len - 3], e.buf[e.len - 2],
                  e.buf[e.len - 1]);
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
    pb_register_body(p, "host", 1, "tcp://a:1", "seg=1\xc2\x9b" "2J");
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
            ck_abort_msg("%s: accepted frame %u (dtype %u codec %u)", what, i, f->dtype,
                         f->codec);
    }
    if (h->type == FL_MSG_WELCOME &&
        (h->u.welcome.npeers == 0) != (h->u.welcome.peers == NULL))
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
            ck_abort_msg("%s: only %ld of %zu prefixes refused", fl_msg_type_name(h.type),
                         refused, e.len);
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
            ck_abort_msg("seed %llu (%zu bytes): rc %d fault %d", (unsigned long long)seed, len,
                         rc, (int)fault);
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
                    ck_abort_msg("%s, byte %zu ^ 0x%02x: rc %d fault %d",
                                 fl_msg_type_name(h.type), pos, xors[k], rc, (int)fault);
                fl_msg_hdr_deinit(&out);
                e.buf[pos] ^= xors[k];
            }
        }
        free(e.buf);
        fl_msg_hdr_deinit(&h);
    }
}
END_TEST

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
    ck_assert_msg(strstr(fl_last_error(), "chunk message declares 2 payload frames but 1"),
                  "%s", fl_last_error());
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

Suite *msg_suite(void);
Suite *msg_suite(void)
{
    Suite *s = suite_create("msg");
    TCase *t = tcase_create("round_trip");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_round_trip_all_types);
    tcase_add_test(t, test_round_trip_welcome);
    tcase_add_test(t, test_round_trip_empty_and_edge_values);
    tcase_add_test(t, test_round_trip_percent_signs);
    suite_add_tcase(s, t);

    t = tcase_create("decode_refusals");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_crafted_valid);
    tcase_add_test(t, test_empty_body_is_present);
    tcase_add_loop_test(t, test_decode_refusals, 0, (int)NELEM(refusals));
    tcase_add_test(t, test_decode_version);
    tcase_add_test(t, test_decode_free_text_truncated);
    tcase_add_test(t, test_decode_utf8_text);
    suite_add_tcase(s, t);

    t = tcase_create("decode_hostile");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_decode_truncated_prefixes);
    tcase_add_test(t, test_decode_garbage);
    tcase_add_test(t, test_decode_mutations);
    suite_add_tcase(s, t);

    t = tcase_create("encode_refusals");
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
    return fl_test_run(msg_suite());
}
