/* NCCL, opened on the first call rather than linked into libflodl. PyTorch loads its own
 * libnccl.so.2 (a wheel's, or one bundled in libtorch), and one process holds one library of a
 * soname: linked, ours and torch's would be two copies of one name, or the loader would pick
 * one for both. So a NCCL already in the process is taken first (RTLD_NOLOAD), then the
 * loader's libnccl.so.2, then the library the build found. These are the entry points
 * intra_nccl.c calls; each resolves its symbol from the library on first use. */
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The soname of the NCCL this was built against: libnccl.so.2. */
#define SONAME_OF(major) "libnccl.so." #major
#define NCCL_SONAME_OF(major) SONAME_OF(major)
#define FLODL_NCCL_SONAME NCCL_SONAME_OF(NCCL_MAJOR)

/* nccl.h declares these two without a prototype. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

typedef ncclResult_t (*unique_id_fn)(ncclUniqueId *);
typedef ncclResult_t (*init_config_fn)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
typedef ncclResult_t (*comm_fn)(ncclComm_t);
typedef ncclResult_t (*async_error_fn)(ncclComm_t, ncclResult_t *);
typedef const char *(*error_string_fn)(ncclResult_t);
typedef const char *(*last_error_fn)(ncclComm_t);
typedef ncclResult_t (*group_fn)(void);
typedef ncclResult_t (*all_gather_fn)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                                      cudaStream_t);
typedef ncclResult_t (*reduce_scatter_fn)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                          ncclComm_t, cudaStream_t);
typedef ncclResult_t (*broadcast_fn)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                                     cudaStream_t);

static struct {
    pthread_once_t once;
    void *lib;
    char why[256];
    unique_id_fn unique_id;
    init_config_fn init_config;
    comm_fn destroy, abort;
    async_error_fn async_error;
    error_string_fn error_string;
    last_error_fn last_error;
    group_fn group_start, group_end;
    all_gather_fn all_gather;
    reduce_scatter_fn reduce_scatter;
    broadcast_fn broadcast;
} nccl = {.once = PTHREAD_ONCE_INIT};

/* ISO C has no cast from an object pointer to a function pointer: the bits are copied. */
static void resolve(void *fn, size_t size, const char *name)
{
    void *sym = dlsym(nccl.lib, name);
    if (sym == NULL && nccl.why[0] == '\0')
        snprintf(nccl.why, sizeof nccl.why, "NCCL has no %s: %s", name, dlerror());
    memcpy(fn, &sym, size);
}

static void load(void)
{
    nccl.lib = dlopen(FLODL_NCCL_SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (nccl.lib == NULL)
        nccl.lib = dlopen(FLODL_NCCL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (nccl.lib == NULL)
        nccl.lib = dlopen(FLODL_NCCL_PATH, RTLD_NOW | RTLD_LOCAL);
    if (nccl.lib == NULL) {
        snprintf(nccl.why, sizeof nccl.why, "cannot load NCCL (%s): %s", FLODL_NCCL_SONAME,
                 dlerror());
        return;
    }
    resolve(&nccl.unique_id, sizeof nccl.unique_id, "ncclGetUniqueId");
    resolve(&nccl.init_config, sizeof nccl.init_config, "ncclCommInitRankConfig");
    resolve(&nccl.destroy, sizeof nccl.destroy, "ncclCommDestroy");
    resolve(&nccl.abort, sizeof nccl.abort, "ncclCommAbort");
    resolve(&nccl.async_error, sizeof nccl.async_error, "ncclCommGetAsyncError");
    resolve(&nccl.error_string, sizeof nccl.error_string, "ncclGetErrorString");
    resolve(&nccl.last_error, sizeof nccl.last_error, "ncclGetLastError");
    resolve(&nccl.group_start, sizeof nccl.group_start, "ncclGroupStart");
    resolve(&nccl.group_end, sizeof nccl.group_end, "ncclGroupEnd");
    resolve(&nccl.all_gather, sizeof nccl.all_gather, "ncclAllGather");
    resolve(&nccl.reduce_scatter, sizeof nccl.reduce_scatter, "ncclReduceScatter");
    resolve(&nccl.broadcast, sizeof nccl.broadcast, "ncclBroadcast");
}

static int ready(void)
{
    pthread_once(&nccl.once, load);
    return nccl.why[0] == '\0';
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    return ready() ? nccl.unique_id(id) : ncclSystemError;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    return ready() ? nccl.init_config(comm, nranks, id, rank, config) : ncclSystemError;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    return ready() ? nccl.destroy(comm) : ncclSystemError;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    return ready() ? nccl.abort(comm) : ncclSystemError;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
    return ready() ? nccl.async_error(comm, async_error) : ncclSystemError;
}

/* Without the library, the reason it could not be loaded: what the caller's error line shows. */
const char *ncclGetErrorString(ncclResult_t result)
{
    return ready() ? nccl.error_string(result) : nccl.why;
}

const char *ncclGetLastError(ncclComm_t comm)
{
    return ready() ? nccl.last_error(comm) : nccl.why;
}

ncclResult_t ncclGroupStart(void)
{
    return ready() ? nccl.group_start() : ncclSystemError;
}

ncclResult_t ncclGroupEnd(void)
{
    return ready() ? nccl.group_end() : ncclSystemError;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream)
{
    return ready() ? nccl.all_gather(send, recv, count, type, comm, stream) : ncclSystemError;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    if (!ready())
        return ncclSystemError;
    return nccl.reduce_scatter(send, recv, count, type, op, comm, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream)
{
    if (!ready())
        return ncclSystemError;
    return nccl.broadcast(send, recv, count, type, root, comm, stream);
}
