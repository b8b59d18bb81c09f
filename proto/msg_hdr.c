/* Header lifetime and the frame check: the pieces of proto/ that need no protobuf-c. */
#include "fl_msg.h"

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

void fl_msg_hdr_deinit(fl_msg_hdr_t *h)
{
    if (h == NULL)
        return;
    if (h->type == FL_MSG_WELCOME)
        free(h->u.welcome.peers);
    memset(h, 0, sizeof *h);
}

void fl_msg_hdr_free_tables(fl_msg_hdr_t *h)
{
    if (h != NULL && h->type == FL_MSG_WELCOME) {
        free(h->u.welcome.peers);
        h->u.welcome.peers = NULL;
        h->u.welcome.npeers = 0;
    }
}

int fl_msg_welcome_alloc(fl_msg_hdr_t *h, uint32_t npeers)
{
    h->u.welcome.peers = NULL;
    h->u.welcome.npeers = 0;
    if (npeers == 0)
        return FL_OK;
    h->u.welcome.peers = calloc(npeers, sizeof *h->u.welcome.peers);
    if (h->u.welcome.peers == NULL)
        return fl_fail(FL_ENOMEM, "welcome: out of memory for %u peers", npeers);
    h->u.welcome.npeers = npeers;
    return FL_OK;
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
    default: return "unknown";
    }
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
                           fl_msg_type_name(h->type), i,
                           (unsigned long long)h->frames[i].bytes, sizes[i]);
        }
        if (h->frames[i].bytes > max_bytes || h->frames[i].raw_bytes > max_bytes) {
            *fault = FL_FAULT_SIZE;
            return fl_fail(FL_EPROTO, "%s message frame %zu of %llu bytes (%llu decoded) is over "
                                      "the %zu-byte limit",
                           fl_msg_type_name(h->type), i, (unsigned long long)h->frames[i].bytes,
                           (unsigned long long)h->frames[i].raw_bytes, max_bytes);
        }
    }
    return FL_OK;
}
