/* The training loop against the parameter server: the server holds the parameters and the
 * optimizer; every step the worker's devices compute the gradient of their batches on the
 * parameters pulled for that step, the worker pushes the mean (dense, or top-k with error
 * feedback) and pulls the next parameters in the same round trip. The step, and so the epoch
 * and batch, come from the server: after a restart of the parameter server (FL_ERESYNC) the
 * worker goes on from the step it resumed at. With several devices per host (and as many
 * shards) each device pushes and pulls its own shards over its own connections after the
 * reduce-scatter inside the host (ps_devices.c), unless --ps-clients host. Rank 0 evaluates on
 * the test split at the end of each epoch and saves the parameters with --save. */
#include "train_int.h"

#include <flodl/ps.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ps_trainer {
    const fl_wk_train_opts_t *o;
    const fl_mlp_shape_t *m;
    fl_ps_client_t *cl;
    int rank;
    int world;
    size_t np;
    float *params;
    float *grad;
    fl_wk_devices_t *dev;
    int parts; /* device clients (0: one client for the host) */
    fl_wk_psdev_t *pd;
    fl_cmp_ef_t *ef;
    fl_cmp_ws_t *ws;
    uint32_t *idx;
    float *val;
    FILE *metrics;
    /* the run: the schedule, the steps (the server's), this run's clock and sums, the epoch in
     * progress */
    fl_cmp_schedule_t dgc;
    size_t nb;      /* steps per epoch */
    uint64_t total; /* the job's steps */
    long global_batch;
    bool lead;      /* rank 0 prints */
    uint64_t start; /* the server's step when this run joined */
    uint64_t step;  /* the server's step now */
    long saved;     /* the step of this worker's last residual file */
    int64_t t_start, t_last;
    long cur_epoch;
    double compute_ms, comm_ms, ep_loss;
    size_t ep_correct, ep_steps;
    long steps; /* this run's */
} ps_trainer_t;

/* One step's figures. */
typedef struct ps_step {
    long ep;
    size_t bi;
    double loss;
    size_t correct;
    double density;
    int64_t t0, t1, t2;
} ps_step_t;

static int setup(ps_trainer_t *t, const fl_dataset_t *train)
{
    const fl_wk_train_opts_t *o = t->o;
    t->np = fl_mlp_nparams(t->m);
    t->params = malloc(t->np * sizeof(float));
    t->grad = calloc(t->np, sizeof(float));
    if (t->params == NULL || t->grad == NULL)
        return fl_fail(FL_ENOMEM, "out of memory for %zu parameters", t->np);
    int rc;
    if (o->init_path != NULL) {
        if ((rc = fl_mlp_load(t->m, t->params, o->init_path)) != FL_OK)
            return rc;
    } else {
        fl_mlp_init(t->m, t->params, o->seed);
    }
    /* A client per device needs a shard per device at least: with fewer shards than devices
     * some devices push nothing, so the parts are min(devices, shards). */
    int shards = fl_ps_client_num_shards(t->cl);
    int parts = o->replicas < shards ? o->replicas : shards;
    t->parts = o->replicas > 1 && !o->ps_host_client && parts > 1 ? parts : 0;
    if ((rc = fl_wk_devices_create(t->m, train, o, t->rank, t->world,
                                   t->parts > 0 ? FL_WK_LOCAL_SHARDS : FL_WK_LOCAL_MEAN, t->grad,
                                   &t->dev)) != FL_OK)
        return rc;
    if (o->topk > 0 && t->parts == 0) {
        fl_cmp_ef_opts_t eo;
        fl_cmp_ef_opts_init(&eo);
        eo.n = t->np;
        eo.name = "gradient";
        eo.max_norm = o->max_norm;
        eo.wire = o->topk_values;
        t->idx = malloc(t->np * sizeof *t->idx);
        t->val = malloc(t->np * sizeof *t->val);
        if (t->idx == NULL || t->val == NULL)
            return fl_fail(FL_ENOMEM, "out of memory for top-k pairs");
        if ((rc = fl_cmp_ef_create(&eo, &t->ef)) != FL_OK ||
            (rc = fl_cmp_ws_create(&t->ws)) != FL_OK)
            return rc;
    }
    return fl_wk_report_open(o, t->rank, t->world, &t->metrics);
}

static void teardown(ps_trainer_t *t)
{
    fl_wk_psdev_destroy(&t->pd);
    fl_wk_devices_destroy(&t->dev);
    fl_cmp_ef_destroy(&t->ef);
    fl_cmp_ws_destroy(&t->ws);
    free(t->idx);
    free(t->val);
    free(t->params);
    free(t->grad);
    if (t->metrics != NULL)
        fclose(t->metrics);
}

/* --resume (or a server that went back to a checkpoint): the top-k residual this worker saved
 * at `step` in dir; without one it goes on with what it has (zero at a start), saying so. */
static int own_residual(ps_trainer_t *t, const char *dir, uint64_t step, bool at_start)
{
    fl_cmp_ef_t *efs[FL_DEV_MAX_DEVICES];
    int nef = 0;
    if (t->ef != NULL)
        efs[nef++] = t->ef;
    for (int j = 0; t->pd != NULL && j < t->parts && fl_wk_psdev_ef(t->pd, j) != NULL; j++)
        efs[nef++] = fl_wk_psdev_ef(t->pd, j);
    if (nef == 0)
        return FL_OK;
    bool restored = false;
    int rc = fl_wk_ckpt_efs_load(dir, t->rank, (long)step, efs, nef, &restored);
    if (rc == FL_OK && !restored && !t->o->quiet)
        printf("rank %d: no top-k residual of step %llu in %s: it %s\n", t->rank,
               (unsigned long long)step, dir, at_start ? "starts at zero" : "goes on as it is");
    return rc;
}

/* The gradient this step pushes: the devices' mean, clipped; or its top-k with error
 * feedback at the epoch's density. */
static int make_grad(ps_trainer_t *t, double density, fl_ps_grad_t *g)
{
    const fl_wk_train_opts_t *o = t->o;
    memset(g, 0, sizeof *g);
    g->batch = (uint32_t)(o->batch * (size_t)o->replicas);
    if (t->ef == NULL) {
        /* Device clients: clipped here on the whole mean, their top-k after the split. */
        if (o->max_norm > 0.0) {
            double s = 0.0;
            for (size_t i = 0; i < t->np; i++)
                s += (double)t->grad[i] * t->grad[i];
            double f = fl_cmp_clip_factor(sqrt(s), o->max_norm);
            for (size_t i = 0; f != 1.0 && i < t->np; i++)
                t->grad[i] *= (float)f;
        }
        g->dense = t->grad;
        return FL_OK;
    }
    fl_cmp_topk_opts_t k;
    fl_cmp_topk_opts_init(&k);
    k.density = density;
    size_t got = 0;
    bool skipped = false;
    int rc = fl_cmp_ef_step(t->ef, t->ws, t->grad, &k, t->idx, t->val, &got, &skipped);
    if (rc != FL_OK)
        return rc;
    g->idx = t->idx;
    g->val = t->val;
    g->k = got;
    return FL_OK;
}

static int save(ps_trainer_t *t, uint64_t step, int epoch)
{
    char s[32], e[32];
    snprintf(s, sizeof s, "%llu", (unsigned long long)step);
    snprintf(e, sizeof e, "%d", epoch);
    fl_st_meta_t meta[3] = {{"flodl.step", s}, {"flodl.epoch", e}, {"flodl.model", "mlp"}};
    return fl_mlp_save(t->m, t->params, t->o->save_path, meta, 3);
}

/* The trainer against the server: its parts, the server's model checked against --layers,
 * the parameters initialised there (or pulled), the device clients split off. */
static int start(ps_trainer_t *t, const fl_dataset_t *train, const fl_dataset_t *test)
{
    int rc = fl_wk_check_model(t->m, train, test);
    if (rc == FL_OK)
        rc = setup(t, train);
    if (rc == FL_OK && fl_ps_client_param_count(t->cl) != t->np)
        rc = fl_fail(FL_EINVAL, "the parameter server holds %zu parameters, --layers %zu",
                     fl_ps_client_param_count(t->cl), t->np);
    if (rc == FL_OK)
        rc = fl_ps_client_init(t->cl, t->params);
    if (rc == FL_OK && t->parts > 0)
        rc = fl_wk_psdev_create(t->cl, t->parts, t->o, &t->pd);
    return rc;
}

/* The run's schedule and clock, the banner, and the residual of the step the server resumed
 * at, when this worker saved one. */
static int begin(ps_trainer_t *t, const fl_dataset_t *train)
{
    const fl_wk_train_opts_t *o = t->o;
    t->nb = fl_wk_devices_batches(t->dev);
    t->total = (uint64_t)o->epochs * t->nb;
    t->global_batch = (long)o->batch * o->replicas * t->world;
    fl_cmp_schedule_init(&t->dgc);
    t->dgc.density = o->topk;
    t->dgc.warmup_epochs = o->topk_warmup;
    t->lead = t->rank == 0 && !o->quiet;
    t->start = fl_ps_client_step(t->cl);
    if (t->lead)
        printf("training: %s, %d ranks x %d device(s), batch %zu per device (global %ld), %zu "
               "parameters, parameter server (%d shards, %s%s), %s pushes, %zu steps per "
               "epoch%s\n",
               train->source, t->world, o->replicas, o->batch, t->global_batch, t->np,
               fl_ps_client_num_shards(t->cl), t->parts > 0 ? "a client per device, " : "",
               fl_ps_consistency_name(fl_ps_client_consistency(t->cl)),
               o->topk > 0 ? "top-k" : "dense", t->nb, t->start > 0 ? " (resuming)" : "");
    t->saved = -1;
    t->t_start = fl_now_ns();
    t->t_last = t->t_start;
    t->cur_epoch = -1;
    t->step = t->start;
    return o->resume_dir != NULL ? own_residual(t, o->resume_dir, t->start, true) : FL_OK;
}

/* The push and pull of the step's gradient g. Device clients push and pull their keys in
 * parallel; after a restart of the server they rejoin through this client and split again.
 * FL_ERESYNC: the server went back to a checkpoint, and this worker with it (its step, and
 * its residual when saved there). */
static int push_pull(ps_trainer_t *t, fl_ps_grad_t *g, double density)
{
    const fl_wk_train_opts_t *o = t->o;
    int rc = t->pd != NULL ? fl_wk_psdev_push_pull(t->pd, t->grad, g->batch, density, t->params)
                           : fl_ps_client_push_pull(t->cl, g, t->params);
    if (rc == FL_ERESYNC && t->pd != NULL &&
        (rc = fl_wk_psdev_rejoin(t->pd, t->cl, t->params)) == FL_OK)
        rc = FL_ERESYNC; /* joined again as one client would have */
    if (rc != FL_ERESYNC)
        return rc;
    if (!o->quiet)
        printf("rank %d: the parameter server restarted: going on from step %llu\n", t->rank,
               (unsigned long long)fl_ps_client_step(t->cl));
    t->step = fl_ps_client_step(t->cl);
    t->cur_epoch = -1;
    rc = o->checkpoint_dir != NULL ? own_residual(t, o->checkpoint_dir, t->step, false) : FL_OK;
    return rc == FL_OK ? FL_ERESYNC : rc;
}

static void client_stats(const ps_trainer_t *t, fl_ps_client_stats_t *cs)
{
    if (t->pd != NULL)
        fl_wk_psdev_stats(t->pd, cs);
    else
        fl_ps_client_get_stats(t->cl, cs);
}

/* The step's metrics line and, when due, the progress line. */
static void report(ps_trainer_t *t, const ps_step_t *s)
{
    const fl_wk_train_opts_t *o = t->o;
    double per_step = (double)(o->batch * (size_t)o->replicas);
    fl_wk_report_t rp = {.loop = FL_WK_LOOP_PS,
                         .metrics = t->metrics,
                         .rank = t->rank,
                         .epoch = (int)s->ep,
                         .epochs = o->epochs,
                         .step = (long)t->step - 1,
                         .loss = s->loss,
                         .acc = (double)s->correct / per_step,
                         .density = s->density,
                         .compute_ms = (double)(s->t1 - s->t0) / 1e6,
                         .exchange_ms = (double)(s->t2 - s->t1) / 1e6};
    int64_t now = fl_now_ns();
    rp.progress = t->lead && (double)(now - t->t_last) / 1e9 >= o->progress_s;
    if (rp.progress) {
        fl_ps_client_stats_t cs;
        client_stats(t, &cs);
        rp.sent = cs.bytes_sent;
        rp.raw = cs.raw_bytes;
        fl_wk_progress_t *p = &rp.p;
        p->at = (long)s->bi + 1;
        p->of = (long)t->nb;
        p->done = (double)(t->step + 1) / (double)t->total;
        p->start = (double)t->start / (double)t->total;
        p->elapsed_s = (double)(now - t->t_start) / 1e9;
        p->loss = t->ep_loss / (double)t->ep_steps;
        p->acc = (double)t->ep_correct / ((double)t->ep_steps * per_step);
        p->samples_per_s = (double)t->steps * (double)t->global_batch / p->elapsed_s;
        p->compute_ms = t->compute_ms / (double)t->steps;
        p->exchange_ms = t->comm_ms / (double)t->steps;
        t->t_last = now;
    }
    fl_wk_report_step(&rp);
}

/* A new epoch starts its sums (and the devices' sampling) over. */
static void enter_epoch(ps_trainer_t *t, long ep)
{
    if (ep == t->cur_epoch)
        return;
    fl_wk_devices_set_epoch(t->dev, ep);
    t->cur_epoch = ep;
    t->ep_loss = 0.0;
    t->ep_correct = 0;
    t->ep_steps = 0;
}

/* One step: the devices' gradient of the server's step's batch on the parameters pulled for
 * it, pushed (dense or top-k) with the next parameters pulled in the same round trip. A
 * restarted server (FL_ERESYNC) is no failure: the worker goes on from its step. */
static int step(ps_trainer_t *t, ps_step_t *sp, bool *done)
{
    const fl_wk_train_opts_t *o = t->o;
    ps_step_t s = {.ep = (long)(t->step / t->nb), .bi = (size_t)(t->step % t->nb)};
    *done = false;
    enter_epoch(t, s.ep);
    s.t0 = fl_now_ns();
    int rc = fl_wk_devices_step(t->dev, t->params, s.bi, NULL, NULL, &s.loss, &s.correct);
    if (rc != FL_OK)
        return rc;
    fl_ps_grad_t g;
    s.density = o->topk > 0 ? fl_cmp_schedule_density(&t->dgc, (double)s.ep) : 0.0;
    if ((rc = make_grad(t, s.density, &g)) != FL_OK)
        return rc;
    s.t1 = fl_now_ns();
    rc = push_pull(t, &g, s.density);
    s.t2 = fl_now_ns();
    if (rc != FL_OK)
        return rc == FL_ERESYNC ? FL_OK : rc;
    t->step = t->pd != NULL ? fl_wk_psdev_step(t->pd) : fl_ps_client_step(t->cl);
    t->steps++;
    t->compute_ms += (double)(s.t1 - s.t0) / 1e6;
    t->comm_ms += (double)(s.t2 - s.t1) / 1e6;
    t->ep_loss += s.loss;
    t->ep_correct += s.correct;
    t->ep_steps++;
    *done = true;
    *sp = s;
    report(t, &s);
    if (o->save_path != NULL && o->save_every > 0 && t->step % (uint64_t)o->save_every == 0 &&
        t->rank == 0)
        return save(t, t->step, (int)s.ep);
    return FL_OK;
}

/* --checkpoint-dir: this worker's top-k residuals at the epoch's step (the server saves the
 * rest at its own). */
static int save_residuals(ps_trainer_t *t)
{
    const fl_wk_train_opts_t *o = t->o;
    if (o->checkpoint_dir == NULL || !(t->ef != NULL || (t->pd != NULL && o->topk > 0)))
        return FL_OK;
    const fl_cmp_ef_t *efs[FL_DEV_MAX_DEVICES];
    int nef = 0;
    if (t->ef != NULL)
        efs[nef++] = t->ef;
    for (int j = 0; t->pd != NULL && j < t->parts; j++)
        efs[nef++] = fl_wk_psdev_ef(t->pd, j);
    int rc = fl_wk_ckpt_efs_save(o->checkpoint_dir, t->rank, (long)t->step, t->saved, efs, nef);
    if (rc == FL_OK)
        t->saved = (long)t->step;
    return rc;
}

/* An epoch ended (these are the parameters after its last update): the residuals saved, and
 * rank 0 evaluates on the test split. */
static int end_epoch(ps_trainer_t *t, long ep, const fl_dataset_t *test, fl_wk_train_result_t *res)
{
    res->epochs = (int)(t->step / t->nb);
    int rc = save_residuals(t);
    if (rc != FL_OK)
        return rc;
    res->train_loss = t->ep_steps ? t->ep_loss / (double)t->ep_steps : 0.0;
    if (test == NULL || t->rank != 0)
        return FL_OK;
    size_t ok;
    if ((rc = fl_mlp_eval(t->m, fl_wk_devices_ws(t->dev), t->params, test->x, test->y, test->n,
                          &res->test_loss, &ok)) != FL_OK)
        return rc;
    res->test_acc = test->n ? (double)ok / (double)test->n : 0.0;
    if (t->lead)
        fl_wk_report_epoch((int)ep, t->o->epochs, res, (double)(fl_now_ns() - t->t_start) / 1e9);
    return FL_OK;
}

/* The run's figures; only rank 0 evaluated. */
static void results(const ps_trainer_t *t, const fl_dataset_t *test, fl_wk_train_result_t *res)
{
    if (t->rank != 0 || test == NULL) {
        res->test_acc = NAN;
        res->test_loss = NAN;
    }
    fl_ps_client_stats_t cs;
    client_stats(t, &cs);
    res->steps = t->steps;
    res->seconds = (double)(fl_now_ns() - t->t_start) / 1e9;
    res->samples_per_s =
        res->seconds > 0 ? (double)t->steps * (double)t->global_batch / res->seconds : 0.0;
    res->bytes_sent = cs.bytes_sent;
    res->raw_bytes = cs.raw_bytes;
    res->compute_ms = t->steps ? t->compute_ms / (double)t->steps : 0.0;
    res->comm_ms = t->steps ? t->comm_ms / (double)t->steps : 0.0;
    res->exposed_ms = res->comm_ms; /* the push and pull follow the backward pass */
}

int fl_wk_train_ps(fl_ps_client_t *cl, int rank, int world, const fl_dataset_t *train,
                   const fl_dataset_t *test, const fl_wk_train_opts_t *o, fl_wk_train_result_t *res)
{
    ps_trainer_t t;
    memset(&t, 0, sizeof t);
    memset(res, 0, sizeof *res);
    t.o = o;
    t.m = &o->shape;
    t.cl = cl;
    t.rank = rank;
    t.world = world;
    int rc = start(&t, train, test);
    if (rc == FL_OK)
        rc = begin(&t, train);
    if (rc != FL_OK) {
        teardown(&t);
        return rc;
    }
    while (rc == FL_OK && t.step < t.total) {
        ps_step_t s;
        bool done;
        rc = step(&t, &s, &done);
        /* The epoch's last step done (not a resync, which left step where the server is). */
        if (rc == FL_OK && done && (t.step % t.nb == 0 || t.step == t.total))
            rc = end_epoch(&t, s.ep, test, res);
    }
    if (rc == FL_OK && o->save_path != NULL && rank == 0)
        rc = save(&t, t.step, res->epochs);
    results(&t, test, res);
    teardown(&t);
    return rc;
}
