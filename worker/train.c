/* The training loop: each step every device (the process's CPU replicas, as threads) computes
 * the gradient of its batch, the process averages them, the exchange averages across ranks
 * (buckets leave while the backward pass goes on), then clipping and the optimizer update the
 * parameters, identically on every rank. Progress lines, one JSON line per step with
 * --metrics, an evaluation on the test split each epoch, checkpoints with --save. */
#include "wk_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct replica {
    fl_wk_sampler_t smp;
    fl_wk_mlp_ws_t *ws;
    uint32_t *idx;
    float *x;
    int32_t *y;
    float *grad; /* replica 0 writes straight into the trainer's gradient */
    double loss;
    size_t correct;
    int rc;
    char err[512];
} replica_t;

typedef struct trainer {
    const fl_wk_train_opts_t *o;
    const fl_wk_mlp_shape_t *m;
    const fl_wk_dataset_t *train;
    fl_comm_t *comm;
    int rank;
    int world;
    size_t np;
    float *params;
    float *grad;
    replica_t *rep;
    fl_wk_xchg_t *xchg;
    fl_opt_t *opt;
    FILE *metrics;
    size_t cur_batch; /* batch index for the replica threads */
} trainer_t;

void fl_wk_train_opts_init(fl_wk_train_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->mode = FL_WK_MODE_LOCAL;
    fl_wk_mlp_parse("64,256,128,10", &o->shape);
    o->batch = 64;
    o->epochs = 10;
    o->shuffle = true;
    o->seed = 1;
    o->replicas = 1;
    fl_opt_opts_init(&o->opt);
    o->opt.momentum = 0.9;
    fl_lr_sched_init(&o->lr, 0.05);
    o->topk_values = FL_FLOAT32;
    o->bucket_bytes = (size_t)1 << 20;
    o->progress_s = 2.0;
}

/* Copies the batch's samples next to each other for the GEMMs. */
static void gather(const fl_wk_dataset_t *d, const uint32_t *idx, size_t b, float *x, int32_t *y)
{
    for (size_t t = 0; t < b; t++) {
        memcpy(x + t * d->dim, d->x + (size_t)idx[t] * d->dim, d->dim * sizeof(float));
        y[t] = d->y[idx[t]];
    }
}

static void layer_done(int layer, void *ud)
{
    trainer_t *tr = ud;
    fl_wk_xchg_ready_from(tr->xchg, fl_wk_mlp_weight_at(tr->m, layer));
}

static int replica_step(trainer_t *tr, replica_t *r, bool overlap)
{
    fl_wk_sampler_batch(&r->smp, tr->cur_batch, r->idx);
    gather(tr->train, r->idx, tr->o->batch, r->x, r->y);
    return fl_wk_mlp_grad(tr->m, r->ws, tr->params, r->x, r->y, tr->o->batch, r->grad, &r->loss,
                          &r->correct, overlap ? layer_done : NULL, tr);
}

typedef struct rep_arg {
    trainer_t *tr;
    replica_t *r;
} rep_arg_t;

static void *replica_main(void *p)
{
    rep_arg_t *a = p;
    a->r->rc = replica_step(a->tr, a->r, false);
    if (a->r->rc != FL_OK)
        snprintf(a->r->err, sizeof a->r->err, "%s", fl_last_error());
    return NULL;
}

/* The devices of this process compute their gradients; their mean ends in tr->grad, and the
 * exchange gets the buckets (while the backward pass runs, with a single device). */
static int compute(trainer_t *tr, double *loss, size_t *correct)
{
    int L = tr->o->replicas;
    if (L == 1) {
        int rc = replica_step(tr, &tr->rep[0], true);
        *loss = tr->rep[0].loss;
        *correct = tr->rep[0].correct;
        return rc;
    }
    pthread_t th[64];
    rep_arg_t args[64];
    for (int j = 1; j < L; j++) {
        args[j] = (rep_arg_t){tr, &tr->rep[j]};
        if (pthread_create(&th[j], NULL, replica_main, &args[j]) != 0)
            return fl_fail(FL_EIO, "rank %d: cannot start CPU replica %d", tr->rank, j);
    }
    int rc = replica_step(tr, &tr->rep[0], false);
    for (int j = 1; j < L; j++)
        pthread_join(th[j], NULL);
    *loss = 0.0;
    *correct = 0;
    for (int j = 0; j < L && rc == FL_OK; j++) {
        if (tr->rep[j].rc != FL_OK)
            return fl_fail(tr->rep[j].rc, "replica %d: %s", j, tr->rep[j].err);
        *loss += tr->rep[j].loss / L;
        *correct += tr->rep[j].correct;
    }
    if (rc != FL_OK)
        return rc;
    /* The replicas' mean, summed in replica order so every rank adds alike. */
    float inv = 1.0f / (float)L;
    for (size_t i = 0; i < tr->np; i++) {
        float s = tr->grad[i];
        for (int j = 1; j < L; j++)
            s += tr->rep[j].grad[i];
        tr->grad[i] = s * inv;
    }
    fl_wk_xchg_ready_from(tr->xchg, 0);
    return FL_OK;
}

static double l2(const float *g, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return sqrt(s);
}

static int check_model(const trainer_t *tr, const fl_wk_dataset_t *test)
{
    const fl_wk_mlp_shape_t *m = tr->m;
    const fl_wk_dataset_t *d = tr->train;
    if ((size_t)m->sizes[0] != d->dim)
        return fl_fail(FL_EINVAL, "--layers: the model takes %d inputs, the data (%s) has %zu "
                                  "features",
                       m->sizes[0], d->source, d->dim);
    if (m->sizes[m->nlayers] < d->classes)
        return fl_fail(FL_EINVAL, "--layers: the model has %d outputs, the data (%s) has %d "
                                  "classes",
                       m->sizes[m->nlayers], d->source, d->classes);
    if (test != NULL && test->dim != d->dim)
        return fl_fail(FL_EINVAL, "the test data (%s) has %zu features, the training data %zu",
                       test->source, test->dim, d->dim);
    return FL_OK;
}

static int setup(trainer_t *tr)
{
    const fl_wk_train_opts_t *o = tr->o;
    int L = o->replicas;
    if (L < 1 || L > 64)
        return fl_fail(FL_EINVAL, "--cpu-replicas: %d is outside 1..64", L);
    tr->np = fl_wk_mlp_nparams(tr->m);
    tr->params = malloc(tr->np * sizeof(float));
    tr->grad = calloc(tr->np, sizeof(float));
    tr->rep = calloc((size_t)L, sizeof *tr->rep);
    if (tr->params == NULL || tr->grad == NULL || tr->rep == NULL)
        return fl_fail(FL_ENOMEM, "out of memory for %zu parameters", tr->np);
    int rc;
    if (o->init_path != NULL) {
        if ((rc = fl_wk_mlp_load(tr->m, tr->params, o->init_path)) != FL_OK)
            return rc;
    } else {
        fl_wk_mlp_init(tr->m, tr->params, o->seed);
    }
    for (int j = 0; j < L; j++) {
        replica_t *r = &tr->rep[j];
        /* Device j of rank k is data-parallel replica k * L + j of world * L. */
        if ((rc = fl_wk_sampler_init(&r->smp, tr->train->n, tr->world * L, tr->rank * L + j,
                                     o->batch, o->shuffle, o->seed)) != FL_OK ||
            (rc = fl_wk_mlp_ws_create(tr->m, o->batch, &r->ws)) != FL_OK)
            return rc;
        r->idx = malloc(o->batch * sizeof *r->idx);
        r->x = malloc(o->batch * tr->train->dim * sizeof *r->x);
        r->y = malloc(o->batch * sizeof *r->y);
        r->grad = j == 0 ? tr->grad : calloc(tr->np, sizeof(float));
        if (r->idx == NULL || r->x == NULL || r->y == NULL || r->grad == NULL)
            return fl_fail(FL_ENOMEM, "out of memory for replica %d", j);
    }
    if ((rc = fl_opt_create(&o->opt, tr->np, &tr->opt)) != FL_OK ||
        (rc = fl_wk_xchg_create(tr->comm, tr->m, o, tr->grad, &tr->xchg)) != FL_OK)
        return rc;
    if (o->metrics_path != NULL) {
        char path[1024];
        if (tr->world > 1)
            snprintf(path, sizeof path, "%s.rank%d", o->metrics_path, tr->rank);
        else
            snprintf(path, sizeof path, "%s", o->metrics_path);
        tr->metrics = fopen(path, "w");
        if (tr->metrics == NULL)
            return fl_fail(FL_EIO, "--metrics: cannot write %s", path);
    }
    return FL_OK;
}

static void teardown(trainer_t *tr)
{
    fl_wk_xchg_destroy(&tr->xchg);
    fl_opt_destroy(&tr->opt);
    for (int j = 0; tr->rep != NULL && j < tr->o->replicas; j++) {
        replica_t *r = &tr->rep[j];
        fl_wk_sampler_deinit(&r->smp);
        fl_wk_mlp_ws_destroy(&r->ws);
        free(r->idx);
        free(r->x);
        free(r->y);
        if (j > 0)
            free(r->grad);
    }
    free(tr->rep);
    free(tr->params);
    free(tr->grad);
    if (tr->metrics != NULL)
        fclose(tr->metrics);
}

static int save(trainer_t *tr, long step, int epoch)
{
    char s[32];
    char e[32];
    snprintf(s, sizeof s, "%ld", step);
    snprintf(e, sizeof e, "%d", epoch);
    fl_st_meta_t meta[3] = {{"flodl.step", s}, {"flodl.epoch", e}, {"flodl.model", "mlp"}};
    return fl_wk_mlp_save(tr->m, tr->params, tr->o->save_path, meta, 3);
}

int fl_wk_train(fl_comm_t *comm, const fl_wk_dataset_t *train, const fl_wk_dataset_t *test,
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
        return fl_fail(FL_EINVAL, "--mode ps: the parameter server is not built yet (issue #4)");
    int rc = check_model(&tr, test);
    if (rc == FL_OK)
        rc = setup(&tr);
    if (rc != FL_OK) {
        teardown(&tr);
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
    size_t nbatches = fl_wk_sampler_batches(&tr.rep[0].smp);
    bool lead = tr.rank == 0 && !o->quiet;
    if (lead)
        printf("training: %s, %d ranks x %d device(s), batch %zu per device (global %ld), %zu "
               "parameters, %s exchange, %zu steps per epoch\n",
               train->source, tr.world, o->replicas, o->batch, global_batch, tr.np,
               o->mode == FL_WK_MODE_LOCAL ? "no" : o->topk > 0 ? "top-k" : "dense", nbatches);

    int64_t t_start = fl_now_ns();
    int64_t t_last = t_start;
    long step = 0;
    double compute_ms = 0.0;
    double exposed_ms = 0.0;
    for (int ep = 0; ep < o->epochs && rc == FL_OK; ep++) {
        for (int j = 0; j < o->replicas; j++)
            fl_wk_sampler_set_epoch(&tr.rep[j].smp, ep);
        double density = o->topk > 0 ? fl_cmp_schedule_density(&dgc, ep) : 0.0;
        double ep_loss = 0.0;
        size_t ep_correct = 0;
        for (size_t bi = 0; bi < nbatches && rc == FL_OK; bi++, step++) {
            int64_t t0 = fl_now_ns();
            tr.cur_batch = bi;
            fl_wk_xchg_begin(tr.xchg, density);
            double loss = 0.0;
            size_t correct = 0;
            rc = compute(&tr, &loss, &correct);
            int64_t t1 = fl_now_ns();
            if (rc == FL_OK)
                rc = fl_wk_xchg_wait(tr.xchg);
            int64_t t2 = fl_now_ns();
            if (rc != FL_OK)
                break;
            if (o->max_norm > 0.0 && !(o->topk > 0 && tr.comm != NULL)) {
                double f = fl_cmp_clip_factor(l2(tr.grad, tr.np), o->max_norm);
                for (size_t i = 0; f != 1.0 && i < tr.np; i++)
                    tr.grad[i] *= (float)f;
            }
            double lr = fl_lr_at(&sched, step);
            if ((rc = fl_opt_step(tr.opt, tr.params, tr.grad, lr)) != FL_OK)
                break;
            double c_ms = (double)(t1 - t0) / 1e6;
            double x_ms = (double)(t2 - t1) / 1e6;
            compute_ms += c_ms;
            exposed_ms += x_ms;
            ep_loss += loss;
            ep_correct += correct;
            fl_wk_xchg_stats_t xs;
            fl_wk_xchg_stats(tr.xchg, &xs);
            if (tr.metrics != NULL)
                fprintf(tr.metrics,
                        "{\"rank\":%d,\"epoch\":%d,\"step\":%ld,\"loss\":%.6f,\"acc\":%.5f,"
                        "\"lr\":%.6g,\"density\":%.6g,\"compute_ms\":%.3f,\"exposed_comm_ms\":"
                        "%.3f,\"bytes_sent\":%llu,\"raw_bytes\":%llu}\n",
                        tr.rank, ep, step, loss,
                        (double)correct / (double)(o->batch * (size_t)o->replicas), lr, density,
                        c_ms, x_ms, (unsigned long long)xs.bytes_sent,
                        (unsigned long long)xs.raw_bytes);
            int64_t now = fl_now_ns();
            if (lead && (double)(now - t_last) / 1e9 >= o->progress_s) {
                double secs = (double)(now - t_start) / 1e9;
                printf("epoch %d/%d step %zu/%zu loss %.4f acc %.1f%% %.0f samples/s compute "
                       "%.1f ms exchange %.1f ms (exposed %.1f ms) sent %.1f MiB ratio %.1fx\n",
                       ep + 1, o->epochs, bi + 1, nbatches, ep_loss / (double)(bi + 1),
                       100.0 * (double)ep_correct /
                           (double)((bi + 1) * o->batch * (size_t)o->replicas),
                       (double)(step + 1) * (double)global_batch / secs,
                       compute_ms / (double)(step + 1), xs.busy_ms / (double)(step + 1),
                       exposed_ms / (double)(step + 1), (double)xs.bytes_sent / 1048576.0,
                       xs.bytes_sent ? (double)xs.raw_bytes / (double)xs.bytes_sent : 0.0);
                fflush(stdout);
                t_last = now;
            }
            if (o->save_path != NULL && o->save_every > 0 && (step + 1) % o->save_every == 0 &&
                tr.rank == 0 && (rc = save(&tr, step + 1, ep)) != FL_OK)
                break;
        }
        if (rc != FL_OK)
            break;
        res->train_loss = nbatches ? ep_loss / (double)nbatches : 0.0;
        res->epochs = ep + 1;
        if (test != NULL && tr.rank == 0) {
            size_t ok;
            if ((rc = fl_wk_mlp_eval(tr.m, tr.rep[0].ws, tr.params, test->x, test->y, test->n,
                                     &res->test_loss, &ok)) != FL_OK)
                break;
            res->test_acc = test->n ? (double)ok / (double)test->n : 0.0;
            if (lead) {
                printf("epoch %d/%d done: train loss %.4f, test loss %.4f, test accuracy %.2f%% "
                       "(%.1f s)\n",
                       ep + 1, o->epochs, res->train_loss, res->test_loss, 100.0 * res->test_acc,
                       (double)(fl_now_ns() - t_start) / 1e9);
                fflush(stdout);
            }
        }
    }
    if (rc == FL_OK && o->save_path != NULL && tr.rank == 0)
        rc = save(&tr, step, res->epochs);
    if (rc == FL_OK && tr.comm != NULL && test != NULL) {
        /* Rank 0 evaluated; every rank reports its figures. */
        double ev[2] = {res->test_loss, res->test_acc};
        if ((rc = fl_broadcast(tr.comm, ev, 2, FL_FLOAT64, 0)) == FL_OK) {
            res->test_loss = ev[0];
            res->test_acc = ev[1];
        }
    }
    fl_wk_xchg_stats_t xs;
    fl_wk_xchg_stats(tr.xchg, &xs);
    res->steps = step;
    res->seconds = (double)(fl_now_ns() - t_start) / 1e9;
    res->samples_per_s = res->seconds > 0 ? (double)step * (double)global_batch / res->seconds : 0;
    res->bytes_sent = xs.bytes_sent;
    res->raw_bytes = xs.raw_bytes;
    res->compute_ms = step ? compute_ms / (double)step : 0.0;
    res->comm_ms = step ? xs.busy_ms / (double)step : 0.0;
    res->exposed_ms = step ? exposed_ms / (double)step : 0.0;
    teardown(&tr);
    return rc;
}
