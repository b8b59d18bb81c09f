"""DistributedOptimizer(mode="ps"): the parameter-server leg, over libflodl's PS client
(include/flodl/ps.h). The rank registers with the job's coordinator as a PS client declaring its
model (parameter count and the tensors' names and shapes, checked against every other rank and
flodl-ps --init), then every step pushes its gradient (dense, or top-k with error feedback over
the whole vector) and pulls the parameters the server's optimizer made, in one round trip per
shard. The torch optimizer wrapped around it never steps here; the bucketed ring exchange lives
in torch.py."""
import ctypes
import os

import torch

import flodl
from . import _lib


def shapes_text(named):
    """The model as the coordinator compares it: "name[d0,d1];" per tensor, flat order."""
    return "".join("%s[%s];" % (n, ",".join(str(d) for d in p.shape)) for n, p in named)


class PsExchange:
    """One PS client per process: the rank's membership of a parameter-server job."""

    def __init__(self, named, compression, timeout_ms=None):
        self.named = named
        self.compression = compression
        self.numel = sum(p.numel() for _, p in named)
        if self.numel == 0:
            raise ValueError("flodl.torch.DistributedOptimizer(mode='ps'): the model has no "
                             "parameter that requires a gradient")
        self.flat = torch.empty(self.numel, dtype=torch.float32)
        self.batch = 1
        self.ef = None
        self.client = None
        o = _lib.PsClientOpts()
        _lib.fl_ps_client_opts_init(ctypes.byref(o))
        flodl._check(_lib.fl_ps_client_opts_from_env(ctypes.byref(o)), "reading the environment")
        self._keep = []

        def s(v):
            b = v.encode()
            self._keep.append(b)
            return b

        curve = os.environ.get("FLODL_CURVE_DIR", "")
        if curve:
            o.curve_dir = s(curve)
        elif os.environ.get("FLODL_INSECURE", "") != "1":
            raise flodl.FlodlError("flodl.torch.DistributedOptimizer(mode='ps'): no security "
                                   "chosen: set FLODL_CURVE_DIR to the job's CurveZMQ keys, or "
                                   "FLODL_INSECURE=1 (flodl-launch sets one)")
        if o.rank < 0 or o.world_size < 1 or not o.coordinator:
            raise flodl.FlodlError("flodl.torch.DistributedOptimizer(mode='ps'): the environment "
                                   "does not say the rank, world size and coordinator; run "
                                   "under flodl-launch (with --ps-flag=--shards=K) or set "
                                   "FLODL_RANK, FLODL_WORLD_SIZE and FLODL_COORDINATOR")
        o.param_count = self.numel
        o.model_shapes = s(shapes_text(named))
        if timeout_ms is not None:
            o.timeout_ms = int(timeout_ms)
            o.rendezvous_timeout_ms = int(timeout_ms)
            o.reconnect_timeout_ms = int(timeout_ms)
        if compression is not None:
            o.values = flodl._WIRE[compression.values]
        flodl._rank = o.rank
        cl = ctypes.c_void_p()
        flodl._check(_lib.fl_ps_client_create(ctypes.byref(o), ctypes.byref(cl)),
                     "joining the parameter server with %d parameters (%d tensors)"
                     % (self.numel, len(named)))
        self.client = cl
        flodl._ps_joined(cl, o.rank, o.world_size)
        self.consistency = _lib.fl_ps_consistency_name(
            _lib.fl_ps_client_consistency(cl)).decode()
        self.staleness = _lib.fl_ps_client_staleness(cl)
        self.shards = _lib.fl_ps_client_num_shards(cl)
        # Rank 0 offers its parameters (taken by shards that have none: no --init file, no
        # checkpoint); every rank then starts from what the server holds.
        self._gather_params()
        flodl._check(_lib.fl_ps_client_init(cl, self.flat.data_ptr()),
                     "fetching the initial parameters from the parameter server")
        self._scatter_params()

    def step_count(self):
        return int(_lib.fl_ps_client_step(self.client))

    def _gather_params(self):
        off = 0
        with torch.no_grad():
            for _, p in self.named:
                n = p.numel()
                self.flat[off:off + n].copy_(p.detach().reshape(-1))
                off += n

    def _scatter_params(self):
        off = 0
        with torch.no_grad():
            for _, p in self.named:
                n = p.numel()
                p.copy_(self.flat[off:off + n].view_as(p))
                off += n

    def _ef_state(self):
        if self.ef is not None:
            return
        o = _lib.EfOpts()
        _lib.fl_cmp_ef_opts_init(ctypes.byref(o))
        o.n = self.numel
        self._name = b"gradient (parameter-server push)"
        o.name = self._name
        o.wire = flodl._WIRE[self.compression.values]
        ef = ctypes.c_void_p()
        flodl._check(_lib.fl_cmp_ef_create(ctypes.byref(o), ctypes.byref(ef)),
                     "error feedback for the parameter-server push")
        ws = ctypes.c_void_p()
        flodl._check(_lib.fl_cmp_ws_create(ctypes.byref(ws)), "top-k workspace")
        t = _lib.TopkOpts()
        _lib.fl_cmp_topk_opts_init(ctypes.byref(t))
        t.density = self.compression.density
        t.name = self._name
        k = ctypes.c_size_t()
        flodl._check(_lib.fl_cmp_topk_count(self.numel, ctypes.byref(t), ctypes.byref(k)),
                     "top-k of the parameter-server push")
        self.ef, self.ws, self.topk = ef, ws, t
        self.idx = torch.empty(k.value, dtype=torch.int32)
        self.val = torch.empty(k.value, dtype=torch.float32)

    def _what(self, step):
        """What a push is, naming the parameters whose gradient holds a NaN or Inf."""
        bad = [n for n, p in self.named
               if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
        return "push of step %d's gradient (%d parameters%s)" % (
            step, self.numel, ", NaN or Inf in the gradient of %s" % ", ".join(
                "'%s'" % n for n in bad) if bad else "")

    def push_pull(self):
        """Pushes this step's gradient and writes the server's next parameters into the model.
        Returns False when the server restarted from a checkpoint (the parameters are then its
        restored ones, and this step's gradient was dropped)."""
        parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach()
                 .reshape(-1).to(device="cpu", dtype=torch.float32) for _, p in self.named]
        g = torch.cat(parts)
        grad = _lib.PsGrad()
        grad.batch = int(self.batch)
        if self.compression is None:
            grad.dense = g.data_ptr()
        else:
            self._ef_state()
            k = ctypes.c_size_t()
            rc = _lib.fl_cmp_ef_step(self.ef, self.ws, g.data_ptr(), ctypes.byref(self.topk),
                                     self.idx.data_ptr(), self.val.data_ptr(), ctypes.byref(k),
                                     None)
            flodl._check(rc, self._what(self.step_count()) if rc == _lib.FL_ENONFINITE else
                         "top-k of the parameter-server push")
            grad.idx = self.idx.data_ptr()
            grad.val = self.val.data_ptr()
            grad.k = k.value
        step = self.step_count()
        rc = _lib.fl_ps_client_push_pull(self.client, ctypes.byref(grad), self.flat.data_ptr())
        if rc == _lib.FL_ERESYNC:
            self._scatter_params()
            return False
        flodl._check(rc, self._what(step) if rc == _lib.FL_ENONFINITE else
                     "push of step %d's gradient (%d parameters) and pull" % (step, self.numel))
        self._scatter_params()
        return True

    def residual(self):
        if self.ef is None:
            return None
        r = ctypes.c_void_p()
        v = ctypes.c_void_p()
        n = ctypes.c_size_t()
        _lib.fl_cmp_ef_state(self.ef, ctypes.byref(r), ctypes.byref(v), ctypes.byref(n))
        arr = (ctypes.c_float * n.value).from_address(r.value)
        return torch.frombuffer(arr, dtype=torch.float32).clone()

    def restore_residual(self, r):
        self._ef_state()
        r = r.to(torch.float32).contiguous()
        flodl._check(_lib.fl_cmp_ef_restore(self.ef, r.data_ptr(), None, r.numel()),
                     "restoring the residual of the parameter-server push")

    def close(self):
        if self.ef is not None:
            _lib.fl_cmp_ef_destroy(ctypes.byref(self.ef))
            _lib.fl_cmp_ws_destroy(ctypes.byref(self.ws))
            self.ef = None
