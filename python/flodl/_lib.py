"""libflodl through ctypes: finding the library, the public structs and function signatures.

Only the public API of include/flodl/*.h is used. Options structs that carry struct_size are
filled by the library's *_opts_init into a buffer with room to spare, so a newer library whose
struct grew at its end still works with these declarations of the fields we set."""
import ctypes
import ctypes.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("FLODL_LIBRARY")
    if env:
        yield env
        return
    for name in ("libflodl.so", "libflodl.so.0.1"):
        yield os.path.join(_HERE, name)
    # Run from the source tree (PYTHONPATH=python): the build directories next to it.
    src = os.path.dirname(os.path.dirname(_HERE))
    if os.path.exists(os.path.join(src, "include", "flodl", "flodl.h")):
        for build in ("build", "build-h"):
            yield os.path.join(src, build, "libflodl.so")
        try:
            for entry in sorted(os.listdir(src)):
                if entry.startswith("build"):
                    yield os.path.join(src, entry, "libflodl.so")
        except OSError:
            pass
    found = ctypes.util.find_library("flodl")
    if found:
        yield found
    yield "libflodl.so.0.1"
    yield "libflodl.so"


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise OSError("flodl: cannot load libflodl; set FLODL_LIBRARY to its path. Tried: " +
                  "; ".join(tried))


lib, path = _load()

c_size = ctypes.c_size_t
c_int = ctypes.c_int
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p

# Error codes and enums (include/flodl/flodl.h).
FL_OK = 0
FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16 = 1, 2, 3
FL_UINT8 = 6
FL_SUM, FL_AVG = 1, 2
FL_ENONFINITE = -9
FL_ERESYNC = -10
FL_PS_SYNC, FL_PS_ASYNC, FL_PS_SSP = 0, 1, 2
FL_HIER_AUTO, FL_HIER_FLAT, FL_HIER_HYBRID = 0, 1, 2
FL_HIER_MEM_HOST, FL_HIER_MEM_SIM = 0, 1

_SPARE = 512  # bytes after the fields we know: room for fields a newer library appends


class CommOpts(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size),
        ("rank", c_int),
        ("world_size", c_int),
        ("coordinator", c_char_p),
        ("job_id", c_char_p),
        ("host", c_char_p),
        ("bind", c_char_p),
        ("timeout_ms", c_int),
        ("rendezvous_timeout_ms", c_int),
        ("stripes", c_int),
        ("segment_bytes", c_size),
        ("small_bytes", c_size),
        ("algo", c_int),
        ("log_level", c_int),
        ("model_signature", ctypes.c_uint64),
        ("settings", c_char_p),
        ("curve_dir", c_char_p),
        ("tune_malloc", c_int),
        ("ipc", c_int),
        ("_spare", ctypes.c_char * _SPARE),
    ]


class CoordOpts(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size),
        ("bind", c_char_p),
        ("world_size", c_int),
        ("job_id", c_char_p),
        ("heartbeat_ms", c_int),
        ("heartbeat_timeout_ms", c_int),
        ("rendezvous_timeout_ms", c_int),
        ("log_level", c_int),
        ("num_shards", c_int),
        ("curve_dir", c_char_p),
        ("stall_report_ms", c_int),
        ("param_count", ctypes.c_uint64),
        ("_spare", ctypes.c_char * _SPARE),
    ]


class TopkOpts(ctypes.Structure):
    _fields_ = [
        ("k", c_size),
        ("density", ctypes.c_double),
        ("mode", c_int),
        ("sample_fraction", ctypes.c_double),
        ("seed", ctypes.c_uint64),
        ("name", c_char_p),
    ]


class EfOpts(ctypes.Structure):
    _fields_ = [
        ("n", c_size),
        ("name", c_char_p),
        ("momentum", ctypes.c_float),
        ("max_norm", ctypes.c_double),
        ("on_nonfinite", c_int),
        ("wire", c_int),
    ]


class SparseOpts(ctypes.Structure):
    _fields_ = [
        ("values", c_int),
        ("lz4", c_int),
        ("allow_dense", c_int),
        ("k_max", c_size),
    ]


class PsClientOpts(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size),
        ("rank", c_int),
        ("world_size", c_int),
        ("coordinator", c_char_p),
        ("job_id", c_char_p),
        ("curve_dir", c_char_p),
        ("host", c_char_p),
        ("param_count", c_size),
        ("model_signature", ctypes.c_uint64),
        ("settings", c_char_p),
        ("timeout_ms", c_int),
        ("rendezvous_timeout_ms", c_int),
        ("reconnect_timeout_ms", c_int),
        ("values", c_int),
        ("lz4", c_int),
        ("log_level", c_int),
        ("tune_malloc", c_int),
        ("model_shapes", c_char_p),
        ("_spare", ctypes.c_char * _SPARE),
    ]


class HierOpts(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size),
        ("hierarchy", c_int),
        ("nbuckets", c_size),
        ("bucket_len", ctypes.POINTER(c_size)),
        ("bucket_type", ctypes.POINTER(c_int)),
        ("density", ctypes.c_double),
        ("values", c_int),
        ("max_norm", ctypes.c_double),
        ("name", c_char_p),
        ("bucket_name", ctypes.POINTER(c_char_p)),
        ("memory", c_int),
        ("_spare", ctypes.c_char * _SPARE),
    ]


class HierTopo(ctypes.Structure):
    _fields_ = [
        ("local_rank", c_int),
        ("local_size", c_int),
        ("cross_rank", c_int),
        ("cross_size", c_int),
        ("uniform", c_int),
    ]


class HierStats(ctypes.Structure):
    _fields_ = [
        ("hybrid", c_int),
        ("topo", HierTopo),
        ("ops", ctypes.c_uint64),
        ("bytes_sent", ctypes.c_uint64),
        ("bytes_sent_remote", ctypes.c_uint64),
    ]


class CommStats(ctypes.Structure):
    _fields_ = [
        ("ops", ctypes.c_uint64),
        ("bytes_sent", ctypes.c_uint64),
        ("bytes_sent_remote", ctypes.c_uint64),
        ("bytes_recv", ctypes.c_uint64),
        ("bad_msgs", ctypes.c_uint64),
        ("last_algo", c_int),
    ]


class PsGrad(ctypes.Structure):
    _fields_ = [
        ("dense", c_void_p),
        ("idx", c_void_p),
        ("val", c_void_p),
        ("k", c_size),
        ("batch", ctypes.c_uint32),
    ]


def _sig(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


P = ctypes.POINTER
fl_version = _sig("fl_version", c_char_p)
fl_strerror = _sig("fl_strerror", c_char_p, c_int)
fl_last_error = _sig("fl_last_error", c_char_p)
fl_comm_opts_init = _sig("fl_comm_opts_init", None, P(CommOpts))
fl_comm_opts_from_env = _sig("fl_comm_opts_from_env", c_int, P(CommOpts))
fl_comm_init = _sig("fl_comm_init", c_int, P(CommOpts), P(c_void_p))
fl_comm_destroy = _sig("fl_comm_destroy", None, P(c_void_p))
fl_comm_abort = _sig("fl_comm_abort", None, c_void_p, c_int, c_char_p)
fl_comm_rank = _sig("fl_comm_rank", c_int, c_void_p)
fl_comm_size = _sig("fl_comm_size", c_int, c_void_p)
fl_allreduce = _sig("fl_allreduce", c_int, c_void_p, c_void_p, c_void_p, c_size, c_int, c_int)
fl_allgather = _sig("fl_allgather", c_int, c_void_p, c_void_p, c_void_p, c_size, c_int)
fl_broadcast = _sig("fl_broadcast", c_int, c_void_p, c_void_p, c_size, c_int, c_int)
fl_barrier = _sig("fl_barrier", c_int, c_void_p)
fl_comm_peer_host = _sig("fl_comm_peer_host", c_char_p, c_void_p, c_int)
fl_comm_get_stats = _sig("fl_comm_get_stats", None, c_void_p, P(CommStats))
fl_hier_topology = _sig("fl_hier_topology", c_int, c_void_p, P(HierTopo))
fl_hier_opts_init = _sig("fl_hier_opts_init", None, P(HierOpts))
fl_hier_create = _sig("fl_hier_create", c_int, c_void_p, P(HierOpts), P(c_void_p))
fl_hier_destroy = _sig("fl_hier_destroy", None, P(c_void_p))
fl_hier_allreduce = _sig("fl_hier_allreduce", c_int, c_void_p, c_size, c_void_p)
fl_hier_residual_len = _sig("fl_hier_residual_len", c_size, c_void_p, c_size)
fl_hier_residual_get = _sig("fl_hier_residual_get", c_int, c_void_p, c_size, c_void_p, c_size)
fl_hier_residual_put = _sig("fl_hier_residual_put", c_int, c_void_p, c_size, c_void_p, c_size)
fl_hier_get_stats = _sig("fl_hier_get_stats", None, c_void_p, P(HierStats))
fl_sparse_opts_init = _sig("fl_sparse_opts_init", None, P(SparseOpts))
fl_sparse_allreduce = _sig("fl_sparse_allreduce", c_int, c_void_p, c_void_p, c_void_p, c_size,
                           c_void_p, c_size, c_int, P(SparseOpts), c_void_p)
fl_cmp_ws_create = _sig("fl_cmp_ws_create", c_int, P(c_void_p))
fl_cmp_ws_destroy = _sig("fl_cmp_ws_destroy", None, P(c_void_p))
fl_cmp_topk_opts_init = _sig("fl_cmp_topk_opts_init", None, P(TopkOpts))
fl_cmp_topk_count = _sig("fl_cmp_topk_count", c_int, c_size, P(TopkOpts), P(c_size))
fl_cmp_ef_opts_init = _sig("fl_cmp_ef_opts_init", None, P(EfOpts))
fl_cmp_ef_create = _sig("fl_cmp_ef_create", c_int, P(EfOpts), P(c_void_p))
fl_cmp_ef_destroy = _sig("fl_cmp_ef_destroy", None, P(c_void_p))
fl_cmp_ef_step = _sig("fl_cmp_ef_step", c_int, c_void_p, c_void_p, c_void_p, P(TopkOpts),
                      c_void_p, c_void_p, P(c_size), P(ctypes.c_bool))
fl_cmp_ef_state = _sig("fl_cmp_ef_state", None, c_void_p, P(c_void_p), P(c_void_p), P(c_size))
fl_cmp_ef_restore = _sig("fl_cmp_ef_restore", c_int, c_void_p, c_void_p, c_void_p, c_size)
fl_coord_opts_init = _sig("fl_coord_opts_init", None, P(CoordOpts))
fl_coord_create = _sig("fl_coord_create", c_int, P(CoordOpts), P(c_void_p))
fl_coord_endpoint = _sig("fl_coord_endpoint", c_char_p, c_void_p)
fl_coord_start = _sig("fl_coord_start", c_int, c_void_p)
fl_coord_wait = _sig("fl_coord_wait", c_int, c_void_p, c_int)
fl_coord_stop = _sig("fl_coord_stop", None, c_void_p)
fl_coord_destroy = _sig("fl_coord_destroy", None, P(c_void_p))
fl_ps_consistency_name = _sig("fl_ps_consistency_name", c_char_p, c_int)
fl_ps_client_opts_init = _sig("fl_ps_client_opts_init", None, P(PsClientOpts))
fl_ps_client_opts_from_env = _sig("fl_ps_client_opts_from_env", c_int, P(PsClientOpts))
fl_ps_client_create = _sig("fl_ps_client_create", c_int, P(PsClientOpts), P(c_void_p))
fl_ps_client_destroy = _sig("fl_ps_client_destroy", None, P(c_void_p))
fl_ps_client_abort = _sig("fl_ps_client_abort", None, c_void_p, c_int, c_char_p)
fl_ps_client_param_count = _sig("fl_ps_client_param_count", c_size, c_void_p)
fl_ps_client_num_shards = _sig("fl_ps_client_num_shards", c_int, c_void_p)
fl_ps_client_consistency = _sig("fl_ps_client_consistency", c_int, c_void_p)
fl_ps_client_staleness = _sig("fl_ps_client_staleness", c_int, c_void_p)
fl_ps_client_step = _sig("fl_ps_client_step", ctypes.c_uint64, c_void_p)
fl_ps_client_init = _sig("fl_ps_client_init", c_int, c_void_p, c_void_p)
fl_ps_client_push_pull = _sig("fl_ps_client_push_pull", c_int, c_void_p, P(PsGrad), c_void_p)
fl_ps_client_pull = _sig("fl_ps_client_pull", c_int, c_void_p, c_void_p)
