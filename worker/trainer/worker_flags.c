/* flodl-worker's flags into its arguments (worker_args.h): each flag's value checked and set,
 * or refused with one line naming the flag and what it takes. Reading the command line and the
 * environment, and what runs after, stay in worker_main.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker_args.h"

static int num(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end != '\0' || !(x >= lo && x <= hi))
        return fl_fail(FL_EINVAL, "%s: '%s' is not a number in [%g, %g]", flag, v, lo, hi);
    *out = x;
    return FL_OK;
}

/* DEVICE:RATIO (--speed-hint, --throttle) into table[DEVICE]. */
static int device_ratio(const char *flag, const char *v, double *table)
{
    char *end = NULL;
    long dev = strtol(v, &end, 10);
    if (end == v || *end != ':' || dev < 0 || dev > 63)
        return fl_fail(FL_EINVAL, "%s: '%s' is not DEVICE:RATIO with DEVICE in 0..63", flag, v);
    return num(flag, end + 1, 0.01, 1000.0, &table[dev]);
}

int fl_wk_args_apply(wargs_t *a, int ch, const char *name, const char *v)
{
    long n;
    double x = 0.0; /* set by fl_cli_double() on success; zeroed for -O2 -Werror */
    size_t z;
    int rc = FL_OK;
    fl_wk_train_opts_t *t = &a->to;
    switch (ch) {
    case O_MODE:
        if (strcmp(v, "local") == 0)
            a->mode = FL_WK_MODE_LOCAL;
        else if (strcmp(v, "ring") == 0)
            a->mode = FL_WK_MODE_RING;
        else if (strcmp(v, "ps") == 0)
            a->mode = FL_WK_MODE_PS;
        else if (strcmp(v, "drill") == 0)
            a->mode = FL_WK_MODE_DRILL;
        else
            rc = fl_fail(FL_EINVAL, "--mode: '%s' is not one of local|ring|ps|drill", v);
        break;
    case O_TRAIN_IMAGES: a->train_images = v; break;
    case O_TRAIN_LABELS: a->train_labels = v; break;
    case O_TEST_IMAGES: a->test_images = v; break;
    case O_TEST_LABELS: a->test_labels = v; break;
    case O_TRAIN_CSV: a->train_csv = v; break;
    case O_TEST_CSV: a->test_csv = v; break;
    case O_DATA_SEED:
        if ((rc = fl_cli_long("--data-seed", v, 0, 0x7fffffffL, &n)) == FL_OK)
            a->data_seed = (uint64_t)n;
        break;
    case O_LAYERS: rc = fl_mlp_parse(v, &t->shape); break;
    case O_BATCH:
        if ((rc = fl_cli_long("--batch-size", v, 1, 1 << 20, &n)) == FL_OK)
            t->batch = (size_t)n;
        break;
    case O_EPOCHS:
        if ((rc = fl_cli_long("--epochs", v, 0, 1000000, &n)) == FL_OK)
            t->epochs = (int)n;
        break;
    case O_SEED:
        if ((rc = fl_cli_long("--seed", v, 0, 0x7fffffffL, &n)) == FL_OK)
            t->seed = (uint64_t)n;
        break;
    case O_NO_SHUFFLE: t->shuffle = false; break;
    case O_OPTIM:
        rc = fl_cli_optim_flag(name, v, &t->opt, &t->lr);
        a->momentum_given = a->momentum_given || strcmp(name, "momentum") == 0;
        break;
    case O_LZ4: a->lz4 = 1; break;
    case O_RECONNECT:
        if ((rc = fl_cli_long("--reconnect-timeout", v, 0, 86400000, &n)) == FL_OK)
            a->reconnect_ms = (int)n;
        break;
    case O_SCALE_LR: t->scale_lr = true; break;
    case O_OVERLAP: t->overlap = true; break;
    case O_MAX_NORM: rc = num("--max-grad-norm", v, 0.0, 1e12, &t->max_norm); break;
    case O_REPLICAS:
        if ((rc = fl_cli_long("--cpu-replicas", v, 1, FL_DEV_MAX_DEVICES, &n)) == FL_OK) {
            t->replicas = (int)n;
            a->replicas_given = true;
        }
        break;
    case O_HIER:
        if (strcmp(v, "hybrid") == 0)
            t->hierarchy = FL_WK_HIER_HYBRID;
        else if (strcmp(v, "flat") == 0)
            t->hierarchy = FL_WK_HIER_FLAT;
        else
            rc = fl_fail(FL_EINVAL, "--hierarchy: '%s' is not one of hybrid|flat", v);
        break;
    case O_FIRST_LEG:
        if (strcmp(v, "auto") == 0)
            t->first_leg = FL_WK_LEG_AUTO;
        else if (strcmp(v, "devices") == 0)
            t->first_leg = FL_WK_LEG_DEVICES;
        else if (strcmp(v, "host") == 0)
            t->first_leg = FL_WK_LEG_HOST;
        else
            rc = fl_fail(FL_EINVAL, "--first-leg: '%s' is not one of auto|devices|host", v);
        break;
    case O_PS_CLIENTS:
        if (strcmp(v, "device") == 0)
            t->ps_host_client = false;
        else if (strcmp(v, "host") == 0)
            t->ps_host_client = true;
        else
            rc = fl_fail(FL_EINVAL, "--ps-clients: '%s' is not one of device|host", v);
        break;
    case O_POLICY:
        if (strcmp(v, "sync") == 0)
            t->policy = FL_WK_POLICY_SYNC;
        else if (strcmp(v, "cadence") == 0)
            t->policy = FL_WK_POLICY_CADENCE;
        else if (strcmp(v, "async") == 0)
            t->policy = FL_WK_POLICY_ASYNC;
        else
            rc = fl_fail(FL_EINVAL, "--policy: '%s' is not one of sync|cadence|async", v);
        break;
    case O_CKPT: t->checkpoint_dir = v; break;
    case O_MPORT:
        if ((rc = fl_cli_long("--metrics-port", v, 0, 65535, &n)) == FL_OK)
            a->metrics_port = (int)n;
        break;
    case O_MBIND: a->metrics_bind = v; break;
    case O_TIMELINE: a->timeline_path = v; break;
    case O_CURVE: a->co.curve_dir = v; break;
    case O_INSECURE: a->insecure = true; break;
    case O_RESUME: t->resume_dir = v; break;
    case O_RESUME_ANY: a->resume_if_any = v; break;
    case O_SHARD:
        if (strcmp(v, "none") == 0)
            t->shard = FL_WK_SHARD_NONE;
        else if (strcmp(v, "grad") == 0)
            t->shard = FL_WK_SHARD_GRAD;
        else if (strcmp(v, "hybrid") == 0)
            t->shard = FL_WK_SHARD_HYBRID;
        else if (strcmp(v, "full") == 0)
            t->shard = FL_WK_SHARD_FULL;
        else
            rc = fl_fail(FL_EINVAL, "--shard: '%s' is not one of none|grad|full|hybrid", v);
        break;
    case O_ANCHOR:
        if ((rc = fl_cli_long("--max-anchor", v, 0, 4096, &n)) == FL_OK)
            t->max_anchor = (int)n;
        break;
    case O_RUN_AHEAD:
        if ((rc = fl_cli_long("--run-ahead", v, 0, 16, &n)) == FL_OK)
            t->run_ahead = (int)n;
        break;
    case O_OVERHEAD: rc = num("--overhead-target", v, 1e-4, 100.0, &t->overhead_target); break;
    case O_HINT: rc = device_ratio("--speed-hint", v, t->speed_hint); break;
    case O_THROTTLE: rc = device_ratio("--throttle", v, t->throttle); break;
    case O_DEVICE: a->device = v; break;
    case O_GPUS: a->gpus = v; break;
    case O_TOPK: rc = num("--topk", v, 0.0, 1.0, &t->topk); break;
    case O_TOPK_WARMUP:
        if ((rc = fl_cli_long("--topk-warmup", v, 0, 1000, &n)) == FL_OK)
            t->topk_warmup = (int)n;
        break;
    case O_TOPK_VALUES:
        if (fl_dtype_parse(v, &t->topk_values) != FL_OK ||
            (t->topk_values != FL_FLOAT32 && t->topk_values != FL_FLOAT16 &&
             t->topk_values != FL_BFLOAT16))
            rc = fl_fail(FL_EINVAL, "--topk-values: '%s' is not one of float32|float16|bfloat16",
                         v);
        break;
    case O_BUCKET:
        if ((rc = num("--bucket-mb", v, 0.0, 4096.0, &x)) == FL_OK)
            t->bucket_bytes = (size_t)(x * 1048576.0);
        break;
    case O_INIT: t->init_path = v; break;
    case O_SAVE: t->save_path = v; break;
    case O_SAVE_EVERY: rc = fl_cli_long("--save-every", v, 1, 1L << 40, &t->save_every); break;
    case O_METRICS: t->metrics_path = v; break;
    case O_PROGRESS: rc = num("--progress", v, 0.0, 86400.0, &t->progress_s); break;
    case O_QUIET:
        t->quiet = true;
        a->d.quiet = true;
        break;
    case O_SIZE:
        if ((rc = fl_cli_size("--size", v, 0, (size_t)16 << 30, &z)) == FL_OK)
            a->d.bytes = z;
        break;
    case O_STEPS:
        if ((rc = fl_cli_long("--steps", v, 0, 100000000, &n)) == FL_OK)
            a->d.steps = (int)n;
        break;
    case O_DTYPE:
        if (fl_dtype_parse(v, &a->d.dtype) != FL_OK ||
            !(a->d.dtype == FL_FLOAT32 || a->d.dtype == FL_FLOAT16 ||
              a->d.dtype == FL_BFLOAT16 || a->d.dtype == FL_FLOAT64))
            rc = fl_fail(FL_EINVAL, "--dtype: '%s' is not one of float32|float16|bfloat16|float64",
                         v);
        break;
    case O_OP:
        if (strcmp(v, "sum") == 0)
            a->d.op = FL_SUM;
        else if (strcmp(v, "avg") == 0)
            a->d.op = FL_AVG;
        else
            rc = fl_fail(FL_EINVAL, "--op: '%s' is not one of sum|avg", v);
        break;
    default: rc = fl_fail(FL_EINVAL, "unknown flag"); break;
    }
    return rc;
}

