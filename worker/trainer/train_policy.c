/* The local-SGD policies' side of the training loop (train.c): El Che's learning rate and its
 * re-planning after a sync (--max-anchor), and --policy async's epochs with what each averaging
 * reports (metrics, progress). The loop itself and the sync policy's step stay in train.c. */
#include "train_int.h"
#include "fl_coll.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* El Che's learning rate: the schedule follows the job's batches in units of a per-batch
 * sync's (world x devices), and a sync of r times more batches steps sqrt(r) times further (the
 * square-root scaling rule, for every optimizer: linear scaling diverged on large anchors). */
double fl_wk_cadence_lr(const trainer_t *tr, const fl_lr_sched_t *sched, double samples_before,
                        double job_batches)
{
    const fl_wk_train_opts_t *o = tr->o;
    double per_sync = (double)o->replicas * tr->world;
    long step = (long)(samples_before / ((double)o->batch * per_sync));
    double r = job_batches / per_sync;
    double f = sqrt(r);
    return fl_lr_at(sched, step) * f;
}

/* El Che after a sync: the exchange time folded in, and every few syncs a new plan from the
 * job's slowest device and longest exchange (the same on every rank). */
int fl_wk_cadence_after(trainer_t *tr, double exchange_s)
{
    tr->exch_ema_s = tr->syncs == 0 ? exchange_s : 0.7 * tr->exch_ema_s + 0.3 * exchange_s;
    if (++tr->syncs, tr->o->replan_every <= 0 || tr->syncs % tr->o->replan_every != 0)
        return FL_OK;
    double v[2] = {fl_wk_cadence_slowest(&tr->cad), tr->exch_ema_s};
    int rc;
    if (tr->comm != NULL && (rc = fl_allreduce(tr->comm, v, v, 2, FL_FLOAT64, FL_MAX)) != FL_OK)
        return rc;
    fl_wk_cadence_plan(&tr->cad, v[0], v[1]);
    return FL_OK;
}

static void on_average(const fl_wk_async_avg_t *av, void *ud)
{
    async_ctx_t *c = ud;
    trainer_t *tr = c->tr;
    const fl_wk_train_opts_t *o = tr->o;
    long step = (*c->step)++;
    c->divergence = av->divergence;
    c->comm_ms += av->exchange_s * 1e3;
    double acc =
        av->host_batches > 0 ? (double)av->correct / (av->host_batches * (double)o->batch) : 0.0;
    int64_t now = fl_now_ns();
    double secs = (double)(now - c->t_start) / 1e9;
    double sps = secs > 0 ? (tr->samples - c->first_samples) / secs : 0.0;
    if (o->obs != NULL) {
        fl_wk_obs_step_t st;
        memset(&st, 0, sizeof st);
        st.samples = tr->samples;
        st.loss = av->loss;
        st.samples_per_s = sps;
        st.exposed_s = av->exchange_s;
        st.divergence = av->divergence;
        st.ctx = tr->comm != NULL ? fl_comm_ctx(tr->comm) : NULL;
        fl_wk_obs_step(&tr->obs, &st);
    }
    fl_wk_report_t rp = {.loop = FL_WK_LOOP_ASYNC,
                         .metrics = tr->metrics,
                         .rank = tr->rank,
                         .epoch = c->ep,
                         .epochs = o->epochs,
                         .step = step,
                         .loss = av->loss,
                         .acc = acc,
                         .job_batches = av->job_batches,
                         .exchange_ms = av->exchange_s * 1e3,
                         .wait_ms = av->wait_s * 1e3,
                         .divergence = av->divergence};
    rp.progress = tr->rank == 0 && !o->quiet && (double)(now - c->t_last) / 1e9 >= o->progress_s;
    rp.p.at = step + 1;
    rp.p.samples_per_s = sps;
    rp.p.exchange_ms = c->comm_ms / (double)(step + 1 - c->first_step);
    fl_wk_report_step(&rp);
    if (rp.progress)
        c->t_last = now;
}

/* --policy async: one epoch (El Che re-plans inside it, as the averagings go). */
int fl_wk_async_epoch_run(trainer_t *tr, async_ctx_t *c, double *loss, size_t *correct,
                          size_t *batches)
{
    int rc = fl_wk_async_epoch(tr->async, tr->params, tr->sched, &tr->samples, on_average, c);
    if (rc == FL_OK)
        fl_wk_async_epoch_figures(tr->async, loss, correct, batches);
    return rc;
}
