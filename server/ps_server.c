/* A parameter-server process's shards as one member of the job: before the rendezvous it
 * checks its --init file and, when resuming, its checkpoints (the steps every shard it serves
 * holds), and binds one socket per shard; then it registers with the coordinator (shard
 * endpoints, settings, parameter count, checkpoint steps), takes the shard map from the
 * welcome, gives every shard its range and initial parameters (the checkpoint of the step the
 * coordinator chose, the --init file's range, or rank 0's first push) and starts them. It
 * relays the job's end (final checkpoint, leave) and its failures (a dead rank, a lost
 * coordinator: shards answer with the reason) to the shards. */
#include "ps_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_tp.h"

struct fl_ps_server {
    fl_ps_server_opts_t o;
    char coordinator[FL_ENDPOINT_MAX];
    char job_id[FL_JOB_MAX];
    char host[FL_HOST_MAX];
    char ckpt_dir[4096];
    char tuning[FL_MSG_TUNING_MAX];
    fl_ctx_t *ctx;
    fl_tp_member_t *member;
    ps_shard_t **shards;
    fl_st_file_t *init;   /* --init, until the shards took their ranges */
    uint64_t param_count; /* from --init or the checkpoints; 0: from the ranks */
    uint64_t signature;   /* of --init's tensor shapes, which the ranks' must match; 0: none */
    char shapes[FL_MODEL_SHAPES_MAX];
    uint64_t resume_steps[FL_MSG_MAX_CHECKPOINTS];
    size_t nresume;
    fl_msg_peer_t *peers; /* from the welcome: hosts for the shards' texts */
    int world;

    fl_service_t svc; /* the server thread; ready once past the rendezvous */
    fl_tp_sock_t *cmd_rx, *cmd_tx;
};

void fl_ps_server_opts_init(fl_ps_server_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->job_id = "flodl";
    o->num_shards = 1;
    o->shard_count = 1;
    o->consistency = FL_PS_SYNC;
    fl_opt_opts_init(&o->opt);
    fl_lr_sched_init(&o->lr, 0.01);
    o->keep = 3;
    o->max_wait_ms = 3600000;
    o->rendezvous_timeout_ms = 300000;
    o->log_level = FL_LOG_INFO;
    o->tune_malloc = true;
}

static int check_opts(const fl_ps_server_opts_t *o)
{
    if (o->coordinator == NULL)
        return fl_fail(FL_EINVAL, "parameter server: no coordinator endpoint given");
    if (o->num_shards < 1 || o->num_shards > FL_MSG_MAX_SHARDS)
        return fl_fail(FL_EINVAL, "parameter server: --num-shards %d out of range 1..%d",
                       o->num_shards, FL_MSG_MAX_SHARDS);
    if (o->shard_first < 0 || o->shard_count < 1 || o->shard_first >= o->num_shards ||
        o->shard_count > o->num_shards - o->shard_first)
        return fl_fail(FL_EINVAL, "parameter server: shards %d..%d outside 0..%d", o->shard_first,
                       o->shard_first + o->shard_count - 1, o->num_shards - 1);
    if (o->consistency != FL_PS_SYNC && o->consistency != FL_PS_ASYNC &&
        o->consistency != FL_PS_SSP)
        return fl_fail(FL_EINVAL, "parameter server: unknown consistency %d", (int)o->consistency);
    if (o->consistency != FL_PS_SSP && o->staleness != 0)
        return fl_fail(FL_EINVAL, "parameter server: --staleness only applies to ssp");
    if (!(o->async_scale >= 0.0) || o->async_scale > 1e6)
        return fl_fail(FL_EINVAL, "parameter server: async scale %g", o->async_scale);
    if (o->keep < 2)
        return fl_fail(FL_EINVAL,
                       "parameter server: --keep %d: keep at least 2 (a crash while "
                       "the shards write one checkpoint must leave an older one they "
                       "all hold)",
                       o->keep);
    if (o->checkpoint_dir == NULL && (o->resume || o->ckpt_every_steps || o->ckpt_every_ms))
        return fl_fail(FL_EINVAL, "parameter server: --resume and --checkpoint-every need "
                                  "--checkpoint-dir");
    if (o->max_wait_ms < 1 || o->rendezvous_timeout_ms < 1)
        return fl_fail(FL_EINVAL, "parameter server: timeouts must be positive");
    fl_opt_t *probe = NULL;
    int rc = fl_opt_create(&o->opt, 1, &probe); /* the optimizer's own checks */
    fl_opt_destroy(&probe);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "parameter server");
    return FL_OK;
}

/* The settings every server of the job must share, beyond the typed ones. */
static void make_tuning(const fl_ps_server_opts_t *o, char *out, size_t cap)
{
    const fl_opt_opts_t *p = &o->opt;
    const fl_lr_sched_t *l = &o->lr;
    snprintf(out, cap,
             "opt=%s,lr=%.9g,mom=%.9g,damp=%.9g,nesterov=%d,wd=%.9g,b1=%.9g,b2=%.9g,eps=%.9g,"
             "sched=%d,warmup=%ld,total=%ld,size=%ld,gamma=%.9g,min=%.9g,scale=%.9g",
             fl_opt_kind_name(p->kind), l->lr, p->momentum, p->dampening, (int)p->nesterov,
             p->weight_decay, p->beta1, p->beta2, p->eps, (int)l->kind, l->warmup_steps,
             l->total_steps, l->step_size, l->gamma, l->min_lr, o->async_scale);
}

static int open_init(fl_ps_server_t *s)
{
    int rc = fl_ps__init_open(s->o.init_path, &s->init, &s->param_count);
    if (rc == FL_OK)
        rc =
            fl_ps__init_shapes(s->init, s->o.init_path, &s->signature, s->shapes, sizeof s->shapes);
    return rc;
}

/* First removes what killed writers of its shards' checkpoints left. Then, with --resume: the
 * steps every shard of this process holds a valid checkpoint of. Without it, a directory that
 * holds checkpoints is refused rather than overwritten. */
static int scan_checkpoints(fl_ps_server_t *s)
{
    const fl_ps_server_opts_t *o = &s->o;
    uint64_t common[256];
    size_t ncommon = 0;
    uint64_t params = 0;
    size_t files = 0;
    char seen[512] = "";
    size_t used = 0;
    size_t stale = 0;
    uint64_t stale_bytes = 0;
    int rc = fl_ps__ckpt_clean(s->ckpt_dir, (uint32_t)o->shard_first, (uint32_t)o->shard_count,
                               (uint32_t)o->num_shards, &stale, &stale_bytes);
    if (rc != FL_OK)
        return rc;
    if (stale > 0)
        FL_INFO(s->ctx,
                "removed %zu temporary file(s) of killed checkpoint writers from %s "
                "(%.1f MiB)",
                stale, s->ckpt_dir, (double)stale_bytes / 1048576.0);
    for (int k = 0; k < o->shard_count; k++) {
        uint32_t idx = (uint32_t)(o->shard_first + k);
        uint64_t steps[256];
        size_t n = 0;
        uint32_t foreign = 0;
        rc = fl_ps__ckpt_list(s->ckpt_dir, idx, (uint32_t)o->num_shards, steps, 256, &n, &foreign);
        if (rc != FL_OK)
            return rc;
        files += n + (foreign > 0);
        if (!o->resume) {
            if (n > 0 || foreign > 0)
                return fl_fail(FL_EINVAL,
                               "--checkpoint-dir %s holds checkpoints of an earlier "
                               "run: pass --resume to continue from them, or choose "
                               "another directory",
                               s->ckpt_dir);
            continue;
        }
        if ((rc = fl_ps__ckpt_valid_steps(s->ckpt_dir, idx, (uint32_t)o->num_shards, s->ctx, steps,
                                          256, &n, &params)) != FL_OK)
            return rc;
        if (used + 48 < sizeof seen)
            used += (size_t)snprintf(seen + used, sizeof seen - used, "%sshard %u: %zu valid%s",
                                     k ? "; " : "", idx, n, n ? ", newest " : "");
        if (n > 0 && used + 24 < sizeof seen)
            used += (size_t)snprintf(seen + used, sizeof seen - used, "%llu",
                                     (unsigned long long)steps[0]);
        if (k == 0) {
            memcpy(common, steps, n * sizeof *steps);
            ncommon = n;
            continue;
        }
        size_t keep = 0;
        for (size_t i = 0; i < ncommon; i++) {
            bool has = false;
            for (size_t j = 0; j < n && !has; j++)
                has = steps[j] == common[i];
            if (has)
                common[keep++] = common[i];
        }
        ncommon = keep;
    }
    if (o->resume && files > 0 && ncommon == 0)
        return fl_fail(FL_EINVAL,
                       "--resume: %s holds checkpoints, but no valid step common to "
                       "shards %d..%d (%s): refusing to start over",
                       s->ckpt_dir, o->shard_first, o->shard_first + o->shard_count - 1, seen);
    s->nresume = ncommon < FL_MSG_MAX_CHECKPOINTS ? ncommon : FL_MSG_MAX_CHECKPOINTS;
    memcpy(s->resume_steps, common, s->nresume * sizeof *common);
    if (params != 0) {
        if (s->param_count != 0 && s->param_count != params)
            return fl_fail(FL_EINVAL,
                           "--init %s has %" PRIu64 " parameters, the checkpoints in "
                           "%s %" PRIu64,
                           o->init_path, s->param_count, s->ckpt_dir, params);
        s->param_count = params;
    }
    if (o->resume)
        FL_INFO(s->ctx, "resuming: %zu checkpoint steps held by shards %d..%d%s", s->nresume,
                o->shard_first, o->shard_first + o->shard_count - 1,
                s->nresume == 0 ? " (none yet: starting afresh)" : "");
    return FL_OK;
}

static int make_pipe(fl_ps_server_t *s)
{
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://flodl-ps-server-%p", (void *)s);
    int rc = fl_tp_sock_create(s->ctx, FL_TP_PAIR, &t, "server commands", &s->cmd_rx);
    if (rc == FL_OK)
        rc = fl_tp_sock_bind(s->cmd_rx, ep, NULL, 0);
    if (rc == FL_OK)
        rc = fl_tp_sock_create(s->ctx, FL_TP_PAIR, &t, "server commands", &s->cmd_tx);
    if (rc == FL_OK)
        rc = fl_tp_sock_connect(s->cmd_tx, ep);
    return rc;
}

int fl_ps_server_create(const fl_ps_server_opts_t *o, fl_ps_server_t **out)
{
    *out = NULL;
    int rc = check_opts(o);
    if (rc != FL_OK)
        return rc;
    fl_ps_server_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return fl_fail(FL_ENOMEM, "parameter server: out of memory");
    fl_service_init(&s->svc);
    if (o->tune_malloc)
        fl_malloc_tune();
    s->o = *o;
    snprintf(s->coordinator, sizeof s->coordinator, "%s", o->coordinator);
    snprintf(s->job_id, sizeof s->job_id, "%s", o->job_id ? o->job_id : "flodl");
    s->o.coordinator = s->coordinator;
    s->o.job_id = s->job_id;
    if (o->checkpoint_dir != NULL) {
        snprintf(s->ckpt_dir, sizeof s->ckpt_dir, "%s", o->checkpoint_dir);
        s->o.checkpoint_dir = s->ckpt_dir;
    }
    s->o.init_path = NULL; /* only used here */
    make_tuning(o, s->tuning, sizeof s->tuning);

    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = o->log_level;
    char name[64];
    snprintf(name, sizeof name, "ps %d..%d", o->shard_first, o->shard_first + o->shard_count - 1);
    co.log_name = name;
    co.io_threads = o->shard_count > 1 ? 2 : 1;
    co.max_msg_bytes = (size_t)1 << 40; /* a shard's pushes are as large as the shard */
    if (o->held_max_bytes != 0)
        co.held_max_bytes = o->held_max_bytes;
    if ((rc = fl_ctx_create(&co, &s->ctx)) != FL_OK ||
        (rc = fl_tp_curve_use(s->ctx, o->curve_dir, "ps")) != FL_OK)
        goto fail;
    if (o->host != NULL)
        snprintf(s->host, sizeof s->host, "%s", o->host);
    else if ((rc = fl_tp_local_addr_towards(o->coordinator, s->host, sizeof s->host)) != FL_OK)
        goto fail;
    if (o->init_path != NULL) {
        s->o.init_path = o->init_path;
        if ((rc = open_init(s)) != FL_OK)
            goto fail;
    }
    if (o->checkpoint_dir != NULL && (rc = scan_checkpoints(s)) != FL_OK)
        goto fail;

    s->shards = calloc((size_t)o->shard_count, sizeof *s->shards);
    if (s->shards == NULL) {
        rc = fl_fail(FL_ENOMEM, "parameter server: out of memory");
        goto fail;
    }
    char bind[FL_ENDPOINT_MAX + 16];
    if (o->bind_host != NULL)
        snprintf(bind, sizeof bind, "tcp://%s:0", o->bind_host);
    else if (fl_tp_is_ip_literal(s->host) && strchr(s->host, ':') == NULL)
        snprintf(bind, sizeof bind, "tcp://%s:0", s->host);
    else
        snprintf(bind, sizeof bind, "tcp://*:0");
    for (int k = 0; k < o->shard_count; k++)
        if ((rc = fl_ps__shard_create(s->ctx, (uint32_t)(o->shard_first + k), bind, s->host,
                                      &s->shards[k])) != FL_OK)
            goto fail;

    fl_tp_member_opts_t mo;
    fl_tp_member_opts_init(&mo);
    mo.coordinator = s->coordinator;
    mo.job_id = s->job_id;
    mo.name = name;
    mo.sender = FL_MSG_SENDER_SERVER;
    mo.rendezvous_timeout_ms = o->rendezvous_timeout_ms;
    if ((rc = fl_tp_member_create(s->ctx, &mo, &s->member)) != FL_OK ||
        (rc = make_pipe(s)) != FL_OK)
        goto fail;
    *out = s;
    return FL_OK;
fail:
    fl_ps_server_destroy(&s);
    return rc;
}

uint64_t fl_ps_server_param_count(const fl_ps_server_t *s)
{
    return s->param_count;
}

const char *fl_ps_server_endpoint(const fl_ps_server_t *s, int k)
{
    return k >= 0 && k < s->o.shard_count ? fl_ps__shard_endpoint(s->shards[k]) : NULL;
}

static int join(fl_ps_server_t *s, fl_msg_hdr_t *welcome)
{
    const fl_ps_server_opts_t *o = &s->o;
    fl_msg_register_t reg;
    memset(&reg, 0, sizeof reg);
    reg.role = FL_ROLE_SERVER;
    reg.rank = o->shard_first;
    reg.shard_count = (uint32_t)o->shard_count;
    reg.num_shards = (uint32_t)o->num_shards;
    snprintf(reg.host, sizeof reg.host, "%s", s->host);
    reg.pid = (int32_t)getpid();
    snprintf(reg.tuning, sizeof reg.tuning, "%s", s->tuning);
    reg.param_count = s->param_count;
    reg.model_signature = s->signature;
    memcpy(reg.model_shapes, s->shapes, sizeof reg.model_shapes);
    reg.consistency = (uint32_t)o->consistency;
    reg.staleness = o->staleness;
    reg.ckpt_every_steps = o->ckpt_every_steps;
    reg.ckpt_every_ms = o->ckpt_every_ms;
    reg.ncheckpoints = (uint32_t)s->nresume;
    memcpy(reg.checkpoints, s->resume_steps, s->nresume * sizeof *s->resume_steps);
    if (fl_msg_register_alloc_shards(&reg, (uint32_t)o->shard_count) != FL_OK)
        return FL_ENOMEM;
    for (int k = 0; k < o->shard_count; k++)
        snprintf(reg.shard_eps[k], FL_ENDPOINT_MAX, "%s", fl_ps__shard_endpoint(s->shards[k]));
    int rc = fl_tp_member_join(s->member, &reg, welcome);
    free(reg.shard_eps);
    return rc;
}

/* Copies parameters [off, off + count) of the --init file (its tensors in file order, one flat
 * vector) into dst. */
static void init_range(const fl_st_file_t *f, uint64_t off, uint64_t count, float *dst)
{
    uint64_t pos = 0;
    for (size_t i = 0; i < fl_st_count(f) && count > 0; i++) {
        const fl_st_tensor_t *t = fl_st_at(f, i);
        uint64_t n = t->bytes / sizeof(float);
        if (off < pos + n) {
            uint64_t from = off - pos;
            uint64_t take = n - from < count ? n - from : count;
            memcpy(dst, (const float *)t->data + from, (size_t)take * sizeof(float));
            dst += take;
            off += take;
            count -= take;
        }
        pos += n;
    }
}

/* The shards' pushes are as large as the shards, and the bytes of a push still arriving count
 * towards the bound on bytes held for messages not yet complete (fl_ctx_held_max): the bound
 * must let every rank's push to every shard of this process be in flight at once, twice over,
 * or the job's own pushes would be cut. A push is at most 8 bytes an element (a sparse block's
 * index and value) and 64 KiB of headers. */
static void fit_held_max(fl_ps_server_t *s, const fl_msg_welcome_t *w)
{
    uint64_t push = 0;
    for (int k = 0; k < s->o.shard_count; k++)
        push += 8 * w->shards[s->o.shard_first + k].count + ((uint64_t)64 << 10);
    uint64_t need = 2 * (uint64_t)s->world * push;
    uint64_t bound = fl_ctx_held_max(s->ctx);
    if (bound == 0 || need <= bound || need > SIZE_MAX)
        return;
    fl_ctx_set_held_max(s->ctx, (size_t)need);
    FL_INFO(s->ctx,
            "the bound on bytes held for messages not yet complete is raised from %llu to %llu "
            "MiB: twice %d ranks' pushes to shards %d..%d",
            (unsigned long long)(bound >> 20), (unsigned long long)(need >> 20), s->world,
            s->o.shard_first, s->o.shard_first + s->o.shard_count - 1);
}

static int setup_shards(fl_ps_server_t *s, fl_msg_hdr_t *h)
{
    const fl_ps_server_opts_t *o = &s->o;
    fl_msg_welcome_t *w = &h->u.welcome;
    if (w->nshards != (uint32_t)o->num_shards)
        return fl_fail(FL_EPROTO,
                       "the coordinator's shard map has %u shards, this server "
                       "expects %d",
                       w->nshards, o->num_shards);
    if (w->consistency != (uint32_t)o->consistency || w->staleness != o->staleness)
        return fl_fail(FL_EPROTO,
                       "the coordinator runs consistency %s (staleness %u), this "
                       "server %s (staleness %u)",
                       fl_ps_consistency_name((fl_ps_consistency_t)w->consistency), w->staleness,
                       fl_ps_consistency_name(o->consistency), o->staleness);
    if (s->init != NULL && w->param_count != s->param_count)
        return fl_fail(FL_EINVAL, "the ranks' model has %" PRIu64 " parameters, --init %" PRIu64,
                       w->param_count, s->param_count);
    s->world = (int)w->npeers;
    s->peers = w->peers; /* kept: the shards name ranks by host */
    w->peers = NULL;
    w->npeers = 0;
    for (int k = 0; k < o->shard_count; k++) {
        uint32_t idx = (uint32_t)(o->shard_first + k);
        const fl_msg_shard_t *m = &w->shards[idx];
        if (m->index != idx || strcmp(m->endpoint, fl_ps__shard_endpoint(s->shards[k])) != 0)
            return fl_fail(FL_EPROTO,
                           "the coordinator's shard map gives shard %u to %s, not "
                           "to this server (%s)",
                           idx, m->endpoint, fl_ps__shard_endpoint(s->shards[k]));
        ps_shard_conf_t c;
        memset(&c, 0, sizeof c);
        c.num_shards = (uint32_t)o->num_shards;
        c.offset = m->offset;
        c.count = m->count;
        c.param_count = w->param_count;
        c.job_id = s->job_id;
        c.generation = h->generation;
        c.peers = s->peers;
        c.state.count = m->count;
        c.state.world = s->world;
        c.state.consistency = o->consistency;
        c.state.staleness = o->staleness;
        c.state.async_scale = o->async_scale;
        c.state.opt = o->opt;
        c.state.lr = o->lr;
        c.ckpt_dir = o->checkpoint_dir;
        c.keep = o->keep;
        c.max_wait_ms = o->max_wait_ms;
        int rc = fl_ps__shard_configure(s->shards[k], &c);
        if (rc != FL_OK)
            return rc;
        if (w->resume) {
            if ((rc = fl_ps__shard_resume(s->shards[k], w->resume_step)) != FL_OK)
                return rc;
        } else if (s->init != NULL) {
            float *buf = malloc(m->count > 0 ? (size_t)m->count * sizeof(float) : 1);
            if (buf == NULL)
                return fl_fail(FL_ENOMEM, "shard %u: out of memory", idx);
            init_range(s->init, m->offset, m->count, buf);
            rc = fl_ps__shard_init_params(s->shards[k], buf, 0);
            free(buf);
            if (rc != FL_OK)
                return rc;
        }
        FL_INFO(s->ctx, "shard %u: parameters %" PRIu64 "..%" PRIu64 " of %" PRIu64 " at %s (%s%s)",
                idx, m->offset, m->offset + m->count, w->param_count,
                fl_ps__shard_endpoint(s->shards[k]), fl_ps_consistency_name(o->consistency),
                w->resume         ? ", resumed"
                : s->init != NULL ? ", from --init"
                                  : "");
    }
    fl_st_close(&s->init);
    fit_held_max(s, w);
    return FL_OK;
}

static void stop_shards(fl_ps_server_t *s, bool checkpoint)
{
    for (int k = 0; k < s->o.shard_count; k++)
        fl_ps__shard_stop(s->shards[k], checkpoint && s->o.checkpoint_dir != NULL);
}

static void *server_main(void *arg)
{
    fl_ps_server_t *s = arg;
    fl_msg_hdr_t welcome;
    int rc = join(s, &welcome);
    if (rc != FL_OK) {
        fl_service_finish(&s->svc, rc, fl_last_error());
        return NULL;
    }
    fl_service_set_ready(&s->svc);
    rc = setup_shards(s, &welcome);
    fl_msg_hdr_deinit(&welcome);
    for (int k = 0; rc == FL_OK && k < s->o.shard_count; k++)
        rc = fl_ps__shard_start(s->shards[k]);
    if (rc == FL_OK)
        rc = fl_tp_member_start(s->member);
    if (rc != FL_OK) {
        char text[1024];
        snprintf(text, sizeof text, "%s", fl_last_error());
        FL_ERROR(s->ctx, "%s", text);
        stop_shards(s, false);
        /* Tell the coordinator why before leaving: its own error (a negative code), which a
         * restart would meet again, so the job fails rather than wait for one. */
        fl_tp_member_start(s->member);
        fl_tp_member_stop(s->member, rc < 0 ? rc : FL_EIO, text);
        fl_service_finish(&s->svc, rc, text);
        return NULL;
    }
    fl_tp_sock_t *socks[2] = {fl_tp_member_events(s->member), s->cmd_rx};
    int result = FL_OK;
    char text[1024] = "the job is over";
    for (;;) {
        bool ready[2] = {false, false};
        if (fl_tp_poll(socks, 2, 1000, ready) < 0) {
            usleep(10000);
            continue;
        }
        if (ready[1]) {
            result = FL_ECLOSED;
            snprintf(text, sizeof text, "parameter server stopped");
            break;
        }
        if (!ready[0])
            continue;
        fl_tp_msg_t ev;
        if (fl_tp_recv(socks[0], &ev, fl_deadline_in(0)) != FL_OK)
            continue;
        bool over = true;
        if (ev.hdr.type == FL_MSG_ERROR) {
            result = ev.hdr.u.error.code < 0 ? ev.hdr.u.error.code : FL_EPEER;
            snprintf(text, sizeof text, "%s", ev.hdr.u.error.text);
        } else if (ev.hdr.type == FL_MSG_SHUTDOWN && ev.hdr.u.shutdown.code == 0) {
            snprintf(text, sizeof text, "%s", ev.hdr.u.shutdown.text);
        } else if (ev.hdr.type == FL_MSG_SHUTDOWN) {
            result = FL_EPEER;
            snprintf(text, sizeof text, "%s", ev.hdr.u.shutdown.text);
        } else {
            over = false;
        }
        fl_tp_msg_close(&ev);
        if (over)
            break;
    }
    if (result != FL_OK && result != FL_ECLOSED) {
        FL_ERROR(s->ctx, "%s", text);
        for (int k = 0; k < s->o.shard_count; k++)
            fl_ps__shard_fail(s->shards[k], result, text);
    } else {
        FL_INFO(s->ctx, "%s", text);
    }
    stop_shards(s, true);
    fl_tp_member_stop(s->member, result == FL_OK ? 0 : 1, text);
    fl_service_finish(&s->svc, result, text);
    return NULL;
}

int fl_ps_server_start(fl_ps_server_t *s)
{
    return fl_service_start(&s->svc, server_main, s, "parameter server");
}

int fl_ps_server_wait(fl_ps_server_t *s, int timeout_ms)
{
    return fl_service_wait(&s->svc, timeout_ms, "still serving");
}

/* Wakes the server thread: its stop pipe, and a cancel while it is still in the rendezvous. */
static void wake(void *arg)
{
    fl_ps_server_t *s = arg;
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, FL_MSG_SENDER_SERVER);
    fl_tp_send(s->cmd_tx, NULL, &h, NULL, 0, fl_deadline_in(5000));
    if (fl_service_is_setting_up(&s->svc))
        fl_tp_member_cancel(s->member);
}

void fl_ps_server_stop(fl_ps_server_t *s)
{
    if (s != NULL)
        fl_service_stop(&s->svc, wake, s);
}

void fl_ps_server_get_stats(const fl_ps_server_t *s, fl_ps_server_stats_t *out)
{
    memset(out, 0, sizeof *out);
    for (int k = 0; k < s->o.shard_count; k++) {
        ps_shard_stats_t st;
        fl_ps__shard_get_stats(s->shards[k], &st);
        out->pushes += st.pushes;
        out->pulls += st.pulls;
        out->refused += st.refused;
        out->checkpoints += st.checkpoints;
        out->timeouts += st.timeouts;
        out->version = st.version > out->version ? st.version : out->version;
        out->step = k == 0 || st.step < out->step ? st.step : out->step;
    }
    out->auth_refused = fl_ctx_stat(s->ctx, FL_STAT_AUTH_REFUSED);
    out->conn_dropped = fl_ctx_stat(s->ctx, FL_STAT_CONN_DROPPED);
    out->bad_msgs =
        fl_ctx_stat(s->ctx, FL_STAT_BAD_HEADER) + fl_ctx_stat(s->ctx, FL_STAT_BAD_MAGIC) +
        fl_ctx_stat(s->ctx, FL_STAT_BAD_VERSION) + fl_ctx_stat(s->ctx, FL_STAT_BAD_JOB) +
        fl_ctx_stat(s->ctx, FL_STAT_BAD_FRAMES) + fl_ctx_stat(s->ctx, FL_STAT_OVERSIZED) +
        fl_ctx_stat(s->ctx, FL_STAT_UNEXPECTED);
}

static void ps_server_destroy(fl_ps_server_t **ps)
{
    if (ps == NULL || *ps == NULL)
        return;
    fl_ps_server_t *s = *ps;
    fl_ps_server_stop(s);
    for (int k = 0; s->shards != NULL && k < s->o.shard_count; k++)
        fl_ps__shard_destroy(&s->shards[k]);
    free(s->shards);
    fl_tp_member_destroy(&s->member);
    fl_tp_sock_destroy(&s->cmd_rx);
    fl_tp_sock_destroy(&s->cmd_tx);
    fl_st_close(&s->init);
    fl_ctx_destroy(&s->ctx);
    free(s->peers);
    fl_service_deinit(&s->svc);
    free(s);
    *ps = NULL;
}

void fl_ps_server_destroy(fl_ps_server_t **ps)
{
    fl_error_keep_begin();
    ps_server_destroy(ps);
    fl_error_keep_end();
}
