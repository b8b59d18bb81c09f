/* The trainer's setup: the devices of the process, the exchanges (one, or one per device on
 * its own sub-communicator, with the first leg's hooks), the optimizer's shards or --shard
 * full's pieces, --policy async, El Che's plan, the metrics file and the timeline's tracks;
 * the parameters kept on the devices; and the teardown. train.c runs the loop. */
#include "train_int.h"
#include "fl_coll.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An overlapped step's first leg: the bucket's mean over the host's devices. */
static int reduce_bucket(size_t start, size_t len, void *ud)
{
    return fl_wk_devices_reduce_range(ud, start, len);
}

/* One exchange per device, each on its own sub-communicator. */
static int per_device_exchanges(trainer_t *tr, fl_wk_local_t local, bool pieces)
{
    const fl_wk_train_opts_t *o = tr->o;
    int L = o->replicas;
    int rc;
    /* Device j's connection: column j of every rank (hybrid), or member r * L + j of one ring
     * of all devices (flat, the sampler's replica order). */
    int colors[FL_DEV_MAX_DEVICES];
    int keys[FL_DEV_MAX_DEVICES];
    for (int j = 0; j < L; j++) {
        colors[j] = local == FL_WK_LOCAL_NONE ? 0 : j;
        keys[j] = local == FL_WK_LOCAL_NONE ? tr->rank * L + j : tr->rank;
    }
    if ((rc = fl_comm_split(tr->comm, L, colors, keys, tr->subs)) != FL_OK)
        return rc;
    tr->nsubs = L;
    if (pieces)
        return FL_OK; /* --shard grad: the columns carry pieces (shard.c), no buckets */
    tr->nx = L;
    for (int j = 0; j < L && rc == FL_OK; j++) {
        if (local == FL_WK_LOCAL_NONE)
            rc = fl_wk_xchg_create(tr->subs[j], o, fl_wk_devices_grad(tr->dev, j), 0, tr->np,
                                   &tr->xchg[j]);
        else
            rc = fl_wk_xchg_create(tr->subs[j], o, tr->grad, fl_shard_offset(tr->np, L, j),
                                   fl_shard_count(tr->np, L, j), &tr->xchg[j]);
        /* Two levels in host memory: each shard's exchange reduces its buckets as the backward
         * pass completes them (devices_overlap.c). */
        if (rc == FL_OK && local == FL_WK_LOCAL_SHARDS && o->overlap)
            fl_wk_xchg_set_prepare(tr->xchg[j], reduce_bucket, tr->dev);
    }
    if (rc == FL_OK && local == FL_WK_LOCAL_SHARDS)
        rc = fl_wk_devices_set_overlap(tr->dev, o->overlap);
    return rc;
}

/* What --shard can be combined with. */
static int check_shard(const trainer_t *tr, bool per_device)
{
    const fl_wk_train_opts_t *o = tr->o;
    if (o->shard == FL_WK_SHARD_NONE)
        return FL_OK;
    if (o->shard == FL_WK_SHARD_FULL && o->max_anchor > 0)
        return fl_fail(FL_EINVAL, "--shard full gathers every layer in the same order on every "
                                  "device: it does not combine with --max-anchor (El Che)");
    if (per_device && o->hierarchy == FL_WK_HIER_FLAT)
        return fl_fail(FL_EINVAL,
                       "--shard %s needs --hierarchy hybrid: a device's shard is its "
                       "column's",
                       fl_wk_shard_name(o->shard));
    if ((o->shard == FL_WK_SHARD_GRAD || o->shard == FL_WK_SHARD_FULL) && o->topk > 0 &&
        tr->comm != NULL)
        return fl_fail(FL_EINVAL,
                       "--shard %s reduce-scatters dense gradients: it does not "
                       "combine with --topk (use --shard hybrid)",
                       fl_wk_shard_name(o->shard));
    return FL_OK;
}

/* The parameters: --init's file, or the seeded initialisation. */
static int params_init(trainer_t *tr)
{
    const fl_wk_train_opts_t *o = tr->o;
    tr->np = fl_mlp_nparams(tr->m);
    tr->params = malloc(tr->np * sizeof(float));
    tr->grad = calloc(tr->np, sizeof(float));
    if (tr->params == NULL || tr->grad == NULL)
        return fl_fail(FL_ENOMEM, "out of memory for %zu parameters", tr->np);
    if (o->init_path != NULL && o->resume_dir != NULL)
        return fl_fail(FL_EINVAL, "--init and --resume: the checkpoint holds the parameters");
    if (o->init_path != NULL)
        return fl_mlp_load(tr->m, tr->params, o->init_path);
    fl_mlp_init(tr->m, tr->params, o->seed);
    return FL_OK;
}

/* What El Che and the local-SGD policies can be combined with. */
static int check_policy(const trainer_t *tr, bool per_device)
{
    const fl_wk_train_opts_t *o = tr->o;
    if (o->max_anchor > 0 && per_device && o->hierarchy == FL_WK_HIER_FLAT &&
        o->policy != FL_WK_POLICY_ASYNC)
        return fl_fail(FL_EINVAL, "--max-anchor (El Che) needs --hierarchy hybrid: a flat ring "
                                  "exchanges every device's gradient on its own");
    bool local_sgd = o->policy == FL_WK_POLICY_CADENCE || o->policy == FL_WK_POLICY_ASYNC;
    const char *pname = o->policy == FL_WK_POLICY_ASYNC ? "async" : "cadence";
    if (local_sgd && o->max_anchor < 1)
        return fl_fail(FL_EINVAL,
                       "--policy %s needs --max-anchor N: the slowest device's "
                       "batches between averages",
                       pname);
    if (local_sgd && o->shard != FL_WK_SHARD_NONE)
        return fl_fail(FL_EINVAL,
                       "--policy %s: every device keeps its own optimizer, "
                       "--shard must be none",
                       pname);
    if (o->policy == FL_WK_POLICY_ASYNC && o->topk > 0)
        return fl_fail(FL_EINVAL, "--policy async averages dense deltas: it does not combine "
                                  "with --topk (use --policy cadence)");
    return FL_OK;
}

/* The devices of the process, after El Che's first plan. */
static int devices(trainer_t *tr, bool per_device, fl_wk_local_t local)
{
    const fl_wk_train_opts_t *o = tr->o;
    fl_wk_cadence_init(&tr->cad, o->replicas, o->max_anchor, o->overhead_target, o->speed_hint);
    if (o->policy != FL_WK_POLICY_SYNC) {
        /* Local SGD starts at the chosen period; the overhead target may shorten it. */
        tr->cad.anchor = o->max_anchor;
        fl_wk_cadence_plan(&tr->cad, 0.0, 0.0);
    }
    int rc =
        fl_wk_devices_create(tr->m, tr->train, o, tr->rank, tr->world, local, tr->grad, &tr->dev);
    if (rc == FL_OK)
        rc = check_shard(tr, per_device);
    if (rc == FL_OK && o->policy == FL_WK_POLICY_CADENCE)
        rc = fl_wk_devices_local_create(tr->dev, &o->opt);
    return rc;
}

/* How the gradients leave: --policy async's own averaging, one exchange, one per device, or
 * none (pieces: --shard grad and full reduce-scatter their columns instead). */
static int exchanges(trainer_t *tr, bool per_device, fl_wk_local_t local, bool pieces)
{
    const fl_wk_train_opts_t *o = tr->o;
    if (o->policy == FL_WK_POLICY_ASYNC) {
        /* Its own averaging on the job's communicator: no buckets. */
        tr->nx = 0;
        return fl_wk_async_create(tr->dev, o, tr->comm, tr->np, &tr->cad, &tr->async);
    }
    if (per_device)
        return per_device_exchanges(tr, local, pieces);
    tr->nx = pieces ? 0 : 1;
    return pieces ? FL_OK : fl_wk_xchg_create(tr->comm, o, tr->grad, 0, tr->np, &tr->xchg[0]);
}

/* The optimizer state: --shard full's pieces, or the shards of --shard none, grad, hybrid. */
static int state(trainer_t *tr, bool per_device, bool pieces)
{
    const fl_wk_train_opts_t *o = tr->o;
    fl_comm_t **cols = !pieces ? NULL : per_device ? tr->subs : &tr->comm;
    if (o->shard != FL_WK_SHARD_FULL)
        return fl_wk_shards_create(o, tr->np, tr->rank, tr->world, cols, &tr->shards);
    int rc = fl_wk_full_create(o, tr->rank, tr->world, cols, tr->params, &tr->full);
    if (rc == FL_OK)
        fl_wk_devices_set_full(tr->dev, tr->full);
    return rc;
}

/* Top-k where the gradient is: on the device, when each exchange takes one device's own
 * gradient (one device per host, or flat) and the step's gradient is not combined on the host
 * first (El Che, local SGD). On cpu the host's error feedback is the device's. Two levels on
 * the devices' first leg after the pass: device j holds its shard reduced
 * (fl_wk_devices_shards_on_devices), so its top-k runs there too; overlapped, the layers'
 * buckets are spread over the devices, and the shards are reduced on the host's side. */
static int topk_on_devices(trainer_t *tr, fl_wk_local_t local)
{
    const fl_wk_train_opts_t *o = tr->o;
    int L = o->replicas;
    bool own = (tr->nx == 1 && L == 1) || (tr->nx == L && local == FL_WK_LOCAL_NONE);
    bool shards = tr->nx == L && L > 1 && local == FL_WK_LOCAL_SHARDS && !o->overlap &&
                  fl_wk_devices_can_keep_shards(tr->dev);
    if (!(own || shards) || o->topk <= 0 || o->device == FL_DEV_CPU ||
        o->policy != FL_WK_POLICY_SYNC || o->max_anchor != 0)
        return FL_OK;
    int rc = FL_OK;
    for (int j = 0; j < tr->nx && rc == FL_OK; j++)
        rc = fl_wk_xchg_on_device(tr->xchg[j], fl_wk_devices_rdev(tr->dev, j));
    if (rc == FL_OK && shards)
        fl_wk_devices_shards_on_devices(tr->dev);
    return rc;
}

/* The metrics registry, the timeline's tracks and the metrics file. */
static int observe(trainer_t *tr)
{
    const fl_wk_train_opts_t *o = tr->o;
    fl_wk_obs_init(&tr->obs, o->obs, tr->rank);
    for (int j = 0; j < tr->nx; j++)
        fl_wk_xchg_set_track(tr->xchg[j], FL_WK_TRACK_EXCHANGE + j);
    if (o->timeline != NULL) {
        char name[64];
        for (int j = 0; j < o->replicas; j++) {
            snprintf(name, sizeof name, "rank %d device %d", tr->rank, j);
            fl_obs_timeline_track(o->timeline, FL_WK_TRACK_DEVICE + j, name);
        }
        for (int j = 0; j < tr->nx; j++) {
            snprintf(name, sizeof name, "rank %d exchange %d", tr->rank, j);
            fl_obs_timeline_track(o->timeline, FL_WK_TRACK_EXCHANGE + j, name);
        }
        snprintf(name, sizeof name, "rank %d step", tr->rank);
        fl_obs_timeline_track(o->timeline, FL_WK_TRACK_STEP, name);
    }
    return fl_wk_report_open(o, tr->rank, tr->world, &tr->metrics);
}

int fl_wk_trainer_setup(trainer_t *tr)
{
    const fl_wk_train_opts_t *o = tr->o;
    int L = o->replicas;
    bool per_device = tr->comm != NULL && L > 1;
    fl_wk_local_t local = !per_device                       ? FL_WK_LOCAL_MEAN
                          : o->hierarchy == FL_WK_HIER_FLAT ? FL_WK_LOCAL_NONE
                                                            : FL_WK_LOCAL_SHARDS;
    bool pieces =
        (o->shard == FL_WK_SHARD_GRAD || o->shard == FL_WK_SHARD_FULL) && tr->comm != NULL;
    int rc = params_init(tr);
    if (rc == FL_OK)
        rc = check_policy(tr, per_device);
    if (rc == FL_OK)
        rc = devices(tr, per_device, local);
    if (rc == FL_OK)
        rc = exchanges(tr, per_device, local, pieces);
    if (rc == FL_OK)
        rc = state(tr, per_device, pieces);
    if (rc == FL_OK)
        rc = topk_on_devices(tr, local);
    return rc == FL_OK ? observe(tr) : rc;
}

void fl_wk_trainer_teardown(trainer_t *tr, int rc, const char *why)
{
    fl_error_keep_begin();
    for (int j = 0; j < tr->nx; j++)
        fl_wk_xchg_destroy(&tr->xchg[j]);
    fl_wk_shards_destroy(&tr->shards);
    fl_wk_full_destroy(&tr->full);
    fl_wk_async_destroy(&tr->async);
    for (int j = 0; j < tr->nsubs; j++)
        fl_comm_destroy(&tr->subs[j]);
    /* No thread uses the communicator any more: a failure is told to the job now, before the
     * devices are freed (a hung kernel can hold that up until it ends). */
    if (rc != FL_OK && tr->comm != NULL)
        fl_comm_abort(tr->comm, rc, why);
    fl_wk_devices_destroy(&tr->dev);
    free(tr->params);
    free(tr->grad);
    if (tr->metrics != NULL)
        fclose(tr->metrics);
    fl_error_keep_end();
}

/* Device t's optimizer, whichever --shard holds it (checkpoints). */
void fl_wk_trainer_optimizers(trainer_t *tr, fl_opt_t **opts)
{
    for (int t = 0; t < FL_DEV_MAX_DEVICES; t++)
        opts[t] = tr->full != NULL ? (t < tr->o->replicas ? fl_wk_full_opt(tr->full, t) : NULL)
                  : t < fl_wk_shards_count(tr->shards) ? fl_wk_shards_opt(tr->shards, t)
                                                       : NULL;
}

/* The parameters (and with them the optimizer) go to the devices and stay there under
 * --policy sync: the whole model's state on every device (--shard none, as DDP), or device j's
 * range of it (--shard hybrid and grad: each device steps its range and writes it back for the
 * all-gather). --shard full's pieces and local SGD keep their host update. */
int fl_wk_trainer_keep(trainer_t *tr, fl_opt_t *const *opts)
{
    const fl_wk_train_opts_t *o = tr->o;
    if (o->policy != FL_WK_POLICY_SYNC || o->shard == FL_WK_SHARD_FULL)
        return FL_OK;
    bool ranges = o->shard != FL_WK_SHARD_NONE;
    size_t off[FL_DEV_MAX_DEVICES];
    size_t len[FL_DEV_MAX_DEVICES];
    int n = fl_wk_shards_count(tr->shards);
    if (ranges && n != o->replicas)
        return fl_fail(FL_EINVAL, "--shard %s: %d optimizer ranges for %d devices",
                       fl_wk_shard_name(o->shard), n, o->replicas);
    for (int t = 0; ranges && t < n; t++)
        fl_wk_shards_range(tr->shards, t, &off[t], &len[t]);
    bool keep = !ranges && tr->comm == NULL && o->replicas == 1 && o->max_anchor == 0;
    int rc = fl_wk_devices_keep(tr->dev, &o->opt, tr->params, ranges ? off : NULL,
                                ranges ? len : NULL, keep);
    /* A resumed optimizer state goes with them. */
    for (int t = 0; rc == FL_OK && o->resume_dir != NULL && t < (ranges ? n : 1); t++)
        rc = fl_wk_devices_opt_load(tr->dev, ranges ? t : -1, opts[t]);
    tr->resident = rc == FL_OK;
    tr->resident_ranges = rc == FL_OK && ranges;
    tr->keep_grad = rc == FL_OK && keep;
    return rc;
}

void fl_wk_rank_state_of(const fl_wk_train_opts_t *o, int nx, fl_wk_xchg_t *const *xchg,
                         fl_wk_devices_t *dev, fl_wk_async_t *async, fl_wk_rank_state_t *s)
{
    memset(s, 0, sizeof *s);
    s->nx = nx;
    s->xchg = xchg;
    bool local = o->policy != FL_WK_POLICY_SYNC;
    for (int j = 0; local && j < o->replicas; j++) {
        fl_opt_t *opt = async != NULL ? fl_wk_async_opt(async, j) : fl_wk_devices_local_opt(dev, j);
        if (opt != NULL)
            s->opt[s->nopt++] = opt;
    }
}
