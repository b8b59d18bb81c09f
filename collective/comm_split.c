/* Sub-communicators, as MPI_Comm_split, with several members per process (one per local
 * device, each driven by its own thread). Every rank binds a fresh data socket per member,
 * then one all-gather over the parent tells every rank every member's group, order and
 * endpoints, and each group's table is built the same way on every rank. A member shares the
 * parent's context, job and deadlines, and hears the parent's failure events (a dead peer, a
 * lost coordinator) on its own tap of the parent's control thread, so a dead peer fails its
 * collectives at once rather than at their deadline. Where the parent has same-host ipc://
 * sockets, each member binds its own in the job's directory too, and names them in the
 * all-gather, so members on one host exchange over ipc as ranks do (comm_ipc.c). */
#include "comm_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_MEMBERS 64

/* One member as every rank sees it: fixed-size, so one all-gather of bytes carries all. */
typedef struct rec {
    int32_t color;
    int32_t key;
    int32_t nendpoints;
    char endpoints[FL_MSG_MAX_STRIPES][FL_ENDPOINT_MAX];
    char ipc[FL_IPC_NAME_MAX]; /* the member's ipc socket name; "": none */
} rec_t;

typedef struct ent {
    const rec_t *r;
    int parent_rank;
    int member;
} ent_t;

static int ent_cmp(const void *a, const void *b)
{
    const ent_t *x = a;
    const ent_t *y = b;
    if (x->r->key != y->r->key)
        return x->r->key < y->r->key ? -1 : 1;
    if (x->parent_rank != y->parent_rank)
        return x->parent_rank < y->parent_rank ? -1 : 1;
    return x->member < y->member ? -1 : x->member > y->member;
}

/* Where a member of this rank binds: next to the parent's own endpoint, same scheme. */
static void member_bind(const fl_comm_t *p, const fl_comm_t *c, char *out, size_t cap)
{
    const char *ep = p->endpoints[0];
    if (strncmp(ep, "tcp://", 6) == 0)
        out[0] = '\0'; /* tcp on this rank's host, ephemeral ports */
    else
        snprintf(out, cap, "%.*s-sub-%p", (int)(cap - 32), ep, (const void *)c);
}

/* Binds the member on ipc:// too when the parent has ipc sockets (a tcp data endpoint, ipc not
 * turned off, a private directory), so the host's members exchange over ipc as ranks do. Its
 * name counts the members made under the root communicator: unique in this process for the
 * root's life, so a member never takes the path of one whose socket ZeroMQ is still closing. */
static int member_ipc_bind(const fl_comm_t *p, fl_comm_t *c)
{
    c->root = p->root != NULL ? p->root : (fl_comm_t *)p;
    c->ipc = p->ipc;
    if (p->ipc_bound == 0)
        return FL_OK;
    unsigned n = atomic_fetch_add(&c->root->ipc_members, 1u);
    snprintf(c->ipc_name, sizeof c->ipc_name, "r%d-p%d-m%u", c->root->rank, (int)getpid(), n);
    return fl_comm_ipc_bind(c, c->stripes);
}

/* A member of this rank, bound but not yet in a group. */
static int member_create(fl_comm_t *p, int t, fl_comm_t **out)
{
    *out = NULL;
    fl_comm_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return fl_fail(FL_ENOMEM, "rank %d: out of memory for sub-communicator %d", p->rank, t);
    c->ctx = p->ctx;
    c->rank = p->rank; /* until the group is known: for error texts */
    c->job_rank = p->job_rank;
    snprintf(c->job_id, sizeof c->job_id, "%s", p->job_id);
    snprintf(c->coordinator, sizeof c->coordinator, "%s", p->coordinator);
    snprintf(c->host, sizeof c->host, "%s", p->host);
    c->timeout_ms = p->timeout_ms;
    c->stripes = p->stripes;
    c->segment_bytes = p->segment_bytes;
    c->small_bytes = p->small_bytes;
    c->algo = p->algo;
    c->model_signature = p->model_signature;
    c->generation = p->generation;
    c->hb_ms = p->hb_ms;
    c->hb_timeout_ms = p->hb_timeout_ms;
    c->last_algo = FL_ALGO_AUTO;
    /* The member's status, so heartbeats (and the coordinator's stall report) see a collective
     * a sub-communicator is in; with several in flight, the one that wrote last. */
    c->status = p->status;
    int rc = FL_OK;
    if (p->member != NULL)
        rc = fl_tp_member_tap(p->member, &c->events);
    c->tapped = p->member;
    if (c->tapped == NULL) {
        /* The parent is itself a sub-communicator: tap the same control thread. */
        c->tapped = p->tapped;
        if (c->tapped != NULL)
            rc = fl_tp_member_tap(c->tapped, &c->events);
    }
    if (rc == FL_OK && c->tapped == NULL)
        rc =
            fl_fail(FL_EINVAL, "rank %d: the communicator to split has no control thread", p->rank);
    char bind[FL_ENDPOINT_MAX];
    member_bind(p, c, bind, sizeof bind);
    if (rc == FL_OK)
        rc = fl_comm_bind_data(c, bind[0] ? bind : NULL, c->stripes);
    if (rc == FL_OK)
        rc = member_ipc_bind(p, c);
    if (rc != FL_OK) {
        if (c->tapped == NULL)
            c->ctx = NULL; /* never destroy the parent's context */
        fl_comm_destroy(&c);
        return rc;
    }
    *out = c;
    return FL_OK;
}

/* Makes c member `me` of the group whose members are ents[0..size) (sorted). */
static int member_join(fl_comm_t *p, fl_comm_t *c, const ent_t *ents, int size, int me)
{
    if (size < 1 || me < 0 || me >= size)
        return fl_fail(FL_EINVAL, "rank %d: member %d of a group of %d", p->rank, me, size);
    c->rank = me;
    c->size = size;
    c->peers = calloc((size_t)size, sizeof *c->peers);
    c->data_out = calloc((size_t)size, sizeof *c->data_out);
    c->inflight = calloc((size_t)size + 1, sizeof *c->inflight);
    c->peer_ipc = calloc((size_t)size, sizeof *c->peer_ipc);
    c->peer_ipc_name = calloc((size_t)size, sizeof *c->peer_ipc_name);
    if (c->peers == NULL || c->data_out == NULL || c->inflight == NULL || c->peer_ipc == NULL ||
        c->peer_ipc_name == NULL)
        return fl_fail(FL_ENOMEM, "rank %d: out of memory for a group of %d", p->rank, size);
    for (int i = 0; i < size; i++) {
        fl_msg_peer_t *q = &c->peers[i];
        const rec_t *r = ents[i].r;
        q->rank = p->peers[ents[i].parent_rank].rank; /* the job's rank, for error texts */
        snprintf(q->host, sizeof q->host, "%s", p->peers[ents[i].parent_rank].host);
        q->pid = p->peers[ents[i].parent_rank].pid;
        q->nendpoints = (uint32_t)r->nendpoints;
        for (int k = 0; k < r->nendpoints; k++)
            snprintf(q->endpoints[k], sizeof q->endpoints[k], "%s", r->endpoints[k]);
        snprintf(c->peer_ipc_name[i], sizeof c->peer_ipc_name[i], "%s", r->ipc);
    }
    fl_tp_sock_set_expect(c->data_in, c->job_id, c->generation);
    if (size > 1) {
        fl_tp_sock_t *s;
        fl_comm_peer_sock(c, fl_ring_mod((long)me + 1, size), &s);
    }
    return FL_OK;
}

/* Checks what a rank sent: a valid endpoint count, terminated strings. */
static int check_rec(const fl_comm_t *p, const rec_t *r, int from)
{
    if (r->color < 0)
        return FL_OK;
    if (r->nendpoints < 1 || r->nendpoints > FL_MSG_MAX_STRIPES)
        return fl_fail(FL_EPROTO, "rank %d: split: rank %d sent %d endpoints", p->rank, from,
                       r->nendpoints);
    for (int k = 0; k < r->nendpoints; k++)
        if (memchr(r->endpoints[k], '\0', FL_ENDPOINT_MAX) == NULL)
            return fl_fail(FL_EPROTO, "rank %d: split: rank %d sent an unterminated endpoint",
                           p->rank, from);
    /* A file name in the job's directory: no '/' or "..", so nothing outside it is dialled. */
    size_t len = strnlen(r->ipc, sizeof r->ipc);
    if (len == sizeof r->ipc || strspn(r->ipc, "abcdefghijklmnopqrstuvwxyz0123456789-") != len)
        return fl_fail(FL_EPROTO, "rank %d: split: rank %d sent a bad ipc socket name", p->rank,
                       from);
    return FL_OK;
}

/* Builds every group this rank's members belong to from the gathered records. */
static int build_groups(fl_comm_t *p, int n, const rec_t *all, fl_comm_t **mine)
{
    size_t total = (size_t)p->size * (size_t)n;
    ent_t *ents = malloc(total * sizeof *ents);
    if (ents == NULL)
        return fl_fail(FL_ENOMEM, "rank %d: split: out of memory", p->rank);
    int rc = FL_OK;
    for (int t = 0; t < n && rc == FL_OK; t++) {
        if (mine[t] == NULL)
            continue;
        int32_t color = all[(size_t)p->rank * n + t].color;
        int size = 0;
        for (int r = 0; r < p->size; r++)
            for (int u = 0; u < n; u++)
                if (all[(size_t)r * n + u].color == color)
                    ents[size++] = (ent_t){&all[(size_t)r * n + u], r, u};
        qsort(ents, (size_t)size, sizeof *ents, ent_cmp);
        int me = -1;
        for (int i = 0; i < size; i++)
            if (ents[i].parent_rank == p->rank && ents[i].member == t)
                me = i;
        rc = member_join(p, mine[t], ents, size, me);
    }
    free(ents);
    return rc;
}

int fl_comm_split(fl_comm_t *p, int n, const int *colors, const int *keys, fl_comm_t **out)
{
    if (n < 1 || n > MAX_MEMBERS)
        return fl_fail(FL_EINVAL, "rank %d: split into %d members per rank (1..%d)", p->rank, n,
                       MAX_MEMBERS);
    for (int t = 0; t < n; t++)
        out[t] = NULL;
    /* Every rank must ask for the same number of members: one all-gather of n first. */
    int32_t *ns = calloc((size_t)p->size, sizeof *ns);
    if (ns == NULL)
        return fl_fail(FL_ENOMEM, "rank %d: split: out of memory", p->rank);
    int32_t n32 = n;
    int rc = fl_allgather(p, &n32, ns, (size_t)p->size, FL_INT32);
    for (int r = 0; rc == FL_OK && r < p->size; r++) {
        if (ns[r] != n) {
            char who[FL_HOST_MAX + 32];
            rc = fl_fail(FL_EINVAL,
                         "rank %d (%s): split into %d members per rank, but %s asks "
                         "for %d",
                         p->rank, p->host, n, fl_comm_peer_name(p, r, who, sizeof who), ns[r]);
        }
    }
    free(ns);
    if (rc != FL_OK)
        return rc;

    fl_comm_t *mine[MAX_MEMBERS] = {NULL};
    size_t total = (size_t)p->size * (size_t)n;
    rec_t *all = calloc(total, sizeof *all);
    if (all == NULL)
        return fl_fail(FL_ENOMEM, "rank %d: split: out of memory for %zu members", p->rank, total);
    rec_t *own = &all[(size_t)p->rank * n];
    for (int t = 0; t < n && rc == FL_OK; t++) {
        own[t].color = colors[t] < 0 ? -1 : colors[t];
        own[t].key = keys != NULL ? keys[t] : 0;
        if (own[t].color < 0)
            continue;
        if ((rc = member_create(p, t, &mine[t])) != FL_OK)
            break;
        own[t].nendpoints = mine[t]->nendpoints;
        if (mine[t]->ipc_bound == mine[t]->nendpoints)
            memcpy(own[t].ipc, mine[t]->ipc_name, sizeof own[t].ipc);
        for (int k = 0; k < mine[t]->nendpoints; k++)
            memcpy(own[t].endpoints[k], mine[t]->endpoints[k], FL_ENDPOINT_MAX);
    }
    /* Every rank takes part in the gather even when its own members failed to bind, so the
     * others do not wait for it; it reports its failure after. */
    rec_t failed = {.color = -2};
    if (rc != FL_OK)
        for (int t = 0; t < n; t++)
            own[t] = failed;
    char detail[1024] = "";
    if (rc != FL_OK)
        snprintf(detail, sizeof detail, "%s", fl_last_error());
    int grc = fl_allgather(p, own, all, total * sizeof *all, FL_UINT8);
    if (rc == FL_OK && grc != FL_OK)
        rc = grc;
    for (int r = 0; rc == FL_OK && r < p->size; r++) {
        for (int u = 0; rc == FL_OK && u < n; u++) {
            const rec_t *x = &all[(size_t)r * n + u];
            if (x->color == -2)
                rc = fl_fail(FL_EPEER,
                             "rank %d: split: rank %d (%s) could not make its "
                             "sub-communicators",
                             p->rank, r, p->peers[r].host);
            else
                rc = check_rec(p, x, r);
        }
    }
    if (rc == FL_OK)
        rc = build_groups(p, n, all, mine);
    free(all);
    if (rc != FL_OK) {
        for (int t = 0; t < n; t++)
            fl_comm_destroy(&mine[t]);
        return detail[0] != '\0' ? fl_fail(rc, "%s", detail) : rc;
    }
    for (int t = 0; t < n; t++)
        out[t] = mine[t];
    return FL_OK;
}
