/* Rendezvous, rank side: register with the coordinator through the membership of transport/
 * (rank, world size, host, data endpoints, model signature, tuning) and take the peer table
 * from the welcome, after checking that it describes exactly this job's ranks. A refusal comes
 * back as the coordinator's text; a timeout says how far the rendezvous got. */
#include "comm_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void fl_comm_tuning(const fl_comm_t *c, char *out, size_t cap)
{
    snprintf(out, cap, "seg=%zu,small=%zu,algo=%d", c->segment_bytes, c->small_bytes, (int)c->algo);
}

static void make_register(const fl_comm_t *c, fl_msg_register_t *r)
{
    memset(r, 0, sizeof *r);
    r->role = FL_ROLE_WORKER;
    r->rank = c->rank;
    r->world_size = c->size;
    snprintf(r->host, sizeof r->host, "%s", c->host);
    r->nendpoints = (uint32_t)c->nendpoints;
    for (int k = 0; k < c->nendpoints; k++)
        snprintf(r->endpoints[k], sizeof r->endpoints[k], "%s", c->endpoints[k]);
    r->pid = (int32_t)getpid();
    r->model_signature = c->model_signature;
    fl_comm_tuning(c, r->tuning, sizeof r->tuning);
    snprintf(r->settings, sizeof r->settings, "%s", c->settings);
}

/* Takes the peer table, after checking that it describes exactly this job's ranks. */
static int take_welcome(fl_comm_t *c, fl_msg_hdr_t *h)
{
    fl_msg_welcome_t *w = &h->u.welcome;
    if (w->npeers != (uint32_t)c->size)
        return fl_fail(FL_EPROTO,
                       "rank %d: coordinator %s sent a peer table of %u ranks for a "
                       "job of %d",
                       c->rank, c->coordinator, w->npeers, c->size);
    for (uint32_t i = 0; i < w->npeers; i++) {
        if (w->peers[i].rank != (int32_t)i || w->peers[i].nendpoints < 1)
            return fl_fail(FL_EPROTO,
                           "rank %d: coordinator's peer table entry %u names rank %d "
                           "with %u endpoints",
                           c->rank, i, w->peers[i].rank, w->peers[i].nendpoints);
    }
    c->peers = w->peers;
    w->peers = NULL;
    w->npeers = 0;
    c->generation = h->generation;
    c->hb_ms = (int)w->heartbeat_ms;
    c->hb_timeout_ms = (int)w->heartbeat_timeout_ms;
    return FL_OK;
}

int fl_comm_rendezvous(fl_comm_t *c, int timeout_ms)
{
    char name[64];
    snprintf(name, sizeof name, "rank %d", c->rank);
    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    mo.coordinator = c->coordinator;
    mo.job_id = c->job_id;
    mo.name = name;
    mo.sender = c->rank;
    mo.rendezvous_timeout_ms = timeout_ms;
    int rc = fl_tp_member_create(c->ctx, &mo, &c->member);
    if (rc != FL_OK)
        return rc;
    c->events = fl_tp_member_events(c->member);
    c->status = fl_tp_member_status(c->member);
    fl_msg_register_t reg;
    make_register(c, &reg);
    fl_msg_hdr_t welcome;
    if ((rc = fl_tp_member_join(c->member, &reg, &welcome)) != FL_OK)
        return rc;
    rc = take_welcome(c, &welcome);
    fl_msg_hdr_deinit(&welcome);
    return rc;
}
