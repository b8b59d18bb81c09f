/* Rendezvous, rank side: register with the coordinator (rank, world size, host, data
 * endpoints, tuning), heartbeat while the others arrive, and take the peer table from the
 * welcome. A refusal comes back as the coordinator's text; a timeout says how far the
 * rendezvous got. */
#include "comm_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Often enough for any coordinator heartbeat timeout above ~0.5 s, which ranks cannot know
 * before the welcome. */
#define RDV_HEARTBEAT_MS 200
#define COORD_MAX_MSG ((size_t)64 << 20)

void fl_comm_tuning(const fl_comm_t *c, char *out, size_t cap)
{
    snprintf(out, cap, "seg=%zu,small=%zu,algo=%d", c->segment_bytes, c->small_bytes,
             (int)c->algo);
}

static int send_register(fl_comm_t *c)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, c->rank);
    snprintf(h.job_id, sizeof h.job_id, "%s", c->job_id);
    fl_msg_register_t *r = &h.u.reg;
    r->rank = c->rank;
    r->world_size = c->size;
    snprintf(r->host, sizeof r->host, "%s", c->host);
    r->nendpoints = (uint32_t)c->nendpoints;
    for (int k = 0; k < c->nendpoints; k++)
        snprintf(r->endpoints[k], sizeof r->endpoints[k], "%s", c->endpoints[k]);
    r->pid = (int32_t)getpid();
    r->model_signature = c->model_signature;
    fl_comm_tuning(c, r->tuning, sizeof r->tuning);
    return fl_tp_send(c->coord, NULL, &h, NULL, 0, fl_deadline_in(1000));
}

static int send_heartbeat(fl_comm_t *c)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, c->rank);
    snprintf(h.job_id, sizeof h.job_id, "%s", c->job_id);
    return fl_tp_send(c->coord, NULL, &h, NULL, 0, fl_deadline_in(0));
}

/* Takes the peer table, after checking that it describes exactly this job's ranks. */
static int take_welcome(fl_comm_t *c, fl_msg_hdr_t *h)
{
    fl_msg_welcome_t *w = &h->u.welcome;
    if (w->npeers != (uint32_t)c->size)
        return fl_fail(FL_EPROTO, "rank %d: coordinator %s sent a peer table of %u ranks for a "
                                  "job of %d",
                       c->rank, c->coordinator, w->npeers, c->size);
    for (uint32_t i = 0; i < w->npeers; i++) {
        if (w->peers[i].rank != (int32_t)i || w->peers[i].nendpoints < 1)
            return fl_fail(FL_EPROTO, "rank %d: coordinator's peer table entry %u names rank %d "
                                      "with %u endpoints",
                           c->rank, i, w->peers[i].rank, w->peers[i].nendpoints);
    }
    if (w->heartbeat_ms < 1 || w->heartbeat_timeout_ms <= w->heartbeat_ms)
        return fl_fail(FL_EPROTO, "rank %d: coordinator sent heartbeat %u ms, timeout %u ms",
                       c->rank, w->heartbeat_ms, w->heartbeat_timeout_ms);
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
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.max_msg_bytes = COORD_MAX_MSG;
    t.linger_ms = 1000;
    int rc = fl_tp_sock_create(c->ctx, FL_TP_DEALER, &t, "coordinator", &c->coord);
    if (rc == FL_OK)
        rc = fl_tp_sock_connect(c->coord, c->coordinator);
    if (rc == FL_OK)
        rc = send_register(c);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "rank %d: register with coordinator %s", c->rank,
                           c->coordinator);

    int64_t deadline = fl_deadline_in(timeout_ms);
    int64_t next_hb = fl_now_ms() + RDV_HEARTBEAT_MS;
    char progress[FL_MSG_MISSING_MAX + 64] = "";
    bool heard = false;
    for (;;) {
        int64_t wake = next_hb < deadline ? next_hb : deadline;
        fl_tp_msg_t m;
        rc = fl_tp_recv(c->coord, &m, wake);
        if (rc == FL_OK) {
            heard = true;
            switch (m.hdr.type) {
            case FL_MSG_WELCOME:
                rc = take_welcome(c, &m.hdr);
                fl_tp_msg_close(&m);
                return rc;
            case FL_MSG_ERROR: {
                int code = m.hdr.u.error.code < 0 ? m.hdr.u.error.code : FL_EPEER;
                rc = fl_fail(code, "rank %d: coordinator %s refused: %s", c->rank,
                             c->coordinator, m.hdr.u.error.text);
                fl_tp_msg_close(&m);
                return rc;
            }
            case FL_MSG_SHUTDOWN:
                rc = fl_fail(FL_EPEER, "rank %d: coordinator %s is shutting down: %s", c->rank,
                             c->coordinator, m.hdr.u.shutdown.text);
                fl_tp_msg_close(&m);
                return rc;
            case FL_MSG_HEARTBEAT:
                snprintf(progress, sizeof progress, "%u of %d ranks registered, missing %s",
                         m.hdr.u.heartbeat.registered, c->size, m.hdr.u.heartbeat.missing);
                break;
            default:
                break;
            }
            fl_tp_msg_close(&m);
        } else if (rc != FL_ETIMEDOUT && rc != FL_EPROTO) {
            return fl_fail_ctx(rc, "rank %d: rendezvous", c->rank);
        }
        int64_t now = fl_now_ms();
        if (now >= deadline) {
            if (heard)
                return fl_fail(FL_ETIMEDOUT, "rank %d: rendezvous with coordinator %s timed out "
                                             "after %d ms: %s",
                               c->rank, c->coordinator, timeout_ms, progress);
            return fl_fail(FL_ETIMEDOUT, "rank %d: no answer from the coordinator at %s within "
                                         "%d ms (is flodl-ps running and reachable?)",
                           c->rank, c->coordinator, timeout_ms);
        }
        if (now >= next_hb) {
            send_heartbeat(c);
            next_hb = now + RDV_HEARTBEAT_MS;
        }
    }
}
