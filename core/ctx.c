/* The context: one ZeroMQ context, the limits every socket applies, and the counters. Each
 * server or rank owns one, so several can share a test process (no global state). */
#include "ctx_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define DEFAULT_MAX_MSG ((size_t)256 << 20)
#define DEFAULT_MAX_FRAMES 16

void fl_ctx_opts_init(fl_ctx_opts_t *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->log_level = FL_LOG_WARN;
    opts->log_name = "flodl";
    opts->io_threads = 1;
    opts->max_msg_bytes = DEFAULT_MAX_MSG;
    opts->max_frames = DEFAULT_MAX_FRAMES;
    opts->held_max_bytes = FL_CTX_HELD_MAX;
}

static bool held_max_bad(size_t bytes)
{
    return bytes != SIZE_MAX && bytes < ((size_t)1 << 20);
}

int fl_ctx_create(const fl_ctx_opts_t *opts, fl_ctx_t **out)
{
    *out = NULL;
    if (opts->io_threads < 1 || opts->io_threads > 64)
        return fl_fail(FL_EINVAL, "ctx: io_threads %d out of range 1..64", opts->io_threads);
    if (opts->max_msg_bytes < 1024)
        return fl_fail(FL_EINVAL, "ctx: max_msg_bytes %zu below 1024", opts->max_msg_bytes);
    if (opts->max_frames < 1 || opts->max_frames > 1024)
        return fl_fail(FL_EINVAL, "ctx: max_frames %zu out of range 1..1024", opts->max_frames);
    if (held_max_bad(opts->held_max_bytes))
        return fl_fail(FL_EINVAL, "ctx: held_max_bytes %zu below 1 MiB", opts->held_max_bytes);
    if (opts->log_level < FL_LOG_DEBUG || opts->log_level > FL_LOG_OFF)
        return fl_fail(FL_EINVAL, "ctx: log_level %d out of range", (int)opts->log_level);

    fl_ctx_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return fl_fail(FL_ENOMEM, "ctx: out of memory");
    c->zmq = zmq_ctx_new();
    if (c->zmq == NULL) {
        free(c);
        return fl_fail(FL_EIO, "ctx: zmq_ctx_new: %s", zmq_strerror(errno));
    }
    zmq_ctx_set(c->zmq, ZMQ_IO_THREADS, opts->io_threads);
    /* Block SIGPIPE-style surprises: ZeroMQ already uses MSG_NOSIGNAL; nothing else to do. */
    c->max_msg_bytes = opts->max_msg_bytes;
    c->max_frames = opts->max_frames;
    atomic_init(&c->held_max, opts->held_max_bytes == SIZE_MAX ? 0 : opts->held_max_bytes);
    atomic_init(&c->held, 0);
    atomic_store(&c->log_level, (int)opts->log_level);
    pthread_mutex_init(&c->name_lock, NULL);
    snprintf(c->log_name, sizeof c->log_name, "%s", opts->log_name ? opts->log_name : "flodl");
    for (int i = 0; i < FL_STAT_COUNT; i++)
        atomic_init(&c->stats[i], 0);
    *out = c;
    return FL_OK;
}

static void ctx_destroy(fl_ctx_t **ctx)
{
    if (ctx == NULL || *ctx == NULL)
        return;
    fl_ctx_t *c = *ctx;
    if (c->security_free != NULL)
        c->security_free(c->security); /* it owns sockets (a ZAP handler): close them first */
    /* zmq_ctx_term blocks until every socket is closed and lingering messages are sent; the
     * sockets' own linger options bound that time. */
    while (zmq_ctx_term(c->zmq) != 0 && errno == EINTR) {
    }
    pthread_mutex_destroy(&c->name_lock);
    free(c);
    *ctx = NULL;
}

void fl_ctx_destroy(fl_ctx_t **ctx)
{
    fl_error_keep_begin();
    ctx_destroy(ctx);
    fl_error_keep_end();
}

void *fl_ctx_zmq(const fl_ctx_t *ctx)
{
    return ctx->zmq;
}

void *fl_ctx_security(const fl_ctx_t *ctx)
{
    return ctx->security;
}

void fl_ctx_set_security(fl_ctx_t *ctx, void *security, void (*free_fn)(void *))
{
    ctx->security = security;
    ctx->security_free = free_fn;
}

size_t fl_ctx_max_msg_bytes(const fl_ctx_t *ctx)
{
    return ctx->max_msg_bytes;
}

size_t fl_ctx_max_frames(const fl_ctx_t *ctx)
{
    return ctx->max_frames;
}

uint64_t fl_ctx_held_max(const fl_ctx_t *ctx)
{
    return atomic_load_explicit(&ctx->held_max, memory_order_relaxed);
}

int fl_ctx_set_held_max(fl_ctx_t *ctx, size_t bytes)
{
    if (held_max_bad(bytes))
        return fl_fail(FL_EINVAL, "ctx: held_max_bytes %zu below 1 MiB", bytes);
    atomic_store_explicit(&ctx->held_max, bytes == SIZE_MAX ? 0 : bytes, memory_order_relaxed);
    return FL_OK;
}

uint64_t fl_ctx_held_add(fl_ctx_t *ctx, int64_t delta)
{
    return atomic_fetch_add(&ctx->held, (uint64_t)delta) + (uint64_t)delta;
}

void fl_ctx_set_log_name(fl_ctx_t *ctx, const char *name)
{
    pthread_mutex_lock(&ctx->name_lock);
    snprintf(ctx->log_name, sizeof ctx->log_name, "%s", name);
    pthread_mutex_unlock(&ctx->name_lock);
}

void fl_ctx_set_log_level(fl_ctx_t *ctx, fl_log_level_t level)
{
    atomic_store(&ctx->log_level, (int)level);
}

fl_log_level_t fl_ctx_log_level(const fl_ctx_t *ctx)
{
    return (fl_log_level_t)atomic_load(&((fl_ctx_t *)ctx)->log_level);
}

void fl_ctx_count(fl_ctx_t *ctx, fl_stat_t stat, uint64_t n)
{
    if (ctx != NULL && stat >= 0 && stat < FL_STAT_COUNT)
        atomic_fetch_add_explicit(&ctx->stats[stat], n, memory_order_relaxed);
}

uint64_t fl_ctx_stat(const fl_ctx_t *ctx, fl_stat_t stat)
{
    if (ctx == NULL || stat < 0 || stat >= FL_STAT_COUNT)
        return 0;
    return atomic_load_explicit(&((fl_ctx_t *)ctx)->stats[stat], memory_order_relaxed);
}

const char *fl_stat_name(fl_stat_t stat)
{
    static const char *const names[FL_STAT_COUNT] = {
        [FL_STAT_MSGS_SENT] = "msgs_sent",       [FL_STAT_MSGS_RECV] = "msgs_recv",
        [FL_STAT_BYTES_SENT] = "bytes_sent",     [FL_STAT_BYTES_RECV] = "bytes_recv",
        [FL_STAT_BAD_HEADER] = "bad_header",     [FL_STAT_BAD_MAGIC] = "bad_magic",
        [FL_STAT_BAD_VERSION] = "bad_version",   [FL_STAT_BAD_JOB] = "bad_job",
        [FL_STAT_BAD_FRAMES] = "bad_frames",     [FL_STAT_OVERSIZED] = "oversized",
        [FL_STAT_UNEXPECTED] = "unexpected",     [FL_STAT_ERRORS_SENT] = "errors_sent",
        [FL_STAT_AUTH_REFUSED] = "auth_refused", [FL_STAT_CONN_DROPPED] = "conn_dropped",
        [FL_STAT_CONN_CUT] = "conn_cut",
    };
    if (stat < 0 || stat >= FL_STAT_COUNT)
        return "unknown";
    return names[stat];
}
