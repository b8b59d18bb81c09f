/* The settings every rank of a job must share, declared at registration (fl_comm_opts_t /
 * fl_ps_client_opts_t .settings): the coordinator refuses a job whose ranks differ, naming the
 * setting and both values, before any step is taken. A setting that differed would otherwise
 * show up late or never: another --lr trains silently into diverged replicas, another
 * --batch-size fails hundreds of steps in. What may differ per rank stays out: the kind of
 * device and its ids (--device, --gpus), --speed-hint, --throttle, paths, observability. */
#include "fl_wk.h"
#include "train_int.h"

#include <stdio.h>
#include <string.h>

static const char *mode_name(fl_wk_mode_t m)
{
    return m == FL_WK_MODE_PS ? "ps" : m == FL_WK_MODE_RING ? "ring" : "local";
}

static const char *policy_name(fl_wk_policy_t p)
{
    return p == FL_WK_POLICY_CADENCE ? "cadence" : p == FL_WK_POLICY_ASYNC ? "async" : "sync";
}

static const char *lr_kind_name(fl_lr_kind_t k)
{
    return k == FL_LR_STEP ? "step" : k == FL_LR_COSINE ? "cosine" : "constant";
}

/* FNV-1a over bytes. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The data set's identity: its sizes and a hash of its first samples and labels. */
static uint64_t data_hash(const fl_dataset_t *d)
{
    size_t first = d->n < 64 ? d->n : 64;
    uint64_t h = 0xcbf29ce484222325ull;
    if (d->x != NULL)
        h = fnv(h, d->x, first * d->dim * sizeof *d->x);
    if (d->y != NULL)
        h = fnv(h, d->y, first * sizeof *d->y);
    return h;
}

int fl_wk_settings(const fl_wk_train_opts_t *t, const fl_dataset_t *train, char *out, size_t cap)
{
    out[0] = '\0';
    char layers[FL_MLP_MAX_LAYERS * 12 + 1] = "";
    char params[FL_MLP_MAX_LAYERS * 64 + 1] = "";
    size_t at = 0;
    size_t pt = 0;
    for (int l = 0; l <= t->shape.nlayers; l++)
        at += (size_t)snprintf(layers + at, sizeof layers - at, "%s%d", l ? "-" : "",
                               t->shape.sizes[l]);
    for (int l = 0; l < t->shape.nlayers; l++)
        pt +=
            (size_t)snprintf(params + pt, sizeof params - pt,
                             "%slayers.%d.weight [%d x %d], layers.%d.bias [%d]", l ? ", " : "", l,
                             t->shape.sizes[l + 1], t->shape.sizes[l], l, t->shape.sizes[l + 1]);
    const fl_opt_opts_t *o = &t->opt;
    const fl_lr_sched_t *s = &t->lr;
    int rc = FL_OK;
#define ADD(name, ...)                                                                             \
    do {                                                                                           \
        if (rc == FL_OK)                                                                           \
            rc = fl_settings_add(out, cap, name, __VA_ARGS__);                                     \
    } while (0)
    ADD("mode", "%s", mode_name(t->mode));
    ADD("layers", "%s", layers);
    ADD("parameters", "%s", params);
    ADD("batch-size", "%zu per device", t->batch);
    ADD("devices", "%d per host", t->replicas);
    /* In --mode ps the optimizer runs on flodl-ps, and each push says how it is encoded
     * (dense or top-k, its value type): a worker's exchange is its own. */
    if (t->mode != FL_WK_MODE_PS) {
        ADD("optimizer", "%s", fl_opt_kind_name(o->kind));
        ADD("lr", "%.15g", s->lr);
        ADD("momentum", "%.15g", o->momentum);
        ADD("dampening", "%.15g", o->dampening);
        ADD("nesterov", "%s", o->nesterov ? "on" : "off");
        ADD("weight-decay", "%.15g", o->weight_decay);
        ADD("beta1", "%.15g", o->beta1);
        ADD("beta2", "%.15g", o->beta2);
        ADD("eps", "%.15g", o->eps);
        ADD("lr-schedule", "%s", lr_kind_name(s->kind));
        ADD("warmup-steps", "%ld", s->warmup_steps);
        ADD("lr-step-size", "%ld", s->step_size);
        ADD("lr-gamma", "%.15g", s->gamma);
        ADD("total-steps", "%ld", s->total_steps);
        ADD("min-lr", "%.15g", s->min_lr);
        ADD("scale-lr", "%s", t->scale_lr ? "on" : "off");
        ADD("max-grad-norm", "%.15g", t->max_norm);
        ADD("topk", "%.15g", t->topk);
        ADD("topk-values", "%s", fl_dtype_name(t->topk_values));
        ADD("topk-warmup", "%d", t->topk_warmup);
        ADD("bucket", "%zu bytes", t->bucket_bytes);
        ADD("hierarchy", "%s", t->hierarchy == FL_WK_HIER_FLAT ? "flat" : "hybrid");
        ADD("shard", "%s", fl_wk_shard_name(t->shard));
        ADD("policy", "%s", policy_name(t->policy));
        ADD("run-ahead", "%d", t->run_ahead);
        ADD("max-anchor", "%d", t->max_anchor);
        ADD("overhead-target", "%.15g", t->overhead_target);
    }
    ADD("epochs", "%d", t->epochs);
    ADD("seed", "%llu", (unsigned long long)t->seed);
    ADD("shuffle", "%s", t->shuffle ? "on" : "off");
    if (train != NULL)
        ADD("data", "%zu samples of %zu features, %d classes, first samples' hash %016llx",
            train->n, train->dim, train->classes, (unsigned long long)data_hash(train));
#undef ADD
    return rc;
}
