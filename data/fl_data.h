/* data: the datasets a worker trains on (the built-in one, IDX and CSV files) and the
 * distributed sampler. Host memory only; below the model and the worker. */
#ifndef FL_DATA_H
#define FL_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fl_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- datasets (data_builtin.c, data_idx.c, data_csv.c) ---- */

typedef struct fl_dataset {
    size_t n;         /* samples */
    size_t dim;       /* features per sample */
    int classes;      /* labels are 0..classes-1 */
    float *x;         /* n * dim features, row-major */
    int32_t *y;       /* n labels */
    char source[256]; /* "built-in (seed 1)" or the file it came from */
    char labels[256]; /* the file the labels came from (IDX: the labels file); "": source */
} fl_dataset_t;

/* The built-in dataset (see data_builtin.c for how it is made): FL_DATA_BUILTIN_DIM features,
 * FL_DATA_BUILTIN_CLASSES classes, FL_DATA_BUILTIN_TRAIN training and FL_DATA_BUILTIN_TEST test
 * samples, identical for a given seed on every machine. FL_OK or FL_ENOMEM. */
#define FL_DATA_BUILTIN_DIM 64
#define FL_DATA_BUILTIN_CLASSES 10
#define FL_DATA_BUILTIN_TRAIN 60000
#define FL_DATA_BUILTIN_TEST 10000
int fl_data_builtin(uint64_t seed, fl_dataset_t *train, fl_dataset_t *test);

/* IDX files (MNIST / Fashion-MNIST: images u8 [n, rows, cols], labels u8 [n]); ".gz" files are
 * read through zlib. Pixels are scaled to [0, 1]. classes = max label + 1 (at most 256).
 * FL_OK, FL_EIO (cannot read), FL_EPROTO (wrong magic, truncated, counts that disagree between
 * images and labels, label out of range) naming the file and the problem, FL_ENOMEM. */
int fl_data_idx(const char *images, const char *labels, fl_dataset_t *out);

/* CSV: one sample per line, the label (an integer >= 0) first, then the features; every line
 * the same number of columns; an optional header line (non-numeric first field) is skipped.
 * Errors as fl_data_idx, naming the file and line. */
int fl_data_csv(const char *path, fl_dataset_t *out);

void fl_dataset_free(fl_dataset_t *d);

/* ---- sampling (sampler.c): PyTorch's DistributedSampler, drop_last ---- */

typedef struct fl_sampler {
    size_t n;     /* samples in the dataset */
    int world;    /* data-parallel replicas */
    int rank;     /* this replica */
    size_t batch; /* per replica */
    bool shuffle; /* a seeded permutation per epoch, the same on every rank */
    uint64_t seed;
    uint32_t *perm; /* n entries (identity without shuffle) */
} fl_sampler_t;

/* FL_OK, FL_EINVAL (world < 1, rank out of range, batch 0, batch larger than a replica's
 * share n / world: the detail says so), FL_ENOMEM. */
int fl_sampler_init(fl_sampler_t *s, size_t n, int world, int rank, size_t batch, bool shuffle,
                    uint64_t seed);
void fl_sampler_deinit(fl_sampler_t *s);

/* Draws the permutation of an epoch (a function of seed and epoch only). */
void fl_sampler_set_epoch(fl_sampler_t *s, long epoch);

/* Batches per epoch for every rank alike: (n / world) / batch. */
size_t fl_sampler_batches(const fl_sampler_t *s);

/* The sample indices of batch i of this rank: perm[rank + (i * batch + t) * world] for t in
 * 0..batch-1. Without shuffle the batches i of all ranks together are samples
 * [i * world * batch, (i + 1) * world * batch). */
void fl_sampler_batch(const fl_sampler_t *s, size_t i, uint32_t *idx);

#ifdef __cplusplus
}
#endif
#endif
