/* flodl compressor: top-k sparsification with error feedback (Deep Gradient Compression, Lin et
 * al. 2018), the density warm-up schedule, and the sparse block codec that carries top-k pairs
 * on the wire. Pure functions over caller buffers: no sockets, no threads. The exchange of the
 * blocks between ranks is fl_sparse_allreduce (comm.h). */
#ifndef FLODL_COMPRESS_H
#define FLODL_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <flodl/flodl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reusable scratch memory of the compressor (grows on demand, never shrinks). One thread at a
 * time per workspace. */
typedef struct fl_cmp_ws fl_cmp_ws_t;

int fl_cmp_ws_create(fl_cmp_ws_t **out);
void fl_cmp_ws_destroy(fl_cmp_ws_t **ws); /* NULL-safe; sets *ws = NULL */

/* ---- top-k selection ---- */

typedef enum fl_cmp_select {
    FL_CMP_EXACT = 0,   /* exactly k entries: the k largest |x|, ties to the lower index */
    FL_CMP_SAMPLED = 1, /* DGC's estimate: threshold from a sample, then at most k entries
                           above it (approximate; the count achieved is reported) */
} fl_cmp_select_t;

typedef struct fl_cmp_topk_opts {
    size_t k;               /* entries to select; 0: ceil(density * n) */
    double density;         /* 0 < density <= 1, used when k is 0 (default 0.01) */
    fl_cmp_select_t mode;   /* default FL_CMP_EXACT */
    double sample_fraction; /* SAMPLED: share of entries sampled (default 0.01) */
    uint64_t seed;          /* SAMPLED: where the samples are taken */
    const char *name;       /* tensor name in error texts (default "gradient") */
} fl_cmp_topk_opts_t;

void fl_cmp_topk_opts_init(fl_cmp_topk_opts_t *opts);

/* The k that opts ask for among n entries. FL_OK, or FL_EINVAL naming the value: n = 0,
 * k = 0, k > n, density outside (0, 1], n above UINT32_MAX (indices are 32-bit). */
int fl_cmp_topk_count(size_t n, const fl_cmp_topk_opts_t *opts, size_t *k);

/* Selects top-k of x[0..n) by magnitude: indices ascending into idx, their values into val (room
 * for k each, as fl_cmp_topk_count gives). *k_out is k for EXACT, at most k for SAMPLED.
 * Expected O(n) (radix selection, no sort), single-threaded.
 * FL_OK, FL_EINVAL (as fl_cmp_topk_count), FL_ENONFINITE (a NaN or Inf: the detail names the
 * tensor and the first bad index; nothing is written), FL_ENOMEM. */
int fl_cmp_topk(fl_cmp_ws_t *ws, const float *x, size_t n, const fl_cmp_topk_opts_t *opts,
                uint32_t *idx, float *val, size_t *k_out);

/* The same selection on CUDA device buffers (x, idx, val in device memory; the exact mode
 * selects the same set as fl_cmp_topk). FL_EGPU without CUDA or a device. */
int fl_cmp_topk_device(const float *x, size_t n, const fl_cmp_topk_opts_t *opts, uint32_t *idx,
                       float *val, size_t *k_out);

/* ---- error feedback ---- */

typedef enum fl_cmp_nonfinite {
    FL_NONFINITE_FAIL = 0, /* refuse the step: FL_ENONFINITE, residual untouched */
    FL_NONFINITE_SKIP = 1, /* skip the step: nothing selected, residual untouched */
} fl_cmp_nonfinite_t;

typedef struct fl_cmp_ef_opts {
    size_t n;                        /* entries of the tensor (required) */
    const char *name;                /* for error texts (default "gradient") */
    float momentum;                  /* DGC momentum correction: u = m*u + g, v += u; 0: plain
                                        error feedback, v += g (default 0) */
    double max_norm;                 /* clip the gradient's L2 norm to this before it is
                                        accumulated; 0: no clipping (default) */
    fl_cmp_nonfinite_t on_nonfinite; /* default FL_NONFINITE_FAIL */
    fl_dtype_t wire;                 /* type the values travel in: float32, float16 or
                                        bfloat16; the residual keeps the rounding error
                                        (default float32) */
} fl_cmp_ef_opts_t;

typedef struct fl_cmp_ef fl_cmp_ef_t;

void fl_cmp_ef_opts_init(fl_cmp_ef_opts_t *opts);
int fl_cmp_ef_create(const fl_cmp_ef_opts_t *opts, fl_cmp_ef_t **out);
void fl_cmp_ef_destroy(fl_cmp_ef_t **ef);

/* One step: accumulates grad (n entries) into the residual, selects top-k of the residual,
 * writes the pairs (values rounded to the wire type) and takes what was sent out of the
 * residual (and, with momentum, zeroes those entries of the velocity). *k_out pairs.
 * A NaN or Inf in grad: FL_ENONFINITE naming the tensor and index (FAIL), or FL_OK with
 * *k_out = 0 and *skipped = true (SKIP); either way the residual is untouched.
 * FL_OK, FL_EINVAL, FL_ENONFINITE, FL_ENOMEM. skipped may be NULL. */
int fl_cmp_ef_step(fl_cmp_ef_t *ef, fl_cmp_ws_t *ws, const float *grad,
                   const fl_cmp_topk_opts_t *topk, uint32_t *idx, float *val, size_t *k_out,
                   bool *skipped);

/* The state a checkpoint must keep: residual (n floats) and velocity (n floats; NULL without
 * momentum). Owned by ef, valid until the next call on it. */
void fl_cmp_ef_state(const fl_cmp_ef_t *ef, const float **residual, const float **velocity,
                     size_t *n);

/* Restores a saved state (velocity may be NULL: zeros). FL_OK, FL_EINVAL (n differs),
 * FL_ENONFINITE (a NaN or Inf in it). */
int fl_cmp_ef_restore(fl_cmp_ef_t *ef, const float *residual, const float *velocity, size_t n);

/* L2 norm of the residual (what error feedback holds back). */
double fl_cmp_ef_residual_norm(const fl_cmp_ef_t *ef);

/* ---- density warm-up (DGC) ---- */

typedef struct fl_cmp_schedule {
    double density;    /* final density (default 0.001) */
    int warmup_epochs; /* epochs of exponential warm-up from dense (default 4: DGC's 25%,
                          6.25%, 1.56%, 0.4%, then 0.1%); 0: the final density at once */
} fl_cmp_schedule_t;

void fl_cmp_schedule_init(fl_cmp_schedule_t *s);

/* Density for a (fractional) epoch: density^((e+1)/(warmup+1)) during warm-up, then density. */
double fl_cmp_schedule_density(const fl_cmp_schedule_t *s, double epoch);

/* Factor that scales a vector of L2 norm `norm` to at most max_norm (1 when already within). */
double fl_cmp_clip_factor(double norm, double max_norm);

/* ---- sparse blocks on the wire ---- */

/* A sparse block: a 40-byte little-endian header (magic "FLSP", version, value type, index
 * coding, flags, n, k, byte sizes) and a body: indices as ascending deltas in LEB128 varints,
 * then the values in the value type; the body lz4-compressed when that shrinks it (a flag says
 * so). Decoding checks every size before it allocates or decompresses. */
#define FL_CMP_SPARSE_HEADER 40

typedef struct fl_cmp_sparse_opts {
    fl_dtype_t values; /* float32 (default), float16 or bfloat16 */
    bool lz4;          /* try lz4 on the body, keep it when smaller (default true) */
} fl_cmp_sparse_opts_t;

void fl_cmp_sparse_opts_init(fl_cmp_sparse_opts_t *opts);

/* v as the value type carries it: float16/bfloat16 round to nearest even, finite values beyond
 * their range saturate at the largest finite one (NaN stays NaN), float32 unchanged. */
float fl_cmp_round(float v, fl_dtype_t values);

/* Checks k pairs for a block: indices strictly ascending and below n, value type float32,
 * float16 or bfloat16. FL_OK or FL_EINVAL naming the position. */
int fl_cmp_sparse_check(const uint32_t *idx, size_t k, size_t n, fl_dtype_t values);

/* Largest encoded size of k pairs with values of the given type (for sizing dst). */
size_t fl_cmp_sparse_bound(size_t k, fl_dtype_t values);

/* Encodes k pairs (indices strictly ascending, each < n) of a tensor of n entries into dst.
 * *len gets the block size. Values are rounded to the value type. FL_OK, FL_EINVAL (indices
 * not ascending or out of range, cap below the bound, bad value type), FL_ENOMEM. */
int fl_cmp_sparse_encode(fl_cmp_ws_t *ws, const uint32_t *idx, const float *val, size_t k, size_t n,
                         const fl_cmp_sparse_opts_t *opts, void *dst, size_t cap, size_t *len);

typedef struct fl_cmp_sparse_info {
    uint64_t n;         /* entries of the dense tensor */
    uint64_t k;         /* pairs */
    fl_dtype_t values;  /* value type */
    bool lz4;           /* body compressed */
    size_t index_bytes; /* decoded index stream */
    size_t value_bytes; /* decoded values */
    size_t body_bytes;  /* body as stored */
} fl_cmp_sparse_info_t;

/* Reads and checks the header of a block of len bytes. FL_OK or FL_EPROTO saying what is wrong
 * (never reads past len). */
int fl_cmp_sparse_peek(const void *src, size_t len, fl_cmp_sparse_info_t *info);

/* Decodes a block: at most k_cap pairs, of a tensor of exactly n entries. FL_OK, FL_EPROTO
 * (corrupt: bad header, sizes that disagree, a corrupt lz4 block, a truncated or overlong
 * varint, an index out of range, more pairs than k_cap or another n), FL_ENOMEM. Nothing is
 * read outside src or written outside idx[k_cap], val[k_cap]. */
int fl_cmp_sparse_decode(fl_cmp_ws_t *ws, const void *src, size_t len, size_t n, size_t k_cap,
                         uint32_t *idx, float *val, size_t *k_out);

/* Decodes a block and adds its pairs into dense[n] (dense[idx] += val). The whole block is
 * checked before dense is touched. Errors as fl_cmp_sparse_decode. */
int fl_cmp_sparse_accumulate(fl_cmp_ws_t *ws, const void *src, size_t len, float *dense, size_t n,
                             size_t *k_out);

#ifdef __cplusplus
}
#endif

#endif
