/* What protobuf-c does not check in a header's bytes: it hands every string over as a
 * NUL-terminated copy (a NUL inside silently cuts it: "flodl\0evil" arrives as "flodl") and
 * checks no UTF-8, and of several bodies it keeps the last. This walks the wire bytes with the
 * generated descriptors, so every string field, of this schema or a later one, meets the
 * wire-text rule (fl_text_scan) at its full wire length, and counts the bodies. Run after
 * protobuf-c accepted the bytes; it still trusts no length. */
#include "msg_int.h"

#include <stdio.h>

#define MAX_DEPTH 4 /* Header > Welcome > Peer is the deepest the schema goes */

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

static int unparsable(fl_msg_fault_t *fault, const char *d)
{
    *fault = FL_FAULT_HEADER;
    return fl_fail(FL_EPROTO, "header: %s does not parse", d);
}

static int walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, int depth,
                unsigned *nbodies, fl_msg_fault_t *fault)
{
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t key;
        uint64_t v;
        if (!read_varint(&p, end, &key))
            return unparsable(fault, d->short_name);
        uint64_t tag = key >> 3;
        const ProtobufCFieldDescriptor *f =
            tag > 0 && tag <= 0x1fffffff ? protobuf_c_message_descriptor_get_field(d, (unsigned)tag)
                                         : NULL;
        switch (key & 7) {
        case PROTOBUF_C_WIRE_TYPE_VARINT:
            if (!read_varint(&p, end, &v))
                return unparsable(fault, d->short_name);
            break;
        case PROTOBUF_C_WIRE_TYPE_64BIT:
            if (end - p < 8)
                return unparsable(fault, d->short_name);
            p += 8;
            break;
        case PROTOBUF_C_WIRE_TYPE_32BIT:
            if (end - p < 4)
                return unparsable(fault, d->short_name);
            p += 4;
            break;
        case PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED:
            if (!read_varint(&p, end, &v) || v > (uint64_t)(end - p))
                return unparsable(fault, d->short_name);
            if (f != NULL && depth == 0 && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0)
                (*nbodies)++;
            if (f != NULL && f->type == PROTOBUF_C_TYPE_STRING) {
                const char *why;
                size_t at = fl_text_scan(p, (size_t)v, &why);
                if (at != (size_t)v) {
                    *fault = FL_FAULT_HEADER;
                    return fl_fail(FL_EPROTO, "header: %s.%s has %s at byte %zu of %llu",
                                   d->short_name, f->name, why, at, (unsigned long long)v);
                }
            } else if (f != NULL && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                if (depth + 1 >= MAX_DEPTH)
                    return unparsable(fault, d->short_name);
                int rc = walk(f->descriptor, p, (size_t)v, depth + 1, nbodies, fault);
                if (rc != FL_OK)
                    return rc;
            }
            p += v;
            break;
        default: /* groups (3, 4) and the unused wire types */
            return unparsable(fault, d->short_name);
        }
    }
    return FL_OK;
}

int fl_msg_wire_check(const void *data, size_t len, unsigned *nbodies, fl_msg_fault_t *fault)
{
    *nbodies = 0;
    if (len == 0)
        return FL_OK;
    return walk(&flodl__header__descriptor, data, len, 0, nbodies, fault);
}
