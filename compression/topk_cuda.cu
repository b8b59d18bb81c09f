/* Top-k by magnitude on CUDA device buffers: the same set as the CPU's exact mode (the k
 * largest |x|, ties to the lower index, indices ascending). Three histogram levels over the
 * magnitude key (bits 30..20, 19..9, 8..0) find the threshold key T and how many entries equal
 * to T are taken; a prefix sum over "equal to T" breaks ties by index only when some equal
 * entries must be left out; CUB's order-preserving compaction writes the indices, and a gather
 * the values. The sampled mode takes its threshold from a sample and compacts what is above it
 * (at most k; the exact path runs when more pass). */
#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "cmp_int.h"
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            rc = fl_fail(FL_EGPU, "top-k on device: %s: %s", #call, cudaGetErrorString(e_));       \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* The kernels are this file's own: internal linkage keeps their names out of libflodl. */
namespace {

__device__ __forceinline__ uint32_t dkey(float v)
{
    return __float_as_uint(v) & 0x7fffffffu;
}

/* Histogram of ((key >> shift) & mask) over entries whose key matches prefix under pmask;
 * also the lowest index of a NaN or Inf. */
__global__ void hist_kernel(const float *x, size_t n, uint32_t prefix, uint32_t pmask, int shift,
                            uint32_t mask, unsigned int *hist, unsigned long long *first_bad)
{
    __shared__ unsigned int h[2048];
    for (unsigned b = threadIdx.x; b <= mask; b += blockDim.x)
        h[b] = 0;
    __syncthreads();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t key = dkey(x[i]);
        if (key >= 0x7f800000u)
            atomicMin(first_bad, (unsigned long long)i);
        else if ((key & pmask) == prefix)
            atomicAdd(&h[(key >> shift) & mask], 1u);
    }
    __syncthreads();
    for (unsigned b = threadIdx.x; b <= mask; b += blockDim.x)
        if (h[b] != 0)
            atomicAdd(&hist[b], h[b]);
}

/* flag = selected when key > t; entries equal to t are marked in eqflag for the tie scan. */
__global__ void flag_kernel(const float *x, size_t n, uint32_t t, int all_eq, uint8_t *flag,
                            uint32_t *eqflag)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t key = dkey(x[i]);
        flag[i] = key > t || (all_eq && key == t);
        if (eqflag != NULL)
            eqflag[i] = key == t;
    }
}

/* After the exclusive scan of eqflag: take the first eq entries equal to t. */
__global__ void tie_kernel(const float *x, size_t n, uint32_t t, const uint32_t *eqrank,
                           uint32_t eq, uint8_t *flag)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (dkey(x[i]) == t && eqrank[i] < eq)
            flag[i] = 1;
}

__global__ void gather_kernel(const float *x, const uint32_t *idx, size_t k, float *val)
{
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < k;
         j += (size_t)gridDim.x * blockDim.x)
        val[j] = x[idx[j]];
}

__global__ void sample_kernel(const float *x, size_t n, size_t s, uint64_t seed, uint32_t *out)
{
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < s;
         j += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (j + 1) * 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        out[j] = dkey(x[z % n]);
    }
}

} // namespace

static int grid_for(size_t n)
{
    size_t g = (n + 255) / 256;
    return (int)(g > 4096 ? 4096 : (g < 1 ? 1 : g));
}

/* Compacts the indices whose flag is set into idx, gathers their values; *count gets how many. */
static int compact(const float *x, size_t n, const uint8_t *flag, uint32_t *idx, float *val,
                   size_t *count)
{
    int rc = FL_OK;
    void *tmp = NULL;
    size_t tmp_bytes = 0;
    unsigned long long *d_count = NULL;
    unsigned long long h_count = 0;
    thrust::counting_iterator<uint32_t> it(0);
    CK(cub::DeviceSelect::Flagged(NULL, tmp_bytes, it, flag, idx, d_count, (int64_t)n));
    CK(cudaMalloc(&tmp, tmp_bytes));
    CK(cudaMalloc(&d_count, sizeof *d_count));
    CK(cub::DeviceSelect::Flagged(tmp, tmp_bytes, it, flag, idx, d_count, (int64_t)n));
    CK(cudaMemcpy(&h_count, d_count, sizeof h_count, cudaMemcpyDeviceToHost));
    if (h_count > 0)
        gather_kernel<<<grid_for(h_count), 256>>>(x, idx, (size_t)h_count, val);
    CK(cudaGetLastError());
    *count = (size_t)h_count;
out:
    cudaFree(tmp);
    cudaFree(d_count);
    return rc;
}

static int exact(const float *x, size_t n, size_t k, const char *name, uint32_t *idx, float *val,
                 size_t *k_out)
{
    static const int shift[3] = {20, 9, 0};
    static const uint32_t mask[3] = {0x7ffu, 0x7ffu, 0x1ffu};
    int rc = FL_OK;
    unsigned int *d_hist = NULL;
    unsigned long long *d_bad = NULL;
    uint8_t *d_flag = NULL;
    uint32_t *d_eq = NULL;
    uint32_t *d_rank = NULL;
    void *tmp = NULL;
    unsigned int hist[2048];
    unsigned long long bad = ~0ULL;
    uint32_t prefix = 0, pmask = 0;
    size_t gt = 0;
    uint32_t count_eq = 0;
    size_t got = 0;

    CK(cudaMalloc(&d_hist, sizeof hist));
    CK(cudaMalloc(&d_bad, sizeof *d_bad));
    CK(cudaMemcpy(d_bad, &bad, sizeof bad, cudaMemcpyHostToDevice));
    for (int level = 0; level < 3; level++) {
        CK(cudaMemset(d_hist, 0, sizeof hist));
        hist_kernel<<<grid_for(n), 256>>>(x, n, prefix, pmask, shift[level], mask[level], d_hist,
                                          d_bad);
        CK(cudaGetLastError());
        CK(cudaMemcpy(hist, d_hist, sizeof hist, cudaMemcpyDeviceToHost));
        if (level == 0) {
            CK(cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost));
            if (bad < n) {
                float v;
                CK(cudaMemcpy(&v, x + bad, sizeof v, cudaMemcpyDeviceToHost));
                rc = fl_fail(FL_ENONFINITE, "'%s' holds %s at index %llu of %zu", name,
                             isnan(v) ? "NaN" : "Inf", bad, n);
                goto out;
            }
        }
        size_t c = 0;
        uint32_t bin = 0;
        for (uint32_t b = mask[level] + 1; b-- > 0;) {
            if (gt + c + hist[b] >= k) {
                bin = b;
                break;
            }
            c += hist[b];
        }
        gt += c;
        prefix |= bin << shift[level];
        pmask |= mask[level] << shift[level];
        count_eq = hist[bin];
    }
    {
        /* prefix is now T, the k-th largest key; gt entries are above it. */
        uint32_t eq = (uint32_t)(k - gt);
        bool all_eq = eq == count_eq;
        CK(cudaMalloc(&d_flag, n));
        if (!all_eq) {
            CK(cudaMalloc(&d_eq, n * sizeof *d_eq));
            CK(cudaMalloc(&d_rank, n * sizeof *d_rank));
        }
        flag_kernel<<<grid_for(n), 256>>>(x, n, prefix, all_eq, d_flag, d_eq);
        CK(cudaGetLastError());
        if (!all_eq) {
            size_t tmp_bytes = 0;
            CK(cub::DeviceScan::ExclusiveSum(NULL, tmp_bytes, d_eq, d_rank, (int64_t)n));
            CK(cudaMalloc(&tmp, tmp_bytes));
            CK(cub::DeviceScan::ExclusiveSum(tmp, tmp_bytes, d_eq, d_rank, (int64_t)n));
            tie_kernel<<<grid_for(n), 256>>>(x, n, prefix, d_rank, eq, d_flag);
            CK(cudaGetLastError());
        }
        if ((rc = compact(x, n, d_flag, idx, val, &got)) != FL_OK)
            goto out;
        if (got != k) {
            rc = fl_fail(FL_EGPU, "top-k on device: selected %zu entries, expected %zu", got, k);
            goto out;
        }
        *k_out = got;
    }
out:
    cudaFree(d_hist);
    cudaFree(d_bad);
    cudaFree(d_flag);
    cudaFree(d_eq);
    cudaFree(d_rank);
    cudaFree(tmp);
    return rc;
}

static int sampled(const float *x, size_t n, size_t k, const fl_cmp_topk_opts_t *o,
                   const char *name, uint32_t *idx, float *val, size_t *k_out)
{
    int rc = FL_OK;
    size_t s = (size_t)(o->sample_fraction * (double)n);
    if (s < 1024)
        s = n < 1024 ? n : 1024;
    uint32_t *d_s = NULL;
    uint32_t *h_s = NULL;
    uint8_t *d_flag = NULL;
    size_t need = (size_t)ceil((double)k * (double)s / (double)n);
    size_t gt = 0;
    size_t got = 0;
    uint32_t thr;
    if (need < 1)
        need = 1;
    if (need > s)
        need = s;
    h_s = (uint32_t *)malloc(s * sizeof *h_s);
    if (h_s == NULL)
        return fl_fail(FL_ENOMEM, "top-k on device: no host memory for %zu samples", s);
    /* Every entry is looked at for NaN/Inf, not only the samples: one histogram pass records
     * the first bad index. */
    {
        unsigned int *d_h = NULL;
        unsigned long long *d_bad = NULL;
        unsigned long long bad = ~0ULL;
        CK(cudaMalloc(&d_h, 2048 * sizeof *d_h));
        CK(cudaMalloc(&d_bad, sizeof *d_bad));
        CK(cudaMemset(d_h, 0, 2048 * sizeof *d_h));
        CK(cudaMemcpy(d_bad, &bad, sizeof bad, cudaMemcpyHostToDevice));
        hist_kernel<<<grid_for(n), 256>>>(x, n, 0, 0, 20, 0x7ffu, d_h, d_bad);
        CK(cudaGetLastError());
        CK(cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost));
        cudaFree(d_h);
        cudaFree(d_bad);
        if (bad < n) {
            float v;
            CK(cudaMemcpy(&v, x + bad, sizeof v, cudaMemcpyDeviceToHost));
            rc = fl_fail(FL_ENONFINITE, "'%s' holds %s at index %llu of %zu", name,
                         isnan(v) ? "NaN" : "Inf", bad, n);
            goto out;
        }
    }
    CK(cudaMalloc(&d_s, s * sizeof *d_s));
    sample_kernel<<<grid_for(s), 256>>>(x, n, s, o->seed, d_s);
    CK(cudaGetLastError());
    CK(cudaMemcpy(h_s, d_s, s * sizeof *h_s, cudaMemcpyDeviceToHost));
    thr = fl_cmp_threshold(h_s, s, need, &gt);
    if (thr >= FL_CMP_KEY_NONFINITE) {
        rc = exact(x, n, k, name, idx, val, k_out); /* reports the NaN/Inf */
        goto out;
    }
    CK(cudaMalloc(&d_flag, n));
    /* threshold thr - 1 with "above" semantics selects key >= thr */
    flag_kernel<<<grid_for(n), 256>>>(x, n, thr > 0 ? thr - 1 : 0, thr == 0, d_flag, NULL);
    CK(cudaGetLastError());
    /* idx has room for k only: count first, then compact when it fits. */
    {
        size_t tmp_bytes = 0;
        void *tmp = NULL;
        unsigned long long *d_sum = NULL;
        unsigned long long h_sum = 0;
        CK(cub::DeviceReduce::Sum(NULL, tmp_bytes, d_flag, d_sum, (int64_t)n));
        CK(cudaMalloc(&tmp, tmp_bytes));
        CK(cudaMalloc(&d_sum, sizeof *d_sum));
        CK(cub::DeviceReduce::Sum(tmp, tmp_bytes, d_flag, d_sum, (int64_t)n));
        CK(cudaMemcpy(&h_sum, d_sum, sizeof h_sum, cudaMemcpyDeviceToHost));
        cudaFree(tmp);
        cudaFree(d_sum);
        if (h_sum > k) {
            rc = exact(x, n, k, name, idx, val, k_out);
            goto out;
        }
    }
    if ((rc = compact(x, n, d_flag, idx, val, &got)) != FL_OK)
        goto out;
    *k_out = got;
out:
    free(h_s);
    cudaFree(d_s);
    cudaFree(d_flag);
    return rc;
}

extern "C" int fl_cmp_topk_device(const float *x, size_t n, const fl_cmp_topk_opts_t *opts,
                                  uint32_t *idx, float *val, size_t *k_out)
{
    size_t k;
    *k_out = 0;
    int rc = fl_cmp_topk_check(n, opts, &k);
    if (rc != FL_OK)
        return rc;
    const char *name = opts->name != NULL ? opts->name : "gradient";
    if (opts->mode == FL_CMP_SAMPLED)
        return sampled(x, n, k, opts, name, idx, val, k_out);
    return exact(x, n, k, name, idx, val, k_out);
}
