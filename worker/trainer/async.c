/* --policy async: local SGD whose devices and hosts do not wait for each averaging. Each device
 * trains its own copy (its own optimizer) in rounds of El Che's counts on the host's sequence of
 * batches, and hands in its round's delta; the training thread averages round k across hosts
 * (one allreduce of the host's count-weighted deltas and batch count) as soon as every device
 * of the host handed in round k, while the devices go on with the next rounds. A device may be
 * at most `bound` rounds ahead of the last completed averaging (--run-ahead): at a round's start
 * it waits until averaging r - bound is done; the allreduce needs every host, so a fast host is
 * held by the slowest one the same way. When averaging k completes, each device replaces its
 * own delta of round k by the average: p += D_k - delta_k, so it keeps the progress of the rounds
 * it did since, on top of the new global parameters. With bound 0 this is --policy cadence. The
 * learning rate follows the job's batches at the last averaging the device applied plus its own
 * batches since. Each averaging reports the weight-space divergence of the device that strayed
 * most. El Che re-plans the counts every few averagings, from each round's timings; a new plan
 * holds from the first round no device can have started yet (bound + 1 after the averaging).
 * A failure on one host travels in the averaging itself (a flag summed with the deltas), so
 * every host stops at the same averaging with the reason. */
#include "train_int.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SLOTS 17 /* run-ahead bound 16 at most */
#define WAIT_S 600

typedef struct dev {
    struct fl_wk_async *a;
    int j;
    float *p;     /* its parameters */
    float *start; /* at its round's start */
    float *grad;
    float *delta[MAX_SLOTS]; /* its delta of round r in slot r % slots */
    double rloss[MAX_SLOTS]; /* and that round's loss sum, correct predictions, seconds */
    size_t rcorrect[MAX_SLOTS];
    double rbusy[MAX_SLOTS];
    fl_opt_t *opt;
    int applied; /* averagings folded into p */
    double loss; /* this epoch: sum over its batches */
    size_t correct;
    size_t batches;
    double busy_s;
} device_t;

struct fl_wk_async {
    fl_wk_devices_t *d;
    const fl_wk_train_opts_t *o;
    fl_comm_t *comm; /* NULL: one host */
    int L;
    int W;
    size_t np;
    int bound;
    int slots;
    device_t dev[FL_DEV_MAX_DEVICES];
    float *sum;    /* the host's count-weighted deltas, its batch count, a failure flag (np + 2) */
    float *params; /* the job's parameters (the caller's), during an epoch */
    double rloss;  /* the round's loss sum and correct predictions on this host */
    size_t rcorrect;
    float *avg[MAX_SLOTS];        /* D_k in slot k % slots */
    double samples_at[MAX_SLOTS]; /* the job's samples after averaging k */
    int rank;
    fl_wk_cadence_t *cad; /* El Che's plan, re-planned by the training thread */
    double exch_ema_s;
    long averaged; /* averagings since creation (the re-plan period counts them) */
    /* the epoch in progress */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int cap;      /* rounds the arrays hold */
    int rounds;   /* the host's rounds planned so far this epoch */
    size_t left;  /* the host's batches not in a planned round */
    size_t *base; /* round r's first batch of the host's sequence */
    int *cnt;     /* round r's count of device j: cnt[r * L + j] */
    int *handed;  /* devices that handed in round r */
    int done;     /* averagings completed */
    int rc;
    char err[1024];
    const fl_lr_sched_t *sched;
    double samples0;       /* the job's samples at the epoch's start */
    double *samples;       /* the caller's: the job's samples so far */
    fl_wk_async_fn on_avg; /* told of each averaging (may be NULL) */
    void *ud;
    fl_fanout_t *fan; /* the devices' threads, during an epoch */
    fl_wk_async_stats_t st;
};

int fl_wk_async_create(fl_wk_devices_t *d, const fl_wk_train_opts_t *o, fl_comm_t *comm, size_t np,
                       fl_wk_cadence_t *cad, fl_wk_async_t **out)
{
    *out = NULL;
    if (o->run_ahead < 0 || o->run_ahead > MAX_SLOTS - 1)
        return fl_fail(FL_EINVAL, "--run-ahead %d is outside 0..%d", o->run_ahead, MAX_SLOTS - 1);
    fl_wk_async_t *a = calloc(1, sizeof *a);
    if (a == NULL)
        return fl_fail(FL_ENOMEM, "--policy async: out of memory");
    a->d = d;
    a->o = o;
    a->comm = comm;
    a->L = o->replicas;
    a->W = comm != NULL ? fl_comm_size(comm) : 1;
    a->rank = comm != NULL ? fl_comm_rank(comm) : 0;
    a->cad = cad;
    a->np = np;
    a->bound = o->run_ahead;
    a->slots = a->bound + 1;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    bool ok = (a->sum = malloc((np + 2) * sizeof(float))) != NULL;
    for (int s = 0; s < a->slots && ok; s++)
        ok = (a->avg[s] = malloc(np * sizeof(float))) != NULL;
    int rc = ok ? FL_OK : fl_fail(FL_ENOMEM, "--policy async: out of memory");
    for (int j = 0; j < a->L && rc == FL_OK; j++) {
        device_t *v = &a->dev[j];
        v->a = a;
        v->j = j;
        ok = (v->p = malloc(np * sizeof(float))) != NULL &&
             (v->start = malloc(np * sizeof(float))) != NULL &&
             (v->grad = malloc(np * sizeof(float))) != NULL;
        for (int s = 0; s < a->slots && ok; s++)
            ok = (v->delta[s] = malloc(np * sizeof(float))) != NULL;
        rc = ok ? fl_opt_create(&o->opt, np, &v->opt)
                : fl_fail(FL_ENOMEM, "--policy async: out of memory for device %d", j);
    }
    if (rc != FL_OK) {
        fl_wk_async_destroy(&a);
        return rc;
    }
    *out = a;
    return FL_OK;
}

static void wk_async_destroy(fl_wk_async_t **pa)
{
    if (pa == NULL || *pa == NULL)
        return;
    fl_wk_async_t *a = *pa;
    for (int j = 0; j < a->L; j++) {
        device_t *v = &a->dev[j];
        free(v->p);
        free(v->start);
        free(v->grad);
        for (int s = 0; s < a->slots; s++)
            free(v->delta[s]);
        fl_opt_destroy(&v->opt);
    }
    for (int s = 0; s < a->slots; s++)
        free(a->avg[s]);
    free(a->sum);
    free(a->base);
    free(a->cnt);
    free(a->handed);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
    *pa = NULL;
}

void fl_wk_async_destroy(fl_wk_async_t **pa)
{
    fl_error_keep_begin();
    wk_async_destroy(pa);
    fl_error_keep_end();
}

static struct timespec deadline(void)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += WAIT_S;
    return dl;
}

/* Called locked. */
static void set_error(fl_wk_async_t *a, int rc, const char *what)
{
    if (a->rc == FL_OK) {
        a->rc = rc;
        snprintf(a->err, sizeof a->err, "%s", what);
    }
    pthread_cond_broadcast(&a->cv);
}

/* Plans the host's next round from the plan's counts (the last one cut to what is left).
 * Called before the devices start or, later, locked. */
static void plan_next(fl_wk_async_t *a)
{
    if (a->left == 0 || a->rounds >= a->cap)
        return;
    int *c = &a->cnt[(size_t)a->rounds * (size_t)a->L];
    size_t total = fl_wk_fit_counts(a->cad->counts, a->L, a->left, c);
    if (total == 0)
        return;
    a->base[a->rounds] = a->rounds > 0 ? a->base[a->rounds - 1] : 0;
    if (a->rounds > 0)
        for (int j = 0; j < a->L; j++)
            a->base[a->rounds] += (size_t)a->cnt[(size_t)(a->rounds - 1) * (size_t)a->L + j];
    a->rounds++;
    a->left -= total;
}

/* The epoch's first rounds: the ones a device may start before the first averaging. */
static int plan_epoch(fl_wk_async_t *a)
{
    a->left = fl_wk_devices_host_batches(a->d);
    a->rounds = 0;
    /* Every round has a batch at least. */
    int cap = (int)a->left + 2;
    if (cap > a->cap) {
        free(a->base);
        free(a->cnt);
        free(a->handed);
        a->base = malloc((size_t)cap * sizeof *a->base);
        a->cnt = malloc((size_t)cap * (size_t)a->L * sizeof *a->cnt);
        a->handed = malloc((size_t)cap * sizeof *a->handed);
        a->cap = a->base != NULL && a->cnt != NULL && a->handed != NULL ? cap : 0;
        if (a->cap == 0)
            return fl_fail(FL_ENOMEM, "--policy async: out of memory for the epoch's rounds");
    }
    memset(a->handed, 0, (size_t)a->cap * sizeof *a->handed);
    for (int r = 0; r <= a->bound; r++)
        plan_next(a);
    return FL_OK;
}

/* Folds every completed averaging into the device's parameters before it starts round r
 * (called locked). With none of its rounds left unaveraged, it simply takes the job's
 * parameters (no rounding drift; the training thread is waiting for its round r then). */
static void apply_done(fl_wk_async_t *a, device_t *v, int r, const float *params)
{
    if (a->done == r) {
        memcpy(v->p, params, a->np * sizeof(float));
        v->applied = a->done;
        return;
    }
    for (; v->applied < a->done; v->applied++) {
        int s = v->applied % a->slots;
        const float *dk = a->avg[s];
        const float *mine = v->delta[s];
        for (size_t i = 0; i < a->np; i++)
            v->p[i] += dk[i] - mine[i];
    }
}

/* Before round r: waits until the device is at most `bound` rounds ahead of the last completed
 * averaging and folds the completed ones in. False when it stops instead (an error, or the
 * host's batches are all in earlier rounds). *since: its batches since the last averaging it
 * applied (the rounds that averaging did not cover); *step0: the schedule's step there. */
static bool round_begin(fl_wk_async_t *a, device_t *v, int r, long *since, double *step0)
{
    double per_sync = (double)a->L * a->W * (double)a->o->batch;
    pthread_mutex_lock(&a->mu);
    int64_t t0 = fl_now_ns();
    struct timespec dl = deadline();
    while (a->rc == FL_OK && a->done < r - a->bound)
        if (pthread_cond_timedwait(&a->cv, &a->mu, &dl) == ETIMEDOUT && a->done < r - a->bound) {
            set_error(a, FL_ETIMEDOUT, "--policy async: no averaging within 600 s");
            break;
        }
    double waited = (double)(fl_now_ns() - t0) / 1e9;
    a->st.throttled_s += waited;
    if (waited > 1e-4)
        a->st.throttles++;
    bool go = a->rc == FL_OK && r < a->rounds;
    if (go) {
        apply_done(a, v, r, a->params);
        *since = 0;
        for (int q = v->applied; q < r; q++)
            *since += a->cnt[(size_t)q * (size_t)a->L + (size_t)v->j];
        int lead = r - a->done;
        a->st.max_lead = lead > a->st.max_lead ? lead : a->st.max_lead;
        *step0 =
            (v->applied > 0 ? a->samples_at[(v->applied - 1) % a->slots] : a->samples0) / per_sync;
    }
    pthread_mutex_unlock(&a->mu);
    return go;
}

/* Round r's batches on the device, each stepping its own parameters; the round's delta, loss,
 * correct predictions and seconds into its slot. */
static int round_train(fl_wk_async_t *a, device_t *v, int r, long since, double step0)
{
    int c = a->cnt[(size_t)r * (size_t)a->L + (size_t)v->j];
    size_t first = a->base[r];
    for (int k = 0; k < v->j; k++)
        first += (size_t)a->cnt[(size_t)r * (size_t)a->L + (size_t)k];
    memcpy(v->start, v->p, a->np * sizeof(float));
    /* The round's time on the device's own clock (events on its compute stream). */
    int rc = fl_wk_devices_clock_start(a->d, v->j);
    int slot = r % a->slots;
    v->rloss[slot] = 0.0;
    v->rcorrect[slot] = 0;
    for (int b = 0; b < c && rc == FL_OK; b++) {
        double loss = 0.0;
        size_t correct = 0;
        rc =
            fl_wk_devices_host_batch(a->d, v->j, v->p, first + (size_t)b, v->grad, &loss, &correct);
        if (rc == FL_OK)
            rc = fl_opt_step(v->opt, v->p, v->grad, fl_lr_at(a->sched, (long)(step0 + since)));
        since++;
        v->rloss[slot] += loss;
        v->rcorrect[slot] += correct;
        v->loss += loss;
        v->correct += correct;
        v->batches++;
    }
    double busy = 0.0;
    if (rc == FL_OK)
        rc = fl_wk_devices_clock_stop(a->d, v->j, &busy);
    v->busy_s += busy;
    v->rbusy[slot] = busy;
    pthread_mutex_lock(&a->mu);
    a->st.busy_s += busy;
    pthread_mutex_unlock(&a->mu);
    float *delta = v->delta[slot];
    for (size_t i = 0; i < a->np; i++)
        delta[i] = v->p[i] - v->start[i];
    return rc;
}

/* Device j's epoch: its rounds, each handed in for the averaging, until it stops. */
static int device_job(int j, void *ud)
{
    fl_wk_async_t *a = ud;
    device_t *v = &a->dev[j];
    long since = 0;
    double step0 = 0.0;
    for (int r = 0; round_begin(a, v, r, &since, &step0); r++) {
        int rc = round_train(a, v, r, since, step0);
        pthread_mutex_lock(&a->mu);
        if (rc != FL_OK) {
            char what[1024];
            snprintf(what, sizeof what, "device %d: %s", v->j, fl_last_error());
            set_error(a, rc, what);
        } else if (++a->handed[r] == a->L) {
            pthread_cond_broadcast(&a->cv);
        }
        pthread_mutex_unlock(&a->mu);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

/* Round k on this host: wait for every device's delta, their count-weighted sum; a local
 * failure (a device's, or before the devices started) becomes the flag instead. batch_s: each
 * device's seconds per batch in the round (0: none). */
static void host_sum(fl_wk_async_t *a, int k, double *wait_s, double *batch_s)
{
    memset(a->sum, 0, (a->np + 2) * sizeof(float));
    a->rloss = 0.0;
    a->rcorrect = 0;
    for (int j = 0; j < a->L; j++)
        batch_s[j] = 0.0;
    pthread_mutex_lock(&a->mu);
    int64_t t0 = fl_now_ns();
    struct timespec dl = deadline();
    bool mine = k < a->rounds;
    while (a->rc == FL_OK && mine && a->handed[k] < a->L)
        if (pthread_cond_timedwait(&a->cv, &a->mu, &dl) == ETIMEDOUT && a->handed[k] < a->L) {
            set_error(a, FL_ETIMEDOUT,
                      "--policy async: the devices did not finish a round "
                      "within 600 s");
            break;
        }
    *wait_s = (double)(fl_now_ns() - t0) / 1e9;
    int rc = a->rc;
    pthread_mutex_unlock(&a->mu);
    if (rc != FL_OK) {
        a->sum[a->np + 1] = 1.0f; /* every host stops at this averaging */
        return;
    }
    if (!mine)
        return; /* this host has no round k: it hands in nothing */
    double total = 0.0;
    for (int j = 0; j < a->L; j++) {
        int c = a->cnt[(size_t)k * (size_t)a->L + (size_t)j];
        const device_t *v = &a->dev[j];
        const float *dj = v->delta[k % a->slots];
        a->rloss += v->rloss[k % a->slots];
        a->rcorrect += v->rcorrect[k % a->slots];
        batch_s[j] = c > 0 ? v->rbusy[k % a->slots] / c : 0.0;
        for (size_t i = 0; i < a->np && c > 0; i++)
            a->sum[i] += (float)c * dj[i];
        total += c;
    }
    a->sum[a->np] = (float)total;
}

/* El Che after averaging k: this round's timings folded in, and every few averagings a new plan
 * from the job's slowest device and longest averaging (one more small allreduce, on every rank
 * at the same averaging), for the rounds no device has started. */
static int replan(fl_wk_async_t *a, const double *batch_s, double exch_s)
{
    fl_wk_cadence_observe(a->cad, batch_s);
    a->exch_ema_s = a->averaged == 0 ? exch_s : 0.7 * a->exch_ema_s + 0.3 * exch_s;
    if (++a->averaged, a->o->replan_every <= 0 || a->averaged % a->o->replan_every != 0)
        return FL_OK;
    double v[2] = {fl_wk_cadence_slowest(a->cad), a->exch_ema_s};
    int rc;
    if (a->comm != NULL && (rc = fl_allreduce(a->comm, v, v, 2, FL_FLOAT64, FL_MAX)) != FL_OK)
        return rc;
    fl_wk_cadence_plan(a->cad, v[0], v[1]);
    return FL_OK;
}

/* ||before - after|| / ||after|| of the device of this host that strayed most in round k. */
static double divergence(const fl_wk_async_t *a, int k, const float *g, const float *dk)
{
    if (k >= a->rounds)
        return 0.0;
    double norm = 0.0;
    for (size_t i = 0; i < a->np; i++)
        norm += (double)g[i] * g[i];
    norm = sqrt(norm);
    double worst = 0.0;
    for (int j = 0; j < a->L; j++) {
        if (a->cnt[(size_t)k * (size_t)a->L + (size_t)j] == 0)
            continue;
        const float *dj = a->dev[j].delta[k % a->slots];
        double s = 0.0;
        for (size_t i = 0; i < a->np; i++) {
            double x = (double)dj[i] - dk[i];
            s += x * x;
        }
        double v = norm > 0 ? sqrt(s) / norm : 0.0;
        worst = v > worst ? v : worst;
    }
    return worst;
}

/* The epoch's first rounds planned and the devices started on them. A failure here is the
 * epoch's (a->rc): the host still takes part in the averaging, so the other hosts hear it. */
static void epoch_start(fl_wk_async_t *a, const float *params)
{
    int rc = plan_epoch(a);
    if (rc != FL_OK) {
        a->rc = rc;
        snprintf(a->err, sizeof a->err, "%s", fl_last_error());
        a->rounds = 0;
        return;
    }
    for (int j = 0; j < a->L; j++) {
        device_t *v = &a->dev[j];
        memcpy(v->p, params, a->np * sizeof(float));
        v->applied = 0;
        v->loss = 0.0;
        v->correct = 0;
        v->batches = 0;
        v->busy_s = 0.0;
    }
    rc = fl_fanout_create(a->L, 0, device_job, a, "--policy async: the devices", &a->fan);
    if (rc != FL_OK) {
        pthread_mutex_lock(&a->mu);
        set_error(a, rc, fl_last_error());
        pthread_mutex_unlock(&a->mu);
        return;
    }
    fl_fanout_begin(a->fan);
}

/* The hosts' sums of a round added up (one allreduce; nothing to add on one host). */
static int sum_hosts(fl_wk_async_t *a, double *exch_s)
{
    int64_t t0 = fl_now_ns();
    if (a->comm != NULL) {
        fl_comm_stats_t s0;
        fl_comm_stats_t s1;
        fl_comm_get_stats(a->comm, &s0);
        int rc = fl_allreduce(a->comm, a->sum, a->sum, a->np + 2, FL_FLOAT32, FL_SUM);
        fl_comm_get_stats(a->comm, &s1);
        a->st.sent += s1.bytes_sent - s0.bytes_sent;
        a->st.remote += s1.bytes_sent_remote - s0.bytes_sent_remote;
        if (rc != FL_OK)
            return rc;
    }
    *exch_s = (double)(fl_now_ns() - t0) / 1e9;
    a->st.exchange_s += *exch_s;
    return FL_OK;
}

/* Averaging k done: the job's samples after it, and the devices told (round k + 1 + bound,
 * the first no device may have started, planned). */
static void publish(fl_wk_async_t *a, int k, double job)
{
    pthread_mutex_lock(&a->mu);
    *a->samples += job * (double)a->o->batch;
    a->samples_at[k % a->slots] = *a->samples;
    a->done = k + 1;
    plan_next(a);
    a->st.averagings++;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* Averaging k: the host's round k summed, summed across hosts, averaged into the job's
 * parameters and reported. *more false once no host had a round k. FL_EPEER when a host (this
 * one, or another) failed; the allreduce's or the re-plan's error. */
static int average(fl_wk_async_t *a, int k, bool *more)
{
    *more = false;
    double wait_s = 0.0;
    double exch_s = 0.0;
    double batch_s[FL_DEV_MAX_DEVICES];
    host_sum(a, k, &wait_s, batch_s);
    int rc = sum_hosts(a, &exch_s);
    if (rc != FL_OK)
        return rc;
    if (a->sum[a->np + 1] > 0.0f)
        return fl_fail(FL_EPEER, "--policy async: another rank failed during the averaging (its "
                                 "log says why); stopping with it");
    double job = a->sum[a->np];
    if (job == 0.0)
        return FL_OK;
    float *dk = a->avg[k % a->slots];
    for (size_t i = 0; i < a->np; i++)
        dk[i] = a->sum[i] / (float)job;
    double host = 0.0;
    for (int j = 0; j < a->L && k < a->rounds; j++)
        host += a->cnt[(size_t)k * (size_t)a->L + (size_t)j];
    fl_wk_async_avg_t av = {.index = k,
                            .job_batches = job,
                            .host_batches = host,
                            .loss = host > 0 ? a->rloss / host : 0.0,
                            .correct = a->rcorrect,
                            .exchange_s = exch_s,
                            .wait_s = wait_s};
    if ((rc = replan(a, batch_s, exch_s)) != FL_OK)
        return rc;
    /* No device reads params before done says so, nor writes the deltas read here. */
    for (size_t i = 0; i < a->np; i++)
        a->params[i] += dk[i];
    av.divergence = divergence(a, k, a->params, dk);
    publish(a, k, job);
    if (a->on_avg != NULL)
        a->on_avg(&av, a->ud);
    *more = true;
    return FL_OK;
}

/* The devices stopped (the epoch's first failure, a device's or the averaging's, kept in
 * a->rc) and joined. */
static int epoch_end(fl_wk_async_t *a, int rc)
{
    pthread_mutex_lock(&a->mu);
    if (rc != FL_OK)
        set_error(a, rc, fl_last_error());
    pthread_cond_broadcast(&a->cv);
    rc = a->rc;
    pthread_mutex_unlock(&a->mu);
    /* a->rc holds the epoch's first failure: the devices' own codes add nothing. */
    if (a->fan != NULL)
        (void)fl_fanout_end(a->fan);
    fl_fanout_destroy(&a->fan);
    a->params = NULL;
    if (rc != FL_OK)
        return fl_fail(rc, "%s", a->err);
    return FL_OK;
}

int fl_wk_async_epoch(fl_wk_async_t *a, float *params, const fl_lr_sched_t *sched, double *samples,
                      fl_wk_async_fn on_avg, void *ud)
{
    a->done = 0;
    a->rc = FL_OK;
    a->err[0] = '\0';
    a->sched = sched;
    a->samples0 = *samples;
    a->samples = samples;
    a->params = params;
    a->on_avg = on_avg;
    a->ud = ud;
    epoch_start(a, params);
    /* The averagings, in order, until no host has a round left or one host failed. */
    int rc = FL_OK;
    bool more = true;
    for (int k = 0; more && rc == FL_OK; k++)
        rc = average(a, k, &more);
    return epoch_end(a, rc);
}

void fl_wk_async_epoch_figures(const fl_wk_async_t *a, double *loss, size_t *correct,
                               size_t *batches)
{
    double l = 0.0;
    *correct = 0;
    *batches = 0;
    for (int j = 0; j < a->L; j++) {
        const device_t *v = &a->dev[j];
        l += v->loss;
        *correct += v->correct;
        *batches += v->batches;
    }
    *loss = *batches ? l / (double)*batches : 0.0;
}

void fl_wk_async_stats(const fl_wk_async_t *a, fl_wk_async_stats_t *out)
{
    *out = a->st;
}

fl_opt_t *fl_wk_async_opt(fl_wk_async_t *a, int j)
{
    return j >= 0 && j < a->L ? a->dev[j].opt : NULL;
}
