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


/* What one step computed. */
typedef struct step_out {
    double loss;
    size_t correct;
    size_t host_batches; /* this host's batches in the step */
    double job_batches;  /* the whole job's */
} step_out_t;


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

static void ready(int device, size_t from, void *ud)
{
    trainer_t *tr = ud;
    if (tr->nx > 0) /* none with --shard grad: the columns reduce-scatter after the step */
        fl_wk_xchg_ready_from(tr->xchg[tr->nx > 1 ? device : 0], from);
}

/* A label the model has no output for is the labels' fault as much as --layers': named with
 * the file the labels came from, its index and its value. */
static int check_labels(const fl_mlp_shape_t *m, const fl_dataset_t *d)
{
    int outputs = m->sizes[m->nlayers];
    for (size_t i = 0; i < d->n; i++)
        if (d->y[i] >= outputs)
            return fl_fail(FL_EINVAL, "%s: label %d at index %zu is out of range 0..%d: the "
                                      "model (--layers) has %d outputs, the data %d classes",
                           d->labels[0] ? d->labels : d->source, (int)d->y[i], i, outputs - 1,
                           outputs, d->classes);
    return FL_OK;
}

int fl_wk_check_model(const fl_mlp_shape_t *m, const fl_dataset_t *d,
                      const fl_dataset_t *test)
{
    if ((size_t)m->sizes[0] != d->dim)
        return fl_fail(FL_EINVAL, "--layers: the model takes %d inputs, the data (%s) has %zu "
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

/* The step's exchanges: begin, wait (the first error), and their figures summed. */
static void xchg_begin(trainer_t *tr, double density)
{
    for (int j = 0; j < tr->nx; j++)
        fl_wk_xchg_begin(tr->xchg[j], density);
}

static int xchg_wait(trainer_t *tr)
{
    int rc = FL_OK;
    char err[1024] = "";
    for (int j = 0; j < tr->nx; j++) {
        int r = fl_wk_xchg_wait(tr->xchg[j]);
        if (r != FL_OK && rc == FL_OK) {
            rc = r;
            snprintf(err, sizeof err, "%s", fl_last_error());
        }
    }
    if (rc != FL_OK)
        fl_fail(rc, "%s", err);
    return rc;
}

static void xchg_stats(trainer_t *tr, fl_wk_xchg_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (tr->shards != NULL) {
        uint64_t sent;
        uint64_t remote;
        fl_wk_shards_bytes(tr->shards, &sent, &remote);
        out->bytes_sent = sent;
        out->remote_bytes = remote;
        /* The dense ring would have sent as much: reduce-scatter plus all-gather. */
        out->raw_bytes = sent;
    }
    if (tr->full != NULL) {
        fl_wk_full_stats_t fs;
        fl_wk_full_stats(tr->full, &fs);
        out->bytes_sent = fs.sent;
        out->remote_bytes = fs.remote;
        out->raw_bytes = fs.sent;
    }
    if (tr->async != NULL) {
        fl_wk_async_stats_t as;
        fl_wk_async_stats(tr->async, &as);
        out->bytes_sent = as.sent;
        out->remote_bytes = as.remote;
        out->raw_bytes = as.sent;
        out->busy_ms = as.exchange_s * 1e3;
    }
    for (int j = 0; j < tr->nx; j++) {
        fl_wk_xchg_stats_t s;
        fl_wk_xchg_stats(tr->xchg[j], &s);
        out->bytes_sent += s.bytes_sent;
        out->remote_bytes += s.remote_bytes;
        out->raw_bytes += s.raw_bytes;
        /* The exchanges run side by side: the step waited for the longest. */
        out->busy_ms = s.busy_ms > out->busy_ms ? s.busy_ms : out->busy_ms;
    }
}

/* Hosts that exchange pieces (1 on one host): the layouts' world. */
static int piece_world(const trainer_t *tr)
{
    return tr->comm != NULL ? tr->world : 1;
}

/* The whole model into params: --shard full's gathered on every rank (a collective), or the
 * devices' resident copy. */
static int materialize(trainer_t *tr)
{
    if (tr->resident_ranges)
        return FL_OK; /* every update wrote its range back and the host gathered them */
    if (tr->resident)
        return fl_wk_devices_get_params(tr->dev, tr->params);
    return tr->full != NULL ? fl_wk_full_materialize(tr->full, tr->params) : FL_OK;
}

/* What the rank holds beyond the ranges (ckpt_rank.c). */
static void rank_state(trainer_t *tr, fl_wk_rank_state_t *s)
{
    fl_wk_rank_state_of(tr->o, tr->nx, tr->xchg, tr->dev, tr->async, s);
}

/* Device t's optimizer state into the host's, for a checkpoint. */
static int save_device_state(trainer_t *tr, fl_opt_t *const *opts)
{
    int n = tr->resident_ranges ? fl_wk_shards_count(tr->shards) : 1;
    int rc = FL_OK;
    for (int t = 0; tr->resident && rc == FL_OK && t < n; t++)
        rc = fl_wk_devices_opt_save(tr->dev, t, opts[t]);
    return rc;
}

/* After a sharded update on the devices: the whole model on every device. On the devices'
 * first leg it is all-gathered on the devices themselves: --shard hybrid's ranges (all this
 * host's) go from device to device; --shard grad's columns, gathered across hosts in host
 * memory, go into their own device each and from there to the others. Else every device takes
 * the host's gathered copy. */
static int gather_ranges(trainer_t *tr)
{
    if (!fl_wk_devices_can_gather(tr->dev))
        return fl_wk_devices_put_params(tr->dev, tr->params);
    size_t off[FL_DEV_MAX_DEVICES];
    size_t len[FL_DEV_MAX_DEVICES];
    int n = fl_wk_shards_count(tr->shards);
    for (int t = 0; t < n; t++)
        fl_wk_shards_column(tr->shards, t, &off[t], &len[t]);
    int rc = fl_wk_shards_across_hosts(tr->shards)
                 ? fl_wk_devices_put_columns(tr->dev, tr->params, off, len)
                 : FL_OK;
    if (rc != FL_OK)
        return rc;
    tr->gathered_on_devices = true;
    return fl_wk_devices_gather_ranges(tr->dev, off, len);
}

/* The update of the step: on the devices, or on the host's shards. */
static int update(trainer_t *tr, double lr)
{
    const fl_wk_train_opts_t *o = tr->o;
    if (!tr->resident)
        return tr->full != NULL ? fl_wk_full_step(tr->full, lr)
                                : fl_wk_shards_step(tr->shards, tr->params, tr->grad, lr);
    if (tr->keep_grad) /* checked and clipped on the device */
        return fl_wk_devices_update(tr->dev, NULL, o->max_norm, lr);
    int rc = fl_wk_shards_check(tr->shards, tr->grad);
    return rc == FL_OK ? fl_wk_devices_update(tr->dev, tr->grad, 0.0, lr) : rc;
}

static int save(trainer_t *tr, long step, int epoch)
{
    char s[32];
    char e[32];
    snprintf(s, sizeof s, "%ld", step);
    snprintf(e, sizeof e, "%d", epoch);
    fl_st_meta_t meta[3] = {{"flodl.step", s}, {"flodl.epoch", e}, {"flodl.model", "mlp"}};
    return fl_mlp_save(tr->m, tr->params, tr->o->save_path, meta, 3);
}

/* Every rank learns whether any rank failed (one small allreduce), so a failure one rank meets
 * alone (its disk, its evaluation) ends the others now, not at their next collective's
 * deadline. Every rank calls it at the same point. */
static int agree(trainer_t *tr, int rc)
{
    if (tr->comm == NULL)
        return rc;
    char detail[1024] = "";
    if (rc != FL_OK)
        snprintf(detail, sizeof detail, "%s", fl_last_error());
    double failed = rc != FL_OK;
    int crc = fl_allreduce(tr->comm, &failed, &failed, 1, FL_FLOAT64, FL_MAX);
    if (rc != FL_OK)
        return fl_fail(rc, "%s", detail);
    if (crc != FL_OK)
        return crc;
    if (failed > 0)
        return fl_fail(FL_EPEER, "rank %d: another rank failed (its log says why); stopping with "
                                 "it",
                       tr->rank);
    return FL_OK;
}

/* One step's compute: batch *bi of every device, or El Che's sync (the devices' planned
 * batches; the job's total agreed with one small allreduce). *t1: when the compute ended.
 * *more false: the epoch is over (nothing computed). */
static int compute(trainer_t *tr, size_t *bi, size_t nbatches, step_out_t *so, bool *more,
                   int64_t *t1)
{
    const fl_wk_train_opts_t *o = tr->o;
    memset(so, 0, sizeof *so);
    int rc;
    if (o->max_anchor == 0) {
        if (*bi >= nbatches) {
            *more = false;
            return FL_OK;
        }
        rc = fl_wk_devices_step(tr->dev, tr->resident ? NULL : tr->params, (*bi)++, ready, tr,
                                &so->loss, &so->correct);
        so->host_batches = (size_t)o->replicas;
        so->job_batches = (double)o->replicas * tr->world;
        *t1 = fl_now_ns();
        return rc;
    }
    int counts[FL_DEV_MAX_DEVICES];
    size_t left = fl_wk_devices_host_batches(tr->dev) - tr->next;
    size_t mine = fl_wk_fit_counts(tr->cad.counts, o->replicas, left, counts);
    double total = (double)mine;
    if (tr->comm != NULL &&
        (rc = fl_allreduce(tr->comm, &total, &total, 1, FL_FLOAT64, FL_SUM)) != FL_OK)
        return rc;
    if (total == 0) {
        *more = false;
        return FL_OK;
    }
    double batch_s[FL_DEV_MAX_DEVICES];
    if (o->policy == FL_WK_POLICY_CADENCE) {
        /* Local SGD: the schedule's step is the job's batches at the last averaging, in units
         * of a per-batch sync's, plus the device's batches since. */
        double per_sync = (double)o->replicas * tr->world * (double)o->batch;
        rc = fl_wk_devices_local_round(tr->dev, tr->params, counts, tr->next, tr->sched,
                                       tr->samples / per_sync, batch_s, &so->loss, &so->correct);
    } else {
        rc = fl_wk_devices_cadence_step(tr->dev, tr->resident ? NULL : tr->params, counts,
                                        tr->next, batch_s, &so->loss, &so->correct);
    }
    if (rc != FL_OK)
        return rc;
    tr->next += mine;
    fl_wk_cadence_observe(&tr->cad, batch_s);
    /* Every batch of the job weighs the same: the exchange averages over ranks. */
    fl_wk_devices_combine(tr->dev, (float)((double)tr->world / total), ready, tr);
    so->host_batches = mine;
    so->job_batches = total;
    *t1 = fl_now_ns();
    return FL_OK;
}

/* Memory per device as --shard and the exchange split it: parameters held for compute, the
 * gradient each device's backward pass fills, optimizer state, error-feedback residuals (one
 * per exchanged range, with top-k). */
static void memory(const trainer_t *tr, fl_wk_train_result_t *res)
{
    const fl_wk_train_opts_t *o = tr->o;
    res->mem_params = tr->np * sizeof(float);
    res->mem_grads = tr->np * sizeof(float);
    res->mem_opt_state = tr->shards != NULL ? fl_wk_shards_state_bytes(tr->shards) : 0;
    if (tr->full != NULL) {
        /* Its pieces and the layers gathered at most at once; the gradient each device's
         * backward pass fills is still whole. */
        size_t params;
        size_t state;
        fl_wk_full_memory(tr->full, &params, &state);
        res->mem_params = params;
        res->mem_opt_state = state;
        fl_wk_full_stats_t fs;
        fl_wk_full_stats(tr->full, &fs);
        res->gathers = fs.gets;
        res->gathers_ready = fs.ready;
        res->gather_wait_ms = res->steps > 0 ? fs.wait_s * 1e3 / (double)res->steps : 0.0;
    }
    size_t widest = tr->np;
    if (tr->nx > 1 && o->hierarchy == FL_WK_HIER_HYBRID)
        widest = fl_shard_count(tr->np, tr->nx, 0); /* shard 0 is the widest */
    res->mem_residual = o->topk > 0 && tr->nx > 0 ? widest * sizeof(float) : 0;
}

/* The step's figures into the metrics registry. */
static void observe_step(trainer_t *tr, const fl_wk_xchg_stats_t *xs, double loss, double c_ms,
                         double x_ms, double divergence, int64_t t_start)
{
    fl_wk_obs_step_t st;
    memset(&st, 0, sizeof st);
    st.samples = tr->samples;
    st.sent = xs->bytes_sent;
    st.remote = xs->remote_bytes;
    st.raw = xs->raw_bytes;
    double r2 = 0.0;
    for (int j = 0; j < tr->nx; j++) {
        double r = fl_wk_xchg_residual_norm(tr->xchg[j]);
        r2 += r * r;
    }
    st.residual = sqrt(r2);
    st.loss = loss;
    double secs = (double)(fl_now_ns() - t_start) / 1e9;
    st.samples_per_s = secs > 0 ? tr->samples / secs : 0.0;
    st.compute_s = c_ms / 1e3;
    st.exposed_s = x_ms / 1e3;
    st.divergence = divergence;
    if (tr->comm != NULL) {
        fl_comm_stats_t cs;
        fl_comm_get_stats(tr->comm, &cs);
        st.recv = cs.bytes_recv;
        st.ctx = fl_comm_ctx(tr->comm); /* the sub-communicators share its counters */
        for (int j = 0; j < tr->nsubs; j++) {
            fl_comm_get_stats(tr->subs[j], &cs);
            st.recv += cs.bytes_recv;
        }
    }
    fl_wk_obs_step(&tr->obs, &st);
}

int fl_wk_train(fl_comm_t *comm, const fl_dataset_t *train, const fl_dataset_t *test,
                const fl_wk_train_opts_t *o, fl_wk_train_result_t *res)
{
    trainer_t tr;
    memset(&tr, 0, sizeof tr);
    memset(res, 0, sizeof *res);
    tr.o = o;
    tr.m = &o->shape;
    tr.train = train;
    tr.comm = o->mode == FL_WK_MODE_LOCAL ? NULL : comm;
    tr.rank = tr.comm ? fl_comm_rank(tr.comm) : 0;
    tr.world = tr.comm ? fl_comm_size(tr.comm) : 1;
    if (o->mode == FL_WK_MODE_PS)
        return fl_fail(FL_EINVAL, "--mode ps trains with fl_wk_train_ps");
    int rc = fl_wk_check_model(tr.m, train, test);
    if (rc == FL_OK)
        rc = fl_wk_trainer_setup(&tr);
    if (rc != FL_OK) {
        fl_wk_trainer_teardown(&tr, FL_OK, NULL);
        return rc;
    }
    long global_batch = (long)o->batch * o->replicas * tr.world;
    double base_lr = o->scale_lr ? fl_lr_scaled(o->lr.lr, global_batch, (long)o->batch) : o->lr.lr;
    fl_lr_sched_t sched = o->lr;
    sched.lr = base_lr;
    fl_cmp_schedule_t dgc;
    fl_cmp_schedule_init(&dgc);
    dgc.density = o->topk;
    dgc.warmup_epochs = o->topk_warmup;
    size_t nbatches = fl_wk_devices_batches(tr.dev);
    bool lead = tr.rank == 0 && !o->quiet;
    if (lead)
        printf("training: %s, %d ranks x %d device(s) (%s%s), batch %zu per device (global "
               "%ld), %zu parameters, %s exchange%s, %zu steps per epoch\n",
               train->source, tr.world, o->replicas,
               fl_dev_name(fl_wk_rdev_dev(fl_wk_devices_rdev(tr.dev, 0))),
               o->replicas > 1 ? ", ..." : "", o->batch, global_batch, tr.np,
               o->mode == FL_WK_MODE_LOCAL ? "no" : o->topk > 0 ? "top-k" : "dense",
               tr.nx <= 1                            ? ""
               : o->hierarchy == FL_WK_HIER_FLAT ? " (flat: every device a ring member)"
                                                 : " (hybrid: device shards across hosts)",
               nbatches);

    int64_t t_start = fl_now_ns();
    int64_t t_last = t_start;
    long step = 0;
    int first_epoch = 0;
    fl_opt_t *opts[FL_DEV_MAX_DEVICES];
    fl_wk_trainer_optimizers(&tr, opts);
    /* What killed writers left behind goes before this run writes or reads there. */
    if (o->checkpoint_dir != NULL)
        fl_wk_ckpt_clean(o->checkpoint_dir, tr.rank, o->quiet);
    if (o->resume_dir != NULL &&
        (o->checkpoint_dir == NULL || strcmp(o->resume_dir, o->checkpoint_dir) != 0))
        fl_wk_ckpt_clean(o->resume_dir, tr.rank, o->quiet);
    if (o->resume_dir != NULL &&
        (rc = fl_wk_ckpt_load(o->resume_dir, o, piece_world(&tr), tr.rank, tr.params, opts,
                              &step, &first_epoch, &tr.samples)) != FL_OK) {
        fl_wk_trainer_teardown(&tr, FL_OK, NULL);
        return rc;
    }
    if (o->resume_dir != NULL && tr.full != NULL)
        fl_wk_full_scatter(tr.full, tr.params);
    fl_wk_rank_state_t own; /* the rank's own state for checkpoints (its objects live on) */
    rank_state(&tr, &own);
    if ((rc = fl_wk_trainer_keep(&tr, opts)) != FL_OK ||
        (o->resume_dir != NULL &&
         (rc = fl_wk_ckpt_rank_resume(o, tr.rank, piece_world(&tr), step, &own)) != FL_OK)) {
        fl_wk_trainer_teardown(&tr, FL_OK, NULL);
        return rc;
    }
    if (lead && o->resume_dir != NULL)
        printf("resumed from %s: step %ld, %d epoch(s) done\n", o->resume_dir, step,
               first_epoch);
    res->epochs = first_epoch;
    tr.sched = &sched;
    long first_step = step;           /* this run's averages count from here */
    double first_samples = tr.samples; /* and its samples/s */
    double compute_ms = 0.0;
    double exposed_ms = 0.0;
    for (int ep = first_epoch; ep < o->epochs && rc == FL_OK; ep++) {
        fl_wk_devices_set_epoch(tr.dev, ep);
        double density = o->topk > 0 ? fl_cmp_schedule_density(&dgc, ep) : 0.0;
        double ep_loss = 0.0;
        size_t ep_correct = 0;
        size_t ep_batches = 0;
        size_t bi = 0;
        tr.next = 0;
        if (tr.async != NULL) {
            async_ctx_t ac = {.tr = &tr, .ep = ep, .step = &step, .first_step = first_step,
                              .t_start = t_start, .t_last = t_last,
                              .first_samples = first_samples};
            double mean = 0.0;
            rc = fl_wk_async_epoch_run(&tr, &ac, &mean, &ep_correct, &ep_batches);
            ep_loss = mean * (double)ep_batches;
            t_last = ac.t_last;
            res->divergence = ac.divergence;
        }
        for (; rc == FL_OK && tr.async == NULL; step++) {
            int64_t t0 = fl_now_ns();
            xchg_begin(&tr, density);
            step_out_t so;
            bool more = true;
            int64_t t1 = t0;
            if ((rc = compute(&tr, &bi, nbatches, &so, &more, &t1)) != FL_OK || !more)
                break;
            if (rc == FL_OK)
                rc = xchg_wait(&tr);
            int64_t t2 = fl_now_ns();
            if (rc != FL_OK)
                break;
            double loss = so.loss;
            size_t correct = so.correct;
            ep_batches += so.host_batches;
            tr.samples += so.job_batches * (double)o->batch;
            int64_t t_rs = fl_now_ns();
            if ((rc = tr.full != NULL ? fl_wk_full_reduce(tr.full, tr.grad)
                                      : fl_wk_shards_reduce(tr.shards, tr.grad)) != FL_OK)
                break;
            double legs_ms = (double)(fl_now_ns() - t_rs) / 1e6;
            if (o->max_norm > 0.0 && o->max_anchor == 0 && !(o->topk > 0 && tr.comm != NULL) &&
                !tr.keep_grad &&
                (rc = tr.full != NULL ? fl_wk_full_clip(tr.full, o->max_norm)
                                      : fl_wk_shards_clip(tr.shards, tr.grad, o->max_norm)) !=
                    FL_OK)
                break;
            double lr = o->max_anchor > 0 ? fl_wk_cadence_lr(&tr, &sched, tr.samples - so.job_batches *
                                                                               (double)o->batch,
                                                       so.job_batches)
                                          : fl_lr_at(&sched, step);
            if (o->policy == FL_WK_POLICY_CADENCE) {
                /* The averaged delta of the round lands on the parameters. */
                for (size_t i = 0; i < tr.np; i++)
                    tr.params[i] += tr.grad[i];
                res->divergence = fl_wk_devices_divergence(tr.dev, tr.params, tr.grad);
            } else if ((rc = update(&tr, lr)) != FL_OK) {
                break;
            }
            int64_t t_ag = fl_now_ns();
            /* --shard full: the next forward pass gathers each layer as it needs it. */
            if (tr.full == NULL && (rc = fl_wk_shards_gather(tr.shards, tr.params)) != FL_OK)
                break;
            /* Resident ranges: every device takes the gathered model (on cpu it is theirs),
             * all-gathered on the devices where the ranges are all this host's. */
            if (tr.resident_ranges && o->device != FL_DEV_CPU &&
                (rc = gather_ranges(&tr)) != FL_OK)
                break;
            legs_ms += (double)(fl_now_ns() - t_ag) / 1e6;
            /* El Che's exchange time: the buckets' wait and --shard grad's legs. */
            if (o->max_anchor > 0 &&
                (rc = fl_wk_cadence_after(&tr, (double)(t2 - t1) / 1e9 + legs_ms / 1e3)) != FL_OK)
                break;
            double c_ms = (double)(t1 - t0) / 1e6;
            double x_ms = (double)(t2 - t1) / 1e6 + legs_ms; /* --shard grad's legs too */
            compute_ms += c_ms;
            exposed_ms += x_ms;
            ep_loss += loss * (double)so.host_batches;
            ep_correct += correct;
            fl_wk_xchg_stats_t xs;
            xchg_stats(&tr, &xs);
            int64_t t_end = fl_now_ns();
            fl_obs_timeline_span(o->timeline, FL_WK_TRACK_STEP, "wait for the exchange", "step",
                                 t1, t2);
            fl_obs_timeline_span(o->timeline, FL_WK_TRACK_STEP, "update", "step", t2, t_end);
            if (o->obs != NULL)
                observe_step(&tr, &xs, loss, c_ms, x_ms, res->divergence, t_start);
            if (tr.metrics != NULL)
                fprintf(tr.metrics,
                        "{\"rank\":%d,\"epoch\":%d,\"step\":%ld,\"loss\":%.6f,\"acc\":%.5f,"
                        "\"lr\":%.6g,\"density\":%.6g,\"compute_ms\":%.3f,\"exposed_comm_ms\":"
                        "%.3f,\"bytes_sent\":%llu,\"raw_bytes\":%llu,\"divergence\":%.6g}\n",
                        tr.rank, ep, step, loss,
                        so.host_batches ? (double)correct / (double)(o->batch * so.host_batches)
                                        : 0.0,
                        lr, density,
                        c_ms, x_ms, (unsigned long long)xs.bytes_sent,
                        (unsigned long long)xs.raw_bytes, res->divergence);
            int64_t now = fl_now_ns();
            if (lead && (double)(now - t_last) / 1e9 >= o->progress_s) {
                double secs = (double)(now - t_start) / 1e9;
                /* How far: whole epochs and this one's batches; El Che's steps take several
                 * batches, so only the batches give the total. */
                double in_ep = nbatches ? (double)bi / (double)nbatches : 0.0;
                char eta[64], sent[96], total[32] = "";
                fl_wk_progress_eta(eta, sizeof eta, (ep + (in_ep < 1.0 ? in_ep : 1.0)) / o->epochs,
                                   (double)first_epoch / o->epochs, secs);
                fl_wk_progress_sent(sent, sizeof sent, xs.bytes_sent, xs.raw_bytes);
                if (o->max_anchor == 0)
                    snprintf(total, sizeof total, "/%ld", (long)o->epochs * (long)nbatches);
                printf("epoch %d/%d step %ld%s (%s) loss %.4f acc %.1f%% %.0f samples/s compute "
                       "%.1f ms exchange %.1f ms (exposed %.1f ms) %s\n",
                       ep + 1, o->epochs, step + 1, total, eta, ep_loss / (double)ep_batches,
                       100.0 * (double)ep_correct / (double)(ep_batches * o->batch),
                       (tr.samples - first_samples) / secs,
                       compute_ms / (double)(step + 1 - first_step),
                       xs.busy_ms / (double)(step + 1 - first_step),
                       exposed_ms / (double)(step + 1 - first_step), sent);
                fflush(stdout);
                t_last = now;
            }
            if (o->save_path != NULL && o->save_every > 0 && (step + 1) % o->save_every == 0 &&
                ((rc = materialize(&tr)) != FL_OK ||
                 (rc = agree(&tr, tr.rank == 0 ? save(&tr, step + 1, ep) : FL_OK)) != FL_OK))
                break;
        }
        if (rc != FL_OK) {
            /* Every host stops in the same step (the exchange needs them all): say which, and
             * where this one was. */
            const char *host = tr.comm != NULL ? fl_comm_peer_host(tr.comm, tr.rank) : NULL;
            fl_fail_ctx(rc, "rank %d (host %s), epoch %d step %ld", tr.rank,
                        host != NULL ? host : "local", ep + 1, step + 1);
            break;
        }
        res->train_loss = ep_batches ? ep_loss / (double)ep_batches : 0.0;
        res->epochs = ep + 1;
        uint64_t used;
        uint64_t total;
        fl_wk_devices_mem_used(tr.dev, &used, &total);
        if (used > res->mem_device_used) {
            res->mem_device_used = used;
            res->mem_device_total = total;
        }
        if (test != NULL && (rc = materialize(&tr)) != FL_OK)
            break;
        if (test != NULL && tr.rank == 0) {
            size_t ok = 0;
            rc = fl_mlp_eval(tr.m, fl_wk_devices_ws(tr.dev), tr.params, test->x, test->y,
                                test->n, &res->test_loss, &ok);
            res->test_acc = test->n ? (double)ok / (double)test->n : 0.0;
            if (lead) {
                printf("epoch %d/%d done: train loss %.4f, test loss %.4f, test accuracy %.2f%% "
                       "(%.1f s)\n",
                       ep + 1, o->epochs, res->train_loss, res->test_loss, 100.0 * res->test_acc,
                       (double)(fl_now_ns() - t_start) / 1e9);
                fflush(stdout);
            }
        }
        /* Rank 0's evaluation may fail alone: the others must not wait for it. */
        if (test != NULL && (rc = agree(&tr, rc)) != FL_OK)
            break;
        fl_wk_obs_epoch(&tr.obs, ep + 1);
        if (rc == FL_OK && o->checkpoint_dir != NULL && (rc = materialize(&tr)) == FL_OK &&
            (rc = save_device_state(&tr, opts)) == FL_OK)
            rc = fl_wk_ckpt_save(o->checkpoint_dir, tr.comm, tr.rank, piece_world(&tr), o,
                                 tr.params, opts, &own, step, ep + 1, tr.samples);
    }
    if (rc == FL_OK && o->save_path != NULL && (rc = materialize(&tr)) == FL_OK)
        rc = agree(&tr, tr.rank == 0 ? save(&tr, step, res->epochs) : FL_OK);
    if (rc == FL_OK && tr.comm != NULL && test != NULL) {
        /* Rank 0 evaluated; every rank reports its figures. */
        double ev[2] = {res->test_loss, res->test_acc};
        if ((rc = fl_broadcast(tr.comm, ev, 2, FL_FLOAT64, 0)) == FL_OK) {
            res->test_loss = ev[0];
            res->test_acc = ev[1];
        }
    }
    if (rc != FL_OK)
        fl_wk_obs_error(&tr.obs);
    fl_wk_xchg_stats_t xs;
    xchg_stats(&tr, &xs);
    res->steps = step;
    res->seconds = (double)(fl_now_ns() - t_start) / 1e9;
    res->samples_per_s = res->seconds > 0 ? (tr.samples - first_samples) / res->seconds : 0;
    res->bytes_sent = xs.bytes_sent;
    res->remote_bytes = xs.remote_bytes;
    res->raw_bytes = xs.raw_bytes;
    long run_steps = step - first_step;
    res->compute_ms = run_steps ? compute_ms / (double)run_steps : 0.0;
    memory(&tr, res);
    if (tr.async != NULL) {
        /* Per averaging: the devices' compute, and their idle time at the run-ahead bound (the
         * averaging the compute did not hide), each per device. */
        fl_wk_async_stats_t as;
        fl_wk_async_stats(tr.async, &as);
        res->compute_ms = run_steps ? as.busy_s * 1e3 / o->replicas / (double)run_steps : 0.0;
        exposed_ms = as.throttled_s * 1e3 / o->replicas;
        res->run_ahead_max = as.max_lead;
        res->throttles = as.throttles;
        res->throttled_ms = as.throttled_s * 1e3;
    }
    res->comm_ms = run_steps ? xs.busy_ms / (double)run_steps : 0.0;
    res->exposed_ms = run_steps ? exposed_ms / (double)run_steps : 0.0;
    if (tr.dev != NULL) {
        res->first_leg = fl_wk_devices_first_leg(tr.dev, &res->first_leg_overlapped);
        res->params_gathered_on_devices = tr.gathered_on_devices;
        res->topk_on_devices = tr.nx > 0 && fl_wk_xchg_on_device_p(tr.xchg[0]);
    }
    /* Closing a failed device reports its error again: the step's text is the one to keep. */
    char why[2048] = "";
    if (rc != FL_OK)
        snprintf(why, sizeof why, "%s", fl_last_error());
    fl_wk_trainer_teardown(&tr, rc, why);
    return rc != FL_OK ? fl_fail(rc, "%s", why) : FL_OK;
}
