/* The communicator: options, creation (context, data sockets, rendezvous, control thread),
 * destruction (leave cleanly, flush queued sends within the deadline), peer sockets created on
 * first use, scratch memory and counters. The collectives themselves live in collectives.c. */
#include "comm_int.h"
#include "member_opts.h"

#include <flodl/compress.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS 300000
#define DEFAULT_RENDEZVOUS_MS 300000
#define DATA_HWM (1 << 20)

void fl_comm_opts_init(fl_comm_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->rank = -1;
    o->world_size = -1;
    o->job_id = "flodl";
    o->timeout_ms = DEFAULT_TIMEOUT_MS;
    o->rendezvous_timeout_ms = DEFAULT_RENDEZVOUS_MS;
    o->stripes = 1;
    o->segment_bytes = (size_t)1 << 20;
    /* Recursive doubling beats the ring up to about 1 MiB at 2 and 4 ranks on loopback (flodl-bench
     * allreduce --algos: 1.9x at 256 KiB on 4 ranks, a tie at 1 MiB); on real links its log2(N)
     * whole-buffer rounds send more bytes than the ring's 2(N-1)/N, so the default stops at
     * 128 KiB. */
    o->small_bytes = (size_t)128 << 10;
    o->algo = FL_ALGO_AUTO;
    o->log_level = FL_LOG_WARN;
    o->tune_malloc = 1;
    o->ipc = 1;
}

static int check_opts(const fl_comm_opts_t *o)
{
    fl_tp_endpoint_t ep;
    /* First, before any other field is read: a struct of another size has other fields. */
    if (o->struct_size != sizeof *o)
        return fl_fail(FL_EINVAL,
                       "comm: fl_comm_opts_t.struct_size is %zu, this libflodl %s expects %zu: "
                       "fill the options with fl_comm_opts_init",
                       o->struct_size, FL_VERSION_STRING, sizeof *o);
    int rc = fl_member_opts_check("comm", o->rank, o->world_size, o->coordinator, o->job_id,
                                  o->host, o->settings);
    if (rc != FL_OK)
        return rc;
    if (o->bind != NULL && fl_tp_endpoint_parse(o->bind, &ep) != FL_OK)
        return fl_fail_ctx(FL_EINVAL, "comm: rank %d: bind", o->rank);
    if (o->timeout_ms < 1 || o->rendezvous_timeout_ms < 1)
        return fl_fail(FL_EINVAL, "comm: timeout_ms and rendezvous_timeout_ms must be positive");
    if (o->stripes < 1 || o->stripes > FL_MSG_MAX_STRIPES)
        return fl_fail(FL_EINVAL, "comm: stripes %d out of range 1..%d", o->stripes,
                       FL_MSG_MAX_STRIPES);
    if (o->segment_bytes < 4096 || o->segment_bytes > ((size_t)64 << 20))
        return fl_fail(FL_EINVAL, "comm: segment_bytes %zu out of range 4 KiB..64 MiB",
                       o->segment_bytes);
    if (o->small_bytes > ((size_t)64 << 20))
        return fl_fail(FL_EINVAL, "comm: small_bytes %zu over 64 MiB", o->small_bytes);
    if (o->algo != FL_ALGO_AUTO && o->algo != FL_ALGO_RING && o->algo != FL_ALGO_RD &&
        o->algo != FL_ALGO_DIRECT)
        return fl_fail(FL_EINVAL, "comm: algo %d is not AUTO, RING, RD or DIRECT", (int)o->algo);
    if (o->log_level < FL_LOG_DEBUG || o->log_level > FL_LOG_OFF)
        return fl_fail(FL_EINVAL, "comm: log_level %d out of range", (int)o->log_level);
    if (o->ipc != 0 && o->ipc != 1)
        return fl_fail(FL_EINVAL, "comm: ipc %d is not 0 or 1", o->ipc);
    return FL_OK;
}

static void data_opts(fl_tp_opts_t *t)
{
    fl_tp_opts_init(t);
    /* Queues are bounded by the collectives themselves (a peer runs at most one op ahead);
     * the high-water mark only has to be out of their way. */
    t->sndhwm = DATA_HWM;
    t->rcvhwm = DATA_HWM;
}

int fl_comm_bind_data(fl_comm_t *c, const char *bind, int stripes)
{
    fl_tp_opts_t t;
    data_opts(&t);
    int rc = fl_tp_sock_create(c->ctx, FL_TP_PULL, &t, "data", &c->data_in);
    if (rc != FL_OK)
        return rc;
    char base[FL_ENDPOINT_MAX + FL_HOST_MAX];
    if (bind != NULL)
        snprintf(base, sizeof base, "%s", bind);
    else if (fl_tp_is_ip_literal(c->host) && strchr(c->host, ':') == NULL)
        snprintf(base, sizeof base, "tcp://%s:0", c->host);
    else
        snprintf(base, sizeof base, "tcp://*:0");
    fl_tp_endpoint_t ep;
    if ((rc = fl_tp_endpoint_parse(base, &ep)) != FL_OK)
        return rc;
    for (int k = 0; k < stripes; k++) {
        char want[sizeof base + 16];
        char bound[FL_ENDPOINT_MAX];
        if (ep.scheme == FL_TP_TCP && ep.port != 0 && k > 0)
            snprintf(want, sizeof want, "tcp://%s:%d", ep.host, ep.port + k);
        else if (ep.scheme != FL_TP_TCP && k > 0)
            snprintf(want, sizeof want, "%s.%d", base, k);
        else
            snprintf(want, sizeof want, "%s", base);
        if ((rc = fl_tp_sock_bind(c->data_in, want, bound, sizeof bound)) != FL_OK)
            return fl_fail_ctx(rc, "rank %d: data endpoint", c->rank);
        if ((rc = fl_tp_endpoint_advertise(bound, c->host, c->endpoints[k],
                                           sizeof c->endpoints[k])) != FL_OK)
            return rc;
    }
    c->nendpoints = stripes;
    return FL_OK;
}

int fl_comm_init(const fl_comm_opts_t *o, fl_comm_t **out)
{
    *out = NULL;
    int rc = check_opts(o);
    if (rc != FL_OK)
        return rc;
    fl_comm_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return fl_fail(FL_ENOMEM, "comm: out of memory");
    if (o->tune_malloc)
        fl_malloc_tune();
    c->rank = o->rank;
    c->job_rank = o->rank;
    c->size = o->world_size;
    snprintf(c->job_id, sizeof c->job_id, "%s", o->job_id);
    snprintf(c->coordinator, sizeof c->coordinator, "%s", o->coordinator);
    c->timeout_ms = o->timeout_ms;
    c->stripes = o->stripes;
    c->segment_bytes = o->segment_bytes;
    c->small_bytes = o->small_bytes;
    c->algo = o->algo;
    c->model_signature = o->model_signature;
    snprintf(c->settings, sizeof c->settings, "%s", o->settings ? o->settings : "");
    c->last_algo = FL_ALGO_AUTO;
    c->ipc = o->ipc == 1;

    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = o->log_level;
    char name[FL_HOST_MAX + 32];
    snprintf(name, sizeof name, "rank %d", o->rank);
    co.log_name = name;
    char self[32]; /* a key of this rank's own, where the job has per-rank keys */
    snprintf(self, sizeof self, "rank-%d", o->rank);
    if ((rc = fl_ctx_create(&co, &c->ctx)) != FL_OK ||
        (rc = fl_tp_curve_use(c->ctx, o->curve_dir, self)) != FL_OK)
        goto fail;

    if (o->host != NULL)
        snprintf(c->host, sizeof c->host, "%s", o->host);
    else if ((rc = fl_tp_local_addr_towards(o->coordinator, c->host, sizeof c->host)) != FL_OK)
        goto fail;

    c->data_out = calloc((size_t)c->size, sizeof *c->data_out);
    c->inflight = calloc((size_t)c->size + 1, sizeof *c->inflight);
    c->peer_ipc = calloc((size_t)c->size, sizeof *c->peer_ipc);
    if (c->data_out == NULL || c->inflight == NULL || c->peer_ipc == NULL) {
        rc = fl_fail(FL_ENOMEM, "comm: out of memory for %d peers", c->size);
        goto fail;
    }
    if ((rc = fl_comm_bind_data(c, o->bind, o->stripes)) != FL_OK)
        goto fail;
    /* Before the rendezvous: a peer that reads this rank's entry in the table finds its
     * sockets there. An explicit ipc:// or inproc:// bind is the only endpoint. */
    if (c->ipc && c->size > 1 && strncmp(c->endpoints[0], "tcp://", 6) == 0 &&
        (rc = fl_comm_ipc_bind(c, o->stripes)) != FL_OK)
        goto fail;
    if ((rc = fl_comm_rendezvous(c, o->rendezvous_timeout_ms)) != FL_OK)
        goto fail;

    fl_tp_sock_set_expect(c->data_in, c->job_id, c->generation);
    snprintf(name, sizeof name, "rank %d %s", c->rank, c->host);
    fl_ctx_set_log_name(c->ctx, name);
    if ((rc = fl_tp_member_start(c->member)) != FL_OK)
        goto fail;
    /* Open the ring's link now so the first collective does not pay for the TCP handshake. */
    if (c->size > 1) {
        fl_tp_sock_t *s;
        fl_comm_peer_sock(c, fl_ring_mod((long)c->rank + 1, c->size), &s);
    }
    FL_INFO(c->ctx, "joined job '%s' as rank %d of %d, data at %s", c->job_id, c->rank, c->size,
            c->endpoints[0]);
    *out = c;
    return FL_OK;

fail:
    fl_comm_destroy(&c);
    return rc;
}

/* How long a rank that stops over another's failure waits for the coordinator to name it: the
 * culprit's own goodbye is on its way, and reaches the coordinator within milliseconds. */
#define VERDICT_WAIT_MS 1000

/* A rank that stops because another failed (FL_EPEER: an agreement said so, or the coordinator
 * did) is no culprit: its goodbye says "after a failure" (code 1), or the coordinator would
 * name whichever goodbye came first. It first gives the coordinator a moment to say who failed
 * and why, so that this rank's log names the culprit too (the control thread logs it). */
static int goodbye_code(fl_comm_t *c)
{
    if (!c->aborted)
        return c->broken_rc != FL_OK ? 1 : 0;
    if (c->abort_rc != FL_EPEER)
        return c->abort_rc;
    bool ready = false;
    fl_tp_sock_t *ev = c->events;
    if (c->await_verdict && ev != NULL)
        fl_tp_poll(&ev, 1, VERDICT_WAIT_MS, &ready);
    return 1;
}

/* The goodbye says how the rank ends: cleanly (code 0), on its own error (the error's code
 * and text, which the coordinator passes on to every other rank), or after another's failure.
 * Sent once: the member's control thread stops with it. */
static void goodbye(fl_comm_t *c)
{
    if (c->member == NULL || c->goodbye_sent)
        return;
    c->goodbye_sent = true;
    char text[FL_MSG_TEXT_MAX];
    int code = goodbye_code(c);
    if (c->aborted)
        snprintf(text, sizeof text, "%.440s (after %llu collectives)", c->abort_text,
                 (unsigned long long)c->seq);
    else
        snprintf(text, sizeof text, "rank %d leaves after %llu collectives%s", c->rank,
                 (unsigned long long)c->seq, c->broken_rc != FL_OK ? " (after a failure)" : "");
    fl_tp_member_stop(c->member, code, text);
}

void fl_comm_abort(fl_comm_t *c, int code, const char *why)
{
    if (c == NULL || c->aborted)
        return;
    c->aborted = true;
    c->abort_rc = code < 0 ? code : FL_EIO; /* negative: the coordinator passes it on */
    snprintf(c->abort_text, sizeof c->abort_text, "%s", why != NULL ? why : "");
    c->await_verdict = c->abort_rc == FL_EPEER && c->broken_rc == FL_OK;
    if (c->broken_rc == FL_OK) {
        c->broken_rc = FL_ECLOSED;
        snprintf(c->broken_text, sizeof c->broken_text, "rank %d stopped on its own error: %s",
                 c->rank, c->abort_text);
    }
    /* Now, not at fl_comm_destroy: what the rank frees before that may block (a device whose
     * kernel hangs, a thread stuck until its deadline), and the others should not wait for
     * it to hear why. */
    goodbye(c);
}

static void comm_destroy(fl_comm_t **pc)
{
    if (pc == NULL || *pc == NULL)
        return;
    fl_comm_t *c = *pc;
    goodbye(c);
    int linger = c->broken_rc != FL_OK ? 0 : (c->timeout_ms < 10000 ? c->timeout_ms : 10000);
    if (c->data_out != NULL) {
        for (int p = 0; p < c->size; p++) {
            if (c->data_out[p] != NULL) {
                fl_tp_sock_set_linger(c->data_out[p], linger);
                fl_tp_sock_destroy(&c->data_out[p]);
            }
        }
    }
    if (c->data_in != NULL)
        fl_tp_sock_set_linger(c->data_in, 0);
    fl_tp_sock_destroy(&c->data_in);
    fl_tp_member_destroy(&c->member);
    if (c->tapped != NULL)
        fl_tp_member_untap(c->tapped, &c->events);
    while (c->stash != NULL) {
        stash_ent_t *e = c->stash;
        c->stash = e->next;
        fl_tp_msg_close(&e->msg);
        free(e);
    }
    if (c->tapped == NULL)
        fl_ctx_destroy(&c->ctx); /* a sub-communicator borrows its parent's */
    fl_comm_ipc_remove(c);       /* after the context: its sockets are closed by then */
    free(c->peers);
    free(c->peer_ipc);
    free(c->peer_ipc_name);
    free(c->data_out);
    /* ZeroMQ's release hooks of zero-copy sends decrement inflight. A communicator of its own
     * ended its context above, which waits for every message; a sub-communicator's context lives
     * on, so wait here (bounded), and leave the counters allocated if sends are still held. */
    bool held = false;
    if (c->tapped != NULL && c->inflight != NULL) {
        int64_t until = fl_deadline_in(2000);
        for (int r = 0; r <= c->size; r++)
            held = !fl_rel_wait(&c->inflight[r], fl_deadline_left_ms(until)) || held;
    }
    if (!held)
        free((void *)c->inflight);
    free(c->scratch);
    free(c->stage);
    fl_cmp_ws_destroy(&c->cmp_ws);
    free(c);
    *pc = NULL;
}

void fl_comm_destroy(fl_comm_t **pc)
{
    fl_error_keep_begin();
    comm_destroy(pc);
    fl_error_keep_end();
}

int fl_comm_rank(const fl_comm_t *c)
{
    return c->rank;
}

int fl_comm_size(const fl_comm_t *c)
{
    return c->size;
}

const char *fl_comm_peer_host(const fl_comm_t *c, int rank)
{
    if (c->peers == NULL || rank < 0 || rank >= c->size)
        return NULL;
    return c->peers[rank].host;
}

const char *fl_comm_peer_name(const fl_comm_t *c, int rank, char *buf, size_t cap)
{
    const char *host = fl_comm_peer_host(c, rank);
    if (host != NULL && c->tapped != NULL) /* a sub-communicator's peer: its rank in the job */
        snprintf(buf, cap, "rank %d (%s; rank %d of a sub-communicator)", (int)c->peers[rank].rank,
                 host, rank);
    else if (host != NULL)
        snprintf(buf, cap, "rank %d (%s)", rank, host);
    else
        snprintf(buf, cap, "rank %d", rank);
    return buf;
}

int fl_comm_peer_sock(fl_comm_t *c, int peer, fl_tp_sock_t **out)
{
    if (c->data_out[peer] != NULL) {
        *out = c->data_out[peer];
        return FL_OK;
    }
    fl_tp_opts_t t;
    data_opts(&t);
    char name[32];
    snprintf(name, sizeof name, "data to rank %d", peer);
    fl_tp_sock_t *s;
    int rc = fl_tp_sock_create(c->ctx, FL_TP_PUSH, &t, name, &s);
    if (rc != FL_OK)
        return rc;
    const fl_msg_peer_t *p = &c->peers[peer];
    /* A peer on this host is dialled over its ipc sockets when all of them are there. */
    char ipc[FL_MSG_MAX_STRIPES][FL_ENDPOINT_MAX];
    bool use_ipc = p->nendpoints <= FL_MSG_MAX_STRIPES;
    for (uint32_t k = 0; use_ipc && k < p->nendpoints; k++)
        use_ipc = fl_comm_ipc_endpoint(c, peer, k, ipc[k], sizeof ipc[k]);
    for (uint32_t k = 0; k < p->nendpoints; k++) {
        if ((rc = fl_tp_sock_connect(s, use_ipc ? ipc[k] : p->endpoints[k])) != FL_OK) {
            fl_tp_sock_destroy(&s);
            return fl_fail_ctx(rc, "rank %d: connect to rank %d (%s)", c->rank, peer, p->host);
        }
    }
    fl_tp_sock_set_stamp(s, c->job_id, c->generation, c->rank);
    if (c->peer_ipc != NULL)
        c->peer_ipc[peer] = use_ipc;
    FL_DEBUG(c->ctx, "data to rank %d over %s", peer, use_ipc ? ipc[0] : p->endpoints[0]);
    c->data_out[peer] = s;
    *out = s;
    return FL_OK;
}

int fl_comm_scratch(fl_comm_t *c, size_t bytes, void **out)
{
    if (bytes > c->scratch_cap) {
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
            return fl_fail(FL_ENOMEM, "rank %d: no memory for %zu bytes of scratch", c->rank,
                           bytes);
        free(c->scratch);
        c->scratch = p;
        c->scratch_cap = bytes;
    }
    *out = c->scratch;
    return FL_OK;
}

void fl_comm_get_stats(const fl_comm_t *c, fl_comm_stats_t *out)
{
    memset(out, 0, sizeof *out);
    out->ops = c->ops;
    out->bytes_sent = c->bytes_sent;
    out->bytes_sent_remote = c->bytes_sent_remote;
    out->bytes_recv = c->bytes_recv;
    out->bad_msgs =
        fl_ctx_stat(c->ctx, FL_STAT_BAD_HEADER) + fl_ctx_stat(c->ctx, FL_STAT_BAD_MAGIC) +
        fl_ctx_stat(c->ctx, FL_STAT_BAD_VERSION) + fl_ctx_stat(c->ctx, FL_STAT_BAD_JOB) +
        fl_ctx_stat(c->ctx, FL_STAT_BAD_FRAMES) + fl_ctx_stat(c->ctx, FL_STAT_OVERSIZED) +
        fl_ctx_stat(c->ctx, FL_STAT_UNEXPECTED);
    out->last_algo = c->last_algo;
}

fl_ctx_t *fl_comm_ctx(const fl_comm_t *c)
{
    return c->ctx;
}
