/* The parts of a step on the trainer's state: its exchanges begun, waited for and counted, its
 * compute, the update, the parameters gathered or made whole, the model saved, the ranks'
 * agreement on a failure, and the figures of memory and of the metrics registry. The loop
 * (train.c) calls them in order. */
#include "train_int.h"
#include "fl_coll.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void ready(int device, size_t from, void *ud)
{
    trainer_t *tr = ud;
    if (tr->nx > 0) /* none with --shard grad: the columns reduce-scatter after the step */
        fl_wk_xchg_ready_from(tr->xchg[tr->nx > 1 ? device : 0], from);
}

/* The step's exchanges: begin, wait (the first error), and their figures summed. */
void fl_wk_tr_xchg_begin(trainer_t *tr, double density)
{
    for (int j = 0; j < tr->nx; j++)
        fl_wk_xchg_begin(tr->xchg[j], density);
}

int fl_wk_tr_xchg_wait(trainer_t *tr)
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

void fl_wk_tr_xchg_stats(trainer_t *tr, fl_wk_xchg_stats_t *out)
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
int fl_wk_tr_piece_world(const trainer_t *tr)
{
    return tr->comm != NULL ? tr->world : 1;
}

/* The whole model into params: --shard full's gathered on every rank (a collective), or the
 * devices' resident copy. */
int fl_wk_tr_materialize(trainer_t *tr)
{
    if (tr->resident_ranges)
        return FL_OK; /* every update wrote its range back and the host gathered them */
    if (tr->resident)
        return fl_wk_devices_get_params(tr->dev, tr->params);
    return tr->full != NULL ? fl_wk_full_materialize(tr->full, tr->params) : FL_OK;
}

/* What the rank holds beyond the ranges (ckpt_rank.c). */
void fl_wk_tr_rank_state(trainer_t *tr, fl_wk_rank_state_t *s)
{
    fl_wk_rank_state_of(tr->o, tr->nx, tr->xchg, tr->dev, tr->async, s);
}

/* Device t's optimizer state into the host's, for a checkpoint. */
int fl_wk_tr_save_device_state(trainer_t *tr, fl_opt_t *const *opts)
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
int fl_wk_tr_gather_ranges(trainer_t *tr)
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
int fl_wk_tr_update(trainer_t *tr, double lr)
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

int fl_wk_tr_save(trainer_t *tr, long step, int epoch)
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
 * deadline. Every rank calls it at the same point. The allreduce carries the lowest failing
 * rank (as size - rank, under MAX), so the others name it; they stop with FL_EPEER, which
 * tells the coordinator that they are not the culprit (fl_comm_abort). */
int fl_wk_tr_agree(trainer_t *tr, int rc)
{
    if (tr->comm == NULL)
        return rc;
    char detail[1024] = "";
    if (rc != FL_OK)
        snprintf(detail, sizeof detail, "%s", fl_last_error());
    int size = fl_comm_size(tr->comm);
    double failed = rc != FL_OK ? (double)(size - tr->rank) : 0.0;
    int crc = fl_allreduce(tr->comm, &failed, &failed, 1, FL_FLOAT64, FL_MAX);
    if (rc != FL_OK)
        return fl_fail(rc, "%s", detail);
    if (crc != FL_OK)
        return crc;
    if (failed > 0)
        return fl_fail(FL_EPEER,
                       "rank %d: rank %d failed (its log says why); stopping with "
                       "it",
                       tr->rank, size - (int)failed);
    return FL_OK;
}

/* One step's compute: batch *bi of every device, or El Che's sync (the devices' planned
 * batches; the job's total agreed with one small allreduce). *t1: when the compute ended.
 * *more false: the epoch is over (nothing computed). */
int fl_wk_tr_compute(trainer_t *tr, size_t *bi, size_t nbatches, step_out_t *so, bool *more,
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
        rc = fl_wk_devices_cadence_step(tr->dev, tr->resident ? NULL : tr->params, counts, tr->next,
                                        batch_s, &so->loss, &so->correct);
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
void fl_wk_tr_memory(const trainer_t *tr, fl_wk_train_result_t *res)
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
void fl_wk_tr_observe_step(trainer_t *tr, const fl_wk_xchg_stats_t *xs, double loss, double c_ms,
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
