/* A header's bytes, walked with the generated descriptors before protobuf-c unpacks them.
 * protobuf-c allocates every entry of a repeated field before anyone can count them (a header
 * declaring 400,000 frames costs milliseconds and megabytes), hands every string over as a
 * NUL-terminated copy (a NUL inside silently cuts it: "flodl\0evil" arrives as "flodl"), checks
 * no UTF-8, and of several bodies keeps the last. This walk refuses a list at the first entry
 * past its bound and a length past the bytes there are, counts the bodies, and checks every
 * string field, of this schema or a later one, against the wire-text rule (fl_text_scan) at
 * its full wire length. It trusts no length and allocates nothing. */
#include "msg_int.h"

#include <stdio.h>

#define MAX_DEPTH 4   /* Header > Welcome > Peer is the deepest the schema goes */
#define MAX_FIELDS 32 /* fields of the widest message (Header, with its bodies) */

typedef struct scan {
    size_t len; /* the whole header's bytes, for the error text */
    unsigned nbodies;
    fl_msg_fault_t text_fault; /* the first string that is not wire text, reported later */
    char text_why[160];
} scan_t;

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t r = 0;
    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            *v = r;
            return true;
        }
    }
    return false;
}

static int unparsable(const scan_t *sc, fl_msg_fault_t *fault, const char *d)
{
    *fault = FL_FAULT_HEADER;
    return fl_fail(FL_EPROTO, "header: %zu bytes do not parse as a header (at a %s field)", sc->len,
                   d);
}

/* Entries a packed list of varints holds: one per byte that ends a varint. */
static uint64_t packed_count(const uint8_t *p, uint64_t n)
{
    uint64_t count = 0;
    for (uint64_t i = 0; i < n; i++)
        count += (p[i] & 0x80) == 0;
    return count;
}

/* Adds entries to field f's count in this message and refuses the first one past its bound. */
static int count_entries(const ProtobufCMessageDescriptor *d, const ProtobufCFieldDescriptor *f,
                         uint32_t *counts, uint64_t entries, fl_msg_fault_t *fault)
{
    size_t i = (size_t)(f - d->fields);
    if (f->label != PROTOBUF_C_LABEL_REPEATED || i >= MAX_FIELDS)
        return FL_OK;
    const char *name = f->name;
    bool table = false;
    uint32_t max = fl_msg_list_max(d, f, &name, &table);
    if (counts[i] + entries <= max) {
        counts[i] += (uint32_t)entries;
        return FL_OK;
    }
    if (d == &flodl__header__descriptor) {
        *fault = FL_FAULT_FRAMES;
        return fl_fail(FL_EPROTO, "header: declares %u frames or more, at most %u", max + 1, max);
    }
    *fault = FL_FAULT_HEADER;
    return fl_fail(FL_EPROTO, "header: %s %s of %llu entries or more is too long", name,
                   table ? "table" : "list", (unsigned long long)max + 1);
}

static void check_text(scan_t *sc, const ProtobufCMessageDescriptor *d,
                       const ProtobufCFieldDescriptor *f, const uint8_t *p, uint64_t v)
{
    const char *why;
    size_t at = fl_text_scan(p, (size_t)v, &why);
    if (at == (size_t)v || sc->text_fault != FL_FAULT_NONE)
        return;
    sc->text_fault = FL_FAULT_HEADER;
    snprintf(sc->text_why, sizeof sc->text_why, "header: %s.%s has %s at byte %zu of %llu",
             d->short_name, f->name, why, at, (unsigned long long)v);
}

static int walk(scan_t *sc, const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                int depth, fl_msg_fault_t *fault);

static int length_prefixed(scan_t *sc, const ProtobufCMessageDescriptor *d,
                           const ProtobufCFieldDescriptor *f, const uint8_t *p, uint64_t v,
                           int depth, uint32_t *counts, fl_msg_fault_t *fault)
{
    if (f == NULL)
        return FL_OK;
    if (depth == 0 && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0)
        sc->nbodies++;
    bool scalar = f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE &&
                  f->type != PROTOBUF_C_TYPE_BYTES;
    int rc = count_entries(d, f, counts, scalar ? packed_count(p, v) : 1, fault);
    if (rc != FL_OK)
        return rc;
    if (f->type == PROTOBUF_C_TYPE_STRING)
        check_text(sc, d, f, p, v);
    else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        if (depth + 1 >= MAX_DEPTH)
            return unparsable(sc, fault, d->short_name);
        return walk(sc, f->descriptor, p, (size_t)v, depth + 1, fault);
    }
    return FL_OK;
}

static int walk(scan_t *sc, const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                int depth, fl_msg_fault_t *fault)
{
    const uint8_t *end = p + n;
    uint32_t counts[MAX_FIELDS] = {0};
    while (p < end) {
        uint64_t key;
        uint64_t v;
        int rc = FL_OK;
        /* Field 0 does not exist: bytes of zeros stop here, not after a walk through them. */
        if (!read_varint(&p, end, &key) || key >> 3 == 0)
            return unparsable(sc, fault, d->short_name);
        uint64_t tag = key >> 3;
        const ProtobufCFieldDescriptor *f =
            tag <= 0x1fffffff ? protobuf_c_message_descriptor_get_field(d, (unsigned)tag) : NULL;
        switch (key & 7) {
        case PROTOBUF_C_WIRE_TYPE_VARINT:
            if (!read_varint(&p, end, &v))
                return unparsable(sc, fault, d->short_name);
            if (f != NULL)
                rc = count_entries(d, f, counts, 1, fault);
            break;
        case PROTOBUF_C_WIRE_TYPE_64BIT:
        case PROTOBUF_C_WIRE_TYPE_32BIT:
            v = (key & 7) == PROTOBUF_C_WIRE_TYPE_64BIT ? 8 : 4;
            if ((uint64_t)(end - p) < v)
                return unparsable(sc, fault, d->short_name);
            p += v;
            if (f != NULL)
                rc = count_entries(d, f, counts, 1, fault);
            break;
        case PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED:
            if (!read_varint(&p, end, &v) || v > (uint64_t)(end - p))
                return unparsable(sc, fault, d->short_name);
            rc = length_prefixed(sc, d, f, p, v, depth, counts, fault);
            p += v;
            break;
        default: /* groups (3, 4) and the unused wire types */
            return unparsable(sc, fault, d->short_name);
        }
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

int fl_msg_wire_scan(const void *data, size_t len, fl_msg_wire_t *out, fl_msg_fault_t *fault)
{
    scan_t sc = {.len = len, .nbodies = 0, .text_fault = FL_FAULT_NONE, .text_why = ""};
    *fault = FL_FAULT_NONE;
    out->nbodies = 0;
    out->text_ok = true;
    int rc = len == 0 ? FL_OK : walk(&sc, &flodl__header__descriptor, data, len, 0, fault);
    out->nbodies = sc.nbodies;
    out->text_ok = sc.text_fault == FL_FAULT_NONE;
    snprintf(out->text_why, sizeof out->text_why, "%s", sc.text_why);
    return rc;
}
