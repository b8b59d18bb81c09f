/* Decoding: bytes -> protobuf-c -> validated fl_msg_hdr_t. Everything that can be checked
 * without knowing the receiver's state is checked here, so no caller ever sees a header with
 * an unterminated string, text that is not wire text (msg_wire.c: not UTF-8, a control
 * character, a NUL inside), an unknown type, a missing body or an impossible frame list. */
#include "fl_msg.h"
#include "msg_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(fl_msg_fault_t *fault, fl_msg_fault_t why, const char *fmt, ...) FL_PRINTF(3, 4);

static int bad(fl_msg_fault_t *fault, fl_msg_fault_t why, const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    *fault = why;
    return fl_fail(FL_EPROTO, "%s", text);
}

/* Copies a protobuf string into a fixed field; a string that does not fit is refused, not
 * truncated, because identifiers (hosts, endpoints, job ids) must survive intact. */
static int copy_id(char *dst, size_t cap, const char *src, const char *what, fl_msg_fault_t *fault)
{
    size_t n = strlen(src);
    if (n >= cap)
        return bad(fault, FL_FAULT_HEADER, "header: %s of %zu bytes is too long", what, n);
    memcpy(dst, src, n + 1);
    return FL_OK;
}

/* Free text (error and shutdown messages) is truncated instead, between two characters so
 * that what is kept is still wire text. */
static void copy_text(char *dst, size_t cap, const char *src)
{
    size_t n = fl_text_cut(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static void set_count(void *body, const fl_msg_field_t *f, size_t n)
{
    uint32_t v = (uint32_t)n;
    memcpy((char *)body + f->n_off, &v, sizeof v);
}

/* The pointer stored at off in a struct: a string, or a list's entries. */
static const void *pointer_at(const void *base, size_t off)
{
    const void *p;
    memcpy(&p, (const char *)base + off, sizeof p);
    return p;
}

static int too_long(const fl_msg_field_t *f, size_t n, fl_msg_fault_t *fault)
{
    return bad(fault, FL_FAULT_HEADER, "header: %s %s of %zu entries is too long", f->name,
               f->kind == FL_MSG_F_TABLE ? "table" : "list", n);
}

static int take_ids(const fl_msg_field_t *f, char *dst, char *const *src, size_t n,
                    fl_msg_fault_t *fault)
{
    for (size_t i = 0; i < n; i++) {
        int rc = copy_id(dst + i * f->cap, f->cap, src[i], f->name, fault);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

/* A heap table of n entries of size bytes, owned by the header from now on (freed by
 * fl_msg_hdr_free_tables); none for n = 0. */
static int alloc_table(const fl_msg_table_t *t, const fl_msg_field_t *f, void *body, size_t n,
                       size_t size, char **items)
{
    *items = NULL;
    if (n > 0 && (*items = calloc(n, size)) == NULL)
        return fl_fail(FL_ENOMEM, "%s: out of memory for %zu %ss", t->name, n, f->name);
    memcpy((char *)body + f->off, items, sizeof *items);
    set_count(body, f, n);
    return FL_OK;
}

static int take_fields(const fl_msg_table_t *t, const void *pb, void *body, fl_msg_fault_t *fault);

static int take_list(const fl_msg_table_t *t, const fl_msg_field_t *f, const void *pb, void *body,
                     fl_msg_fault_t *fault)
{
    size_t n;
    memcpy(&n, (const char *)pb + f->pb_n, sizeof n);
    const void *src = pointer_at(pb, f->pb);
    char *dst = (char *)body + f->off;
    if (n > f->max)
        return too_long(f, n, fault);
    int rc = FL_OK;
    switch (f->kind) {
    case FL_MSG_F_IDS:
        if ((rc = take_ids(f, dst, src, n, fault)) == FL_OK)
            set_count(body, f, n);
        return rc;
    case FL_MSG_F_U64S:
        if (n > 0)
            memcpy(dst, src, n * sizeof(uint64_t));
        set_count(body, f, n);
        return FL_OK;
    case FL_MSG_F_ID_TABLE:
        if ((rc = alloc_table(t, f, body, n, f->cap, &dst)) != FL_OK)
            return rc;
        return take_ids(f, dst, src, n, fault);
    case FL_MSG_F_TABLE:
        if ((rc = alloc_table(t, f, body, n, f->sub->size, &dst)) != FL_OK)
            return rc;
        for (size_t i = 0; i < n && rc == FL_OK; i++)
            rc = take_fields(f->sub, ((void *const *)src)[i], dst + i * f->sub->size, fault);
        return rc;
    default: return FL_OK;
    }
}

static int take_field(const fl_msg_table_t *t, const fl_msg_field_t *f, const void *pb, void *body,
                      fl_msg_fault_t *fault)
{
    const char *src = (const char *)pb + f->pb;
    char *dst = (char *)body + f->off;
    uint32_t v;
    int rc;
    switch (f->kind) {
    case FL_MSG_F_U32: memcpy(dst, src, 4); return FL_OK;
    case FL_MSG_F_U64: memcpy(dst, src, 8); return FL_OK;
    case FL_MSG_F_BOOL: *(bool *)dst = *(const protobuf_c_boolean *)src != 0; return FL_OK;
    case FL_MSG_F_ENUM:
        memcpy(&v, src, sizeof v);
        if (v > f->max)
            return bad(fault, FL_FAULT_HEADER, "header: unknown %s %d", f->name, (int)v);
        memcpy(dst, &v, sizeof v);
        return FL_OK;
    case FL_MSG_F_ID:
        if ((rc = copy_id(dst, f->cap, pointer_at(pb, f->pb), f->name, fault)) != FL_OK)
            return rc;
        if (f->check != NULL && f->check(dst, f->cap) != FL_OK)
            return bad(fault, FL_FAULT_HEADER, "header: %s", fl_last_error());
        return FL_OK;
    case FL_MSG_F_ID_CUT:
    case FL_MSG_F_TEXT: copy_text(dst, f->cap, pointer_at(pb, f->pb)); return FL_OK;
    default: return take_list(t, f, pb, body, fault);
    }
}

static int take_fields(const fl_msg_table_t *t, const void *pb, void *body, fl_msg_fault_t *fault)
{
    for (size_t i = 0; i < t->nfields; i++) {
        int rc = take_field(t, &t->fields[i], pb, body, fault);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

static int decode_body(const Flodl__Header *h, unsigned nbodies, fl_msg_hdr_t *out,
                       fl_msg_fault_t *fault)
{
    Flodl__Header__BodyCase want = fl_msg_body_case((int)h->type);
    if (want == FLODL__HEADER__BODY__NOT_SET)
        return bad(fault, FL_FAULT_HEADER, "header: unknown message type %llu",
                   (unsigned long long)h->type);
    /* protobuf-c keeps the last of several bodies; the wire walk counted them all. */
    if (nbodies > 1)
        return bad(fault, FL_FAULT_HEADER, "header: %s message with %u bodies",
                   fl_msg_type_name((int)h->type), nbodies);
    if (h->body_case == FLODL__HEADER__BODY__NOT_SET)
        return bad(fault, FL_FAULT_HEADER, "header: %s message without its body (type %llu)",
                   fl_msg_type_name((int)h->type), (unsigned long long)h->type);
    if (h->body_case != want)
        return bad(fault, FL_FAULT_HEADER, "header: %s message with a %s body (field %d)",
                   fl_msg_type_name((int)h->type),
                   fl_msg_type_name(fl_msg_type_of_body(h->body_case)), (int)h->body_case);

    /* The member of the oneof that body_case names: its field descriptor says where. */
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field(&flodl__header__descriptor, h->body_case);
    return take_fields(fl_msg_table((int)h->type), pointer_at(h, fd->offset), &out->u, fault);
}

static int decode_frames(const Flodl__Header *h, fl_msg_hdr_t *out, fl_msg_fault_t *fault)
{
    if (h->n_frames > FL_MSG_MAX_FRAMES)
        return bad(fault, FL_FAULT_FRAMES, "header: declares %llu frames, at most 16",
                   (unsigned long long)h->n_frames);
    for (size_t i = 0; i < h->n_frames; i++) {
        const Flodl__FrameDesc *f = h->frames[i];
        if (f->dtype != 0 && !fl_dtype_is_valid((int)f->dtype))
            return bad(fault, FL_FAULT_FRAMES, "header: frame with unknown dtype %llu",
                       (unsigned long long)f->dtype);
        if (f->codec != FLODL__CODEC__CODEC_RAW && f->codec != FLODL__CODEC__CODEC_LZ4 &&
            f->codec != FLODL__CODEC__CODEC_SPARSE)
            return bad(fault, FL_FAULT_FRAMES, "header: frame with unknown codec %llu",
                       (unsigned long long)f->codec);
        if (f->codec != FLODL__CODEC__CODEC_LZ4 && f->raw_bytes != f->bytes)
            return bad(fault, FL_FAULT_FRAMES,
                       "header: raw frame declares %llu decoded bytes unlike its size",
                       (unsigned long long)f->raw_bytes);
        if (f->dtype != 0 && f->codec != FLODL__CODEC__CODEC_SPARSE &&
            f->raw_bytes % fl_dtype_size((fl_dtype_t)f->dtype) != 0)
            return bad(fault, FL_FAULT_FRAMES,
                       "header: %s frame of %llu bytes is not a whole number of elements",
                       fl_dtype_name((fl_dtype_t)f->dtype), (unsigned long long)f->raw_bytes);
        out->frames[i].bytes = f->bytes;
        out->frames[i].dtype = (uint32_t)f->dtype;
        out->frames[i].codec = (uint32_t)f->codec;
        out->frames[i].raw_bytes = f->raw_bytes;
    }
    out->nframes = (uint32_t)h->n_frames;
    return FL_OK;
}

int fl_msg_decode(const void *data, size_t len, fl_msg_hdr_t *out, fl_msg_fault_t *fault)
{
    memset(out, 0, sizeof *out);
    *fault = FL_FAULT_NONE;

    /* Every count and length on the wire is checked before protobuf-c allocates for it. */
    fl_msg_wire_t wire;
    int rc = fl_msg_wire_scan(data, len, &wire, fault);
    if (rc != FL_OK)
        return rc;
    Flodl__Header *h = flodl__header__unpack(NULL, len, data);
    if (h == NULL)
        return bad(fault, FL_FAULT_HEADER, "header: %llu bytes do not parse as a header",
                   (unsigned long long)len);
    if (h->magic != FL_MSG_MAGIC) {
        rc = bad(fault, FL_FAULT_MAGIC, "header: bad magic 0x%08llx", (unsigned long long)h->magic);
        goto out;
    }
    /* Fill what a refusal needs before any further check can fail. */
    out->version = h->version;
    out->type = (fl_msg_type_t)h->type;
    out->sender = h->sender;
    out->generation = h->generation;
    out->seq = h->seq;
    out->step = h->step;
    if (h->version != FL_MSG_VERSION) {
        rc = bad(fault, FL_FAULT_VERSION, "header: protocol version %llu, expected 1",
                 (unsigned long long)h->version);
        goto out;
    }
    /* Every string at its wire length, before any is copied: protobuf-c's copies stop at a
     * NUL inside and are not checked for UTF-8. */
    if (!wire.text_ok) {
        rc = bad(fault, FL_FAULT_HEADER, "%s", wire.text_why);
        goto out;
    }
    if ((rc = copy_id(out->job_id, FL_JOB_MAX, h->job_id, "job id", fault)) != FL_OK ||
        (rc = decode_frames(h, out, fault)) != FL_OK)
        goto out;
    rc = decode_body(h, wire.nbodies, out, fault);
out:
    if (rc != FL_OK && rc != FL_EPROTO && *fault == FL_FAULT_NONE)
        *fault = FL_FAULT_HEADER;
    if (rc != FL_OK)
        fl_msg_hdr_free_tables(out);
    flodl__header__free_unpacked(h, NULL);
    return rc;
}
