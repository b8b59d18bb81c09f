/* Encoding: fl_msg_hdr_t -> protobuf-c structs -> bytes in memory the caller hands out.
 * Bounds are checked here too, so a sender fails loudly instead of emitting a header that
 * every receiver would refuse; free text is escaped rather than refused (fl_msg_encode). */
#include "fl_msg.h"
#include "msg_int.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static int check_str(const char *what, const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n >= cap)
        return fl_fail(FL_EINVAL, "encode: %s is not terminated within %zu bytes", what, cap);
    const char *why;
    size_t at = fl_text_scan(s, n, &why);
    if (at != n)
        return fl_fail(FL_EINVAL, "encode: %s has %s at byte %zu of %zu", what, why, at, n);
    return FL_OK;
}

/* Everything the protobuf-c view of one header points at beyond the caller's header: the
 * body's struct, pointer arrays, escaped texts. A small message fits the inline buffer; a
 * welcome's tables take blocks from the heap, all freed together after packing. */
typedef struct block {
    struct block *next;
    max_align_t data[];
} block_t;

#define ARENA_BLOCK 65536

typedef struct arena {
    unsigned char *at;
    size_t left;
    block_t *blocks;
    max_align_t first[2048 / sizeof(max_align_t)];
} arena_t;

static void *take(arena_t *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n > a->left) {
        size_t size = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        block_t *b = malloc(sizeof *b + size);
        if (b == NULL)
            return NULL;
        b->next = a->blocks;
        a->blocks = b;
        a->at = (unsigned char *)b->data;
        a->left = size;
    }
    void *p = a->at;
    a->at += n;
    a->left -= n;
    return p;
}

static void arena_free(arena_t *a)
{
    while (a->blocks != NULL) {
        block_t *b = a->blocks;
        a->blocks = b->next;
        free(b);
    }
}

/* Free text: terminated within cap (a bound, as for identifiers), then escaped into cap
 * bytes of the arena when it is not wire text. */
static int put_text(arena_t *a, const fl_msg_field_t *f, const char *s, char **dst)
{
    if (strnlen(s, f->cap) >= f->cap)
        return fl_fail(FL_EINVAL, "encode: %s is not terminated within %zu bytes", f->name, f->cap);
    char *out = take(a, f->cap);
    if (out == NULL)
        return fl_fail(FL_ENOMEM, "encode: out of memory for the %s", f->name);
    *dst = (char *)fl_text_escape(s, out, f->cap);
    return FL_OK;
}

static uint32_t count_of(const void *body, const fl_msg_field_t *f)
{
    uint32_t n;
    memcpy(&n, (const char *)body + f->n_off, sizeof n);
    return n;
}

/* A list's entries and count in the protobuf-c struct. */
static void set_list(void *pb, const fl_msg_field_t *f, size_t n, const void *items)
{
    memcpy((char *)pb + f->pb_n, &n, sizeof n);
    memcpy((char *)pb + f->pb, &items, sizeof items);
}

static int too_many(const fl_msg_field_t *f, uint32_t n)
{
    return fl_fail(FL_EINVAL, "encode: %u %ss, at most %u", n, f->name, f->max);
}

static int put_id(const fl_msg_field_t *f, const char *s, char **dst)
{
    int rc = check_str(f->name, s, f->cap);
    if (rc == FL_OK && f->check != NULL)
        rc = f->check(s, f->cap);
    *dst = (char *)s;
    return rc;
}

static int put_ids(arena_t *a, const fl_msg_field_t *f, const char *src, uint32_t n, void *pb)
{
    if (n > f->max)
        return too_many(f, n);
    char **items = take(a, n * sizeof *items);
    if (items == NULL)
        return fl_fail(FL_ENOMEM, "encode: out of memory for %u %ss", n, f->name);
    for (uint32_t i = 0; i < n; i++) {
        int rc = check_str(f->name, src + i * f->cap, f->cap);
        if (rc != FL_OK)
            return rc;
        items[i] = (char *)src + i * f->cap;
    }
    set_list(pb, f, n, items);
    return FL_OK;
}

static int put_fields(arena_t *a, const fl_msg_table_t *t, const void *body, void *pb);

/* A table of messages: one protobuf-c struct per entry, each filled by its own table. */
static int put_table(arena_t *a, const fl_msg_field_t *f, const char *src, uint32_t n, void *pb)
{
    if (n > f->max)
        return too_many(f, n);
    size_t size = f->sub->pb->sizeof_message;
    unsigned char *store = take(a, (size_t)n * (size + sizeof(void *)));
    if (store == NULL)
        return fl_fail(FL_ENOMEM, "encode: out of memory for %u %ss", n, f->name);
    void **items = (void **)(store + (size_t)n * size);
    for (uint32_t i = 0; i < n; i++) {
        items[i] = store + (size_t)i * size;
        protobuf_c_message_init(f->sub->pb, items[i]);
        int rc = put_fields(a, f->sub, src + (size_t)i * f->sub->size, items[i]);
        if (rc != FL_OK)
            return rc;
    }
    set_list(pb, f, n, items);
    return FL_OK;
}

static int put_field(arena_t *a, const fl_msg_field_t *f, const void *body, void *pb)
{
    const char *src = (const char *)body + f->off;
    char *dst = (char *)pb + f->pb;
    uint32_t n = f->kind >= FL_MSG_F_IDS ? count_of(body, f) : 0;
    const char *table;
    switch (f->kind) {
    case FL_MSG_F_U32:
    case FL_MSG_F_ENUM: memcpy(dst, src, 4); return FL_OK;
    case FL_MSG_F_U64: memcpy(dst, src, 8); return FL_OK;
    case FL_MSG_F_BOOL: *(protobuf_c_boolean *)dst = *(const bool *)src; return FL_OK;
    case FL_MSG_F_ID:
    case FL_MSG_F_ID_CUT: return put_id(f, src, (char **)dst);
    case FL_MSG_F_TEXT: return put_text(a, f, src, (char **)dst);
    case FL_MSG_F_IDS: return put_ids(a, f, src, n, pb);
    case FL_MSG_F_U64S:
        if (n > f->max)
            return too_many(f, n);
        set_list(pb, f, n, src); /* the body's own array: nothing to convert */
        return FL_OK;
    case FL_MSG_F_ID_TABLE: memcpy(&table, src, sizeof table); return put_ids(a, f, table, n, pb);
    case FL_MSG_F_TABLE: memcpy(&table, src, sizeof table); return put_table(a, f, table, n, pb);
    }
    return fl_fail(FL_EINVAL, "encode: field %s of an unknown kind", f->name);
}

static int put_fields(arena_t *a, const fl_msg_table_t *t, const void *body, void *pb)
{
    for (size_t i = 0; i < t->nfields; i++) {
        int rc = put_field(a, &t->fields[i], body, pb);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

/* The body: the member of the Header.body oneof that m's type names, filled from its table.
 * protobuf-c packs the member that body_case names even when every field in it is at its
 * default, which is what the protocol asks (the body is always on the wire). */
static int put_body(arena_t *a, Flodl__Header *h, const fl_msg_hdr_t *m)
{
    const fl_msg_table_t *t = fl_msg_table(m->type);
    if (t == NULL)
        return fl_fail(FL_EINVAL, "encode: unknown message type %d", (int)m->type);
    void *pb = take(a, t->pb->sizeof_message);
    if (pb == NULL)
        return fl_fail(FL_ENOMEM, "encode: out of memory for a %s body", t->name);
    protobuf_c_message_init(t->pb, pb);
    h->body_case = fl_msg_body_case(m->type);
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field(&flodl__header__descriptor, h->body_case);
    memcpy((char *)h + fd->offset, &pb, sizeof pb);
    return put_fields(a, t, &m->u, pb);
}

/* The header's own fields; frames are bounded by the C side's array. */
static int put_header(Flodl__Header *h, Flodl__FrameDesc *frames, Flodl__FrameDesc **ptrs,
                      const fl_msg_hdr_t *m)
{
    flodl__header__init(h);
    h->magic = FL_MSG_MAGIC;
    h->version = m->version;
    int rc = check_str("job id", m->job_id, FL_JOB_MAX);
    if (rc != FL_OK)
        return rc;
    h->job_id = (char *)m->job_id;
    h->generation = m->generation;
    h->type = (Flodl__MsgType)m->type;
    h->sender = m->sender;
    h->seq = m->seq;
    h->step = m->step;
    if (m->nframes > FL_MSG_MAX_FRAMES)
        return fl_fail(FL_EINVAL, "encode: %u frames, at most %d", m->nframes, FL_MSG_MAX_FRAMES);
    for (uint32_t i = 0; i < m->nframes; i++) {
        Flodl__FrameDesc *f = &frames[i];
        flodl__frame_desc__init(f);
        f->bytes = m->frames[i].bytes;
        f->dtype = (Flodl__DType)m->frames[i].dtype;
        f->codec = (Flodl__Codec)m->frames[i].codec;
        f->raw_bytes = m->frames[i].raw_bytes;
        ptrs[i] = f;
    }
    h->n_frames = m->nframes;
    h->frames = ptrs;
    return FL_OK;
}

int fl_msg_encode(const fl_msg_hdr_t *m, void *(*alloc)(size_t len, void *ud), void *ud,
                  size_t *len)
{
    Flodl__Header h;
    Flodl__FrameDesc frames[FL_MSG_MAX_FRAMES];
    Flodl__FrameDesc *ptrs[FL_MSG_MAX_FRAMES];
    arena_t a;
    a.at = (unsigned char *)a.first;
    a.left = sizeof a.first;
    a.blocks = NULL;

    int rc = put_header(&h, frames, ptrs, m);
    if (rc == FL_OK)
        rc = put_body(&a, &h, m);
    if (rc == FL_OK) {
        size_t n = protobuf_c_message_get_packed_size(&h.base);
        uint8_t *out = alloc(n, ud);
        if (out == NULL) {
            rc = fl_fail(FL_ENOMEM, "encode: no memory for a %zu-byte header", n);
        } else {
            protobuf_c_message_pack(&h.base, out);
            *len = n;
        }
    }
    arena_free(&a);
    return rc;
}
