/* The cuda backend's operations, queued on the stream: copies and fills with the runtime's
 * asynchronous calls, the three GEMMs with cuBLAS, and the kernels. Each kernel's per-element
 * body is fl_math.h's, or the same expression in the same order as dev_host.c's loop (nvcc runs
 * with --fmad=false), so results keep the host's bits; top-k lives in dev_cuda_topk.cu. */
#include <cub/block/block_reduce.cuh>

#include "dev_cuda_int.h"

namespace {

/* One grid-stride loop for every elementwise operation: f(i) for each i < n. */
template <typename F>
__global__ void each_kernel(size_t n, F f)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        f(i);
}

struct relu_f {
    float *z;
    __device__ void operator()(size_t i) const { z[i] = fl_relu(z[i]); }
};

struct relu_back_f {
    float *da;
    const float *a;
    __device__ void operator()(size_t i) const { da[i] = fl_relu_back(da[i], a[i]); }
};

struct bias_rows_f {
    float *z;
    const float *bias;
    size_t cols;
    __device__ void operator()(size_t i) const { z[i] = bias[i % cols]; }
};

/* The bias gradient gb[j] = sum over rows of dz[r][j], rows in order (the host's sum, so its
 * bits). One thread per column would leave a 4096-wide layer 16 blocks whose threads each wait
 * for 512 loads in turn; instead a block takes BG_COLS columns, its threads bring a tile of
 * BG_ROWS rows into shared memory together (coalesced, many loads in flight), and one thread
 * per column adds the tile's rows in order to the sum it carries from the tiles before. */
#define BG_COLS 32
#define BG_ROWS 64
#define BG_THREADS 256
__global__ void bias_grad_kernel(float *gb, const float *dz, size_t rows, size_t cols)
{
    __shared__ float tile[BG_ROWS][BG_COLS + 1];
    size_t c0 = (size_t)blockIdx.x * BG_COLS;
    unsigned tc = threadIdx.x % BG_COLS;
    unsigned tr = threadIdx.x / BG_COLS;
    float acc = 0.0f;
    for (size_t r0 = 0; r0 < rows; r0 += BG_ROWS) {
        for (unsigned r = tr; r < BG_ROWS; r += BG_THREADS / BG_COLS) {
            size_t row = r0 + r;
            size_t col = c0 + tc;
            tile[r][tc] = row < rows && col < cols ? dz[row * cols + col] : 0.0f;
        }
        __syncthreads();
        if (threadIdx.x < BG_COLS) {
            size_t n = rows - r0 < BG_ROWS ? rows - r0 : BG_ROWS;
            for (size_t r = 0; r < n; r++)
                acc += tile[r][threadIdx.x];
        }
        __syncthreads();
    }
    if (threadIdx.x < BG_COLS && c0 + threadIdx.x < cols)
        gb[c0 + threadIdx.x] = acc;
}

/* The intra-host reduction: rows in order, fl_math.h's body. */
struct sum_rows_f {
    float *out;
    const float *in;
    size_t cols;
    size_t rows;
    float a;
    __device__ void operator()(size_t i) const { out[i] = fl_sum_rows(in, cols, rows, i, a); }
};

struct scale_f {
    float *x;
    float a;
    __device__ void operator()(size_t i) const { x[i] *= a; }
};

/* The host loop's two forms: alpha 1 adds x itself. */
struct axpy_f {
    float *y;
    const float *x;
    float a;
    bool one;
    __device__ void operator()(size_t i) const
    {
        if (one)
            y[i] += x[i];
        else
            y[i] += a * x[i];
    }
};

struct opt_f {
    fl_opt_scalars_t sc;
    float *p;
    const float *g;
    float *b1; /* NULL for plain SGD */
    float *b2;
    __device__ void operator()(size_t i) const
    {
        if (sc.kind == FL_OPT_SGD) {
            float none = 0.0f;
            fl_sgd_elem(&sc, &p[i], g[i], b1 != NULL ? &b1[i] : &none);
        } else {
            fl_adam_elem(&sc, &p[i], g[i], &b1[i], &b2[i]);
        }
    }
};

struct ef_accum_f {
    float *v;
    float *u; /* NULL without momentum */
    const float *g;
    float m;
    float scale;
    __device__ void operator()(size_t i) const
    {
        float unused = 0.0f;
        if (u != NULL)
            fl_ef_accum(&v[i], &u[i], g[i], m, scale, true);
        else
            fl_ef_accum(&v[i], &unused, g[i], m, scale, false);
    }
};

/* Top-k's indices are distinct, so no two threads touch one entry of v or u. */
/* An index past the residual (never from top-k) is skipped: a stray write would poison the
 * context, and the host path reports it instead. */
struct ef_sent_f {
    float *v;
    float *u;
    const uint32_t *idx;
    float *val;
    size_t n;
    int wire;
    __device__ void operator()(size_t j) const
    {
        float sent = fl_wire_round(val[j], wire);
        val[j] = sent;
        if (idx[j] >= n)
            return;
        v[idx[j]] -= sent;
        if (u != NULL)
            u[idx[j]] = 0.0f;
    }
};

/* One thread per row, dev_host.c's xent row for row in double. The correct count is exact in
 * any order (small integers in a double), so an atomic add is enough for it. */
struct xent_row_f {
    const float *logits;
    const int32_t *y;
    float *dz;
    double *row_loss;
    double *out;
    size_t b;
    size_t c;
    __device__ void operator()(size_t r) const
    {
        const float *z = logits + r * c;
        size_t arg = 0;
        for (size_t j = 1; j < c; j++)
            if (z[j] > z[arg])
                arg = j;
        size_t label = (size_t)y[r];
        if (arg == label)
            atomicAdd(&out[1], 1.0);
        double mx = z[arg];
        double se = 0.0;
        for (size_t j = 0; j < c; j++)
            se += exp((double)z[j] - mx);
        double lse = log(se) + mx;
        row_loss[r] = lse - (double)z[label];
        if (dz != NULL) {
            float *g = dz + r * c;
            for (size_t j = 0; j < c; j++)
                g[j] = (float)(exp((double)z[j] - lse) / (double)b);
            g[label] -= 1.0f / (float)b;
        }
    }
};

/* The summed loss in row order, as the host adds it: the block brings the rows into shared
 * memory a chunk at a time (loads in flight together), one thread adds them in order. */
#define XS_CHUNK 512
__global__ void xent_sum_kernel(const double *row_loss, size_t rows, double *out)
{
    __shared__ double chunk[XS_CHUNK];
    double sum = 0.0;
    for (size_t r0 = 0; r0 < rows; r0 += XS_CHUNK) {
        size_t n = rows - r0 < XS_CHUNK ? rows - r0 : XS_CHUNK;
        for (size_t r = threadIdx.x; r < n; r += blockDim.x)
            chunk[r] = row_loss[r0 + r];
        __syncthreads();
        if (threadIdx.x == 0)
            for (size_t r = 0; r < n; r++)
                sum += chunk[r];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        out[0] = sum;
}

typedef cub::BlockReduce<double, FL_CUDA_BLOCK> block_sum_t;

/* Each block's share of sum x^2 into part[block]; the grid depends on n only, so the order of
 * the additions (and the bits) is the same on every run. */
__global__ void sumsq_part_kernel(const float *x, size_t n, double *part)
{
    __shared__ typename block_sum_t::TempStorage tmp;
    double s = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        s += (double)x[i] * x[i];
    double b = block_sum_t(tmp).Sum(s);
    if (threadIdx.x == 0)
        part[blockIdx.x] = b;
}

__global__ void sum_parts_kernel(const double *part, unsigned g, double *out)
{
    __shared__ typename block_sum_t::TempStorage tmp;
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < g; i += blockDim.x)
        s += part[i];
    double b = block_sum_t(tmp).Sum(s);
    if (threadIdx.x == 0)
        *out = b;
}

/* The lowest index of a NaN or Inf into *first, which starts as all ones (-1 as int64, the
 * largest unsigned value for atomicMin): no finalising step is needed. */
__global__ void nonfinite_kernel(const float *x, size_t n, unsigned long long *first)
{
    unsigned long long mine = ~0ULL;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n && mine == ~0ULL;
         i += stride)
        if (!fl_is_finite(x[i]))
            mine = i;
    if (mine != ~0ULL)
        atomicMin(first, mine);
}

} // namespace

static int check(const fl_dev_t *d, const dev_op_t *op, cudaError_t e)
{
    return e == cudaSuccess ? FL_OK : fl_dev_cuda_fail(d, fl_dev_op_name(op->code), e);
}

template <typename F>
static cudaError_t launch_each(cudaStream_t st, size_t n, F f)
{
    if (n == 0)
        return cudaSuccess;
    each_kernel<<<fl_dev_cuda_grid(n, FL_CUDA_GRID_MAX), FL_CUDA_BLOCK, 0, st>>>(n, f);
    return cudaGetLastError();
}

/* Bytes of alignment the kernels need at p[i]: 8 for the double and int64 outputs, 4 for the
 * float, int32 and uint32 arrays. A misaligned access would be a sticky fault that ends the
 * process's CUDA context, so it is refused before anything is queued. */
static size_t align_of(const dev_op_t *op, int i)
{
    switch (op->code) {
    case DOP_XENT: return i >= 3 ? 8 : 4;
    case DOP_SUMSQ:
    case DOP_NONFINITE: return i == 1 ? 8 : 4;
    case DOP_TOPK: return i == 3 ? 8 : 4;
    default: return 4;
    }
}

static int check_aligned(const fl_dev_t *d, const dev_op_t *op)
{
    if (op->code <= DOP_MEMSET || op->code == DOP_PEER)
        return FL_OK; /* copies and fills take any byte address */
    for (int i = 0; i < DEV_NPTR; i++) {
        size_t a = align_of(op, i);
        if (op->p[i] != NULL && !op->host[i] && (uintptr_t)op->p[i] % a != 0)
            return fl_fail(FL_EINVAL, "device %s: %s: address %d (%p) is not %zu-byte aligned",
                           d->name, fl_dev_op_name(op->code), i, op->p[i], a);
    }
    return FL_OK;
}

static int copy(fl_stream_t *s, const dev_op_t *op)
{
    cudaStream_t st = fl_dev_cuda_stream(s)->st;
    size_t n = op->n[0];
    cudaError_t e = cudaSuccess;
    switch (op->code) {
    case DOP_H2D: e = cudaMemcpyAsync(op->p[0], op->p[1], n, cudaMemcpyHostToDevice, st); break;
    case DOP_D2H: e = cudaMemcpyAsync(op->p[0], op->p[1], n, cudaMemcpyDeviceToHost, st); break;
    case DOP_D2D:
        if (op->p[0] != op->p[1])
            e = cudaMemcpyAsync(op->p[0], op->p[1], n, cudaMemcpyDeviceToDevice, st);
        break;
    case DOP_PEER:
        /* Two logical devices on one GPU (--gpus 0,0) make this a plain device copy. */
        e = cudaMemcpyPeerAsync(op->p[0], s->d->o.id, op->p[1], op->peer->o.id, n, st);
        break;
    default: e = cudaMemsetAsync(op->p[0], op->i0, n, st); break;
    }
    return check(s->d, op, e);
}

/* dev_host.c's GEMMs are row-major. A row-major r x c matrix with leading dimension c is, read
 * column-major, its transpose (c x r, same leading dimension), and C = A B gives C^T = B^T A^T.
 * So each row-major call becomes a column-major one with the operands swapped, the same
 * transpose flags, and m and n swapped:
 *   fwd   z[b,out] = x[b,in] w[out,in]^T   ->  z^T (out x b) = op_T(w^T) x^T:  T, N, m=out, n=b,
 *         k=in,  A=w lda=in,   B=x ldb=in,   C=z ldc=out
 *   wgrad gw[out,in] = dz[b,out]^T a[b,in]  ->  gw^T (in x out) = a^T op_T(dz^T): N, T, m=in,
 *         n=out, k=b,   A=a lda=in,  B=dz ldb=out, C=gw ldc=in
 *   igrad da[b,in] = dz[b,out] w[out,in]    ->  da^T (in x b) = w^T dz^T:  N, N, m=in, n=b,
 *         k=out, A=w lda=in,   B=dz ldb=out, C=da ldc=in */
static int gemm(fl_stream_t *s, const dev_op_t *op)
{
    cublasHandle_t h = NULL;
    int rc = fl_dev_cuda_blas(s, &h);
    if (rc != FL_OK)
        return rc;
    int b = (int)op->n[0];
    int out = (int)op->n[1];
    int in = (int)op->n[2];
    const float *p0 = (const float *)op->p[0];
    const float *p1 = (const float *)op->p[1];
    float *c = (float *)op->p[2];
    const float one = 1.0f;
    const float zero = 0.0f;
    cublasStatus_t st;
    switch (op->code) {
    case DOP_GEMM_FWD:
        st = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, out, b, in, &one, p1, in, p0, in, &op->f[0],
                         c, out);
        break;
    case DOP_GEMM_WGRAD:
        st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, b, &one, p1, in, p0, out, &zero, c,
                         in);
        break;
    default:
        st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, in, b, out, &one, p1, in, p0, out, &zero, c,
                         in);
        break;
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        return fl_fail(FL_EGPU, "device %s: %s: cuBLAS: %s", s->d->name, fl_dev_op_name(op->code),
                       cublasGetStatusName(st));
    return FL_OK;
}

static int xent(fl_stream_t *s, const dev_op_t *op)
{
    cudaStream_t st = fl_dev_cuda_stream(s)->st;
    double *out = (double *)op->p[4];
    xent_row_f f = {(const float *)op->p[0],
                    (const int32_t *)op->p[1],
                    (float *)op->p[2],
                    (double *)op->p[3],
                    out,
                    op->n[0],
                    op->n[1]};
    /* out[1] counts with atomics from zero. */
    cudaError_t e = cudaMemsetAsync(out, 0, 2 * sizeof(double), st);
    if (e == cudaSuccess)
        e = launch_each(st, op->n[0], f);
    if (e == cudaSuccess) {
        xent_sum_kernel<<<1, FL_CUDA_BLOCK, 0, st>>>(f.row_loss, op->n[0], out);
        e = cudaGetLastError();
    }
    return check(s->d, op, e);
}

static int sumsq(fl_stream_t *s, const dev_op_t *op)
{
    cuda_stream_t *q = fl_dev_cuda_stream(s);
    size_t n = op->n[0];
    double *out = (double *)op->p[1];
    if (n == 0)
        return check(s->d, op, cudaMemsetAsync(out, 0, sizeof(double), q->st));
    unsigned g = fl_dev_cuda_grid(n, FL_CUDA_RED_GRID);
    /* part is the stream's own: operations on one stream run in order, so no other sum can
     * be using it. */
    sumsq_part_kernel<<<g, FL_CUDA_BLOCK, 0, q->st>>>((const float *)op->p[0], n, q->part);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        sum_parts_kernel<<<1, FL_CUDA_BLOCK, 0, q->st>>>(q->part, g, out);
        e = cudaGetLastError();
    }
    return check(s->d, op, e);
}

static int nonfinite(fl_stream_t *s, const dev_op_t *op)
{
    cudaStream_t st = fl_dev_cuda_stream(s)->st;
    size_t n = op->n[0];
    unsigned long long *first = (unsigned long long *)op->p[1];
    cudaError_t e = cudaMemsetAsync(first, 0xff, sizeof *first, st);
    if (e == cudaSuccess && n > 0) {
        nonfinite_kernel<<<fl_dev_cuda_grid(n, FL_CUDA_GRID_MAX), FL_CUDA_BLOCK, 0, st>>>(
            (const float *)op->p[0], n, first);
        e = cudaGetLastError();
    }
    return check(s->d, op, e);
}

/* The elementwise kernels: one grid-stride launch each. */
static int elementwise(fl_stream_t *s, const dev_op_t *op)
{
    cudaStream_t st = fl_dev_cuda_stream(s)->st;
    size_t n = op->n[0];
    float *x = (float *)op->p[0];
    const float *y = (const float *)op->p[1];
    cudaError_t e = cudaSuccess;
    switch (op->code) {
    case DOP_BIAS_ROWS:
        e = launch_each(st, op->n[0] * op->n[1], bias_rows_f{x, y, op->n[1]});
        break;
    case DOP_RELU: e = launch_each(st, n, relu_f{x}); break;
    case DOP_RELU_BACK: e = launch_each(st, n, relu_back_f{x, y}); break;
    case DOP_BIAS_GRAD:
        if (op->n[1] > 0) {
            unsigned g = (unsigned)((op->n[1] + BG_COLS - 1) / BG_COLS);
            bias_grad_kernel<<<g, BG_THREADS, 0, st>>>(x, y, op->n[0], op->n[1]);
            e = cudaGetLastError();
        }
        break;
    case DOP_SUM_ROWS: e = launch_each(st, n, sum_rows_f{x, y, n, op->n[1], op->f[0]}); break;
    case DOP_SCALE: e = launch_each(st, n, scale_f{x, op->f[0]}); break;
    case DOP_AXPY: e = launch_each(st, n, axpy_f{x, y, op->f[0], op->f[0] == 1.0f}); break;
    case DOP_OPT:
        e = launch_each(st, n, opt_f{op->sc, x, y, (float *)op->p[2], (float *)op->p[3]});
        break;
    case DOP_EF_ACCUM:
        e = launch_each(st, n,
                        ef_accum_f{x, (float *)op->p[1], (const float *)op->p[2], op->f[0],
                                   op->f[1]});
        break;
    case DOP_EF_SENT:
        e = launch_each(st, n,
                        ef_sent_f{x, (float *)op->p[1], (const uint32_t *)op->p[2],
                                  (float *)op->p[3], op->n[1], op->i0});
        break;
    default:
        return fl_fail(FL_EINVAL, "device %s: unknown operation %d", s->d->name, (int)op->code);
    }
    return check(s->d, op, e);
}

int fl_dev_cuda_run(fl_stream_t *s, const dev_op_t *op)
{
    /* Cheap when the calling thread is bound already; right when it is not. */
    cudaError_t e = cudaSetDevice(s->d->o.id);
    if (e != cudaSuccess)
        return check(s->d, op, e);
    int rc = check_aligned(s->d, op);
    if (rc != FL_OK)
        return rc;
    switch (op->code) {
    case DOP_H2D:
    case DOP_D2H:
    case DOP_D2D:
    case DOP_MEMSET:
    case DOP_PEER: return copy(s, op);
    case DOP_GEMM_FWD:
    case DOP_GEMM_WGRAD:
    case DOP_GEMM_IGRAD: return gemm(s, op);
    case DOP_XENT: return xent(s, op);
    case DOP_SUMSQ: return sumsq(s, op);
    case DOP_NONFINITE: return nonfinite(s, op);
    case DOP_TOPK: return fl_dev_cuda_topk(s, op);
    default: return elementwise(s, op);
    }
}
