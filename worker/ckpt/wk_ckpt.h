/* worker/ckpt: checkpoints of a job in any layout: every rank's ranges and the manifest
 * (shard_ckpt.c), and what a rank holds that no range file does (ckpt_rank.c). */
#ifndef FL_WK_CKPT_H
#define FL_WK_CKPT_H

#include "wk_xchg.h"

/* ---- a rank's own state in checkpoints (ckpt_rank.c) ---- */

/* What a rank holds that no range file does: the error-feedback residuals of its exchanges
 * (top-k), and local SGD's optimizer of each device (--policy cadence and async). */
typedef struct fl_wk_rank_state {
    int nx;
    struct fl_wk_xchg *const *xchg; /* nx exchanges (those without residuals are skipped) */
    int nopt;
    fl_opt_t *opt[FL_DEV_MAX_DEVICES]; /* nopt devices' own optimizers (0: none) */
} fl_wk_rank_state_t;

/* Writes s to dir/state-s<step>-r<rank>.safetensors (nothing when s holds nothing), with the
 * layout it was taken in (hosts: world, devices, hierarchy). FL_OK or FL_EIO naming the path. */
int fl_wk_ckpt_rank_save(const char *dir, int rank, int world, const fl_wk_train_opts_t *o,
                         long step, const fl_wk_rank_state_t *s);

/* Restores s from the file of rank and step in dir when it was taken in this layout (the same
 * hosts, devices, hierarchy and exchange ranges); otherwise (another layout, an older
 * checkpoint without the file) s keeps its fresh state, and *restored says which. FL_OK,
 * FL_EPROTO (a corrupt file), FL_ENONFINITE, the device's error. */
int fl_wk_ckpt_rank_load(const char *dir, int rank, int world, const fl_wk_train_opts_t *o,
                         long step, fl_wk_rank_state_t *s, bool *restored);

/* --resume: fl_wk_ckpt_rank_load from o->resume_dir, rank 0 saying so (unless quiet) when what s
 * holds starts afresh. Its errors. */
int fl_wk_ckpt_rank_resume(const fl_wk_train_opts_t *o, int rank, int world, long step,
                           fl_wk_rank_state_t *s);

/* --mode ps (ckpt_rank.c): the worker's residual of its pushes at `step` (the server's), in
 * dir/state-s<step>-r<rank>.safetensors, this rank's files of other steps but `keep` removed;
 * and restored from the file of `step` when there is one of this length (*restored says). FL_OK,
 * FL_EIO naming the path, FL_EPROTO (a corrupt file), FL_ENONFINITE. */
int fl_wk_ckpt_ef_save(const char *dir, int rank, long step, long keep, const fl_cmp_ef_t *ef);
int fl_wk_ckpt_ef_load(const char *dir, int rank, long step, fl_cmp_ef_t *ef, bool *restored);
/* The same with nef residuals, one per device client (ef.0 .. ef.<nef-1>, and the file says
 * how many and where each starts): restored only into the same split (*restored false
 * otherwise, and then nothing changed). nef 1 is the file of the two calls above. */
int fl_wk_ckpt_efs_save(const char *dir, int rank, long step, long keep,
                        const fl_cmp_ef_t *const *ef, int nef);
int fl_wk_ckpt_efs_load(const char *dir, int rank, long step, fl_cmp_ef_t *const *ef, int nef,
                        bool *restored);

/* mkdir -p: 0, or -1 with errno. */
int fl_wk_ckpt_mkdirs(const char *dir);

/* ---- sharded checkpoints (shard_ckpt.c) ---- */

/* A range of the flat parameters a rank owns with its optimizer state, as checkpoints name
 * them: under --shard none, grad and hybrid one per device; under full one per device and
 * layer (the padding left out). */
typedef struct fl_wk_range {
    int id;     /* its file in a checkpoint */
    int dev;    /* the device whose optimizer holds its state */
    size_t off; /* [off, off + len) of the flat parameters */
    size_t len;
    size_t at;      /* where it starts in that optimizer's buffers */
    size_t opt_len; /* the optimizer's length */
} fl_wk_range_t;
#define FL_WK_MAX_RANGES (FL_DEV_MAX_DEVICES * FL_MLP_MAX_LAYERS)

/* Rank's ranges under o->shard (world: hosts exchanging pieces, 1 on one host), into out
 * (FL_WK_MAX_RANGES entries): how many. A pure function, so rank 0 can name every rank's. */
int fl_wk_ranges(const fl_wk_train_opts_t *o, size_t np, int world, int rank, fl_wk_range_t *out);

/* Writes this rank's ranges (parameters from params, optimizer state from opts[device]) to
 * dir/shard-s<step>-r<rank>-d<id>.safetensors, then (after every rank wrote, comm may be NULL on
 * one host) rank 0 writes dir/manifest.safetensors naming every range of the job and the job's
 * samples so far (the schedule's position), atomically; rank 0 then removes older steps' files,
 * the previous step's kept. own (may be NULL): this rank's own state, written beside its ranges
 * (fl_wk_ckpt_rank_save). Every rank learns whether every rank succeeded. FL_OK, FL_EIO naming
 * the path, or a collective's error. */
int fl_wk_ckpt_save(const char *dir, fl_comm_t *comm, int rank, int world,
                    const fl_wk_train_opts_t *o, const float *params, fl_opt_t *const *opts,
                    const fl_wk_rank_state_t *own, long step, int epoch, double samples);

/* Removes the temporary files that writers of this rank's checkpoint files (rank 0: and of
 * the manifest) left in dir when they were killed, unless their pid runs (fl_st_clean_tmp),
 * saying so on stdout unless quiet. Called at start, before this rank writes or reads there;
 * other ranks' files are theirs to clean (on shared storage their writers' pids are not ours
 * to check). */
void fl_wk_ckpt_clean(const char *dir, int rank, bool quiet);

/* Loads the checkpoint in dir into another layout if need be (other hosts, devices or
 * --shard): all parameters, and the optimizer state of this rank's ranges (opts[device])
 * assembled from the saved ranges that overlap them. *step, *epoch and *samples: where it was
 * taken. FL_OK; FL_EINVAL (a model or optimizer that differs, naming both); FL_EPROTO (a missing
 * or corrupt file, ranges that do not cover the parameters); FL_EIO. */
int fl_wk_ckpt_load(const char *dir, const fl_wk_train_opts_t *o, int world, int rank,
                    float *params, fl_opt_t *const *opts, long *step, int *epoch, double *samples);

#endif
