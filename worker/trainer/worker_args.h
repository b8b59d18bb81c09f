/* flodl-worker's command line (worker_main.c, worker_flags.c): the long options' codes and
 * what they set. Private to the flodl-worker program. */
#ifndef FL_WK_WORKER_ARGS_H
#define FL_WK_WORKER_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "fl_coll.h"
#include "fl_core.h"
#include "fl_wk.h"

enum {
    O_MODE = 1000, O_TRAIN_IMAGES, O_TRAIN_LABELS, O_TEST_IMAGES, O_TEST_LABELS, O_TRAIN_CSV,
    O_TEST_CSV, O_DATA_SEED, O_LAYERS, O_BATCH, O_EPOCHS, O_SEED, O_NO_SHUFFLE, O_OPTIM,
    O_SCALE_LR, O_OVERLAP, O_FIRST_LEG, O_LZ4, O_RECONNECT, O_MAX_NORM, O_REPLICAS, O_HIER, O_PS_CLIENTS, O_SHARD, O_POLICY, O_MPORT, O_MBIND, O_TIMELINE, O_CURVE, O_INSECURE, O_CKPT, O_RESUME, O_RESUME_ANY, O_ANCHOR, O_RUN_AHEAD, O_OVERHEAD, O_HINT, O_THROTTLE, O_DEVICE, O_GPUS, O_TOPK, O_TOPK_WARMUP, O_TOPK_VALUES, O_BUCKET, O_INIT,
    O_SAVE, O_SAVE_EVERY, O_METRICS, O_PROGRESS, O_QUIET, O_SIZE, O_STEPS, O_DTYPE, O_OP, O_HELP,
    O_VERSION
};

typedef struct wargs {
    fl_comm_opts_t co;
    fl_wk_train_opts_t to;
    fl_wk_drill_opts_t d;
    int mode; /* -1: not given */
    const char *drill_flag; /* a drill-only flag that was given, if any */
    const char *optim_flag; /* an optimizer flag that was given, if any */
    const char *ps_flag;    /* a parameter-server flag that was given, if any */
    int lz4;
    int reconnect_ms;
    const char *train_images, *train_labels, *test_images, *test_labels;
    const char *train_csv, *test_csv;
    uint64_t data_seed;
    int metrics_port; /* -1: off */
    const char *metrics_bind;
    const char *resume_if_any; /* --resume-if-any: resume_dir when it holds a manifest */
    bool insecure;             /* --insecure */
    const char *env_curve;     /* FLODL_CURVE_DIR */
    bool env_insecure;         /* FLODL_INSECURE=1 */
    const char *timeline_path;
    const char *device;        /* --device (NULL: auto) */
    const char *gpus;          /* --gpus */
    bool replicas_given;       /* --cpu-replicas */
    bool momentum_given;       /* --momentum (the default 0.9 is SGD's alone) */
    char settings[FL_SETTINGS_MAX]; /* what every rank must share, checked at rendezvous */
} wargs_t;

/* Applies one flag (ch: its code, name: its long name, v: its value) to a: FL_OK, or FL_EINVAL
 * with the detail set (naming the flag and what it takes). */
int fl_wk_args_apply(wargs_t *a, int ch, const char *name, const char *v);

#endif
