/* Private to server/: the parameter server's pieces below the sockets. A shard's state (its
 * parameters, optimizer, the clocks of the ranks and the consistency rules) in ps_state.c; the
 * fused average-and-update pass in ps_apply.c; payload decoding and checks in ps_payload.c;
 * checkpoints of a shard in ps_ckpt.c. None of them touches a socket. */
#ifndef FL_PS_INT_H
#define FL_PS_INT_H

#include <stdatomic.h>

#include <flodl/compress.h>
#include <flodl/ps.h>

#include "fl_core.h"
#include "fl_msg.h"
#include "fl_ps.h"

/* Payloads sit wherever ZeroMQ put them, at any offset: they are read through these
 * (plain loads on x86, and no misaligned-access undefined behaviour). */
typedef float ps_uf32 __attribute__((aligned(1), may_alias));
typedef uint16_t ps_u16 __attribute__((aligned(1), may_alias));

/* ---- one rank's gradient for a shard (what a push carries, decoded or not) ---- */

typedef enum ps_src_kind {
    PS_SRC_F32 = 0,  /* dense float32 */
    PS_SRC_F16 = 1,  /* dense IEEE half */
    PS_SRC_BF16 = 2, /* dense bfloat16 */
    PS_SRC_SPARSE = 3,
} ps_src_kind_t;

/* The apply pass's block, in elements; dense payloads in pieces split on multiples of it. */
#define PS_BLOCK 2048

typedef struct ps_src {
    ps_src_kind_t kind;
    const void *dense;                    /* dense and contiguous (chunk_elems 0): count elements */
    const void *chunk[FL_MSG_MAX_FRAMES]; /* dense in pieces: chunk c holds elements from
                                             c * chunk_elems on (a multiple of PS_BLOCK) */
    uint64_t chunk_elems;                 /* 0: contiguous */
    const uint32_t *idx; /* sparse: k indices into the shard, strictly ascending, < count */
    const float *val;
    size_t k;
    uint32_t batch;            /* samples behind it; 0: the rank skips the step */
    double maxabs;             /* largest |value| (checked finite on arrival) */
    void (*release)(void *ud); /* called once when the state no longer needs the memory */
    void *ud;
} ps_src_t;

/* Calls src's release hook (if any) and clears it. */
void fl_ps__src_release(ps_src_t *src);

/* Element `at` of a dense source of es-byte elements; [at, at + n) must lie in one piece
 * (blocks of PS_BLOCK from a multiple of PS_BLOCK do). */
static inline const void *ps_src_at(const ps_src_t *s, uint64_t at, size_t es)
{
    if (s->chunk_elems == 0)
        return (const char *)s->dense + at * es;
    uint64_t c = at / s->chunk_elems;
    return (const char *)s->chunk[c] + (at - c * s->chunk_elems) * es;
}

/* ---- the parameters, shared with replies in flight (copy on write) ---- */

typedef struct ps_params ps_params_t;

/* Takes a reference to the current parameters for a reply sent without copying; drop it with
 * fl_ps__params_unref (safe from any thread, e.g. ZeroMQ's I/O thread). */
ps_params_t *fl_ps__params_ref(ps_params_t *p);
void fl_ps__params_unref(ps_params_t *p);
const float *fl_ps__params_data(const ps_params_t *p);

/* ---- a shard's state (ps_state.c) ---- */

typedef struct ps_state ps_state_t;

typedef struct ps_state_opts {
    uint64_t count; /* parameters of the shard (0: an empty shard) */
    int world;      /* ranks that push */
    fl_ps_consistency_t consistency;
    uint32_t staleness; /* SSP */
    double async_scale; /* ASYNC and SSP: factor on each push (0: 1 / world) */
    fl_opt_opts_t opt;
    fl_lr_sched_t lr;
} ps_state_opts_t;

int fl_ps__state_create(const ps_state_opts_t *opts, ps_state_t **out);
void fl_ps__state_destroy(ps_state_t **st); /* releases every held source */

/* Initial parameters (count floats, copied): from rank 0's first push or an --init file.
 * Every rank's clock starts at step. FL_EINVAL when it already has parameters,
 * FL_ENONFINITE for a NaN or Inf (naming the index). */
int fl_ps__state_init(ps_state_t *st, const float *params, uint64_t step);

/* The state of a checkpoint: parameters, the optimizer's buffers (NULL: zeros) and step
 * count, the version and the ranks' clocks (nclocks entries; another number of ranks than
 * the job's sets every clock to the smallest saved one). FL_OK, FL_EINVAL, FL_ENONFINITE. */
int fl_ps__state_restore(ps_state_t *st, const float *params, const float *buf1, const float *buf2,
                         uint64_t opt_steps, uint64_t version, const uint64_t *clocks,
                         size_t nclocks);

bool fl_ps__state_ready(const ps_state_t *st);
uint64_t fl_ps__state_count(const ps_state_t *st);
uint64_t fl_ps__state_version(const ps_state_t *st);
/* Steps completed by the slowest rank (sync: the steps applied). */
uint64_t fl_ps__state_min_clock(const ps_state_t *st);
/* The next step rank pushes. */
uint64_t fl_ps__state_clock(const ps_state_t *st, int rank);
const uint64_t *fl_ps__state_clocks(const ps_state_t *st);
/* Steps skipped because the combined gradient overflowed float32. */
uint64_t fl_ps__state_skipped(const ps_state_t *st);
/* The current parameters (a reference for a reply: fl_ps__params_ref). NULL before init. */
ps_params_t *fl_ps__state_params(ps_state_t *st);
/* The optimizer, for checkpoints. */
const fl_opt_t *fl_ps__state_opt(const ps_state_t *st);

/* fl_ps__state_check_push's answer to a push of the step the rank pushed last (a retry): taken
 * already, to be acknowledged and ignored. */
#define PS_PUSH_DUPLICATE 1

/* Async: the most steps a rank may jump ahead of its last push. */
#define PS_MAX_STEP_JUMP 1000000

/* May rank push step now? FL_OK, PS_PUSH_DUPLICATE (its last step again), or FL_EINVAL with
 * why (no parameters yet; an older step; sync: not the shard's current step; SSP: beyond the
 * staleness bound, naming the slowest rank; async: an absurd jump). */
int fl_ps__state_check_push(const ps_state_t *st, int rank, uint64_t step, char *why, size_t cap);

/* Takes rank's gradient for step (after fl_ps__state_check_push said yes). The state owns src
 * from here on (it calls src->release once done). Sync: held until every rank pushed the
 * step, then averaged in rank order, weighted by batch counts, and applied once; async and
 * SSP: applied now, scaled. *updated: a new version exists (pulls may be answered). FL_OK, or
 * FL_EINVAL for a bad learning rate from the schedule. */
int fl_ps__state_push(ps_state_t *st, int rank, uint64_t step, ps_src_t *src, bool *updated);

/* May rank pull the parameters for computing step now? latest: whatever is there once the
 * shard has parameters. FL_OK (ready), FL_ETIMEDOUT (not yet: *blocker is the rank waited
 * for, *blocker_step its clock), FL_EINVAL with why (a pull for a step beyond the rank's own
 * pushes, which could never be answered). */
int fl_ps__state_check_pull(const ps_state_t *st, int rank, uint64_t step, bool latest,
                            int *blocker, uint64_t *blocker_step, char *why, size_t cap);

/* ---- the fused average-and-update pass (ps_apply.c) ---- */

/* One optimizer step over count parameters with the gradient
 *   g[i] = ((sum over srcs, in order, of weight[s] * value_s[i]) * scale) / divisor
 * in float32, each operation rounded (a weight, scale or divisor of 1 is skipped), computed
 * block by block (sparse sources add at their indices) and fed to the optimizer's range step,
 * so the gradient never exists whole. params is updated in place. The caller began the
 * optimizer step (fl_opt_step_begin). */
void fl_ps__apply(fl_opt_t *opt, float *params, uint64_t count, const ps_src_t *const *srcs,
                  const float *weight, size_t nsrc, float scale, float divisor);

/* ---- payloads (ps_payload.c) ---- */

/* Turns a push's payload frames into a source: dense float32/float16/bfloat16 of count
 * elements in nframes pieces (every piece but the last of the same element count, a multiple
 * of PS_BLOCK; raw: pointing into the frames, no copy; lz4: each piece decompressed into one
 * buffer at *owned), or one sparse block of a tensor of count entries (decoded into *owned).
 * Checks every size, index and value (NaN or Inf refused, naming the index) before anything
 * is used; sets src->maxabs. *owned (NULL when nothing was allocated) is the caller's to free
 * once the source is released; the caller sets src->batch and src->release. FL_OK, or
 * FL_EPROTO / FL_ENONFINITE / FL_ENOMEM with the detail (then *owned is NULL). */
int fl_ps__payload_decode(fl_cmp_ws_t *ws, const void *const *data, const size_t *bytes,
                          const fl_msg_frame_t *desc, size_t nframes, uint64_t count, ps_src_t *src,
                          void **owned);

/* Encodes count parameters with lz4 into a new buffer when that shrinks them: FL_OK with *out
 * (malloc'd, *out_len bytes) or *out = NULL when lz4 does not pay; FL_ENOMEM. */
int fl_ps__payload_lz4(const float *params, uint64_t count, void **out, size_t *out_len);

/* ---- the --init file (ps_init.c) ---- */

/* Opens and checks a parameter server's --init file: float32 tensors, every value finite, at
 * least one parameter. FL_OK with *out (close it with fl_st_close) and the parameters in
 * *param_count; FL_EINVAL naming the file and, for a bad value, the tensor and its index. */
int fl_ps__init_open(const char *path, fl_st_file_t **out, uint64_t *param_count);

/* Its tensors as the ranks describe their model (fl_model_shapes, in file order): the
 * signature of their text, and in shapes (cap bytes) a first entry FL_PS_INIT_FILE_TAG + path
 * (outside the signature: the coordinator names the file with it) then the text, cut to fit.
 * FL_OK or FL_ENOMEM. */
int fl_ps__init_shapes(const fl_st_file_t *f, const char *path, uint64_t *signature, char *shapes,
                       size_t cap);

/* ---- checkpoints (ps_ckpt.c) ---- */

typedef struct ps_ckpt_meta {
    uint32_t shard;
    uint32_t num_shards;
    uint64_t offset; /* the shard's key range */
    uint64_t count;
    uint64_t param_count; /* of the whole model */
    uint64_t step;        /* the step the file is named after (steps completed) */
    uint64_t version;     /* updates applied */
    uint64_t opt_steps;
    fl_opt_kind_t opt;
    fl_ps_consistency_t consistency;
} ps_ckpt_meta_t;

/* An open checkpoint: the tensors point into the file, valid until fl_ps__ckpt_close. */
typedef struct ps_ckpt {
    char path[4096];
    fl_st_file_t *file;
    ps_ckpt_meta_t meta;
    const float *params;
    const float *buf1; /* NULL when the optimizer has none */
    const float *buf2;
    const uint64_t *clocks;
    size_t nclocks;
} ps_ckpt_t;

void fl_ps__ckpt_meta_init(ps_ckpt_meta_t *m);

/* Writes a shard's checkpoint for m->step atomically under dir (created if missing), then
 * removes all but the newest `keep` of this shard (keep <= 0: none removed). FL_OK, FL_EINVAL,
 * FL_EIO naming the path. */
int fl_ps__ckpt_write(const char *dir, const ps_ckpt_meta_t *m, const float *params,
                      const float *buf1, const float *buf2, const uint64_t *clocks, size_t nclocks,
                      int keep);

/* Steps of this shard's checkpoint files under dir, newest first (at most cap; none when dir
 * does not exist). *foreign (may be NULL) gets the shard count of files written by a job with
 * another number of shards, 0 when there are none. FL_OK, FL_EIO, FL_ENOMEM. */
int fl_ps__ckpt_list(const char *dir, uint32_t shard, uint32_t num_shards, uint64_t *steps,
                     size_t cap, size_t *n, uint32_t *foreign);

/* Removes the temporary files that writers of shards first..first + count - 1 (of
 * num_shards) killed mid-checkpoint left in dir, unless their pid runs (fl_st_clean_tmp: the
 * caller writes none of them yet). Other shards' files, served by other processes that may
 * share dir, are left alone. FL_OK with what was removed, FL_EIO. */
int fl_ps__ckpt_clean(const char *dir, uint32_t first, uint32_t count, uint32_t num_shards,
                      size_t *nfiles, uint64_t *nbytes);

/* Opens and checks the checkpoint of one step: CRC, format, metadata naming this shard and
 * step, tensor shapes and types. FL_OK, FL_EPROTO naming the file and the problem, FL_EIO. */
int fl_ps__ckpt_open(const char *dir, uint32_t shard, uint32_t num_shards, uint64_t step,
                     ps_ckpt_t *out);
void fl_ps__ckpt_close(ps_ckpt_t *c);

/* The steps of this shard whose checkpoint opens cleanly, newest first; the bad ones are
 * logged (with why) and skipped. *param_count: the model size they agree on (0 in: take the
 * newest file's). FL_EINVAL when dir holds only checkpoints of another shard count. */
int fl_ps__ckpt_valid_steps(const char *dir, uint32_t shard, uint32_t num_shards, fl_ctx_t *ctx,
                            uint64_t *steps, size_t cap, size_t *n, uint64_t *param_count);

/* ---- a shard: its thread, socket and state (ps_shard.c, ps_shard_msg.c) ---- */

typedef struct ps_shard ps_shard_t;

typedef struct ps_shard_conf {
    uint32_t num_shards;
    uint64_t offset; /* the shard's key range in the model */
    uint64_t count;
    uint64_t param_count;
    const char *job_id;
    uint64_t generation;
    const fl_msg_peer_t *peers; /* world entries (hosts, for texts); borrowed until destroy */
    ps_state_opts_t state;      /* count and world are the shard's and the job's */
    const char *ckpt_dir;       /* NULL: no checkpoints */
    int keep;                   /* checkpoints kept per shard */
    int max_wait_ms;            /* the longest a pull is held, whatever it asks */
} ps_shard_conf_t;

/* Creates shard `index` bound on `bind` ("tcp://10.0.0.5:0"), advertising `host` to ranks.
 * FL_OK, FL_EIO (cannot bind), FL_ENOMEM. */
int fl_ps__shard_create(fl_ctx_t *ctx, uint32_t index, const char *bind, const char *host,
                        ps_shard_t **out);

/* The endpoint ranks dial. */
const char *fl_ps__shard_endpoint(const ps_shard_t *sh);

/* Gives the shard its key range and settings (once, before start). FL_OK, FL_EINVAL,
 * FL_ENOMEM. */
int fl_ps__shard_configure(ps_shard_t *sh, const ps_shard_conf_t *conf);

/* Initial parameters (conf.count floats) at step: from an --init file. */
int fl_ps__shard_init_params(ps_shard_t *sh, const float *params, uint64_t step);

/* Loads the checkpoint of step, checking it belongs to this shard's range and model. FL_OK,
 * FL_EPROTO / FL_EIO naming the file and the problem. */
int fl_ps__shard_resume(ps_shard_t *sh, uint64_t step);

/* Starts the thread. FL_OK or FL_EIO. */
int fl_ps__shard_start(ps_shard_t *sh);

/* The job failed (a rank died, the coordinator is gone): pending and later requests are
 * answered with code and text. Asynchronous. */
void fl_ps__shard_fail(ps_shard_t *sh, int code, const char *text);

/* Stops the thread, first writing a final checkpoint when asked and the shard has
 * parameters. Joins. */
void fl_ps__shard_stop(ps_shard_t *sh, bool final_checkpoint);

void fl_ps__shard_destroy(ps_shard_t **sh);

typedef struct ps_shard_stats {
    uint64_t pushes;
    uint64_t pulls;
    uint64_t refused;
    uint64_t checkpoints;
    uint64_t timeouts;
    uint64_t version;
    uint64_t step; /* steps completed by the slowest rank */
} ps_shard_stats_t;

/* Counters, readable while the thread runs (version and step only after stop). */
void fl_ps__shard_get_stats(const ps_shard_t *sh, ps_shard_stats_t *out);

#endif
