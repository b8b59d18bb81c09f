/* The field table of every message body: each field once, with where it lives on both sides
 * (fl_msg.h's structs, protobuf-c's) and its bound. msg_encode.c and msg_decode.c walk the same
 * tables, so the two directions cannot disagree on a field or its limit. The header's own
 * fields (magic, version, job id, frames) are checked in a stricter order and stay with the
 * walkers. Entries are in the order decoding checks them. */
#include "msg_int.h"

#include <stddef.h>

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* 0 when member m of T is n bytes, a compile error otherwise: no entry can drift from the
 * struct it describes. */
#define SIZED(T, m, n) (0 * sizeof(char[sizeof(((T *)0)->m) == (n) ? 1 : -1]))

/* Each table defines S (the fl_msg body) and P (the protobuf-c struct) for these. */
#define NUM(k, m, pm, n)                                                                           \
    {                                                                                              \
        .name = #m, .kind = (k), .off = offsetof(S, m) + SIZED(S, m, n),                           \
        .pb = offsetof(P, pm) + SIZED(P, pm, n)                                                    \
    }
#define U32(m) NUM(FL_MSG_F_U32, m, m, 4)
#define U64(m) NUM(FL_MSG_F_U64, m, m, 8)
#define U64_AS(m, pm) NUM(FL_MSG_F_U64, m, pm, 8)
#define BOOL(m)                                                                                    \
    {                                                                                              \
        .name = #m, .kind = FL_MSG_F_BOOL, .off = offsetof(S, m) + SIZED(S, m, sizeof(bool)),      \
        .pb = offsetof(P, m) + SIZED(P, m, sizeof(protobuf_c_boolean))                             \
    }
#define ENUM(m, what, top)                                                                         \
    {                                                                                              \
        .name = (what), .kind = FL_MSG_F_ENUM, .off = offsetof(S, m) + SIZED(S, m, 4),             \
        .pb = offsetof(P, m) + SIZED(P, m, 4), .max = (top)                                        \
    }
#define STR_CHECKED(k, m, what, fn)                                                                \
    {                                                                                              \
        .name = (what), .kind = (k), .off = offsetof(S, m),                                        \
        .pb = offsetof(P, m) + SIZED(P, m, sizeof(char *)), .cap = sizeof(((S *)0)->m),            \
        .check = (fn)                                                                              \
    }
#define STR(k, m, what) STR_CHECKED(k, m, what, NULL)
#define LIST(k, m, nm, pm, what)                                                                   \
    .name = (what), .kind = (k), .off = offsetof(S, m),                                            \
    .n_off = offsetof(S, nm) + SIZED(S, nm, 4),                                                    \
    .pb = offsetof(P, pm) + SIZED(P, pm, sizeof(void *)),                                          \
    .pb_n = offsetof(P, n_##pm) + SIZED(P, n_##pm, sizeof(size_t))
#define IDS(m, nm, what)                                                                           \
    {                                                                                              \
        LIST(FL_MSG_F_IDS, m, nm, m, what), .cap = sizeof(((S *)0)->m[0]),                         \
                                            .max = NELEM(((S *)0)->m)                              \
    }
#define U64S(m, nm, what)                                                                          \
    {                                                                                              \
        LIST(FL_MSG_F_U64S, m, nm, m, what), .max = NELEM(((S *)0)->m)                             \
    }
#define ID_TABLE(m, nm, pm, what, top)                                                             \
    {                                                                                              \
        LIST(FL_MSG_F_ID_TABLE, m, nm, pm, what), .cap = sizeof(*((S *)0)->m), .max = (top)        \
    }
#define TABLE(m, nm, what, top, table)                                                             \
    {                                                                                              \
        LIST(FL_MSG_F_TABLE, m, nm, m, what), .max = (top), .sub = &(table)                        \
    }
#define TABLE_OF(var, what, desc, fields)                                                          \
    static const fl_msg_table_t var = {(what), &(desc), sizeof(S), (fields), NELEM(fields)}

#define S fl_msg_peer_t
#define P Flodl__Peer
static const fl_msg_field_t peer_fields[] = {
    U32(rank),
    STR(FL_MSG_F_ID, host, "peer host"),
    IDS(endpoints, nendpoints, "endpoint"),
    U32(pid),
};
TABLE_OF(peer_table, "peer", flodl__peer__descriptor, peer_fields);
#undef S
#undef P

#define S fl_msg_shard_t
#define P Flodl__Shard
static const fl_msg_field_t shard_fields[] = {
    U32(index),
    U64(offset),
    U64(count),
    STR(FL_MSG_F_ID, endpoint, "shard endpoint"),
    STR(FL_MSG_F_ID, host, "shard host"),
};
TABLE_OF(shard_table, "shard", flodl__shard__descriptor, shard_fields);
#undef S
#undef P

#define S fl_msg_register_t
#define P Flodl__Register
static const fl_msg_field_t register_fields[] = {
    U32(rank),
    U32(world_size),
    U32(pid),
    U64(model_signature),
    STR(FL_MSG_F_ID, host, "host"),
    STR(FL_MSG_F_ID, tuning, "tuning"),
    STR_CHECKED(FL_MSG_F_ID, settings, "settings", fl_settings_check),
    STR(FL_MSG_F_ID, model_shapes, "model shapes"),
    IDS(endpoints, nendpoints, "endpoint"),
    ENUM(role, "role", FLODL__ROLE__ROLE_SERVER),
    ENUM(consistency, "consistency", FLODL__CONSISTENCY__CONSISTENCY_SSP),
    U64(param_count),
    U32(shard_count),
    U32(num_shards),
    U32(staleness),
    U64_AS(ckpt_every_steps, checkpoint_every_steps),
    U64_AS(ckpt_every_ms, checkpoint_every_ms),
    U64S(checkpoints, ncheckpoints, "checkpoint"),
    ID_TABLE(shard_eps, nshard_eps, shard_endpoints, "shard endpoint", FL_MSG_MAX_SHARDS),
    STR(FL_MSG_F_ID, token, "token"),
};
TABLE_OF(register_table, "register", flodl__register__descriptor, register_fields);
#undef S
#undef P

#define S fl_msg_welcome_t
#define P Flodl__Welcome
static const fl_msg_field_t welcome_fields[] = {
    TABLE(peers, npeers, "peer", FL_MSG_MAX_PEERS, peer_table),
    U32(heartbeat_ms),
    U32(heartbeat_timeout_ms),
    ENUM(consistency, "consistency", FLODL__CONSISTENCY__CONSISTENCY_SSP),
    TABLE(shards, nshards, "shard", FL_MSG_MAX_SHARDS, shard_table),
    U64(param_count),
    U32(staleness),
    BOOL(resume),
    U64(resume_step),
    U64_AS(ckpt_every_steps, checkpoint_every_steps),
    U64_AS(ckpt_every_ms, checkpoint_every_ms),
    STR(FL_MSG_F_ID, token, "token"),
};
TABLE_OF(welcome_table, "welcome", flodl__welcome__descriptor, welcome_fields);
#undef S
#undef P

#define S fl_msg_barrier_t
#define P Flodl__Barrier
static const fl_msg_field_t barrier_fields[] = {U64(id), U32(round)};
TABLE_OF(barrier_table, "barrier", flodl__barrier__descriptor, barrier_fields);
#undef S
#undef P

#define S fl_msg_heartbeat_t
#define P Flodl__Heartbeat
static const fl_msg_field_t heartbeat_fields[] = {
    U32(op),         U64(op_seq),     U32(op_step),
    U32(waiting_on), U32(registered), STR(FL_MSG_F_TEXT, missing, "missing"),
};
TABLE_OF(heartbeat_table, "heartbeat", flodl__heartbeat__descriptor, heartbeat_fields);
#undef S
#undef P

/* An error's host names another member: checked like any identifier when sent, but an error
 * must reach whoever it is for, so a receiver cuts that host instead of refusing the error. */
#define S fl_msg_error_t
#define P Flodl__Error
static const fl_msg_field_t error_fields[] = {
    U32(code),
    U32(about_rank),
    STR(FL_MSG_F_ID_CUT, host, "error host"),
    STR(FL_MSG_F_TEXT, text, "error text"),
};
TABLE_OF(error_table, "error", flodl__error__descriptor, error_fields);
#undef S
#undef P

#define S fl_msg_shutdown_t
#define P Flodl__Shutdown
static const fl_msg_field_t shutdown_fields[] = {
    U32(code),
    STR(FL_MSG_F_TEXT, text, "shutdown text"),
};
TABLE_OF(shutdown_table, "shutdown", flodl__shutdown__descriptor, shutdown_fields);
#undef S
#undef P

#define S fl_msg_chunk_t
#define P Flodl__Chunk
static const fl_msg_field_t chunk_fields[] = {
    U32(coll),  U32(phase), U32(step),  U32(seg),   U64(offset),
    U64(count), U32(op),    U64(total), U32(dtype),
};
TABLE_OF(chunk_table, "chunk", flodl__chunk__descriptor, chunk_fields);
#undef S
#undef P

#define S fl_msg_push_t
#define P Flodl__Push
static const fl_msg_field_t push_fields[] = {
    ENUM(kind, "push kind", FLODL__PUSH_KIND__PUSH_INIT),
    U32(shard),
    U64(offset),
    U64(count),
    U64(step),
    U32(batch),
    BOOL(checkpoint),
};
TABLE_OF(push_table, "push", flodl__push__descriptor, push_fields);
#undef S
#undef P

#define S fl_msg_push_ack_t
#define P Flodl__PushAck
static const fl_msg_field_t push_ack_fields[] = {U32(shard), U64(step), U64(version),
                                                 BOOL(ignored)};
TABLE_OF(push_ack_table, "push-ack", flodl__push_ack__descriptor, push_ack_fields);
#undef S
#undef P

#define S fl_msg_pull_t
#define P Flodl__Pull
static const fl_msg_field_t pull_fields[] = {
    U32(shard), U64(offset), U64(count), U64(step), BOOL(latest), U32(wait_ms), BOOL(lz4),
};
TABLE_OF(pull_table, "pull", flodl__pull__descriptor, pull_fields);
#undef S
#undef P

#define S fl_msg_pull_reply_t
#define P Flodl__PullReply
static const fl_msg_field_t pull_reply_fields[] = {
    U32(shard), U64(offset), U64(count), U64(version), U64(step), U64(min_step),
};
TABLE_OF(pull_reply_table, "pull-reply", flodl__pull_reply__descriptor, pull_reply_fields);
#undef S
#undef P

const fl_msg_table_t *fl_msg_table(int type)
{
    switch (type) {
    case FL_MSG_REGISTER: return &register_table;
    case FL_MSG_WELCOME: return &welcome_table;
    case FL_MSG_BARRIER: return &barrier_table;
    case FL_MSG_HEARTBEAT: return &heartbeat_table;
    case FL_MSG_ERROR: return &error_table;
    case FL_MSG_SHUTDOWN: return &shutdown_table;
    case FL_MSG_CHUNK: return &chunk_table;
    case FL_MSG_PUSH: return &push_table;
    case FL_MSG_PUSH_ACK: return &push_ack_table;
    case FL_MSG_PULL: return &pull_table;
    case FL_MSG_PULL_REPLY: return &pull_reply_table;
    default: return NULL;
    }
}

/* The list fields of table t and of its tables of messages, one level down (the schema's
 * deepest). */
static const fl_msg_field_t *list_in(const fl_msg_table_t *t, const ProtobufCMessageDescriptor *d,
                                     size_t pb_off)
{
    for (size_t i = 0; i < t->nfields; i++) {
        const fl_msg_field_t *f = &t->fields[i];
        if (t->pb == d && f->kind >= FL_MSG_F_IDS && f->pb == pb_off)
            return f;
        if (f->kind == FL_MSG_F_TABLE && f->sub->pb == d) {
            const fl_msg_field_t *g = list_in(f->sub, d, pb_off);
            if (g != NULL)
                return g;
        }
    }
    return NULL;
}

uint32_t fl_msg_list_max(const ProtobufCMessageDescriptor *d, const ProtobufCFieldDescriptor *f,
                         const char **name, bool *table)
{
    *name = f->name;
    *table = false;
    if (d == &flodl__header__descriptor)
        return FL_MSG_MAX_FRAMES; /* Header.frames, its only list */
    for (int type = FL_MSG_REGISTER; type <= FL_MSG_PULL_REPLY; type++) {
        const fl_msg_field_t *g = list_in(fl_msg_table(type), d, f->offset);
        if (g != NULL) {
            *name = g->name;
            *table = g->kind == FL_MSG_F_TABLE;
            return g->max;
        }
    }
    return UINT32_MAX;
}
