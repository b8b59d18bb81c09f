/* Header lifetime and the frame check: the pieces of proto/ that need no protobuf-c. */
#include "fl_msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fl_msg_hdr_init(fl_msg_hdr_t *h, fl_msg_type_t type, int32_t sender)
{
    memset(h, 0, sizeof *h);
    h->version = FL_MSG_VERSION;
    h->type = type;
    h->sender = sender;
    if (type == FL_MSG_HEARTBEAT)
        h->u.heartbeat.waiting_on = -1;
    if (type == FL_MSG_ERROR)
        h->u.error.about_rank = -1;
}

void fl_msg_hdr_free_tables(fl_msg_hdr_t *h)
{
    if (h == NULL)
        return;
    if (h->type == FL_MSG_WELCOME) {
        free(h->u.welcome.peers);
        h->u.welcome.peers = NULL;
        h->u.welcome.npeers = 0;
        free(h->u.welcome.shards);
        h->u.welcome.shards = NULL;
        h->u.welcome.nshards = 0;
    } else if (h->type == FL_MSG_REGISTER) {
        free(h->u.reg.shard_eps);
        h->u.reg.shard_eps = NULL;
        h->u.reg.nshard_eps = 0;
    }
}

void fl_msg_hdr_deinit(fl_msg_hdr_t *h)
{
    if (h == NULL)
        return;
    fl_msg_hdr_free_tables(h);
    memset(h, 0, sizeof *h);
}

/* A zeroed table of n entries of size bytes, its count in *count (0 when there is none: n = 0,
 * or out of memory). */
static void *table_new(uint32_t n, size_t size, uint32_t *count)
{
    void *items = n > 0 ? calloc(n, size) : NULL;
    *count = items != NULL ? n : 0;
    return items;
}

int fl_msg_welcome_alloc(fl_msg_hdr_t *h, uint32_t npeers)
{
    fl_msg_welcome_t *w = &h->u.welcome;
    w->peers = table_new(npeers, sizeof *w->peers, &w->npeers);
    if (w->npeers != npeers)
        return fl_fail(FL_ENOMEM, "welcome: out of memory for %u peers", npeers);
    return FL_OK;
}

int fl_msg_welcome_alloc_shards(fl_msg_hdr_t *h, uint32_t nshards)
{
    fl_msg_welcome_t *w = &h->u.welcome;
    w->shards = table_new(nshards, sizeof *w->shards, &w->nshards);
    if (w->nshards != nshards)
        return fl_fail(FL_ENOMEM, "welcome: out of memory for %u shards", nshards);
    return FL_OK;
}

int fl_msg_register_alloc_shards(fl_msg_register_t *reg, uint32_t n)
{
    reg->shard_eps = table_new(n, sizeof *reg->shard_eps, &reg->nshard_eps);
    if (reg->nshard_eps != n)
        return fl_fail(FL_ENOMEM, "register: out of memory for %u shard endpoints", n);
    return FL_OK;
}

int fl_msg_hdr_copy(fl_msg_hdr_t *dst, const fl_msg_hdr_t *src)
{
    *dst = *src;
    /* Nothing of src's may be freed through dst, whatever fails below. */
    if (src->type == FL_MSG_WELCOME) {
        dst->u.welcome.peers = NULL;
        dst->u.welcome.npeers = 0;
        dst->u.welcome.shards = NULL;
        dst->u.welcome.nshards = 0;
    } else if (src->type == FL_MSG_REGISTER) {
        dst->u.reg.shard_eps = NULL;
        dst->u.reg.nshard_eps = 0;
    }
    if (src->type == FL_MSG_WELCOME) {
        const fl_msg_welcome_t *w = &src->u.welcome;
        if (fl_msg_welcome_alloc(dst, w->npeers) != FL_OK)
            goto fail;
        if (w->npeers > 0)
            memcpy(dst->u.welcome.peers, w->peers, (size_t)w->npeers * sizeof *w->peers);
        if (fl_msg_welcome_alloc_shards(dst, w->nshards) != FL_OK)
            goto fail;
        if (w->nshards > 0)
            memcpy(dst->u.welcome.shards, w->shards, (size_t)w->nshards * sizeof *w->shards);
    } else if (src->type == FL_MSG_REGISTER) {
        const fl_msg_register_t *r = &src->u.reg;
        if (fl_msg_register_alloc_shards(&dst->u.reg, r->nshard_eps) != FL_OK)
            goto fail;
        if (r->nshard_eps > 0)
            memcpy(dst->u.reg.shard_eps, r->shard_eps,
                   (size_t)r->nshard_eps * sizeof *r->shard_eps);
    }
    return FL_OK;
fail:
    fl_msg_hdr_free_tables(dst);
    return FL_ENOMEM;
}

const char *fl_msg_type_name(int type)
{
    switch (type) {
    case FL_MSG_REGISTER: return "register";
    case FL_MSG_WELCOME: return "welcome";
    case FL_MSG_BARRIER: return "barrier";
    case FL_MSG_HEARTBEAT: return "heartbeat";
    case FL_MSG_ERROR: return "error";
    case FL_MSG_SHUTDOWN: return "shutdown";
    case FL_MSG_CHUNK: return "chunk";
    case FL_MSG_PUSH: return "push";
    case FL_MSG_PUSH_ACK: return "push-ack";
    case FL_MSG_PULL: return "pull";
    case FL_MSG_PULL_REPLY: return "pull-reply";
    default: return "unknown";
    }
}

const char *fl_msg_op_name(uint32_t op)
{
    switch (op) {
    case FL_MSG_OP_NONE: return "none";
    case FL_MSG_OP_ALLREDUCE: return "allreduce";
    case FL_MSG_OP_REDUCE_SCATTER: return "reduce-scatter";
    case FL_MSG_OP_ALLGATHER: return "all-gather";
    case FL_MSG_OP_BROADCAST: return "broadcast";
    case FL_MSG_OP_BARRIER: return "barrier";
    case FL_MSG_OP_SPARSE_ALLREDUCE: return "sparse allreduce";
    case FL_MSG_OP_PUSH: return "push";
    case FL_MSG_OP_PULL: return "pull";
    case FL_MSG_OP_PUSH_PULL: return "push and pull";
    default: {
        static _Thread_local char other[32];
        snprintf(other, sizeof other, "operation %u", op);
        return other;
    }
    }
}

uint64_t fl_msg_ps_piece(uint64_t count)
{
    const uint64_t min = (uint64_t)1 << 20;
    if (count <= min)
        return count;
    uint64_t per = (count + FL_MSG_MAX_FRAMES - 1) / FL_MSG_MAX_FRAMES;
    per = (per + FL_MSG_PS_ALIGN - 1) / FL_MSG_PS_ALIGN * FL_MSG_PS_ALIGN;
    return per > min ? per : min;
}

bool fl_msg_op_is_ps(uint32_t op)
{
    return op == FL_MSG_OP_PUSH || op == FL_MSG_OP_PULL || op == FL_MSG_OP_PUSH_PULL;
}

int fl_msg_check_frames(const fl_msg_hdr_t *h, const size_t *sizes, size_t n, size_t max_bytes,
                        fl_msg_fault_t *fault)
{
    *fault = FL_FAULT_NONE;
    if (n != h->nframes) {
        *fault = FL_FAULT_FRAMES;
        return fl_fail(FL_EPROTO, "%s message declares %u payload frames but %zu arrived",
                       fl_msg_type_name(h->type), h->nframes, n);
    }
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] != h->frames[i].bytes) {
            *fault = FL_FAULT_FRAMES;
            return fl_fail(FL_EPROTO, "%s message frame %zu declares %llu bytes but %zu arrived",
                           fl_msg_type_name(h->type), i, (unsigned long long)h->frames[i].bytes,
                           sizes[i]);
        }
        if (h->frames[i].bytes > max_bytes || h->frames[i].raw_bytes > max_bytes) {
            *fault = FL_FAULT_SIZE;
            return fl_fail(FL_EPROTO,
                           "%s message frame %zu of %llu bytes (%llu decoded) is over "
                           "the %zu-byte limit",
                           fl_msg_type_name(h->type), i, (unsigned long long)h->frames[i].bytes,
                           (unsigned long long)h->frames[i].raw_bytes, max_bytes);
        }
    }
    return FL_OK;
}
