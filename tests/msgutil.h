/* Helpers shared by the message suites (test_msg_*.c): encoding, and decoding from exact-size
 * heap copies so that ASan sees any read past the end; sample messages with every field set;
 * and protobuf wire format written by hand, without the generated code (which these suites
 * must not include: the bytes they craft must not depend on it). */
#ifndef FL_MSGUTIL_H
#define FL_MSGUTIL_H

#include "fl_msg.h"
#include "testutil.h"

typedef struct enc {
    uint8_t *buf;
    size_t len;
    int calls;
} enc_t;

void *alloc_malloc(size_t n, void *ud);

/* Encodes h; the caller frees e->buf. */
void encode_ok(const fl_msg_hdr_t *h, enc_t *e);

/* Decodes from a heap copy of exactly len bytes, so ASan sees any read past the end. */
int decode_exact(const void *data, size_t len, fl_msg_hdr_t *out, fl_msg_fault_t *fault);

void make_register(fl_msg_hdr_t *h);

void make_welcome(fl_msg_hdr_t *h, uint32_t npeers);

void make_barrier(fl_msg_hdr_t *h);

void make_heartbeat(fl_msg_hdr_t *h);

void make_error(fl_msg_hdr_t *h);

void make_shutdown(fl_msg_hdr_t *h);

void make_chunk(fl_msg_hdr_t *h);

typedef void (*make_fn)(fl_msg_hdr_t *h);

void make_welcome3(fl_msg_hdr_t *h);

static const make_fn makers[] = {make_register, make_welcome3, make_barrier, make_heartbeat,
                                 make_error,    make_shutdown, make_chunk};

typedef struct pb {
    uint8_t *b;
    size_t n;
    size_t cap;
} pb_t;

void pb_raw(pb_t *p, const void *d, size_t n);

void pb_varint(pb_t *p, uint64_t v);

enum { WT_VARINT = 0, WT_LEN = 2, WT_FIXED32 = 5 };

void pb_tag(pb_t *p, unsigned field, unsigned wt);

void pb_uint(pb_t *p, unsigned field, uint64_t v);

/* int32 fields: negative values are sign-extended to ten bytes. */
void pb_int(pb_t *p, unsigned field, int64_t v);

void pb_bytes(pb_t *p, unsigned field, const void *d, size_t n);

void pb_str(pb_t *p, unsigned field, const char *s);

/* Appends sub as a nested message and frees it. */
void pb_sub(pb_t *p, unsigned field, pb_t *sub);

/* A string of n copies of c (static storage, one at a time). */
const char *long_str(char c, size_t n);

/* Header fields (Header: 1 magic, 2 version, 3 job_id, 4 generation, 5 type, 6 sender, 7 seq,
 * 8 step, 9 frames; bodies 16..22). */
void pb_header(pb_t *p, uint32_t magic, uint64_t version, uint64_t type, int32_t sender);

void pb_chunk_body(pb_t *p);

/* Register body with host, endpoints and tuning as given. */
void pb_register_body(pb_t *p, const char *host, int neps, const char *ep, const char *tuning);

#endif
