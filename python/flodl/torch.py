"""flodl for PyTorch training: DistributedOptimizer averages gradients over the ranks while the
backward pass is still running, and broadcast_parameters makes every rank start from root's
weights.

    opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           model.named_parameters(),
                                           compression=flodl.TopK(0.01))
    flodl.torch.broadcast_parameters(model.state_dict(), root=0)

Gradients are grouped into buckets of about bucket_mb, in the reverse order of the parameters
(the order backward produces them). A hook on each parameter's gradient accumulator marks it
ready; once a bucket is complete (and every bucket before it has gone), a background thread
exchanges it while backward goes on. Buckets go in the same order on every rank. step() waits
for the exchange, writes the averaged gradients back into .grad, then steps the wrapped
optimizer. One backward pass per step."""
import ctypes
import queue
import threading

import torch

import flodl
from . import _lib
from ._tensor import _dtypes, _host

__all__ = ["DistributedOptimizer", "broadcast_parameters"]


class _Bucket:
    def __init__(self, index, entries):
        self.index = index
        self.entries = entries  # [(name, param, offset, numel)], backward order
        self.numel = sum(e[3] for e in entries)
        self.dtype = entries[0][1].dtype
        self.label = "gradient bucket %d (%s)" % (
            index, ", ".join(e[0] for e in entries[:3]) + (", ..." if len(entries) > 3 else ""))
        self.ef = None   # top-k: error feedback state (residual), created on first use
        self.ws = None
        self.reset()

    def reset(self):
        self.waiting = set(id(e[1]) for e in self.entries)
        self.flat = None
        self.sent = False
        self.done = threading.Event()
        self.error = None


class DistributedOptimizer:
    """Wraps a torch.optim optimizer: step() steps it with gradients averaged over all ranks.

    named_parameters: the model's (name, parameter) pairs, the same on every rank (names appear
    in error texts). compression: None (dense averaging) or flodl.TopK(density, values): each
    bucket sends only its largest entries, keeping the rest as a residual added to the next
    step's gradient (error feedback, saved in state_dict()). bucket_mb: bucket size in MiB."""

    def __init__(self, optimizer, named_parameters=None, compression=None, bucket_mb=25.0):
        if compression is not None and not isinstance(compression, flodl.TopK):
            raise TypeError("flodl.torch.DistributedOptimizer: compression must be None or "
                            "flodl.TopK, not %r" % (compression,))
        self.optimizer = optimizer
        self.compression = compression
        if named_parameters is None:
            named_parameters = [("param.%d.%d" % (g, i), p)
                                for g, group in enumerate(optimizer.param_groups)
                                for i, p in enumerate(group["params"])]
        named = [(n, p) for n, p in list(named_parameters) if p.requires_grad]
        seen = set()
        for n, p in named:
            if id(p) in seen:
                raise ValueError("flodl.torch.DistributedOptimizer: parameter '%s' is listed "
                                 "twice" % n)
            seen.add(id(p))
            if p.dtype not in _dtypes():
                raise TypeError("flodl.torch.DistributedOptimizer: parameter '%s' has dtype %s "
                                "(float32, float16, bfloat16 only)" % (n, p.dtype))
        limit = max(1, int(float(bucket_mb) * (1 << 20)))
        self._buckets = []
        cur, size = [], 0
        for n, p in reversed(named):
            nbytes = p.numel() * p.element_size()
            if cur and (size + nbytes > limit or p.dtype != cur[0][1].dtype):
                self._buckets.append(_Bucket(len(self._buckets), cur))
                cur, size = [], 0
            cur.append((n, p, size // p.element_size(), p.numel()))
            size += nbytes
        if cur:
            self._buckets.append(_Bucket(len(self._buckets), cur))
        self._of = {}
        for b in self._buckets:
            for e in b.entries:
                self._of[id(e[1])] = b
        self._lock = threading.Lock()
        self._next = 0            # the next bucket to hand to the thread, in bucket order
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._exchange_loop, name="flodl-exchange",
                                        daemon=True)
        self._thread.start()
        self._hooks = []
        self._accs = []
        for n, p in named:
            # The gradient accumulator's hook runs once p.grad holds this pass's gradient
            # (a tensor hook would see it before accumulation); works on PyTorch 1.x and 2.x.
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append(acc.register_hook(self._make_hook(p)))
            self._accs.append(acc)  # keep the node, or the hook goes with it

    # ---- the wrapped optimizer ----

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, *args, **kwargs):
        return self.optimizer.zero_grad(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.__dict__["optimizer"], name)

    def state_dict(self):
        sd = self.optimizer.state_dict()
        if self.compression is not None:
            res = {}
            for b in self._buckets:
                if b.ef is None:
                    continue
                r = ctypes.c_void_p()
                v = ctypes.c_void_p()
                n = ctypes.c_size_t()
                _lib.fl_cmp_ef_state(b.ef, ctypes.byref(r), ctypes.byref(v), ctypes.byref(n))
                arr = (ctypes.c_float * n.value).from_address(r.value)
                res[b.index] = {"names": [e[0] for e in b.entries],
                                "residual": torch.frombuffer(arr, dtype=torch.float32).clone()}
            sd["flodl_residuals"] = res
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        res = state_dict.pop("flodl_residuals", None)
        self.optimizer.load_state_dict(state_dict)
        if res and self.compression is not None:
            for idx, saved in res.items():
                b = self._buckets[int(idx)]
                names = [e[0] for e in b.entries]
                if saved["names"] != names:
                    raise ValueError("flodl.torch.DistributedOptimizer.load_state_dict: residual "
                                     "of bucket %d is for %s, this model's bucket holds %s"
                                     % (b.index, saved["names"], names))
                self._topk_state(b)
                r = saved["residual"].to(torch.float32).contiguous()
                flodl._check(_lib.fl_cmp_ef_restore(b.ef, r.data_ptr(), None, r.numel()),
                             "restoring the residual of %s" % b.label)

    # ---- the exchange ----

    def _make_hook(self, p):
        def hook(*_):
            self._ready(p)
        return hook

    def _ready(self, p):
        b = self._of[id(p)]
        with self._lock:
            if id(p) not in b.waiting:
                return  # a second backward before step(): the first gradient already went
            b.waiting.discard(id(p))
            if not b.waiting:
                self._pack(b)
            self._send_ready()

    def _pack(self, b):
        parts = []
        for _, p, _, _ in b.entries:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            parts.append(g.detach().reshape(-1))
        b.flat = torch.cat(parts)

    def _send_ready(self):
        while self._next < len(self._buckets) and self._buckets[self._next].flat is not None:
            b = self._buckets[self._next]
            b.sent = True
            self._queue.put(b)
            self._next += 1

    def _exchange_loop(self):
        while True:
            b = self._queue.get()
            if b is None:
                return
            try:
                if self.compression is None:
                    self._dense(b)
                else:
                    self._topk(b)
            except BaseException as e:  # raised again by step() on the caller's thread
                b.error = e
            b.done.set()

    def _dense(self, b):
        h = _host(b.flat)
        comm = flodl._need()
        with flodl._lock:
            flodl._check(_lib.fl_allreduce(comm, h.data_ptr(), h.data_ptr(), h.numel(),
                                           _dtypes()[h.dtype], _lib.FL_AVG),
                         "allreduce of %s" % b.label)
        b.result = h

    def _topk_state(self, b):
        if b.ef is not None:
            return
        o = _lib.EfOpts()
        _lib.fl_cmp_ef_opts_init(ctypes.byref(o))
        o.n = b.numel
        b.name_bytes = b.label.encode()
        o.name = b.name_bytes
        o.wire = flodl._WIRE[self.compression.values]
        ef = ctypes.c_void_p()
        flodl._check(_lib.fl_cmp_ef_create(ctypes.byref(o), ctypes.byref(ef)),
                     "error feedback for %s" % b.label)
        ws = ctypes.c_void_p()
        flodl._check(_lib.fl_cmp_ws_create(ctypes.byref(ws)), "top-k workspace")
        t = _lib.TopkOpts()
        _lib.fl_cmp_topk_opts_init(ctypes.byref(t))
        t.density = self.compression.density
        t.name = b.name_bytes
        k = ctypes.c_size_t()
        flodl._check(_lib.fl_cmp_topk_count(b.numel, ctypes.byref(t), ctypes.byref(k)),
                     "top-k of %s" % b.label)
        s = _lib.SparseOpts()
        _lib.fl_sparse_opts_init(ctypes.byref(s))
        s.values = flodl._WIRE[self.compression.values]
        s.k_max = k.value  # the same density on every rank: no round to gather the k's
        b.ef, b.ws, b.topk, b.k, b.sparse = ef, ws, t, k.value, s

    def _topk(self, b):
        self._topk_state(b)
        g = b.flat.to(device="cpu", dtype=torch.float32).contiguous()
        idx = torch.empty(b.k, dtype=torch.int32)
        val = torch.empty(b.k, dtype=torch.float32)
        k = ctypes.c_size_t()
        skipped = ctypes.c_bool()
        flodl._check(_lib.fl_cmp_ef_step(b.ef, b.ws, g.data_ptr(), ctypes.byref(b.topk),
                                         idx.data_ptr(), val.data_ptr(), ctypes.byref(k),
                                         ctypes.byref(skipped)),
                     "top-k of %s" % b.label)
        out = torch.empty(b.numel, dtype=torch.float32)
        comm = flodl._need()
        with flodl._lock:
            flodl._check(_lib.fl_sparse_allreduce(comm, idx.data_ptr(), val.data_ptr(), k.value,
                                                  out.data_ptr(), b.numel, _lib.FL_AVG,
                                                  ctypes.byref(b.sparse), None),
                         "sparse allreduce of %s" % b.label)
        b.result = out

    def synchronize(self):
        """Waits for every bucket's exchange and writes the averaged gradients into .grad.
        Buckets whose parameters got no gradient in this pass go with zeros."""
        with self._lock:
            for b in self._buckets:
                if b.flat is None:
                    b.waiting.clear()
                    self._pack(b)
            self._send_ready()
        error = None
        for b in self._buckets:
            b.done.wait()
            if b.error is not None and error is None:
                error = b.error
        try:
            if error is not None:
                raise error
            for b in self._buckets:
                for _, p, off, n in b.entries:
                    avg = b.result[off:off + n].view_as(p)
                    if p.grad is None:
                        p.grad = avg.to(device=p.device, dtype=p.dtype).clone()
                    else:
                        p.grad.copy_(avg)
        finally:
            with self._lock:
                for b in self._buckets:
                    b.result = None
                    b.reset()
                self._next = 0

    def step(self, closure=None):
        self.synchronize()
        return self.optimizer.step(closure) if closure is not None else self.optimizer.step()

    def close(self):
        """Stops the exchange thread and frees the compressor state."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for b in self._buckets:
            if b.ef is not None:
                _lib.fl_cmp_ef_destroy(ctypes.byref(b.ef))
                _lib.fl_cmp_ws_destroy(ctypes.byref(b.ws))
                b.ef = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def broadcast_parameters(params, root=0):
    """Copies root's tensors into every rank's, in place: params is a state_dict (name ->
    tensor, e.g. model.state_dict()) or (name, tensor) pairs, in the same order on every rank.
    Any dtype (the bytes travel)."""
    items = list(params.items()) if hasattr(params, "items") else list(params)
    comm = flodl._need()
    for name, t in items:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        with torch.no_grad():
            src = t if t.is_contiguous() and t.device.type == "cpu" else t.detach().contiguous()
            h = _host(src)
            with flodl._lock:
                flodl._check(_lib.fl_broadcast(comm, h.data_ptr(), h.numel() * h.element_size(),
                                               _lib.FL_UINT8, int(root)),
                             "broadcast of parameter '%s' from rank %d" % (name, root))
            if h is not t:
                t.copy_(h)
