/* Helpers shared by the message suites: sample messages, exact decodes, hand-made bytes. */
#include "msgutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *alloc_malloc(size_t n, void *ud)
{
    enc_t *e = ud;
    e->calls++;
    e->buf = malloc(n > 0 ? n : 1);
    return e->buf;
}

void encode_ok(const fl_msg_hdr_t *h, enc_t *e)
{
    memset(e, 0, sizeof *e);
    int rc = fl_msg_encode(h, alloc_malloc, e, &e->len);
    ck_assert_msg(rc == FL_OK, "encode %s: rc %d: %s", fl_msg_type_name(h->type), rc,
                  fl_last_error());
    ck_assert_int_eq(e->calls, 1);
    ck_assert_uint_gt(e->len, 0);
}

int decode_exact(const void *data, size_t len, fl_msg_hdr_t *out, fl_msg_fault_t *fault)
{
    uint8_t *copy = malloc(len > 0 ? len : 1);
    ck_assert_ptr_nonnull(copy);
    if (len > 0)
        memcpy(copy, data, len);
    int rc = fl_msg_decode(len > 0 ? copy : NULL, len, out, fault);
    free(copy);
    return rc;
}

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

void make_register(fl_msg_hdr_t *h)
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

void make_welcome(fl_msg_hdr_t *h, uint32_t npeers)
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

void make_barrier(fl_msg_hdr_t *h)
{
    fl_msg_hdr_init(h, FL_MSG_BARRIER, 3);
    set_common(h);
    h->u.barrier.id = 0x0102030405060708ULL;
    h->u.barrier.round = 6;
}

void make_heartbeat(fl_msg_hdr_t *h)
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

void make_error(fl_msg_hdr_t *h)
{
    fl_msg_hdr_init(h, FL_MSG_ERROR, -1);
    set_common(h);
    h->u.error.code = FL_EPEER;
    h->u.error.about_rank = 9;
    snprintf(h->u.error.host, sizeof h->u.error.host, "gpu-node-09");
    snprintf(h->u.error.text, sizeof h->u.error.text,
             "rank 9 on gpu-node-09: no heartbeat for 15000 ms during allreduce #42");
}

void make_shutdown(fl_msg_hdr_t *h)
{
    fl_msg_hdr_init(h, FL_MSG_SHUTDOWN, 7);
    set_common(h);
    h->u.shutdown.code = FL_ETIMEDOUT;
    snprintf(h->u.shutdown.text, sizeof h->u.shutdown.text, "leaving: training finished");
}

void make_chunk(fl_msg_hdr_t *h)
{
    fl_msg_hdr_init(h, FL_MSG_CHUNK, 2);
    set_common(h);
    static const uint32_t dts[] = {FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16, FL_FLOAT64,
                                   FL_INT32,   FL_UINT8,   FL_INT64,    0};
    h->nframes = FL_MSG_MAX_FRAMES;
    for (uint32_t i = 0; i < FL_MSG_MAX_FRAMES; i++) {
        uint64_t raw = (uint64_t)(i + 1) * 8 * 1024 * 1024 * 1024; /* over 4 GiB: 64 bits */
        uint32_t codec = i % 2 ? FL_CODEC_LZ4 : FL_CODEC_RAW;
        h->frames[i] =
            (fl_msg_frame_t){codec == FL_CODEC_RAW ? raw : 1000 + i, dts[i % 8], codec, raw};
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

void make_welcome3(fl_msg_hdr_t *h)
{
    make_welcome(h, 3);
}

void pb_raw(pb_t *p, const void *d, size_t n)
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

void pb_varint(pb_t *p, uint64_t v)
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

void pb_tag(pb_t *p, unsigned field, unsigned wt)
{
    pb_varint(p, (uint64_t)field << 3 | wt);
}

void pb_uint(pb_t *p, unsigned field, uint64_t v)
{
    pb_tag(p, field, WT_VARINT);
    pb_varint(p, v);
}

void pb_int(pb_t *p, unsigned field, int64_t v)
{
    pb_uint(p, field, (uint64_t)v);
}

static void pb_fixed32(pb_t *p, unsigned field, uint32_t v)
{
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    pb_tag(p, field, WT_FIXED32);
    pb_raw(p, le, sizeof le);
}

void pb_bytes(pb_t *p, unsigned field, const void *d, size_t n)
{
    pb_tag(p, field, WT_LEN);
    pb_varint(p, n);
    pb_raw(p, d, n);
}

void pb_str(pb_t *p, unsigned field, const char *s)
{
    pb_bytes(p, field, s, strlen(s));
}

void pb_sub(pb_t *p, unsigned field, pb_t *sub)
{
    pb_bytes(p, field, sub->b, sub->n);
    free(sub->b);
    memset(sub, 0, sizeof *sub);
}

const char *long_str(char c, size_t n)
{
    static char s[4096];
    ck_assert_uint_lt(n, sizeof s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

void pb_header(pb_t *p, uint32_t magic, uint64_t version, uint64_t type, int32_t sender)
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

void pb_chunk_body(pb_t *p)
{
    pb_t c = {0};
    pb_uint(&c, 1, 1);
    pb_uint(&c, 6, 100);
    pb_sub(p, 22, &c);
}

void pb_register_body(pb_t *p, const char *host, int neps, const char *ep, const char *tuning)
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
