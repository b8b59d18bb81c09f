"""The exchange DistributedOptimizer drives: libflodl's two-level engine (include/flodl/hier.h).
Flat, it is one ring over all ranks; hybrid, the processes of one host reduce-scatter each
bucket, each sends its shard across hosts (dense, or top-k with error feedback on the shard)
and the host all-gathers it. The processes of one host are the ranks that registered with the
same host: FLODL_HOST, or the address each reaches the coordinator from."""
import ctypes
import os

import flodl
from . import _lib

HIERARCHIES = {"auto": _lib.FL_HIER_AUTO, "flat": _lib.FL_HIER_FLAT,
               "hybrid": _lib.FL_HIER_HYBRID}
MEMORY = {"": _lib.FL_HIER_MEM_HOST, "cpu": _lib.FL_HIER_MEM_HOST, "sim": _lib.FL_HIER_MEM_SIM}


def _memory():
    """FLODL_DEVICE=sim: top-k and its residuals on libflodl's simulated device (the device
    code paths, checkable without a GPU); unset or cpu: on the host."""
    v = os.environ.get("FLODL_DEVICE", "")
    if v not in MEMORY:
        raise ValueError("flodl: FLODL_DEVICE=%r is not 'cpu' or 'sim'" % v)
    return MEMORY[v]


class Engine:
    """One engine per DistributedOptimizer. buckets: [(numel, flodl dtype, label)] in exchange
    order. Opened on the first exchange, or at once when flodl.init() already ran: creating it
    is a collective over the job's communicator."""

    def __init__(self, buckets, hierarchy, compression):
        self.buckets = buckets
        self.hierarchy = hierarchy
        self.compression = compression
        self.h = None
        self.closed = False
        self.pending = {}  # bucket index -> residual restored before the engine opened

    def open(self):
        with flodl._lock:
            if self.h is not None:
                return
            if self.closed:
                raise flodl.FlodlError("flodl: rank %d: the exchange was closed (close() or "
                                       "flodl.shutdown())" % flodl._rank)
            comm = flodl._need()
            n = len(self.buckets)
            lens = (_lib.c_size * n)(*[b[0] for b in self.buckets])
            types = (_lib.c_int * n)(*[b[1] for b in self.buckets])
            names = (_lib.c_char_p * n)(*[b[2].encode() for b in self.buckets])
            o = _lib.HierOpts()
            _lib.fl_hier_opts_init(ctypes.byref(o))
            o.hierarchy = HIERARCHIES[self.hierarchy]
            o.nbuckets = n
            o.bucket_len = lens
            o.bucket_type = types
            o.bucket_name = names
            o.memory = _memory()
            if self.compression is not None:
                o.density = self.compression.density
                o.values = flodl._WIRE[self.compression.values]
            h = ctypes.c_void_p()
            flodl._check(_lib.fl_hier_create(comm, ctypes.byref(o), ctypes.byref(h)),
                         "the gradient exchange (hierarchy=%r)" % self.hierarchy)
            self.h = h
            flodl._engines.add(self)
            pending, self.pending = self.pending, {}
            for index, r in pending.items():
                self.restore(index, r)

    def allreduce(self, index, t):
        """Averages bucket index over all ranks in place: t is its contiguous host tensor."""
        self.open()
        with flodl._lock:
            if self.h is None:
                raise flodl.FlodlError("flodl: rank %d: the exchange was closed" % flodl._rank)
            flodl._check(_lib.fl_hier_allreduce(self.h, index, t.data_ptr()),
                         "exchange of %s" % self.buckets[index][2])

    def residual(self, index):
        """The residual top-k keeps for bucket index (this rank's shard under hybrid), or
        None."""
        import torch
        with flodl._lock:
            if self.h is None:
                return self.pending.get(index)
            n = _lib.fl_hier_residual_len(self.h, index)
            if n == 0:
                return None
            r = torch.empty(n, dtype=torch.float32)
            flodl._check(_lib.fl_hier_residual_get(self.h, index, r.data_ptr(), n),
                         "reading the residual of %s" % self.buckets[index][2])
            return r

    def restore(self, index, r):
        import torch
        r = r.to(torch.float32).contiguous()
        with flodl._lock:
            if self.h is None:
                self.pending[index] = r.clone()
                return
            flodl._check(_lib.fl_hier_residual_put(self.h, index, r.data_ptr(), r.numel()),
                         "restoring the residual of %s" % self.buckets[index][2])

    def stats(self):
        """What the exchange did: hybrid or not, where this rank sits, the bytes it sent and
        those that crossed to another host."""
        s = _lib.HierStats()
        with flodl._lock:
            if self.h is not None:
                _lib.fl_hier_get_stats(self.h, ctypes.byref(s))
        t = s.topo
        return {"hybrid": bool(s.hybrid), "local_rank": t.local_rank,
                "local_size": t.local_size, "cross_rank": t.cross_rank,
                "cross_size": t.cross_size, "buckets": s.ops, "bytes_sent": s.bytes_sent,
                "bytes_sent_remote": s.bytes_sent_remote}

    def close(self):
        """Frees the engine and its sub-communicators (before the job's communicator goes)."""
        with flodl._lock:
            self.closed = True
            if self.h is not None:
                _lib.fl_hier_destroy(ctypes.byref(self.h))
                self.h = None
            flodl._engines.discard(self)
