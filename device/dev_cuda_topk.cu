/* Exact top-k by magnitude on the cuda backend: the set of dev_host.c's fl_dev_host_topk (the
 * k largest |x|, ties to the lower index, indices ascending), with compression/topk_cuda.cu's
 * algorithm made asynchronous. Three histogram levels over the magnitude key find the threshold
 * key T; each level's bin is chosen on the device by a one-block kernel, so nothing returns to
 * the host before the result. The workspace is allocated once, in topk_open. */
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <stdlib.h>

#include "dev_cuda_int.h"

#define TOPK_BINS 2048u
#define TOPK_NONE (~0ULL)

/* The selection's state between kernels, in device memory. */
typedef struct topk_state {
    uint32_t prefix;          /* the bits of T chosen so far */
    uint32_t pmask;           /* which bits those are */
    unsigned long long above; /* keys strictly above the chosen prefix */
    unsigned long long bad;   /* the lowest index of a NaN or Inf; TOPK_NONE: none */
    int64_t count;            /* entries compacted (CUB writes it) */
} topk_state_t;

/* One allocation, carved up: state, histogram, one word per entry, CUB's scratch. */
typedef struct cuda_topk {
    void *base;
    topk_state_t *st;
    uint32_t *hist; /* TOPK_BINS */
    uint32_t *mark; /* n_max: 1 where key == T, scanned in place into each one's rank among
                       those, then overwritten in place with the selection flag */
    void *tmp;      /* CUB's scratch for the rank scan and the compaction */
    size_t tmp_bytes;
} cuda_topk_t;

/* Levels over key bits 30..20, 19..9 and 8..0, as dev_host.c's threshold(). */
__host__ __device__ static inline int lv_shift(int lv)
{
    return lv == 0 ? 20 : lv == 1 ? 9 : 0;
}

__host__ __device__ static inline uint32_t lv_mask(int lv)
{
    return lv == 2 ? 0x1ffu : 0x7ffu;
}

namespace {

__global__ void init_kernel(topk_state_t *st, uint32_t *hist)
{
    for (unsigned b = threadIdx.x; b < TOPK_BINS; b += blockDim.x)
        hist[b] = 0;
    if (threadIdx.x == 0) {
        st->prefix = 0;
        st->pmask = 0;
        st->above = 0;
        st->bad = TOPK_NONE;
        st->count = 0;
    }
}

/* The level's histogram of keys matching the prefix so far; level 0 also finds the lowest
 * index of a NaN or Inf (one atomic per thread that saw one). */
__global__ void hist_kernel(const float *x, size_t n, int lv, uint32_t *hist, topk_state_t *st)
{
    __shared__ uint32_t h[TOPK_BINS];
    if (lv > 0 && st->bad != TOPK_NONE)
        return; /* the result will be "nothing selected": skip the work */
    const uint32_t prefix = st->prefix;
    const uint32_t pmask = st->pmask;
    const int shift = lv_shift(lv);
    const uint32_t mask = lv_mask(lv);
    for (unsigned b = threadIdx.x; b <= mask; b += blockDim.x)
        h[b] = 0;
    __syncthreads();
    unsigned long long bad = TOPK_NONE;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t key = fl_mag_key(x[i]);
        if (key >= FL_KEY_NONFINITE)
            bad = bad < i ? bad : i;
        else if ((key & pmask) == prefix)
            atomicAdd(&h[(key >> shift) & mask], 1u);
    }
    if (bad != TOPK_NONE)
        atomicMin(&st->bad, bad);
    __syncthreads();
    for (unsigned b = threadIdx.x; b <= mask; b += blockDim.x)
        if (h[b] != 0)
            atomicAdd(&hist[b], h[b]);
}

/* The level's bin, as the host chooses it: from the top bin down until the need-th largest key
 * is inside (bin 0 if never). Thread t holds the t-th chunk of bins from the top; a block scan
 * gives each the count above its chunk, and exactly one thread sees the crossing. The
 * histogram is zeroed for the next level on the way. One block of FL_CUDA_BLOCK threads. */
__global__ void select_kernel(uint32_t *hist, int lv, unsigned long long need, topk_state_t *st)
{
    typedef cub::BlockScan<unsigned long long, FL_CUDA_BLOCK> scan_t;
    __shared__ typename scan_t::TempStorage tmp;
    if (st->bad != TOPK_NONE)
        return;
    const unsigned per = (lv_mask(lv) + 1) / FL_CUDA_BLOCK; /* 8 or 2 */
    const unsigned lo = (FL_CUDA_BLOCK - 1 - threadIdx.x) * per;
    uint32_t h[TOPK_BINS / FL_CUDA_BLOCK];
    unsigned long long sum = 0;
    for (unsigned u = 0; u < per; u++) {
        h[u] = hist[lo + u];
        hist[lo + u] = 0;
        sum += h[u];
    }
    const unsigned long long above = st->above;
    unsigned long long higher = 0;
    scan_t(tmp).ExclusiveSum(sum, higher);
    __syncthreads(); /* every thread has read st->above before one writes it */
    unsigned long long run = above + higher;
    if (run >= need)
        return; /* the crossing is in a higher chunk */
    for (unsigned u = per; u-- > 0;) {
        uint32_t b = lo + u;
        if (run + h[u] >= need || b == 0) {
            st->prefix |= b << lv_shift(lv);
            st->pmask |= lv_mask(lv) << lv_shift(lv);
            st->above = run;
            return;
        }
        run += h[u];
    }
}

/* Marks the entries equal to T (st->prefix, all 31 bits chosen) for the rank scan. */
__global__ void mark_kernel(const float *x, size_t n, const topk_state_t *st, uint32_t *mark)
{
    const uint32_t t = st->prefix;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        mark[i] = fl_mag_key(x[i]) == t;
}

/* Selected: above T, or equal to T and among the first k - above equal ones by index. Nothing
 * when x holds a NaN or Inf. Each entry's rank becomes its flag, in place. */
__global__ void flag_kernel(const float *x, size_t n, unsigned long long k, const topk_state_t *st,
                            uint32_t *mark)
{
    const uint32_t t = st->prefix;
    const bool bad = st->bad != TOPK_NONE;
    const unsigned long long eq = k - st->above;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t key = fl_mag_key(x[i]);
        mark[i] = !bad && (key > t || (key == t && mark[i] < eq));
    }
}

__global__ void gather_kernel(const float *x, const uint32_t *idx, size_t k, const topk_state_t *st,
                              float *val)
{
    const size_t count = (size_t)st->count < k ? (size_t)st->count : k;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < count; j += stride)
        val[j] = x[idx[j]];
}

__global__ void finish_kernel(const topk_state_t *st, int64_t *out)
{
    bool bad = st->bad != TOPK_NONE;
    out[0] = bad ? 0 : st->count;
    out[1] = bad ? (int64_t)st->bad : -1;
}

} // namespace

/* CUB's two calls, typed once so that sizing (tmp NULL) and running agree. */
static cudaError_t rank_scan(void *tmp, size_t &bytes, uint32_t *mark, size_t n, cudaStream_t s)
{
    return cub::DeviceScan::ExclusiveSum(tmp, bytes, mark, (uint32_t)n, s);
}

static cudaError_t compact(void *tmp, size_t &bytes, const uint32_t *flag, uint32_t *idx,
                           int64_t *count, size_t n, cudaStream_t s)
{
    thrust::counting_iterator<uint32_t> it(0);
    return cub::DeviceSelect::Flagged(tmp, bytes, it, flag, idx, count, (int64_t)n, s);
}

/* The larger of the two scratch sizes for n entries (no work is queued). */
static cudaError_t scratch_bytes(size_t n, size_t *out)
{
    size_t a = 0;
    size_t b = 0;
    cudaError_t e = rank_scan(NULL, a, NULL, n, 0);
    if (e == cudaSuccess)
        e = compact(NULL, b, NULL, NULL, NULL, n, 0);
    *out = a > b ? a : b;
    return e;
}

static size_t up256(size_t b)
{
    return (b + 255) & ~(size_t)255;
}

int fl_dev_cuda_topk_open(fl_dev_topk_t *t)
{
    fl_dev_t *d = t->d;
    size_t n = t->n_max;
    cudaError_t e = cudaSetDevice(d->o.id);
    size_t tmp = 0;
    if (e == cudaSuccess)
        e = scratch_bytes(n, &tmp);
    if (e != cudaSuccess)
        return fl_dev_cuda_fail(d, "top-k workspace", e);
    cuda_topk_t *w = (cuda_topk_t *)calloc(1, sizeof *w);
    if (w == NULL)
        return fl_fail(FL_ENOMEM, "device %s: out of memory for a top-k workspace", d->name);
    size_t off_hist = up256(sizeof(topk_state_t));
    size_t off_mark = off_hist + up256(TOPK_BINS * sizeof(uint32_t));
    size_t off_tmp = off_mark + up256(n * sizeof(uint32_t));
    size_t total = off_tmp + tmp;
    e = cudaMalloc(&w->base, total);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0;
        size_t tot = 0;
        if (cudaMemGetInfo(&fr, &tot) != cudaSuccess)
            cudaGetLastError();
        free(w);
        return fl_fail(FL_ENOMEM,
                       "device %s: top-k workspace for %zu entries: %zu bytes asked, "
                       "%zu free of %zu (%s)",
                       d->name, n, total, fr, tot, cudaGetErrorString(e));
    }
    char *base = (char *)w->base;
    w->st = (topk_state_t *)base;
    w->hist = (uint32_t *)(base + off_hist);
    w->mark = (uint32_t *)(base + off_mark);
    w->tmp = base + off_tmp;
    w->tmp_bytes = tmp;
    t->impl = w;
    return FL_OK;
}

void fl_dev_cuda_topk_close(fl_dev_topk_t *t)
{
    cuda_topk_t *w = (cuda_topk_t *)t->impl;
    if (w == NULL)
        return;
    if (cudaSetDevice(t->d->o.id) != cudaSuccess || cudaFree(w->base) != cudaSuccess)
        cudaGetLastError();
    free(w);
    t->impl = NULL;
}

/* Queues the three levels: T and the count above it end in w->st. k = 0 needs only level 0's
 * NaN/Inf search. */
static cudaError_t threshold(cudaStream_t s, cuda_topk_t *w, const float *x, size_t n, size_t k)
{
    unsigned g = fl_dev_cuda_grid(n, FL_CUDA_GRID_MAX);
    init_kernel<<<1, FL_CUDA_BLOCK, 0, s>>>(w->st, w->hist);
    cudaError_t e = cudaGetLastError();
    for (int lv = 0; lv < (k > 0 ? 3 : 1) && e == cudaSuccess; lv++) {
        hist_kernel<<<g, FL_CUDA_BLOCK, 0, s>>>(x, n, lv, w->hist, w->st);
        e = cudaGetLastError();
        if (e == cudaSuccess && k > 0) {
            select_kernel<<<1, FL_CUDA_BLOCK, 0, s>>>(w->hist, lv, k, w->st);
            e = cudaGetLastError();
        }
    }
    return e;
}

/* Queues the choice of the k entries against T: ties by rank, an order-preserving compaction
 * of the indices (ascending), then their values. */
static cudaError_t choose(cudaStream_t s, cuda_topk_t *w, const float *x, size_t n, size_t k,
                          uint32_t *idx, float *val)
{
    unsigned g = fl_dev_cuda_grid(n, FL_CUDA_GRID_MAX);
    size_t bytes = w->tmp_bytes;
    mark_kernel<<<g, FL_CUDA_BLOCK, 0, s>>>(x, n, w->st, w->mark);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = rank_scan(w->tmp, bytes, w->mark, n, s);
    if (e == cudaSuccess) {
        flag_kernel<<<g, FL_CUDA_BLOCK, 0, s>>>(x, n, k, w->st, w->mark);
        e = cudaGetLastError();
    }
    bytes = w->tmp_bytes;
    if (e == cudaSuccess)
        e = compact(w->tmp, bytes, w->mark, idx, &w->st->count, n, s);
    if (e == cudaSuccess) {
        gather_kernel<<<fl_dev_cuda_grid(k, FL_CUDA_GRID_MAX), FL_CUDA_BLOCK, 0, s>>>(x, idx, k,
                                                                                      w->st, val);
        e = cudaGetLastError();
    }
    return e;
}

int fl_dev_cuda_topk(fl_stream_t *s, const dev_op_t *op)
{
    cuda_topk_t *w = (cuda_topk_t *)op->p[4];
    cudaStream_t st = fl_dev_cuda_stream(s)->st;
    const float *x = (const float *)op->p[0];
    size_t n = op->n[0];
    size_t k = op->n[1];
    const char *what = fl_dev_op_name(op->code);
    /* Sized for n_max in topk_open; CUB's needs grow with n, so this holds unless CUB changed
     * its mind, which would be a bug worth a clear error rather than an overrun. */
    size_t need = 0;
    cudaError_t e = scratch_bytes(n, &need);
    if (e != cudaSuccess)
        return fl_dev_cuda_fail(s->d, what, e);
    if (need > w->tmp_bytes)
        return fl_fail(FL_EGPU,
                       "device %s: %s: CUB needs %zu bytes of scratch for %zu entries, "
                       "the workspace has %zu",
                       s->d->name, what, need, n, w->tmp_bytes);
    e = threshold(st, w, x, n, k);
    if (e == cudaSuccess && k > 0)
        e = choose(st, w, x, n, k, (uint32_t *)op->p[1], (float *)op->p[2]);
    if (e == cudaSuccess) {
        finish_kernel<<<1, 1, 0, st>>>(w->st, (int64_t *)op->p[3]);
        e = cudaGetLastError();
    }
    return e == cudaSuccess ? FL_OK : fl_dev_cuda_fail(s->d, what, e);
}
