/* cuBLAS, loaded on the first GEMM of a CUDA device rather than when the process starts. Linked
 * in, libcublasLt's initialisers touch about 90 MB of its own data in every process, which made
 * a drill or CPU-only rank cost 97 MB of anonymous memory: 256 ranks did not fit on a 24 GiB
 * host. These are the entry points the CUDA backend calls (cublas_v2.h maps its names onto the
 * _v2 ones); each resolves its symbol from the library on first use. */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

typedef cublasStatus_t (*create_fn)(cublasHandle_t *);
typedef cublasStatus_t (*destroy_fn)(cublasHandle_t);
typedef cublasStatus_t (*set_stream_fn)(cublasHandle_t, cudaStream_t);
typedef cublasStatus_t (*set_math_fn)(cublasHandle_t, cublasMath_t);
typedef const char *(*status_name_fn)(cublasStatus_t);
typedef cublasStatus_t (*sgemm_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                   int, const float *, const float *, int, const float *, int,
                                   const float *, float *, int);

static struct {
    pthread_once_t once;
    void *lib;
    char why[256];
    create_fn create;
    destroy_fn destroy;
    set_stream_fn set_stream;
    set_math_fn set_math;
    status_name_fn status_name;
    sgemm_fn sgemm;
} blas = {.once = PTHREAD_ONCE_INIT};

/* ISO C has no cast from an object pointer to a function pointer: the bits are copied. */
static void resolve(void *fn, size_t size, const char *name)
{
    void *sym = dlsym(blas.lib, name);
    if (sym == NULL && blas.why[0] == '\0')
        snprintf(blas.why, sizeof blas.why, "cuBLAS has no %s: %s", name, dlerror());
    memcpy(fn, &sym, size);
}

static void load(void)
{
    /* The toolkit's soname first (the loader's paths, LD_LIBRARY_PATH), then the library the
     * build found. */
    blas.lib = dlopen(FLODL_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (blas.lib == NULL)
        blas.lib = dlopen(FLODL_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (blas.lib == NULL) {
        snprintf(blas.why, sizeof blas.why, "cannot load cuBLAS (%s): %s", FLODL_CUBLAS_SONAME,
                 dlerror());
        return;
    }
    resolve(&blas.create, sizeof blas.create, "cublasCreate_v2");
    resolve(&blas.destroy, sizeof blas.destroy, "cublasDestroy_v2");
    resolve(&blas.set_stream, sizeof blas.set_stream, "cublasSetStream_v2");
    resolve(&blas.set_math, sizeof blas.set_math, "cublasSetMathMode");
    resolve(&blas.status_name, sizeof blas.status_name, "cublasGetStatusName");
    resolve(&blas.sgemm, sizeof blas.sgemm, "cublasSgemm_v2");
}

static bool ready(void)
{
    pthread_once(&blas.once, load);
    return blas.why[0] == '\0';
}

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    return ready() ? blas.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    return ready() ? blas.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
    return ready() ? blas.set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    return ready() ? blas.set_math(handle, mode) : CUBLAS_STATUS_NOT_INITIALIZED;
}

/* Without the library, the reason it could not be loaded: what the caller's error line shows. */
const char *cublasGetStatusName(cublasStatus_t status)
{
    return ready() ? blas.status_name(status) : blas.why;
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                              int m, int n, int k, const float *alpha, const float *a, int lda,
                              const float *b, int ldb, const float *beta, float *c, int ldc)
{
    if (!ready())
        return CUBLAS_STATUS_NOT_INITIALIZED;
    return blas.sgemm(handle, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
