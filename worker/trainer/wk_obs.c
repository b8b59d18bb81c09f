/* What a worker shows of its training (--metrics-port, --timeline): the step's figures as
 * Prometheus series, and the tracks of the Chrome trace (devices, exchanges, the step). */
#include "train_int.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static int add(fl_wk_obs_t *m, const char *name, const char *help, fl_obs_kind_t kind)
{
    return fl_obs_add(m->obs, name, help, kind, m->labels);
}

void fl_wk_obs_init(fl_wk_obs_t *m, fl_obs_t *obs, int rank)
{
    memset(m, 0, sizeof *m);
    m->obs = obs;
    snprintf(m->labels, sizeof m->labels, "rank=\"%d\"", rank);
    if (obs == NULL)
        return;
    m->steps = add(m, "flodl_steps_total", "Optimizer steps (or averagings) done", FL_OBS_COUNTER);
    /* The job's figures come from rank 0 alone, unlabelled: every rank repeating them would
     * count the job once per rank in a sum. */
    m->samples = m->sps = -1;
    if (rank == 0) {
        m->samples =
            fl_obs_add(obs, "flodl_job_samples_total",
                       "Samples the whole job trained on (rank 0 says)", FL_OBS_COUNTER, NULL);
        m->sps = fl_obs_add(obs, "flodl_job_samples_per_second",
                            "Samples per second of the whole job, so far (rank 0 says)",
                            FL_OBS_GAUGE, NULL);
    }
    m->sent =
        add(m, "flodl_bytes_sent_total", "Gradient-exchange bytes this rank sent", FL_OBS_COUNTER);
    m->remote = add(m, "flodl_bytes_sent_remote_total",
                    "Of the bytes sent, those to ranks on other hosts", FL_OBS_COUNTER);
    m->recv = add(m, "flodl_bytes_received_total", "Bytes this rank received", FL_OBS_COUNTER);
    m->ratio =
        add(m, "flodl_compression_ratio", "Dense bytes over bytes sent, so far", FL_OBS_GAUGE);
    m->residual =
        add(m, "flodl_residual_norm", "L2 norm of the error-feedback residuals", FL_OBS_GAUGE);
    m->loss = add(m, "flodl_loss", "Training loss of the last step", FL_OBS_GAUGE);
    m->compute =
        add(m, "flodl_step_compute_seconds", "Compute time of the last step", FL_OBS_GAUGE);
    m->exposed = add(m, "flodl_step_exposed_comm_seconds", "Exchange time the last step waited for",
                     FL_OBS_GAUGE);
    /* Distributions over the run, not only the last value. */
    static const double bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                    0.1,    0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
    int nb = (int)(sizeof bounds / sizeof bounds[0]);
    m->step_h = fl_obs_add_histogram(obs, "flodl_step_seconds",
                                     "Step time: compute and the exchange it waited for", m->labels,
                                     bounds, nb);
    m->wait_h = fl_obs_add_histogram(obs, "flodl_exchange_wait_seconds",
                                     "Exchange time a step waited for (not hidden by compute)",
                                     m->labels, bounds, nb);
    m->last =
        add(m, "flodl_last_step_timestamp_seconds", "Unix time of the last step", FL_OBS_GAUGE);
    m->epoch = add(m, "flodl_epoch", "Epochs done", FL_OBS_GAUGE);
    m->divergence =
        add(m, "flodl_divergence", "Weight-space divergence of the last averaging", FL_OBS_GAUGE);
    for (int k = 0; k < FL_STAT_COUNT; k++) {
        m->bad[k] = -1;
        if (k < FL_STAT_BAD_HEADER || k == FL_STAT_ERRORS_SENT)
            continue; /* traffic counters, not refusals */
        char labels[96];
        snprintf(labels, sizeof labels, "%s,kind=\"%s\"", m->labels, fl_stat_name((fl_stat_t)k));
        m->bad[k] = fl_obs_add(m->obs, "flodl_bad_messages_total",
                               "Messages refused, by kind (malformed, foreign job, oversized, out "
                               "of place, unknown key)",
                               FL_OBS_COUNTER, labels);
    }
    m->errors = add(m, "flodl_errors_total", "Training steps that failed", FL_OBS_COUNTER);
}

void fl_wk_obs_step(fl_wk_obs_t *m, const fl_wk_obs_step_t *s)
{
    if (m->obs == NULL)
        return;
    fl_obs_inc(m->obs, m->steps, 1);
    fl_obs_set(m->obs, m->samples, s->samples);
    fl_obs_set(m->obs, m->sent, (double)s->sent);
    fl_obs_set(m->obs, m->remote, (double)s->remote);
    fl_obs_set(m->obs, m->recv, (double)s->recv);
    fl_obs_set(m->obs, m->ratio, s->sent ? (double)s->raw / (double)s->sent : 0.0);
    fl_obs_set(m->obs, m->residual, s->residual);
    fl_obs_set(m->obs, m->loss, s->loss);
    fl_obs_set(m->obs, m->sps, s->samples_per_s);
    fl_obs_set(m->obs, m->compute, s->compute_s);
    fl_obs_set(m->obs, m->exposed, s->exposed_s);
    fl_obs_observe(m->obs, m->step_h, s->compute_s + s->exposed_s);
    fl_obs_observe(m->obs, m->wait_h, s->exposed_s);
    fl_obs_set(m->obs, m->divergence, s->divergence);
    for (int k = 0; s->ctx != NULL && k < FL_STAT_COUNT; k++)
        if (m->bad[k] >= 0)
            fl_obs_set(m->obs, m->bad[k], (double)fl_ctx_stat(s->ctx, (fl_stat_t)k));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fl_obs_set(m->obs, m->last, (double)ts.tv_sec + ts.tv_nsec / 1e9);
}

void fl_wk_obs_epoch(fl_wk_obs_t *m, int epochs)
{
    fl_obs_set(m->obs, m->epoch, epochs);
}

void fl_wk_obs_error(fl_wk_obs_t *m)
{
    fl_obs_inc(m->obs, m->errors, 1);
}
