/* The training loop: each step every device (the process's CPU replicas, as threads) computes
 * the gradient of its batch and the exchange averages them over all devices of all ranks
 * (buckets leave while the backward pass goes on): in two levels (reduce-scatter inside the
 * host, device j's shard across hosts on its own sub-communicator, all-gather in shared memory)
 * or flat (every device a member of one exchange); then clipping and the optimizer update the
 * parameters, identically on every rank. Progress lines, one JSON line per step with
 * --metrics, an evaluation on the test split each epoch, checkpoints with --save. */
#include "train_int.h"
#include "fl_coll.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One synchronous step: its clock (start, compute done, exchange done), what it computed, its
 * learning rate and the time of --shard's legs after the exchange. */
typedef struct step {
    int64_t t0, t1, t2;
    step_out_t so;
    double lr;
    double legs_ms;
} step_t;

/* What the loop carries across steps and epochs: the schedules, this run's clock and counters
 * (a resumed run's averages start where it resumed), the optimizers and the rank's own state
 * for checkpoints, and the epoch in progress. */
typedef struct run {
    fl_lr_sched_t sched;
    fl_cmp_schedule_t dgc;
    size_t nbatches;
    long global_batch;
    bool lead; /* rank 0 prints */
    int64_t t_start, t_last;
    long step, first_step;
    int first_epoch;
    double first_samples;
    double compute_ms, exposed_ms;
    fl_opt_t *opts[FL_DEV_MAX_DEVICES];
    fl_wk_rank_state_t own; /* its objects live on */
    /* the epoch in progress */
    int ep;
    double density;
    double ep_loss;
    size_t ep_correct, ep_batches, bi;
} run_t;

void fl_wk_train_opts_init(fl_wk_train_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->mode = FL_WK_MODE_LOCAL;
    fl_mlp_parse("64,256,128,10", &o->shape);
    o->batch = 64;
    o->epochs = 10;
    o->shuffle = true;
    o->seed = 1;
    o->replicas = 1;
    o->device = FL_DEV_CPU;
    for (int j = 0; j < FL_DEV_MAX_DEVICES; j++)
        o->gpus[j] = j;
    fl_opt_opts_init(&o->opt);
    o->opt.momentum = 0.9;
    fl_lr_sched_init(&o->lr, 0.05);
    o->topk_values = FL_FLOAT32;
    o->bucket_bytes = (size_t)1 << 20;
    o->progress_s = 2.0;
    o->overhead_target = 0.1;
    o->replan_every = 4;
    o->run_ahead = 1;
    o->sim_fail_device = -1;
}

/* A label the model has no output for is the labels' fault as much as --layers': named with
 * the file the labels came from, its index and its value. */
static int check_labels(const fl_mlp_shape_t *m, const fl_dataset_t *d)
{
    int outputs = m->sizes[m->nlayers];
    for (size_t i = 0; i < d->n; i++)
        if (d->y[i] >= outputs)
            return fl_fail(FL_EINVAL,
                           "%s: label %d at index %zu is out of range 0..%d: the "
                           "model (--layers) has %d outputs, the data %d classes",
                           d->labels[0] ? d->labels : d->source, (int)d->y[i], i, outputs - 1,
                           outputs, d->classes);
    return FL_OK;
}

int fl_wk_check_model(const fl_mlp_shape_t *m, const fl_dataset_t *d, const fl_dataset_t *test)
{
    if ((size_t)m->sizes[0] != d->dim)
        return fl_fail(FL_EINVAL,
                       "--layers: the model takes %d inputs, the data (%s) has %zu "
                       "features",
                       m->sizes[0], d->source, d->dim);
    int rc = check_labels(m, d);
    if (rc != FL_OK)
        return rc;
    if (test != NULL && test->dim != d->dim)
        return fl_fail(FL_EINVAL, "the test data (%s) has %zu features, the training data %zu",
                       test->source, test->dim, d->dim);
    return test != NULL ? check_labels(m, test) : FL_OK;
}

/* The schedules of the run: the learning rate (scaled to the global batch with --scale-lr)
 * and top-k's density warm-up. */
static void plan(trainer_t *tr, run_t *r)
{
    const fl_wk_train_opts_t *o = tr->o;
    r->global_batch = (long)o->batch * o->replicas * tr->world;
    r->sched = o->lr;
    if (o->scale_lr)
        r->sched.lr = fl_lr_scaled(o->lr.lr, r->global_batch, (long)o->batch);
    fl_cmp_schedule_init(&r->dgc);
    r->dgc.density = o->topk;
    r->dgc.warmup_epochs = o->topk_warmup;
    r->nbatches = fl_wk_devices_batches(tr->dev);
    r->lead = tr->rank == 0 && !o->quiet;
    tr->sched = &r->sched;
}

static void banner(const trainer_t *tr, const run_t *r)
{
    const fl_wk_train_opts_t *o = tr->o;
    printf("training: %s, %d ranks x %d device(s) (%s%s), batch %zu per device (global "
           "%ld), %zu parameters, %s exchange%s, %zu steps per epoch\n",
           tr->train->source, tr->world, o->replicas,
           fl_dev_name(fl_wk_rdev_dev(fl_wk_devices_rdev(tr->dev, 0))),
           o->replicas > 1 ? ", ..." : "", o->batch, r->global_batch, tr->np,
           o->mode == FL_WK_MODE_LOCAL ? "no"
           : o->topk > 0               ? "top-k"
                                       : "dense",
           tr->nx <= 1                       ? ""
           : o->hierarchy == FL_WK_HIER_FLAT ? " (flat: every device a ring member)"
                                             : " (hybrid: device shards across hosts)",
           r->nbatches);
}

/* What killed writers left behind goes before this run writes or reads there; then --resume
 * loads the checkpoint into this layout. */
static int resume(trainer_t *tr, run_t *r)
{
    const fl_wk_train_opts_t *o = tr->o;
    if (o->checkpoint_dir != NULL)
        fl_wk_ckpt_clean(o->checkpoint_dir, tr->rank, o->quiet);
    if (o->resume_dir == NULL)
        return FL_OK;
    if (o->checkpoint_dir == NULL || strcmp(o->resume_dir, o->checkpoint_dir) != 0)
        fl_wk_ckpt_clean(o->resume_dir, tr->rank, o->quiet);
    int rc = fl_wk_ckpt_load(o->resume_dir, o, fl_wk_tr_piece_world(tr), tr->rank, tr->params,
                             r->opts, &r->step, &r->first_epoch, &tr->samples);
    if (rc == FL_OK && tr->full != NULL)
        fl_wk_full_scatter(tr->full, tr->params);
    return rc;
}

/* Before the first step: the banner, the checkpoint resumed, the parameters on the devices
 * and the rank's own state restored. */
static int start(trainer_t *tr, run_t *r, fl_wk_train_result_t *res)
{
    const fl_wk_train_opts_t *o = tr->o;
    plan(tr, r);
    if (r->lead)
        banner(tr, r);
    r->t_start = fl_now_ns();
    r->t_last = r->t_start;
    fl_wk_trainer_optimizers(tr, r->opts);
    int rc = resume(tr, r);
    if (rc != FL_OK)
        return rc;
    fl_wk_tr_rank_state(tr, &r->own);
    if ((rc = fl_wk_trainer_keep(tr, r->opts)) != FL_OK)
        return rc;
    if (o->resume_dir != NULL && (rc = fl_wk_ckpt_rank_resume(o, tr->rank, fl_wk_tr_piece_world(tr),
                                                              r->step, &r->own)) != FL_OK)
        return rc;
    if (r->lead && o->resume_dir != NULL)
        printf("resumed from %s: step %ld, %d epoch(s) done\n", o->resume_dir, r->step,
               r->first_epoch);
    res->epochs = r->first_epoch;
    r->first_step = r->step;
    r->first_samples = tr->samples;
    return FL_OK;
}

/* Clipping by the global norm happens here unless the exchange or the devices did it: El Che
 * clips per device, top-k's error feedback clips before compressing, and a gradient kept on
 * the device is clipped there. */
static bool clips_here(const trainer_t *tr)
{
    const fl_wk_train_opts_t *o = tr->o;
    return o->max_norm > 0.0 && o->max_anchor == 0 && !(o->topk > 0 && tr->comm != NULL) &&
           !tr->keep_grad;
}

/* After the exchange: --shard's reduce-scatter, clipping, the update (or local SGD's averaged
 * delta) and the gather, then El Che's exchange time; s->lr and s->legs_ms are set. */
static int apply(trainer_t *tr, const run_t *r, step_t *s, fl_wk_train_result_t *res)
{
    const fl_wk_train_opts_t *o = tr->o;
    int64_t t_rs = fl_now_ns();
    int rc = tr->full != NULL ? fl_wk_full_reduce(tr->full, tr->grad)
                              : fl_wk_shards_reduce(tr->shards, tr->grad);
    if (rc != FL_OK)
        return rc;
    s->legs_ms = (double)(fl_now_ns() - t_rs) / 1e6;
    if (clips_here(tr) &&
        (rc = tr->full != NULL ? fl_wk_full_clip(tr->full, o->max_norm)
                               : fl_wk_shards_clip(tr->shards, tr->grad, o->max_norm)) != FL_OK)
        return rc;
    double before = tr->samples - s->so.job_batches * (double)o->batch;
    s->lr = o->max_anchor > 0 ? fl_wk_cadence_lr(tr, &r->sched, before, s->so.job_batches)
                              : fl_lr_at(&r->sched, r->step);
    if (o->policy == FL_WK_POLICY_CADENCE) {
        /* The averaged delta of the round lands on the parameters. */
        for (size_t i = 0; i < tr->np; i++)
            tr->params[i] += tr->grad[i];
        res->divergence = fl_wk_devices_divergence(tr->dev, tr->params, tr->grad);
    } else if ((rc = fl_wk_tr_update(tr, s->lr)) != FL_OK) {
        return rc;
    }
    int64_t t_ag = fl_now_ns();
    /* --shard full: the next forward pass gathers each layer as it needs it. */
    if (tr->full == NULL && (rc = fl_wk_shards_gather(tr->shards, tr->params)) != FL_OK)
        return rc;
    /* Resident ranges: every device takes the gathered model (on cpu it is theirs),
     * all-gathered on the devices where the ranges are all this host's. */
    if (tr->resident_ranges && o->device != FL_DEV_CPU &&
        (rc = fl_wk_tr_gather_ranges(tr)) != FL_OK)
        return rc;
    s->legs_ms += (double)(fl_now_ns() - t_ag) / 1e6;
    /* El Che's exchange time: the buckets' wait and --shard grad's legs. */
    if (o->max_anchor > 0)
        return fl_wk_cadence_after(tr, (double)(s->t2 - s->t1) / 1e9 + s->legs_ms / 1e3);
    return FL_OK;
}

/* The progress line is due: rank 0, not quiet, its interval passed since the last one. */
static bool progress_due(run_t *r, int64_t now, double interval_s)
{
    if (!r->lead || (double)(now - r->t_last) / 1e9 < interval_s)
        return false;
    r->t_last = now;
    return true;
}

/* The step's lines: its metrics (the step's own figures) and the progress line (the epoch's so
 * far, and per step of this run). */
static void report(trainer_t *tr, run_t *r, const step_t *s, const fl_wk_xchg_stats_t *xs,
                   double c_ms, double x_ms, const fl_wk_train_result_t *res)
{
    const fl_wk_train_opts_t *o = tr->o;
    const step_out_t *so = &s->so;
    fl_wk_report_t rp = {.loop = FL_WK_LOOP_SYNC,
                         .metrics = tr->metrics,
                         .rank = tr->rank,
                         .epoch = r->ep,
                         .epochs = o->epochs,
                         .step = r->step,
                         .loss = so->loss,
                         .lr = s->lr,
                         .density = r->density,
                         .compute_ms = c_ms,
                         .exchange_ms = x_ms,
                         .divergence = res->divergence,
                         .sent = xs->bytes_sent,
                         .raw = xs->raw_bytes};
    rp.acc = so->host_batches ? (double)so->correct / (double)(o->batch * so->host_batches) : 0.0;
    int64_t now = fl_now_ns();
    rp.progress = progress_due(r, now, o->progress_s);
    fl_wk_progress_t *p = &rp.p;
    double steps = (double)(r->step + 1 - r->first_step);
    p->elapsed_s = (double)(now - r->t_start) / 1e9;
    /* How far: whole epochs and this one's batches; El Che's steps take several batches, so
     * only the batches give the total. */
    double in_ep = r->nbatches ? (double)r->bi / (double)r->nbatches : 0.0;
    p->done = (r->ep + (in_ep < 1.0 ? in_ep : 1.0)) / o->epochs;
    p->start = (double)r->first_epoch / o->epochs;
    p->at = r->step + 1;
    p->of = o->max_anchor == 0 ? (long)o->epochs * (long)r->nbatches : 0;
    p->loss = r->ep_loss / (double)r->ep_batches;
    p->acc = (double)r->ep_correct / (double)(r->ep_batches * o->batch);
    p->samples_per_s = (tr->samples - r->first_samples) / p->elapsed_s;
    p->compute_ms = r->compute_ms / steps;
    p->exchange_ms = xs->busy_ms / steps;
    p->exposed_ms = r->exposed_ms / steps;
    fl_wk_report_step(&rp);
}

/* The step's figures: the run's and the epoch's sums, the timeline, the metrics registry and
 * the lines. */
static void account(trainer_t *tr, run_t *r, const step_t *s, const fl_wk_train_result_t *res)
{
    const fl_wk_train_opts_t *o = tr->o;
    double c_ms = (double)(s->t1 - s->t0) / 1e6;
    double x_ms = (double)(s->t2 - s->t1) / 1e6 + s->legs_ms; /* --shard grad's legs too */
    r->compute_ms += c_ms;
    r->exposed_ms += x_ms;
    r->ep_loss += s->so.loss * (double)s->so.host_batches;
    r->ep_correct += s->so.correct;
    fl_wk_xchg_stats_t xs;
    fl_wk_tr_xchg_stats(tr, &xs);
    int64_t t_end = fl_now_ns();
    fl_obs_timeline_span(o->timeline, FL_WK_TRACK_STEP, "wait for the exchange", "step", s->t1,
                         s->t2);
    fl_obs_timeline_span(o->timeline, FL_WK_TRACK_STEP, "update", "step", s->t2, t_end);
    if (o->obs != NULL)
        fl_wk_tr_observe_step(tr, &xs, s->so.loss, c_ms, x_ms, res->divergence, r->t_start);
    report(tr, r, s, &xs, c_ms, x_ms, res);
}

/* --save-every: the model saved by rank 0 every so many steps (every rank learns whether it
 * was). */
static int save_every(trainer_t *tr, const run_t *r)
{
    const fl_wk_train_opts_t *o = tr->o;
    if (o->save_path == NULL || o->save_every <= 0 || (r->step + 1) % o->save_every != 0)
        return FL_OK;
    int rc = fl_wk_tr_materialize(tr);
    return rc == FL_OK
               ? fl_wk_tr_agree(tr, tr->rank == 0 ? fl_wk_tr_save(tr, r->step + 1, r->ep) : FL_OK)
               : rc;
}

/* One synchronous step: every device's batch (or El Che's sync) computed while the exchange
 * averages the buckets, then the update. *more false: the epoch had no batch left. */
static int sync_step(trainer_t *tr, run_t *r, fl_wk_train_result_t *res, bool *more)
{
    step_t s;
    memset(&s, 0, sizeof s);
    s.t0 = fl_now_ns();
    fl_wk_tr_xchg_begin(tr, r->density);
    s.t1 = s.t0;
    *more = true;
    int rc = fl_wk_tr_compute(tr, &r->bi, r->nbatches, &s.so, more, &s.t1);
    if (rc != FL_OK || !*more)
        return rc;
    rc = fl_wk_tr_xchg_wait(tr);
    s.t2 = fl_now_ns();
    if (rc != FL_OK)
        return rc;
    r->ep_batches += s.so.host_batches;
    tr->samples += s.so.job_batches * (double)tr->o->batch;
    if ((rc = apply(tr, r, &s, res)) != FL_OK)
        return rc;
    account(tr, r, &s, res);
    return save_every(tr, r);
}

/* --policy async: the epoch's averagings, each reported as it lands (train_policy.c). */
static int async_epoch(trainer_t *tr, run_t *r, fl_wk_train_result_t *res)
{
    async_ctx_t ac = {.tr = tr,
                      .ep = r->ep,
                      .step = &r->step,
                      .first_step = r->first_step,
                      .t_start = r->t_start,
                      .t_last = r->t_last,
                      .first_samples = r->first_samples};
    double mean = 0.0;
    int rc = fl_wk_async_epoch_run(tr, &ac, &mean, &r->ep_correct, &r->ep_batches);
    r->ep_loss = mean * (double)r->ep_batches;
    r->t_last = ac.t_last;
    res->divergence = ac.divergence;
    return rc;
}

/* The epoch's steps; a failure says where this host was (every host stops in the same step:
 * the exchange needs them all). */
static int steps(trainer_t *tr, run_t *r, fl_wk_train_result_t *res)
{
    int rc = FL_OK;
    if (tr->async != NULL) {
        rc = async_epoch(tr, r, res);
    } else {
        bool more = true;
        while ((rc = sync_step(tr, r, res, &more)) == FL_OK && more)
            r->step++;
    }
    if (rc == FL_OK)
        return FL_OK;
    const char *host = tr->comm != NULL ? fl_comm_peer_host(tr->comm, tr->rank) : NULL;
    return fl_fail_ctx(rc, "rank %d (host %s), epoch %d step %ld", tr->rank,
                       host != NULL ? host : "local", r->ep + 1, r->step + 1);
}

/* Rank 0 evaluates on the test split; every rank learns whether it could (it may fail alone,
 * and the others must not wait for it). */
static int evaluate(trainer_t *tr, const run_t *r, const fl_dataset_t *test,
                    fl_wk_train_result_t *res)
{
    int rc = fl_wk_tr_materialize(tr);
    if (rc != FL_OK)
        return rc;
    if (tr->rank == 0) {
        size_t ok = 0;
        rc = fl_mlp_eval(tr->m, fl_wk_devices_ws(tr->dev), tr->params, test->x, test->y, test->n,
                         &res->test_loss, &ok);
        res->test_acc = test->n ? (double)ok / (double)test->n : 0.0;
        if (r->lead)
            fl_wk_report_epoch(r->ep, tr->o->epochs, res, (double)(fl_now_ns() - r->t_start) / 1e9);
    }
    return fl_wk_tr_agree(tr, rc);
}

/* The end of an epoch: its figures, the devices' memory, the evaluation and the checkpoint. */
static int end_epoch(trainer_t *tr, run_t *r, const fl_dataset_t *test, fl_wk_train_result_t *res)
{
    const fl_wk_train_opts_t *o = tr->o;
    res->train_loss = r->ep_batches ? r->ep_loss / (double)r->ep_batches : 0.0;
    res->epochs = r->ep + 1;
    uint64_t used;
    uint64_t total;
    fl_wk_devices_mem_used(tr->dev, &used, &total);
    if (used > res->mem_device_used) {
        res->mem_device_used = used;
        res->mem_device_total = total;
    }
    int rc = test != NULL ? evaluate(tr, r, test, res) : FL_OK;
    if (rc != FL_OK)
        return rc;
    fl_wk_obs_epoch(&tr->obs, r->ep + 1);
    if (o->checkpoint_dir == NULL)
        return FL_OK;
    if ((rc = fl_wk_tr_materialize(tr)) != FL_OK ||
        (rc = fl_wk_tr_save_device_state(tr, r->opts)) != FL_OK)
        return rc;
    return fl_wk_ckpt_save(o->checkpoint_dir, tr->comm, tr->rank, fl_wk_tr_piece_world(tr), o,
                           tr->params, r->opts, &r->own, r->step, r->ep + 1, tr->samples);
}

static int epoch(trainer_t *tr, run_t *r, int ep, const fl_dataset_t *test,
                 fl_wk_train_result_t *res)
{
    const fl_wk_train_opts_t *o = tr->o;
    fl_wk_devices_set_epoch(tr->dev, ep);
    r->ep = ep;
    r->density = o->topk > 0 ? fl_cmp_schedule_density(&r->dgc, ep) : 0.0;
    r->ep_loss = 0.0;
    r->ep_correct = 0;
    r->ep_batches = 0;
    r->bi = 0;
    tr->next = 0;
    int rc = steps(tr, r, res);
    return rc == FL_OK ? end_epoch(tr, r, test, res) : rc;
}

/* After the last epoch: the model saved, and every rank reports rank 0's evaluation. */
static int finish(trainer_t *tr, const run_t *r, const fl_dataset_t *test,
                  fl_wk_train_result_t *res)
{
    int rc = FL_OK;
    if (tr->o->save_path != NULL && (rc = fl_wk_tr_materialize(tr)) == FL_OK)
        rc = fl_wk_tr_agree(tr, tr->rank == 0 ? fl_wk_tr_save(tr, r->step, res->epochs) : FL_OK);
    if (rc != FL_OK || tr->comm == NULL || test == NULL)
        return rc;
    double ev[2] = {res->test_loss, res->test_acc};
    if ((rc = fl_broadcast(tr->comm, ev, 2, FL_FLOAT64, 0)) == FL_OK) {
        res->test_loss = ev[0];
        res->test_acc = ev[1];
    }
    return rc;
}

/* The run's figures per step; --policy async counts its averagings' compute and its idle time
 * at the run-ahead bound (the averaging the compute did not hide), each per device. */
static void results(trainer_t *tr, const run_t *r, fl_wk_train_result_t *res)
{
    const fl_wk_train_opts_t *o = tr->o;
    fl_wk_xchg_stats_t xs;
    fl_wk_tr_xchg_stats(tr, &xs);
    res->steps = r->step;
    res->seconds = (double)(fl_now_ns() - r->t_start) / 1e9;
    res->samples_per_s = res->seconds > 0 ? (tr->samples - r->first_samples) / res->seconds : 0;
    res->bytes_sent = xs.bytes_sent;
    res->remote_bytes = xs.remote_bytes;
    res->raw_bytes = xs.raw_bytes;
    long run_steps = r->step - r->first_step;
    res->compute_ms = run_steps ? r->compute_ms / (double)run_steps : 0.0;
    double exposed_ms = r->exposed_ms;
    fl_wk_tr_memory(tr, res);
    if (tr->async != NULL) {
        fl_wk_async_stats_t as;
        fl_wk_async_stats(tr->async, &as);
        res->compute_ms = run_steps ? as.busy_s * 1e3 / o->replicas / (double)run_steps : 0.0;
        exposed_ms = as.throttled_s * 1e3 / o->replicas;
        res->run_ahead_max = as.max_lead;
        res->throttles = as.throttles;
        res->throttled_ms = as.throttled_s * 1e3;
    }
    res->comm_ms = run_steps ? xs.busy_ms / (double)run_steps : 0.0;
    res->exposed_ms = run_steps ? exposed_ms / (double)run_steps : 0.0;
    if (tr->dev != NULL) {
        res->first_leg = fl_wk_devices_first_leg(tr->dev, &res->first_leg_overlapped);
        res->params_gathered_on_devices = tr->gathered_on_devices;
        res->topk_on_devices = tr->nx > 0 && fl_wk_xchg_on_device_p(tr->xchg[0]);
    }
}

int fl_wk_train(fl_comm_t *comm, const fl_dataset_t *train, const fl_dataset_t *test,
                const fl_wk_train_opts_t *o, fl_wk_train_result_t *res)
{
    memset(res, 0, sizeof *res);
    if (o->mode == FL_WK_MODE_PS)
        return fl_fail(FL_EINVAL, "--mode ps trains with fl_wk_train_ps");
    trainer_t tr;
    run_t r;
    memset(&tr, 0, sizeof tr);
    memset(&r, 0, sizeof r);
    tr.o = o;
    tr.m = &o->shape;
    tr.train = train;
    tr.comm = o->mode == FL_WK_MODE_LOCAL ? NULL : comm;
    tr.rank = tr.comm ? fl_comm_rank(tr.comm) : 0;
    tr.world = tr.comm ? fl_comm_size(tr.comm) : 1;
    int rc = fl_wk_check_model(tr.m, train, test);
    if (rc == FL_OK)
        rc = fl_wk_trainer_setup(&tr);
    if (rc == FL_OK)
        rc = start(&tr, &r, res);
    if (rc != FL_OK) {
        fl_wk_trainer_teardown(&tr, FL_OK, NULL);
        return rc;
    }
    for (int ep = r.first_epoch; ep < o->epochs && rc == FL_OK; ep++)
        rc = epoch(&tr, &r, ep, test, res);
    if (rc == FL_OK)
        rc = finish(&tr, &r, test, res);
    if (rc != FL_OK)
        fl_wk_obs_error(&tr.obs);
    results(&tr, &r, res);
    fl_wk_trainer_teardown(&tr, rc, rc != FL_OK ? fl_last_error() : NULL);
    return rc;
}
