/* Private to proto/: the generated protobuf-c declarations. No other folder includes this. */
#ifndef FL_MSG_INT_H
#define FL_MSG_INT_H

#include "fl_msg.h"
#include "flodl.pb-c.h"

/* The Header.body member that carries a message of this type, or NOT_SET for an unknown
 * type. */
static inline Flodl__Header__BodyCase fl_msg_body_case(int type)
{
    switch (type) {
    case FL_MSG_REGISTER: return FLODL__HEADER__BODY_REG;
    case FL_MSG_WELCOME: return FLODL__HEADER__BODY_WELCOME;
    case FL_MSG_BARRIER: return FLODL__HEADER__BODY_BARRIER;
    case FL_MSG_HEARTBEAT: return FLODL__HEADER__BODY_HEARTBEAT;
    case FL_MSG_ERROR: return FLODL__HEADER__BODY_ERROR;
    case FL_MSG_SHUTDOWN: return FLODL__HEADER__BODY_SHUTDOWN;
    case FL_MSG_CHUNK: return FLODL__HEADER__BODY_CHUNK;
    case FL_MSG_PUSH: return FLODL__HEADER__BODY_PUSH;
    case FL_MSG_PUSH_ACK: return FLODL__HEADER__BODY_PUSH_ACK;
    case FL_MSG_PULL: return FLODL__HEADER__BODY_PULL;
    case FL_MSG_PULL_REPLY: return FLODL__HEADER__BODY_PULL_REPLY;
    default: return FLODL__HEADER__BODY__NOT_SET;
    }
}

/* The message type whose body a Header.body case is (0 for NOT_SET). */
static inline int fl_msg_type_of_body(Flodl__Header__BodyCase body)
{
    for (int t = FL_MSG_REGISTER; t <= FL_MSG_PULL_REPLY; t++)
        if (fl_msg_body_case(t) == body)
            return t;
    return FL_MSG_NONE;
}

/* What the walk of a header's bytes found (msg_wire.c). */
typedef struct fl_msg_wire {
    unsigned nbodies;   /* body fields on the wire: protobuf-c keeps only the last */
    bool text_ok;       /* every string field is wire text at its full length */
    char text_why[160]; /* else the first that is not: "Register.host has a control ..." */
} fl_msg_wire_t;

/* Walks a header's bytes before protobuf-c unpacks them (msg_wire.c): refuses bytes that do not
 * parse, a length past the end, and a list at its first entry past the bound of its field
 * (fl_msg_list_max), so no count declared on the wire costs work or memory beyond the bound.
 * FL_OK, or FL_EPROTO with *fault FL_FAULT_FRAMES (frames) or FL_FAULT_HEADER. Strings are
 * checked against the wire-text rule but only reported in out, so that the caller can check
 * the magic and version first. */
int fl_msg_wire_scan(const void *data, size_t len, fl_msg_wire_t *out, fl_msg_fault_t *fault);

/* The most entries repeated field f of message d may carry (msg_fields.c), with its name and
 * whether it is a table of messages for the error text; UINT32_MAX for a list no table knows. */
uint32_t fl_msg_list_max(const ProtobufCMessageDescriptor *d, const ProtobufCFieldDescriptor *f,
                         const char **name, bool *table);

/* ---- the field tables (msg_fields.c) ---- */

/* How a field of a message body travels, and what each direction checks. Strings and lists
 * are bounded by the C side's arrays: cap is a string's bytes, terminator included. */
typedef enum fl_msg_kind {
    FL_MSG_F_U32,    /* a 4-byte integer or enum, copied bit for bit */
    FL_MSG_F_ENUM,   /* a 4-byte enum; decoding refuses a value past max: "unknown <name>" */
    FL_MSG_F_U64,    /* an 8-byte integer */
    FL_MSG_F_BOOL,   /* bool here, protobuf_c_boolean there */
    FL_MSG_F_ID,     /* an identifier, char[cap]: refused, never cut, when too long */
    FL_MSG_F_ID_CUT, /* an identifier when sent, cut rather than refused when taken */
    FL_MSG_F_TEXT,   /* free text, char[cap]: escaped when sent, cut when taken */
    /* the lists, last: a kind >= FL_MSG_F_IDS has a count */
    FL_MSG_F_IDS,      /* at most max identifiers: char[max][cap] and a uint32_t count */
    FL_MSG_F_U64S,     /* at most max uint64_t: an array and a uint32_t count */
    FL_MSG_F_ID_TABLE, /* at most max identifiers: a heap char (*)[cap] and a uint32_t count */
    FL_MSG_F_TABLE,    /* at most max messages of table sub: a heap array, a uint32_t count */
} fl_msg_kind_t;

typedef struct fl_msg_table fl_msg_table_t;

/* One field: where it lives in the fl_msg_*_t body and in the protobuf-c struct. */
typedef struct fl_msg_field {
    const char *name; /* in error texts: "host", "shard endpoint", "push kind" */
    fl_msg_kind_t kind;
    size_t off;   /* in the body */
    size_t pb;    /* in the protobuf-c struct */
    size_t n_off; /* lists: the body's uint32_t count */
    size_t pb_n;  /* lists: the protobuf-c struct's size_t count */
    size_t cap;   /* strings, and a list's strings: bytes, terminator included */
    uint32_t max; /* lists: most entries; enums: the largest value known */
    int (*check)(const char *s, size_t cap); /* strings: a further rule (settings) */
    const fl_msg_table_t *sub;               /* FL_MSG_F_TABLE: its entries' fields */
} fl_msg_field_t;

/* A message's fields, in the order both directions check them. */
struct fl_msg_table {
    const char *name; /* "welcome": the message, in out-of-memory texts */
    const ProtobufCMessageDescriptor *pb;
    size_t size; /* of the C struct: an entry of a table */
    const fl_msg_field_t *fields;
    size_t nfields;
};

/* The table of a message type's body; NULL for an unknown type. */
const fl_msg_table_t *fl_msg_table(int type);

#endif
