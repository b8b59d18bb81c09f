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
    int parts;            /* device clients (0: one client for the host) */
    fl_wk_psdev_t *pd;
    fl_cmp_ef_t *ef;
    fl_cmp_ws_t *ws;
    uint32_t *idx;
    float *val;
    FILE *metrics;
} ps_trainer_t;

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
                                     t->parts > 0 ? FL_WK_LOCAL_SHARDS : FL_WK_LOCAL_MEAN,
                                     t->grad, &t->dev)) != FL_OK)
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
    if (o->metrics_path != NULL) {
        char path[1024];
        if (t->world > 1)
            snprintf(path, sizeof path, "%s.rank%d", o->metrics_path, t->rank);
        else
            snprintf(path, sizeof path, "%s", o->metrics_path);
        if ((t->metrics = fopen(path, "w")) == NULL)
            return fl_fail(FL_EIO, "--metrics: cannot write %s", path);
    }
    return FL_OK;
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

int fl_wk_train_ps(fl_ps_client_t *cl, int rank, int world, const fl_dataset_t *train,
                   const fl_dataset_t *test, const fl_wk_train_opts_t *o,
                   fl_wk_train_result_t *res)
{
    ps_trainer_t t;
    memset(&t, 0, sizeof t);
    memset(res, 0, sizeof *res);
    t.o = o;
    t.m = &o->shape;
    t.cl = cl;
    t.rank = rank;
    t.world = world;
    int rc = fl_wk_check_model(t.m, train, test);
    if (rc == FL_OK)
        rc = setup(&t, train);
    if (rc == FL_OK && fl_ps_client_param_count(cl) != t.np)
        rc = fl_fail(FL_EINVAL, "the parameter server holds %zu parameters, --layers %zu",
                     fl_ps_client_param_count(cl), t.np);
    if (rc == FL_OK)
        rc = fl_ps_client_init(cl, t.params);
    if (rc == FL_OK && t.parts > 0)
        rc = fl_wk_psdev_create(cl, t.parts, o, &t.pd);
    if (rc != FL_OK) {
        teardown(&t);
        return rc;
    }
    size_t nb = fl_wk_devices_batches(t.dev);
    uint64_t total = (uint64_t)o->epochs * nb;
    long global_batch = (long)o->batch * o->replicas * world;
    fl_cmp_schedule_t dgc;
    fl_cmp_schedule_init(&dgc);
    dgc.density = o->topk;
    dgc.warmup_epochs = o->topk_warmup;
    bool lead = rank == 0 && !o->quiet;
    uint64_t start = fl_ps_client_step(cl);
    if (lead)
        printf("training: %s, %d ranks x %d device(s), batch %zu per device (global %ld), %zu "
               "parameters, parameter server (%d shards, %s%s), %s pushes, %zu steps per "
               "epoch%s\n",
               train->source, world, o->replicas, o->batch, global_batch, t.np,
               fl_ps_client_num_shards(cl), t.parts > 0 ? "a client per device, " : "",
               fl_ps_consistency_name(fl_ps_client_consistency(cl)),
               o->topk > 0 ? "top-k" : "dense", nb, start > 0 ? " (resuming)" : "");

    /* The residual of the step the server resumed at, when this worker saved one. */
    if (o->resume_dir != NULL && (rc = own_residual(&t, o->resume_dir, start, true)) != FL_OK) {
        teardown(&t);
        return rc;
    }
    long saved = -1; /* the step of this worker's last residual file */
    int64_t t_start = fl_now_ns(), t_last = t_start;
    long cur_epoch = -1;
    double compute_ms = 0.0, comm_ms = 0.0, ep_loss = 0.0;
    size_t ep_correct = 0, ep_steps = 0;
    long steps = 0;
    uint64_t step = start;
    while (rc == FL_OK && step < total) {
        long ep = (long)(step / nb);
        size_t bi = (size_t)(step % nb);
        if (ep != cur_epoch) {
            fl_wk_devices_set_epoch(t.dev, ep);
            cur_epoch = ep;
            ep_loss = 0.0;
            ep_correct = 0;
            ep_steps = 0;
        }
        int64_t t0 = fl_now_ns();
        double loss = 0.0;
        size_t correct = 0;
        if ((rc = fl_wk_devices_step(t.dev, t.params, bi, NULL, NULL, &loss, &correct)) != FL_OK)
            break;
        fl_ps_grad_t g;
        double density = o->topk > 0 ? fl_cmp_schedule_density(&dgc, (double)ep) : 0.0;
        if ((rc = make_grad(&t, density, &g)) != FL_OK)
            break;
        int64_t t1 = fl_now_ns();
        /* Device clients: each its keys, in parallel; after a restart of the server they
         * rejoin through this client and split again. */
        rc = t.pd != NULL ? fl_wk_psdev_push_pull(t.pd, t.grad, g.batch, density, t.params)
                          : fl_ps_client_push_pull(cl, &g, t.params);
        int64_t t2 = fl_now_ns();
        if (rc == FL_ERESYNC && t.pd != NULL &&
            (rc = fl_wk_psdev_rejoin(t.pd, cl, t.params)) == FL_OK)
            rc = FL_ERESYNC; /* joined again as one client would have */
        if (rc == FL_ERESYNC) {
            if (!o->quiet)
                printf("rank %d: the parameter server restarted: going on from step %llu\n",
                       rank, (unsigned long long)fl_ps_client_step(cl));
            step = fl_ps_client_step(cl);
            cur_epoch = -1;
            /* The server went back to a checkpoint: so does the residual, when saved there. */
            rc = o->checkpoint_dir != NULL ? own_residual(&t, o->checkpoint_dir, step, false)
                                           : FL_OK;
            continue;
        }
        if (rc != FL_OK)
            break;
        step = t.pd != NULL ? fl_wk_psdev_step(t.pd) : fl_ps_client_step(cl);
        steps++;
        compute_ms += (double)(t1 - t0) / 1e6;
        comm_ms += (double)(t2 - t1) / 1e6;
        ep_loss += loss;
        ep_correct += correct;
        ep_steps++;
        if (t.metrics != NULL)
            fprintf(t.metrics,
                    "{\"rank\":%d,\"epoch\":%ld,\"step\":%llu,\"loss\":%.6f,\"acc\":%.5f,"
                    "\"density\":%.6g,\"compute_ms\":%.3f,\"exchange_ms\":%.3f}\n",
                    rank, ep, (unsigned long long)step - 1, loss,
                    (double)correct / (double)(o->batch * (size_t)o->replicas), density,
                    (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6);
        int64_t now = fl_now_ns();
        if (lead && (double)(now - t_last) / 1e9 >= o->progress_s) {
            fl_ps_client_stats_t cs;
            if (t.pd != NULL)
                fl_wk_psdev_stats(t.pd, &cs);
            else
                fl_ps_client_get_stats(cl, &cs);
            char eta[64], sent[96];
            fl_wk_progress_eta(eta, sizeof eta, (double)(step + 1) / (double)total,
                               (double)start / (double)total, (double)(now - t_start) / 1e9);
            fl_wk_progress_sent(sent, sizeof sent, cs.bytes_sent, cs.raw_bytes);
            printf("epoch %ld/%d step %zu/%zu (%s) loss %.4f acc %.1f%% %.0f samples/s compute "
                   "%.1f ms push+pull %.1f ms %s\n",
                   ep + 1, o->epochs, bi + 1, nb, eta, ep_loss / (double)ep_steps,
                   100.0 * (double)ep_correct /
                       (double)(ep_steps * o->batch * (size_t)o->replicas),
                   (double)steps * (double)global_batch / ((double)(now - t_start) / 1e9),
                   compute_ms / (double)steps, comm_ms / (double)steps, sent);
            fflush(stdout);
            t_last = now;
        }
        if (o->save_path != NULL && o->save_every > 0 && step % (uint64_t)o->save_every == 0 &&
            rank == 0 && (rc = save(&t, step, (int)ep)) != FL_OK)
            break;
        if (step % nb != 0 && step != total)
            continue;
        /* An epoch ended: these are the parameters after its last update. */
        res->epochs = (int)(step / nb);
        if (o->checkpoint_dir != NULL && (t.ef != NULL || (t.pd != NULL && o->topk > 0))) {
            const fl_cmp_ef_t *efs[FL_DEV_MAX_DEVICES];
            int nef = 0;
            if (t.ef != NULL)
                efs[nef++] = t.ef;
            for (int j = 0; t.pd != NULL && j < t.parts; j++)
                efs[nef++] = fl_wk_psdev_ef(t.pd, j);
            if ((rc = fl_wk_ckpt_efs_save(o->checkpoint_dir, rank, (long)step, saved, efs,
                                          nef)) != FL_OK)
                break;
            saved = (long)step;
        }
        res->train_loss = ep_steps ? ep_loss / (double)ep_steps : 0.0;
        if (test != NULL && rank == 0) {
            size_t ok;
            if ((rc = fl_mlp_eval(t.m, fl_wk_devices_ws(t.dev), t.params, test->x, test->y,
                                     test->n, &res->test_loss, &ok)) != FL_OK)
                break;
            res->test_acc = test->n ? (double)ok / (double)test->n : 0.0;
            if (lead) {
                printf("epoch %ld/%d done: train loss %.4f, test loss %.4f, test accuracy "
                       "%.2f%% (%.1f s)\n",
                       ep + 1, o->epochs, res->train_loss, res->test_loss, 100.0 * res->test_acc,
                       (double)(fl_now_ns() - t_start) / 1e9);
                fflush(stdout);
            }
        }
    }
    if (rc == FL_OK && o->save_path != NULL && rank == 0)
        rc = save(&t, step, res->epochs);
    if (rank != 0 || test == NULL) {
        res->test_acc = NAN; /* rank 0 evaluates */
        res->test_loss = NAN;
    }
    fl_ps_client_stats_t cs;
    if (t.pd != NULL)
        fl_wk_psdev_stats(t.pd, &cs);
    else
        fl_ps_client_get_stats(cl, &cs);
    res->steps = steps;
    res->seconds = (double)(fl_now_ns() - t_start) / 1e9;
    res->samples_per_s =
        res->seconds > 0 ? (double)steps * (double)global_batch / res->seconds : 0.0;
    res->bytes_sent = cs.bytes_sent;
    res->raw_bytes = cs.raw_bytes;
    res->compute_ms = steps ? compute_ms / (double)steps : 0.0;
    res->comm_ms = steps ? comm_ms / (double)steps : 0.0;
    res->exposed_ms = res->comm_ms; /* the push and pull follow the backward pass */
    teardown(&t);
    return rc;
}
