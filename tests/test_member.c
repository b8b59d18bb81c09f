/* transport/tp_member.c: joining a coordinator, the events of the control thread (a dead peer,
 * a coordinator that goes away), reconnecting to a restarted coordinator on the same endpoint
 * within the reconnect deadline, or failing with a clear error after it, and a connection
 * that drops under a member, which ZeroMQ opens again as the same member. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fl_ps.h"
#include "fl_tp.h"
#include "testutil.h"

static fl_coord_t *coord_at(const char *bind, int world, int hb_timeout_ms)
{
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = bind;
    o.world_size = world;
    o.heartbeat_timeout_ms = hb_timeout_ms;
    o.rendezvous_timeout_ms = 20000;
    o.log_level = FL_LOG_OFF;
    fl_coord_t *c = NULL;
    ck_assert_msg(fl_coord_create(&o, &c) == FL_OK, "%s", fl_last_error());
    ck_assert_msg(fl_coord_start(c) == FL_OK, "%s", fl_last_error());
    return c;
}

static fl_ctx_t *quiet_ctx(void)
{
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    fl_ctx_t *ctx = NULL;
    ck_assert(fl_ctx_create(&co, &ctx) == FL_OK);
    return ctx;
}

static void worker_reg(fl_msg_register_t *r, int rank, int world)
{
    memset(r, 0, sizeof *r);
    r->rank = rank;
    r->world_size = world;
    snprintf(r->host, sizeof r->host, "127.0.0.1");
    r->nendpoints = 1;
    snprintf(r->endpoints[0], sizeof r->endpoints[0], "tcp://127.0.0.1:%d", 1 + rank);
    r->pid = getpid();
}

static fl_tp_member_t *member(fl_ctx_t *ctx, const char *coordinator, int rank, int reconnect_ms)
{
    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    mo.coordinator = coordinator;
    mo.name = rank == 0 ? "rank 0" : "rank 1";
    mo.sender = rank;
    mo.rendezvous_timeout_ms = 10000;
    mo.reconnect_timeout_ms = reconnect_ms;
    fl_tp_member_t *m = NULL;
    ck_assert_msg(fl_tp_member_create(ctx, &mo, &m) == FL_OK, "%s", fl_last_error());
    return m;
}

/* Waits up to ms for the next event. */
static int next_event(fl_tp_member_t *m, int ms, fl_tp_msg_t *ev)
{
    return fl_tp_recv(fl_tp_member_events(m), ev, fl_deadline_in(ms));
}

START_TEST(test_join_and_clean_leave)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 1, 2000);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, fl_coord_endpoint(c), 0, 0);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    ck_assert_msg(fl_tp_member_join(m, &r, &w) == FL_OK, "%s", fl_last_error());
    ck_assert_int_eq(w.type, FL_MSG_WELCOME);
    ck_assert_uint_eq(w.u.welcome.npeers, 1);
    ck_assert_uint_eq(fl_tp_member_generation(m), w.generation);
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(m) == FL_OK);
    /* The status reaches the heartbeats without a call. */
    atomic_store(&fl_tp_member_status(m)->op, 3);
    fl_tp_msg_t ev;
    ck_assert_int_eq(next_event(m, 300, &ev), FL_ETIMEDOUT); /* nothing to report */
    fl_tp_member_stop(m, 0, "done");
    ck_assert_int_eq(fl_coord_wait(c, 5000), FL_OK); /* the coordinator saw a clean leave */
    fl_tp_member_destroy(&m);
    ck_assert_ptr_null(m);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

START_TEST(test_refused_join_names_both)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 2, 2000);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, fl_coord_endpoint(c), 0, 0);
    fl_msg_register_t r;
    worker_reg(&r, 0, 3); /* the coordinator expects 2 */
    fl_msg_hdr_t w;
    ck_assert_int_eq(fl_tp_member_join(m, &r, &w), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "world size 3") != NULL &&
                      strstr(fl_last_error(), "expects 2") != NULL,
                  "%s", fl_last_error());
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

START_TEST(test_no_coordinator_times_out)
{
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    mo.coordinator = "tcp://127.0.0.1:1"; /* nobody listens there */
    mo.name = "rank 0";
    mo.rendezvous_timeout_ms = 500;
    fl_tp_member_t *m = NULL;
    ck_assert(fl_tp_member_create(ctx, &mo, &m) == FL_OK);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    int64_t t0 = fl_now_ms();
    ck_assert_int_eq(fl_tp_member_join(m, &r, &w), FL_ETIMEDOUT);
    ck_assert_int_lt(fl_now_ms() - t0, 3000);
    ck_assert_msg(strstr(fl_last_error(), "no answer from the coordinator") != NULL, "%s",
                  fl_last_error());
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
}
END_TEST

START_TEST(test_bad_options)
{
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    fl_tp_member_t *m = NULL;
    ck_assert_int_eq(fl_tp_member_create(ctx, &mo, &m), FL_EINVAL); /* no coordinator */
    mo.coordinator = "udp://x:1";
    ck_assert_int_eq(fl_tp_member_create(ctx, &mo, &m), FL_EINVAL);
    mo.coordinator = "tcp://127.0.0.1:5";
    mo.reconnect_timeout_ms = -1;
    ck_assert_int_eq(fl_tp_member_create(ctx, &mo, &m), FL_EINVAL);
    ck_assert_ptr_null(m);
    mo.reconnect_timeout_ms = 0;
    ck_assert(fl_tp_member_create(ctx, &mo, &m) == FL_OK);
    ck_assert_int_eq(fl_tp_member_start(m), FL_EINVAL); /* before a join */
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
}
END_TEST

/* A member that does not reconnect: the death of another rank, then a coordinator that
 * stops, are fatal events naming what happened. */
START_TEST(test_peer_death_is_an_error_event)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 2, 600);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *a = member(ctx, fl_coord_endpoint(c), 0, 0);
    fl_tp_member_t *b = member(ctx, fl_coord_endpoint(c), 1, 0);
    fl_msg_register_t ra, rb;
    worker_reg(&ra, 0, 2);
    worker_reg(&rb, 1, 2);
    /* b registers without waiting for the welcome (its join would block): a raw register. */
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    fl_tp_sock_t *raw = NULL;
    ck_assert(fl_tp_sock_create(ctx, FL_TP_DEALER, &t, "raw", &raw) == FL_OK);
    ck_assert(fl_tp_sock_connect(raw, fl_coord_endpoint(c)) == FL_OK);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, 1);
    snprintf(h.job_id, sizeof h.job_id, "flodl");
    h.u.reg = rb;
    ck_assert(fl_tp_send(raw, NULL, &h, NULL, 0, fl_deadline_in(1000)) == FL_OK);
    fl_msg_hdr_t w;
    ck_assert_msg(fl_tp_member_join(a, &ra, &w) == FL_OK, "%s", fl_last_error());
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(a) == FL_OK);
    /* rank 1 never heartbeats: declared dead within the coordinator's timeout. */
    fl_tp_msg_t ev;
    ck_assert_int_eq(next_event(a, 5000, &ev), FL_OK);
    ck_assert_int_eq(ev.hdr.type, FL_MSG_ERROR);
    ck_assert_int_eq(ev.hdr.u.error.code, FL_EPEER);
    ck_assert_int_eq(ev.hdr.u.error.about_rank, 1);
    ck_assert_msg(strstr(ev.hdr.u.error.text, "rank 1") != NULL, "%s", ev.hdr.u.error.text);
    fl_tp_msg_close(&ev);
    fl_tp_member_destroy(&a);
    fl_tp_member_destroy(&b);
    fl_tp_sock_destroy(&raw);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

START_TEST(test_coordinator_gone_without_reconnect)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 1, 2000);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, fl_coord_endpoint(c), 0, 0);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    ck_assert(fl_tp_member_join(m, &r, &w) == FL_OK);
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(m) == FL_OK);
    fl_coord_stop(c); /* says goodbye with a non-zero code */
    fl_tp_msg_t ev;
    ck_assert_int_eq(next_event(m, 5000, &ev), FL_OK);
    ck_assert_int_eq(ev.hdr.type, FL_MSG_ERROR);
    ck_assert_msg(strstr(ev.hdr.u.error.text, "coordinator ended the job") != NULL, "%s",
                  ev.hdr.u.error.text);
    fl_tp_msg_close(&ev);
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

/* The coordinator stops and a new one comes up on the same endpoint: the member says it lost
 * the coordinator, registers again, and posts the new welcome (another generation). */
START_TEST(test_reconnect_to_restarted_coordinator)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 1, 1000);
    char ep[FL_ENDPOINT_MAX];
    snprintf(ep, sizeof ep, "%s", fl_coord_endpoint(c));
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, ep, 0, 10000);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    ck_assert(fl_tp_member_join(m, &r, &w) == FL_OK);
    uint64_t gen1 = w.generation;
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(m) == FL_OK);

    fl_coord_destroy(&c);
    fl_tp_msg_t ev;
    ck_assert_int_eq(next_event(m, 5000, &ev), FL_OK);
    ck_assert_int_eq(ev.hdr.type, FL_MSG_SHUTDOWN);
    ck_assert_int_eq(ev.hdr.u.shutdown.code, FL_TP_MEMBER_LOST);
    ck_assert_msg(strstr(ev.hdr.u.shutdown.text, "registering again") != NULL, "%s",
                  ev.hdr.u.shutdown.text);
    fl_tp_msg_close(&ev);

    usleep(300 * 1000);
    c = coord_at(ep, 1, 1000); /* same port */
    ck_assert_int_eq(next_event(m, 8000, &ev), FL_OK);
    ck_assert_int_eq(ev.hdr.type, FL_MSG_WELCOME);
    ck_assert_uint_ne(ev.hdr.generation, gen1);
    ck_assert_uint_eq(ev.hdr.u.welcome.npeers, 1);
    ck_assert_uint_eq(fl_tp_member_generation(m), ev.hdr.generation);
    fl_tp_msg_close(&ev);

    /* Alive and beating with the new coordinator: no event for a while (well past its
     * heartbeat timeout), then a clean leave the new coordinator counts. */
    ck_assert_int_eq(next_event(m, 1500, &ev), FL_ETIMEDOUT);
    fl_tp_member_stop(m, 0, "done");
    ck_assert_int_eq(fl_coord_wait(c, 5000), FL_OK);
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

START_TEST(test_reconnect_gives_up_at_its_deadline)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 1, 600);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, fl_coord_endpoint(c), 0, 800);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    ck_assert(fl_tp_member_join(m, &r, &w) == FL_OK);
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(m) == FL_OK);
    fl_coord_destroy(&c);
    fl_tp_msg_t ev;
    ck_assert_int_eq(next_event(m, 5000, &ev), FL_OK);
    ck_assert_int_eq(ev.hdr.u.shutdown.code, FL_TP_MEMBER_LOST);
    fl_tp_msg_close(&ev);
    int64_t t0 = fl_now_ms();
    ck_assert_int_eq(next_event(m, 5000, &ev), FL_OK);
    ck_assert_int_lt(fl_now_ms() - t0, 3000);
    ck_assert_int_eq(ev.hdr.type, FL_MSG_ERROR);
    ck_assert_int_eq(ev.hdr.u.error.code, FL_EPEER);
    ck_assert_msg(strstr(ev.hdr.u.error.text, "not back") != NULL, "%s", ev.hdr.u.error.text);
    fl_tp_msg_close(&ev);
    /* Stop is prompt after a failure. */
    t0 = fl_now_ms();
    fl_tp_member_destroy(&m);
    ck_assert_int_lt(fl_now_ms() - t0, 3000);
    fl_ctx_destroy(&ctx);
}
END_TEST

/* The port of a tcp:// endpoint. */
static int port_of(const char *endpoint)
{
    const char *colon = strrchr(endpoint, ':');
    ck_assert_ptr_nonnull(colon);
    return atoi(colon + 1);
}

/* Resets the connections this process accepted on `port` (the coordinator's side of its
 * members' connections), as a server's guard closes one or as a ZMTP heartbeat that timed out
 * on a host short of CPU ends one; ZeroMQ on the member's side connects again by itself.
 * Returns how many. */
static int reset_accepted(int port)
{
    int n = 0;
    for (int fd = 3; fd < 1024; fd++) {
        struct sockaddr_in self, peer;
        socklen_t slen = sizeof self, plen = sizeof peer;
        if (getsockname(fd, (struct sockaddr *)&self, &slen) != 0 || self.sin_family != AF_INET ||
            ntohs(self.sin_port) != port || getpeername(fd, (struct sockaddr *)&peer, &plen) != 0)
            continue;
        struct sockaddr unspec;
        memset(&unspec, 0, sizeof unspec);
        unspec.sa_family = AF_UNSPEC;
        if (connect(fd, &unspec, sizeof unspec) == 0)
            n++;
    }
    return n;
}

/* A running member whose connection drops: ZeroMQ connects again, and the coordinator must
 * hear it as the same rank on the new connection. Before the member kept its routing id, the
 * coordinator ignored its heartbeats there and sent to the route that was gone, and both sides
 * declared the other silent at the heartbeat timeout. */
START_TEST(test_dropped_connection_keeps_the_member)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 1, 1000);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, fl_coord_endpoint(c), 0, 0);
    fl_msg_register_t r;
    worker_reg(&r, 0, 1);
    fl_msg_hdr_t w;
    ck_assert_msg(fl_tp_member_join(m, &r, &w) == FL_OK, "%s", fl_last_error());
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(m) == FL_OK);
    usleep(200 * 1000);
    ck_assert_int_eq(reset_accepted(port_of(fl_coord_endpoint(c))), 1);
    fl_tp_msg_t ev;
    int rc = next_event(m, 2500, &ev); /* 2.5 heartbeat timeouts */
    ck_assert_msg(rc == FL_ETIMEDOUT, "after its connection dropped: %s",
                  rc == FL_OK ? ev.hdr.u.error.text : fl_last_error());
    ck_assert_int_eq(fl_coord_active(c), 1);
    fl_tp_member_stop(m, 0, "done");
    ck_assert_int_eq(fl_coord_wait(c, 5000), FL_OK); /* its goodbye counted as rank 0's */
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

/* A TCP relay between members and the coordinator, as a NAT or a load balancer is. `cut` closes
 * the members' side of every connection and leaves the coordinator's side open and unread: a
 * path that died without the coordinator seeing it end. */
#define RELAY_MAX 8
typedef struct relay {
    int lfd;
    int port; /* where members connect */
    struct sockaddr_in to;
    int down[RELAY_MAX], up[RELAY_MAX], stale[RELAY_MAX];
    _Atomic bool cut, stop;
    pthread_t thread;
} relay_t;

/* Copies what fd `from` has to `to`; false when either end is done. */
static bool relay_copy(int from, int to)
{
    char buf[65536];
    ssize_t n = read(from, buf, sizeof buf);
    for (ssize_t off = 0; n > 0 && off < n;) {
        ssize_t w = write(to, buf + off, (size_t)(n - off));
        if (w <= 0)
            return false;
        off += w;
    }
    return n > 0;
}

static void relay_accept(relay_t *r)
{
    int d = accept(r->lfd, NULL, NULL);
    int u = socket(AF_INET, SOCK_STREAM, 0);
    int i = 0;
    while (i < RELAY_MAX && r->down[i] >= 0)
        i++;
    if (d < 0 || u < 0 || i == RELAY_MAX || connect(u, (struct sockaddr *)&r->to, sizeof r->to)) {
        if (d >= 0)
            close(d);
        if (u >= 0)
            close(u);
        return;
    }
    r->down[i] = d;
    r->up[i] = u;
}

static void *relay_main(void *arg)
{
    relay_t *r = arg;
    while (!atomic_load(&r->stop)) {
        bool cut = atomic_exchange(&r->cut, false);
        struct pollfd p[1 + 2 * RELAY_MAX] = {{.fd = r->lfd, .events = POLLIN}};
        for (int i = 0; i < RELAY_MAX; i++) {
            if (cut && r->down[i] >= 0) {
                close(r->down[i]);
                r->stale[i] = r->up[i];
                r->down[i] = r->up[i] = -1;
            }
            p[1 + 2 * i] = (struct pollfd){.fd = r->down[i], .events = POLLIN};
            p[2 + 2 * i] = (struct pollfd){.fd = r->up[i], .events = POLLIN};
        }
        if (poll(p, 1 + 2 * RELAY_MAX, 20) <= 0)
            continue;
        if (p[0].revents & POLLIN)
            relay_accept(r);
        for (int i = 0; i < RELAY_MAX; i++) {
            bool ok = true;
            if (p[1 + 2 * i].revents != 0)
                ok = relay_copy(r->down[i], r->up[i]);
            if (ok && p[2 + 2 * i].revents != 0)
                ok = relay_copy(r->up[i], r->down[i]);
            if (!ok && r->down[i] >= 0) {
                close(r->down[i]);
                close(r->up[i]);
                r->down[i] = r->up[i] = -1;
            }
        }
    }
    return NULL;
}

static void relay_start(relay_t *r, int upstream_port)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < RELAY_MAX; i++)
        r->down[i] = r->up[i] = r->stale[i] = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    r->to = a;
    r->to.sin_port = htons((uint16_t)upstream_port);
    r->lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert(r->lfd >= 0 && bind(r->lfd, (struct sockaddr *)&a, sizeof a) == 0 &&
              listen(r->lfd, 8) == 0 && getsockname(r->lfd, (struct sockaddr *)&a, &alen) == 0);
    r->port = ntohs(a.sin_port);
    ck_assert(pthread_create(&r->thread, NULL, relay_main, r) == 0);
}

static void relay_stop(relay_t *r)
{
    atomic_store(&r->stop, true);
    pthread_join(r->thread, NULL);
    for (int i = 0; i < RELAY_MAX; i++) {
        int fds[3] = {r->down[i], r->up[i], r->stale[i]};
        for (int k = 0; k < 3; k++)
            if (fds[k] >= 0)
                close(fds[k]);
    }
    close(r->lfd);
}

/* The path under a running member dies where the coordinator cannot see it: the member's new
 * connection comes while the old one still looks open there, and must take its place (the
 * coordinator's ROUTER hands the route over). Refused as a duplicate, the member would be
 * unheard until the heartbeat timeout. */
START_TEST(test_silently_dead_path_keeps_the_member)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 1, 1000);
    relay_t r;
    relay_start(&r, port_of(fl_coord_endpoint(c)));
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", r.port);
    fl_ctx_t *ctx = quiet_ctx();
    fl_tp_member_t *m = member(ctx, ep, 0, 0);
    fl_msg_register_t reg;
    worker_reg(&reg, 0, 1);
    fl_msg_hdr_t w;
    ck_assert_msg(fl_tp_member_join(m, &reg, &w) == FL_OK, "%s", fl_last_error());
    fl_msg_hdr_deinit(&w);
    ck_assert(fl_tp_member_start(m) == FL_OK);
    usleep(200 * 1000);
    atomic_store(&r.cut, true);
    fl_tp_msg_t ev;
    int rc = next_event(m, 2500, &ev); /* 2.5 heartbeat timeouts */
    ck_assert_msg(rc == FL_ETIMEDOUT, "after its path died: %s",
                  rc == FL_OK ? ev.hdr.u.error.text : fl_last_error());
    ck_assert_int_eq(fl_coord_active(c), 1);
    fl_tp_member_stop(m, 0, "done");
    ck_assert_int_eq(fl_coord_wait(c, 5000), FL_OK);
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
    relay_stop(&r);
    fl_coord_destroy(&c);
}
END_TEST

typedef struct joiner {
    fl_tp_member_t *m;
    fl_msg_register_t reg;
    int rc;
    char why[512]; /* its error, from its thread's */
    _Atomic bool done;
} joiner_t;

static void *join_main(void *arg)
{
    joiner_t *j = arg;
    fl_msg_hdr_t w;
    j->rc = fl_tp_member_join(j->m, &j->reg, &w);
    snprintf(j->why, sizeof j->why, "%s", j->rc == FL_OK ? "" : fl_last_error());
    fl_msg_hdr_deinit(&w);
    atomic_store(&j->done, true);
    return NULL;
}

/* A registered member whose connection drops while it waits for the others still gets its
 * welcome. Before, the welcome went to the route that was gone, and the member, registering
 * again on its new connection without a token, was refused. */
START_TEST(test_dropped_connection_in_the_rendezvous)
{
    fl_coord_t *c = coord_at("tcp://127.0.0.1:0", 2, 2000);
    fl_ctx_t *ctx = quiet_ctx();
    joiner_t a = {.m = member(ctx, fl_coord_endpoint(c), 0, 0)};
    worker_reg(&a.reg, 0, 2);
    pthread_t t;
    ck_assert(pthread_create(&t, NULL, join_main, &a) == 0);
    int64_t until = fl_deadline_in(5000);
    while (fl_coord_registered(c) < 1 && fl_now_ms() < until)
        usleep(10 * 1000);
    ck_assert_int_eq(fl_coord_registered(c), 1);
    ck_assert_int_eq(reset_accepted(port_of(fl_coord_endpoint(c))), 1);
    usleep(300 * 1000);
    fl_tp_member_t *b = member(ctx, fl_coord_endpoint(c), 1, 0);
    fl_msg_register_t rb;
    worker_reg(&rb, 1, 2);
    fl_msg_hdr_t w;
    ck_assert_msg(fl_tp_member_join(b, &rb, &w) == FL_OK, "%s", fl_last_error());
    fl_msg_hdr_deinit(&w);
    until = fl_deadline_in(3000);
    while (!atomic_load(&a.done) && fl_now_ms() < until)
        usleep(10 * 1000);
    bool done = atomic_load(&a.done);
    if (!done)
        fl_tp_member_cancel(a.m);
    pthread_join(t, NULL);
    ck_assert_msg(done && a.rc == FL_OK, "rank 0 after its connection dropped: %s",
                  done ? a.why : "no welcome within 3 s of rank 1's");
    fl_tp_member_destroy(&a.m);
    fl_tp_member_destroy(&b);
    fl_ctx_destroy(&ctx);
    fl_coord_destroy(&c);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("member");
    TCase *t = tcase_create("member");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_join_and_clean_leave);
    tcase_add_test(t, test_refused_join_names_both);
    tcase_add_test(t, test_no_coordinator_times_out);
    tcase_add_test(t, test_bad_options);
    tcase_add_test(t, test_peer_death_is_an_error_event);
    tcase_add_test(t, test_coordinator_gone_without_reconnect);
    tcase_add_test(t, test_reconnect_to_restarted_coordinator);
    tcase_add_test(t, test_reconnect_gives_up_at_its_deadline);
    tcase_add_test(t, test_dropped_connection_keeps_the_member);
    tcase_add_test(t, test_silently_dead_path_keeps_the_member);
    tcase_add_test(t, test_dropped_connection_in_the_rendezvous);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
