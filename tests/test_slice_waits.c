/* Waits in slices (collective/, transport/) when what they wait for completes just as a slice
 * ends: the wait must end in success, never in a timeout or in a failure heard meanwhile.
 * Linked with -Wl,--wrap for calls these waits make (tests/CMakeLists.txt names them): each
 * wrapper, once armed, makes its race happen every time, as each case says. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_int.h"
#include "fl_intra.h"
#include "fl_ps.h"
#include "testutil.h"

#define OK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ == FL_OK, "%s: %s: %s", #call, fl_strerror(rc_), fl_last_error());       \
    } while (0)

/* ---- the wrappers ---- */

static atomic_int release_late; /* fl_rel_wait: the next one that times out releases one send */
static atomic_int miss_once;    /* fl_tp_try_recv: the next one finds nothing */
static atomic_int late_done_ms; /* fl_event_done: the next one says "not yet" after this long */
static atomic_int blind_ms;     /* fl_tp_poll: the next slice on poll_thread sees nothing */
static pthread_t poll_thread;

bool __real_fl_rel_wait(fl_rel_t *r, int timeout_ms);
bool __wrap_fl_rel_wait(fl_rel_t *r, int timeout_ms);
int __real_fl_tp_try_recv(fl_tp_sock_t *s, fl_tp_msg_t *m);
int __wrap_fl_tp_try_recv(fl_tp_sock_t *s, fl_tp_msg_t *m);
bool __real_fl_event_done(fl_event_t *e);
bool __wrap_fl_event_done(fl_event_t *e);
int __real_fl_tp_poll(fl_tp_sock_t *const *socks, size_t n, int timeout_ms, bool *ready);
int __wrap_fl_tp_poll(fl_tp_sock_t *const *socks, size_t n, int timeout_ms, bool *ready);

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

bool __wrap_fl_rel_wait(fl_rel_t *r, int timeout_ms)
{
    bool done = __real_fl_rel_wait(r, timeout_ms);
    /* ZeroMQ's I/O thread lets go of the send just after the slice ended. */
    if (!done && atomic_exchange(&release_late, 0))
        fl_rel_hook(NULL, r);
    return done;
}

int __wrap_fl_tp_try_recv(fl_tp_sock_t *s, fl_tp_msg_t *m)
{
    if (atomic_exchange(&miss_once, 0)) {
        m->nframes = 0;
        return FL_ETIMEDOUT;
    }
    return __real_fl_tp_try_recv(s, m);
}

bool __wrap_fl_event_done(fl_event_t *e)
{
    int ms = atomic_exchange(&late_done_ms, 0);
    if (ms == 0)
        return __real_fl_event_done(e);
    /* Looked at just before the device finished, and the wait's clock is read only later. */
    ck_assert_int_eq(fl_event_sync(e, 10000), FL_OK);
    sleep_ms(ms);
    return false;
}

int __wrap_fl_tp_poll(fl_tp_sock_t *const *socks, size_t n, int timeout_ms, bool *ready)
{
    if (timeout_ms > 0 && pthread_equal(pthread_self(), poll_thread)) {
        int ms = atomic_exchange(&blind_ms, 0);
        if (ms > 0) {
            /* A slice that ends with nothing seen, past the deadline, while the answer
             * arrives. */
            sleep_ms(ms);
            for (size_t i = 0; i < n; i++)
                ready[i] = false;
            return 0;
        }
    }
    return __real_fl_tp_poll(socks, n, timeout_ms, ready);
}

/* ---- a communicator of two ranks, this one rank 0, with no membership: its data socket,
 * a peer's socket into it, and an events pipe the test posts on ---- */

typedef struct fake {
    fl_comm_t c;
    fl_tp_status_t status;
    fl_tp_sock_t *peer;  /* PUSH into c.data_in, as rank 1 */
    fl_tp_sock_t *ev_tx; /* the control thread's end of c.events */
} fake_t;

static fl_tp_sock_t *sock(fl_ctx_t *ctx, fl_tp_kind_t kind, const char *name)
{
    fl_tp_opts_t o;
    fl_tp_opts_init(&o);
    o.linger_ms = 0;
    fl_tp_sock_t *s = NULL;
    OK(fl_tp_sock_create(ctx, kind, &o, name, &s));
    return s;
}

static void fake_open(fake_t *f)
{
    memset(f, 0, sizeof *f);
    fl_comm_t *c = &f->c;
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    OK(fl_ctx_create(&co, &c->ctx));
    c->rank = 0;
    c->size = 2;
    snprintf(c->host, sizeof c->host, "test-host");
    c->timeout_ms = 5000;
    c->status = &f->status;
    atomic_store(&f->status.waiting_on, -1);
    c->inflight = calloc((size_t)c->size + 1, sizeof *c->inflight);
    c->data_out = calloc((size_t)c->size, sizeof *c->data_out);
    ck_assert(c->inflight != NULL && c->data_out != NULL);
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://slice-waits-data-%p", (void *)f);
    c->data_in = sock(c->ctx, FL_TP_PULL, "data");
    OK(fl_tp_sock_bind(c->data_in, ep, NULL, 0));
    f->peer = sock(c->ctx, FL_TP_PUSH, "peer");
    OK(fl_tp_sock_connect(f->peer, ep));
    snprintf(ep, sizeof ep, "inproc://slice-waits-events-%p", (void *)f);
    c->events = sock(c->ctx, FL_TP_PAIR, "events");
    OK(fl_tp_sock_bind(c->events, ep, NULL, 0));
    f->ev_tx = sock(c->ctx, FL_TP_PAIR, "events-tx");
    OK(fl_tp_sock_connect(f->ev_tx, ep));
}

static void fake_close(fake_t *f)
{
    fl_comm_t *c = &f->c;
    fl_tp_sock_destroy(&f->peer);
    fl_tp_sock_destroy(&f->ev_tx);
    fl_tp_sock_destroy(&c->data_in);
    fl_tp_sock_destroy(&c->events);
    for (int p = 0; p < c->size; p++)
        fl_tp_sock_destroy(&c->data_out[p]);
    free(c->data_out);
    free((void *)c->inflight);
    fl_ctx_destroy(&c->ctx);
}

/* The control thread's news of a dead peer, waiting on the events pipe. */
static void post_failure(fake_t *f)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_ERROR, -1);
    h.u.error.code = FL_EPEER;
    snprintf(h.u.error.text, sizeof h.u.error.text, "rank 1 (test-host) is dead");
    atomic_fetch_add(&f->status.posted, 1);
    OK(fl_tp_send(f->ev_tx, NULL, &h, NULL, 0, fl_deadline_in(1000)));
    bool ready = false;
    fl_tp_sock_t *ev = f->c.events;
    ck_assert(fl_tp_poll(&ev, 1, 1000, &ready) == 1 && ready);
}

static void op_of(fake_t *f, coll_op_t *op, int64_t deadline)
{
    memset(op, 0, sizeof *op);
    op->c = &f->c;
    op->kind = FL_COLL_ALLREDUCE;
    op->seq = 1;
    op->count = 4;
    op->dtype = FL_FLOAT32;
    op->op = FL_SUM;
    op->deadline = deadline;
    op->waiting_on = 1;
}

/* A region's last send is released just after a slice timed out, at the deadline. */
START_TEST(test_region_released_at_deadline)
{
    fake_t f;
    fake_open(&f);
    coll_op_t op;
    op_of(&f, &op, fl_deadline_in(0));
    fl_rel_add(&f.c.inflight[0], 1);
    atomic_store(&release_late, 1);
    OK(fl_coll__wait_region(&op, 0));
    ck_assert_int_eq(atomic_load(&release_late), 0);
    ck_assert_int_eq(fl_rel_held(&f.c.inflight[0]), 0);
    fake_close(&f);
}
END_TEST

/* The same while a failure is posted: the sends completed, so the wait does not fail. */
START_TEST(test_region_released_with_event)
{
    fake_t f;
    fake_open(&f);
    coll_op_t op;
    op_of(&f, &op, fl_deadline_in(5000));
    post_failure(&f);
    fl_rel_add(&f.c.inflight[1], 1);
    atomic_store(&release_late, 1);
    OK(fl_coll__wait_region(&op, 1));
    ck_assert_int_eq(atomic_load(&release_late), 0);
    fake_close(&f);
}
END_TEST

/* An op's end waits for all its sends: the last one released at the deadline ends it well. */
START_TEST(test_end_released_at_deadline)
{
    fake_t f;
    fake_open(&f);
    coll_op_t op;
    op_of(&f, &op, fl_deadline_in(0));
    fl_rel_add(&f.c.inflight[2], 1);
    atomic_store(&release_late, 1);
    OK(fl_coll__end(&op, FL_OK));
    ck_assert_int_eq(atomic_load(&release_late), 0);
    ck_assert_int_eq(f.c.broken_rc, FL_OK);
    ck_assert_uint_eq(f.c.ops, 1);
    fake_close(&f);
}
END_TEST

/* The message an op waits for arrives with a failure event, just after a look found the data
 * socket empty: the op takes it rather than failing. */
START_TEST(test_recv_data_beside_event)
{
    fake_t f;
    fake_open(&f);
    coll_op_t op;
    op_of(&f, &op, fl_deadline_in(5000));
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, 1);
    h.seq = op.seq;
    h.u.chunk.coll = (uint32_t)op.kind;
    h.u.chunk.total = op.count;
    h.u.chunk.dtype = (uint32_t)op.dtype;
    h.u.chunk.op = (uint32_t)op.op;
    h.frames[0].dtype = FL_FLOAT32;
    h.frames[0].codec = FL_CODEC_RAW;
    float data[4] = {1, 2, 3, 4};
    fl_buf_t b = {data, sizeof data, NULL, NULL};
    OK(fl_tp_send(f.peer, NULL, &h, &b, 1, fl_deadline_in(1000)));
    bool ready = false;
    fl_tp_sock_t *in = f.c.data_in;
    ck_assert(fl_tp_poll(&in, 1, 1000, &ready) == 1 && ready);
    post_failure(&f);
    atomic_store(&miss_once, 1);
    fl_tp_msg_t m;
    OK(fl_coll__recv(&op, &m));
    ck_assert_int_eq(atomic_load(&miss_once), 0);
    ck_assert_int_eq(m.hdr.sender, 1);
    ck_assert_uint_eq(fl_tp_msg_size(&m, 0), sizeof data);
    fl_tp_msg_close(&m);
    fake_close(&f);
}
END_TEST

/* The intra-host collectives' wait: the device finishes as the wait reads the clock past the
 * deadline. */
START_TEST(test_intra_done_at_deadline)
{
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = FL_DEV_SIM;
    fl_dev_t *d = NULL;
    fl_stream_t *st = NULL;
    fl_dptr_t buf = {0};
    OK(fl_dev_create(&o, &d));
    OK(fl_dev_bind(d));
    OK(fl_stream_create(d, &st));
    OK(fl_dev_alloc(d, 64 * sizeof(float), &buf));
    fl_intra_opts_t io;
    fl_intra_opts_init(&io);
    io.impl = FL_INTRA_COPY;
    io.host = "test-host";
    fl_intra_t *x = NULL;
    OK(fl_intra_create(&d, 1, &io, &x));
    OK(fl_intra_allgather(x, &buf, 64, &st, NULL));
    atomic_store(&late_done_ms, 150);
    OK(fl_intra_wait(x, 50));
    ck_assert_int_eq(atomic_load(&late_done_ms), 0);
    fl_intra_destroy(&x);
    fl_stream_destroy(&st);
    fl_dev_free(d, &buf);
    fl_dev_destroy(&d);
}
END_TEST

/* A member's join: the coordinator's welcome arrives while the last slice runs past the
 * rendezvous deadline seeing nothing. */
START_TEST(test_join_welcome_at_deadline)
{
    fl_coord_t *coord = fl_test_coord(1, 0);
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    fl_ctx_t *ctx = NULL;
    OK(fl_ctx_create(&co, &ctx));
    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    mo.coordinator = fl_coord_endpoint(coord);
    mo.name = "rank 0";
    mo.sender = 0;
    mo.rendezvous_timeout_ms = 300;
    fl_tp_member_t *m = NULL;
    OK(fl_tp_member_create(ctx, &mo, &m));
    fl_msg_register_t reg;
    memset(&reg, 0, sizeof reg);
    reg.world_size = 1;
    snprintf(reg.host, sizeof reg.host, "127.0.0.1");
    reg.nendpoints = 1;
    snprintf(reg.endpoints[0], sizeof reg.endpoints[0], "tcp://127.0.0.1:1");
    reg.pid = getpid();
    poll_thread = pthread_self();
    atomic_store(&blind_ms, 1500);
    fl_msg_hdr_t welcome;
    OK(fl_tp_member_join(m, &reg, &welcome));
    ck_assert_int_eq(atomic_load(&blind_ms), 0);
    ck_assert_int_eq(welcome.type, FL_MSG_WELCOME);
    fl_msg_hdr_deinit(&welcome);
    fl_tp_member_destroy(&m);
    fl_ctx_destroy(&ctx);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
}
END_TEST

/* A parameter-server exchange: the shard's reply arrives while the last slice runs past the
 * exchange's deadline (timeout_ms and the reply margin) seeing nothing. */
START_TEST(test_ps_reply_at_deadline)
{
    enum { N = 64 };
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = "tcp://127.0.0.1:0";
    co.world_size = 1;
    co.num_shards = 1;
    co.log_level = FL_LOG_OFF;
    fl_coord_t *coord = NULL;
    OK(fl_coord_create(&co, &coord));
    OK(fl_coord_start(coord));
    fl_ps_server_opts_t so;
    fl_ps_server_opts_init(&so);
    so.coordinator = fl_coord_endpoint(coord);
    so.host = "127.0.0.1";
    so.num_shards = 1;
    so.shard_count = 1;
    fl_lr_sched_init(&so.lr, 0.1);
    so.log_level = FL_LOG_OFF;
    fl_ps_server_t *srv = NULL;
    OK(fl_ps_server_create(&so, &srv));
    OK(fl_ps_server_start(srv));
    fl_ps_client_opts_t po;
    fl_ps_client_opts_init(&po);
    po.rank = 0;
    po.world_size = 1;
    po.coordinator = fl_coord_endpoint(coord);
    po.host = "127.0.0.1";
    po.param_count = N;
    po.timeout_ms = 100;
    po.log_level = FL_LOG_OFF;
    fl_ps_client_t *cl = NULL;
    OK(fl_ps_client_create(&po, &cl));
    float params[N] = {0};
    OK(fl_ps_client_init(cl, params));
    poll_thread = pthread_self();
    atomic_store(&blind_ms, 5600);
    OK(fl_ps_client_pull(cl, params));
    ck_assert_int_eq(atomic_load(&blind_ms), 0);
    fl_ps_client_destroy(&cl);
    fl_ps_server_stop(srv);
    fl_ps_server_destroy(&srv);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
}
END_TEST

static Suite *slice_waits_suite(void)
{
    Suite *s = suite_create("slice_waits");
    TCase *t = tcase_create("done beats the deadline");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_region_released_at_deadline);
    tcase_add_test(t, test_region_released_with_event);
    tcase_add_test(t, test_end_released_at_deadline);
    tcase_add_test(t, test_recv_data_beside_event);
    tcase_add_test(t, test_intra_done_at_deadline);
    tcase_add_test(t, test_join_welcome_at_deadline);
    tcase_add_test(t, test_ps_reply_at_deadline);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(slice_waits_suite());
}
