/* Private to the cuda backend (dev_cuda.cu: devices, memory, streams, events; dev_cuda_ops.cu:
 * the operations; dev_cuda_topk.cu: top-k): the per-stream record and the helpers the three
 * files share. Compiled by nvcc only. */
#ifndef FL_DEV_CUDA_INT_H
#define FL_DEV_CUDA_INT_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "dev_int.h"

/* Threads per block of every kernel, and the caps on grid-stride grids. */
#define FL_CUDA_BLOCK 256
#define FL_CUDA_GRID_MAX 4096u
/* Blocks of a reduction: each writes one partial into the stream's scratch, so the sum's order
 * (and bits) depends on n only. */
#define FL_CUDA_RED_GRID 1024u

/* What a stream owns. cuBLAS handle and scratch outlive the CUDA stream: when the stream is
 * destroyed they go back to the device and serve the next stream, since destroying a cuBLAS
 * handle synchronises the whole device. */
typedef struct cuda_stream {
    cudaStream_t st;
    cublasHandle_t blas;      /* made on the first GEMM (NULL before), bound to st */
    double *part;             /* FL_CUDA_RED_GRID partial sums of a reduction */
    struct cuda_stream *next; /* on the device's list of records to reuse */
} cuda_stream_t;

static inline cuda_stream_t *fl_dev_cuda_stream(const fl_stream_t *s)
{
    return (cuda_stream_t *)s->impl;
}

/* Blocks for n items of a grid-stride loop (at least 1, at most cap). */
static inline unsigned fl_dev_cuda_grid(size_t n, unsigned cap)
{
    size_t g = (n + FL_CUDA_BLOCK - 1) / FL_CUDA_BLOCK;
    return g < 1 ? 1u : g > cap ? cap : (unsigned)g;
}

/* FL_EGPU "device <name>: <what>: <CUDA error text>", after clearing the thread's last error
 * so the next launch check does not see this one again. */
int fl_dev_cuda_fail(const fl_dev_t *d, const char *what, cudaError_t e);

/* The stream's cuBLAS handle, made (pedantic math: no TF32) on first use. One thread at a time
 * per stream. FL_OK or FL_EGPU. */
int fl_dev_cuda_blas(fl_stream_t *s, cublasHandle_t *out);

/* Queues op on s (dev_cuda_ops.cu). The device is made current first. */
int fl_dev_cuda_run(fl_stream_t *s, const dev_op_t *op);

/* Top-k (dev_cuda_topk.cu): the workspace for t->n_max entries, made and freed once, and the
 * queued selection of DOP_TOPK (op->p[4] is the workspace). */
int fl_dev_cuda_topk_open(fl_dev_topk_t *t);
void fl_dev_cuda_topk_close(fl_dev_topk_t *t);
int fl_dev_cuda_topk(fl_stream_t *s, const dev_op_t *op);

#endif
