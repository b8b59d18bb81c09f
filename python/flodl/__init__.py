"""flodl from Python: a process API in the style of Horovod over libflodl (ctypes).

    import flodl
    flodl.init()                      # rank, world size, coordinator from the environment
    flodl.allreduce(t, op="avg")      # in place, on every rank
    flodl.shutdown()

Rank, world size and coordinator come from the variables a launcher sets (flodl-launch's
FLODL_*, torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, Open MPI's, Kubernetes'), read by
libflodl's fl_comm_opts_from_env; CurveZMQ keys from FLODL_CURVE_DIR, or FLODL_INSECURE=1 for
plain text. One communicator per process; the collectives may be called from any thread (they
take turns)."""
import atexit
import ctypes
import os
import sys
import threading

from . import _lib
from ._lib import lib as _raw  # noqa: F401  (for callers that want the raw library)

__version__ = "0.1.0"
__all__ = ["FlodlError", "init", "shutdown", "is_initialized", "rank", "size", "local_rank",
           "local_size", "cross_rank", "cross_size", "stats", "allreduce", "broadcast",
           "allgather", "barrier", "TopK", "library_path", "library_version"]


class FlodlError(RuntimeError):
    """A libflodl call failed: code is the negative fl_err_t, detail fl_last_error()'s text
    (rank, host, operation and cause)."""

    def __init__(self, message, code=None, detail=None):
        super().__init__(message)
        self.code = code
        self.detail = detail


class TopK:
    """Top-k compression with error feedback for DistributedOptimizer: density of the entries
    sent per bucket (0 < density <= 1), values the wire type of the values ("float32",
    "float16" or "bfloat16")."""

    def __init__(self, density=0.01, values="float32"):
        if not 0.0 < float(density) <= 1.0:
            raise ValueError("flodl.TopK: density %r is not in (0, 1]" % (density,))
        if values not in _WIRE:
            raise ValueError("flodl.TopK: values %r is not one of float32, float16, bfloat16" %
                             (values,))
        self.density = float(density)
        self.values = values

    def __repr__(self):
        return "flodl.TopK(density=%g, values=%r)" % (self.density, self.values)


_WIRE = {"float32": _lib.FL_FLOAT32, "float16": _lib.FL_FLOAT16, "bfloat16": _lib.FL_BFLOAT16}
_OPS = {"sum": _lib.FL_SUM, "avg": _lib.FL_AVG, "average": _lib.FL_AVG}

_comm = None
_psc = None               # the parameter-server client of DistributedOptimizer(mode="ps")
_rank = -1
_size = 0
_lock = threading.RLock()  # one thread at a time per communicator (comm.h)
_keep = []                 # strings the options point at, alive as long as the communicator
_engines = set()           # DistributedOptimizer exchanges open on _comm: closed before it
_uncaught = None           # the exception that ends the program, if one does
_prev_excepthook = None


def _excepthook(kind, value, tb):
    global _uncaught
    _uncaught = "%s: %s" % (kind.__name__, value)
    (_prev_excepthook or sys.__excepthook__)(kind, value, tb)


def _at_exit():
    # A program that ends on an uncaught exception leaves the job with it, so the other ranks
    # hear at once (naming this rank and the exception) instead of at their deadline.
    shutdown(error=_uncaught)


def library_path():
    return _lib.path


def library_version():
    return _lib.fl_version().decode()


def _text(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def _check(rc, what):
    """Raises FlodlError for a failed call; must run on the thread that made the call (the
    detail text is the thread's own)."""
    if rc == _lib.FL_OK:
        return
    detail = _text(_lib.fl_last_error())
    name = _text(_lib.fl_strerror(rc))
    raise FlodlError("flodl: %s failed (rank %d, %s): %s" % (what, _rank, name, detail),
                     code=rc, detail=detail)


def init(timeout_ms=None, rendezvous_timeout_ms=None, job_id=None, host=None):
    """Joins the job: registers with the coordinator and waits for every rank. Keyword arguments
    override the defaults (timeout_ms: deadline of one collective). Idempotent."""
    global _comm, _rank, _size
    with _lock:
        if _comm is not None:
            return
        o = _lib.CommOpts()
        _lib.fl_comm_opts_init(ctypes.byref(o))
        _check(_lib.fl_comm_opts_from_env(ctypes.byref(o)), "reading the environment")
        keep = []

        def s(v):
            b = v.encode()
            keep.append(b)
            return b

        curve = os.environ.get("FLODL_CURVE_DIR", "")
        insecure = os.environ.get("FLODL_INSECURE", "") == "1"
        if curve:
            o.curve_dir = s(curve)
        elif not insecure:
            raise FlodlError("flodl.init: no security chosen: set FLODL_CURVE_DIR to the job's "
                             "CurveZMQ keys (flodl-keygen), or FLODL_INSECURE=1 for plain text "
                             "(flodl-launch sets one)")
        missing = [n for n, bad in (("rank (FLODL_RANK or RANK)", o.rank < 0),
                                    ("world size (FLODL_WORLD_SIZE or WORLD_SIZE)",
                                     o.world_size < 1),
                                    ("coordinator (FLODL_COORDINATOR or MASTER_ADDR)",
                                     not o.coordinator)) if bad]
        if missing:
            raise FlodlError("flodl.init: the environment does not say the %s; run under "
                             "flodl-launch, torchrun, mpirun, or set FLODL_RANK, "
                             "FLODL_WORLD_SIZE and FLODL_COORDINATOR" % ", ".join(missing))
        if timeout_ms is not None:
            o.timeout_ms = int(timeout_ms)
        if rendezvous_timeout_ms is not None:
            o.rendezvous_timeout_ms = int(rendezvous_timeout_ms)
        if job_id is not None:
            o.job_id = s(job_id)
        if host is not None:
            o.host = s(host)
        _rank = o.rank
        comm = ctypes.c_void_p()
        _check(_lib.fl_comm_init(ctypes.byref(o), ctypes.byref(comm)), "init")
        _comm = comm
        _exit_hooks()
        _size = _lib.fl_comm_size(comm)
        _rank = _lib.fl_comm_rank(comm)
        _keep[:] = keep


def _exit_hooks():
    global _prev_excepthook
    if _prev_excepthook is None:
        _prev_excepthook = sys.excepthook
        sys.excepthook = _excepthook
        atexit.register(_at_exit)


def _ps_joined(client, rank_, size_):
    """DistributedOptimizer(mode="ps") made this process a parameter-server client: rank() and
    size() answer from it, and shutdown() leaves the job through it."""
    global _psc, _rank, _size
    with _lock:
        _psc = client
        _rank, _size = rank_, size_
        _exit_hooks()


def shutdown(error=None):
    """Leaves the job. error (a string): this rank stops on an error of its own, and the
    coordinator tells the others at once. Safe to call twice; called at exit when the program
    did not (with the uncaught exception that ended it, if any)."""
    global _comm, _psc, _rank, _size
    with _lock:
        if _psc is not None:
            if error is not None:
                _lib.fl_ps_client_abort(_psc, -1, str(error).encode())
            _lib.fl_ps_client_destroy(ctypes.byref(_psc))
            _psc = None
            _size = 0
        if _comm is None:
            return
        for e in list(_engines):  # their sub-communicators go before the communicator
            e.close()
        if error is not None:
            _lib.fl_comm_abort(_comm, -1, str(error).encode())
        _lib.fl_comm_destroy(ctypes.byref(_comm))
        _comm = None
        _size = 0


def is_initialized():
    return _comm is not None or _psc is not None


def _need():
    if _comm is None:
        if _psc is not None:
            raise FlodlError("flodl: rank %d is a parameter-server client "
                             "(DistributedOptimizer(mode='ps')); collectives need flodl.init() "
                             "in a job without one" % _rank)
        raise FlodlError("flodl: not initialized; call flodl.init() first")
    return _comm


def rank():
    if _psc is None:
        _need()
    return _rank


def size():
    if _psc is None:
        _need()
    return _size


def _topology():
    t = _lib.HierTopo()
    with _lock:
        _check(_lib.fl_hier_topology(_need(), ctypes.byref(t)), "topology")
    return t


def local_rank():
    """This rank's place among the ranks of its host, as Horovod's: ranks registered with the
    same host (FLODL_HOST, or the address they reach the coordinator from), ordered by rank."""
    return _topology().local_rank


def local_size():
    """The number of ranks on this rank's host."""
    return _topology().local_size


def cross_rank():
    """This rank's host's place among the job's hosts, ordered by their lowest rank."""
    return _topology().cross_rank


def cross_size():
    """The number of hosts in the job."""
    return _topology().cross_size


def stats():
    """This rank's communicator counters since init(): collectives, bytes sent and received,
    the bytes sent to ranks on another host, and messages refused."""
    s = _lib.CommStats()
    with _lock:
        _lib.fl_comm_get_stats(_need(), ctypes.byref(s))
    return {"ops": s.ops, "bytes_sent": s.bytes_sent, "bytes_sent_remote": s.bytes_sent_remote,
            "bytes_recv": s.bytes_recv, "bad_msgs": s.bad_msgs}


from ._tensor import allreduce, broadcast, allgather, barrier  # noqa: E402,F401
