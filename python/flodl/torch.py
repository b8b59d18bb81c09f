"""flodl for PyTorch training: DistributedOptimizer averages gradients over the ranks while the
backward pass is still running (or, with mode="ps", trains through flodl-ps), broadcast_parameters
makes every rank start from root's weights and broadcast_optimizer_state from root's optimizer
state.

    opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           model.named_parameters(),
                                           compression=flodl.TopK(0.01))
    flodl.torch.broadcast_parameters(model.state_dict(), root=0)

Gradients are grouped into buckets of about bucket_mb, in the reverse order of the parameters
(the order backward produces them). A hook on each parameter's gradient accumulator marks it
ready; once a bucket is complete (and every bucket before it has gone), a background thread
exchanges it while backward goes on. Buckets go in the same order on every rank. step() waits
for the exchange, writes the averaged gradients back into .grad, then steps the wrapped
optimizer. backward_passes_per_step=K accumulates K backward passes locally and exchanges once,
on the K-th (as Horovod's)."""
import io
import queue
import threading

import torch

import flodl
from . import _lib
from ._engine import HIERARCHIES, Engine
from ._ps import PsExchange
from ._tensor import _dtypes, _host

__all__ = ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state"]


class _Bucket:
    def __init__(self, index, entries):
        self.index = index
        self.entries = entries  # [(name, param, offset, numel)], backward order
        self.numel = sum(e[3] for e in entries)
        self.dtype = entries[0][1].dtype
        self.label = "gradient bucket %d (%s)" % (
            index, ", ".join(e[0] for e in entries[:3]) + (", ..." if len(entries) > 3 else ""))
        self.buf = None  # the packed gradients, kept across steps (no allocation per step)
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
    step's gradient (error feedback, saved in state_dict()). bucket_mb: bucket size in MiB.
    backward_passes_per_step: K backward passes (their gradients summed in .grad, as PyTorch
    does) before one exchange and one step(); a K+1-th pass raises.

    mode="ring" (default): the ranks of flodl.init() average the gradients (allreduce), and
    step() steps the wrapped optimizer on every rank. mode="ps": no flodl.init(); this rank
    joins the job's parameter server (flodl-ps with shards, e.g. flodl-launch
    --ps-flag=--shards=2), declaring its model (the parameters' count, names and shapes, which
    every rank and flodl-ps --init must share); rank 0 offers its parameters as the initial
    ones and every rank starts from the server's. step() pushes the gradient (dense, or top-k
    with error feedback over the whole model) and writes the parameters the server's optimizer
    made (flodl-ps --optimizer, --lr, ...) into the model: the wrapped optimizer never steps
    and its hyperparameters are not used. The server's --consistency (sync, async, ssp) says
    whether step() waits for the other ranks. timeout_ms: the deadline of one exchange.

    hierarchy (mode="ring"): "hybrid" runs the two-level exchange: the processes of one host
    (the ranks registered with the same host: FLODL_HOST, or the address each reaches the
    coordinator from) reduce-scatter each bucket, each sends only its shard across hosts (top-k
    then selects on the host's average shard, whose residual this rank keeps) and the host
    all-gathers it. "flat": one ring over all ranks. "auto" (default): hybrid when there are
    several hosts with the same number of processes, more than one each; one host, or one
    process per host, is flat. Every rank must give the same hierarchy, buckets and compression:
    a rank that does not is refused on every rank, naming it."""

    def __init__(self, optimizer, named_parameters=None, compression=None, bucket_mb=25.0,
                 backward_passes_per_step=1, mode="ring", timeout_ms=None,
                 hierarchy="auto"):
        if compression is not None and not isinstance(compression, flodl.TopK):
            raise TypeError("flodl.torch.DistributedOptimizer: compression must be None or "
                            "flodl.TopK, not %r" % (compression,))
        if mode not in ("ring", "ps"):
            raise ValueError("flodl.torch.DistributedOptimizer: mode %r is not 'ring' or 'ps'"
                             % (mode,))
        if hierarchy not in HIERARCHIES:
            raise ValueError("flodl.torch.DistributedOptimizer: hierarchy %r is not 'auto', "
                             "'flat' or 'hybrid'" % (hierarchy,))
        if mode == "ps" and hierarchy == "hybrid":
            raise ValueError("flodl.torch.DistributedOptimizer: mode='ps' pushes each rank's "
                             "whole gradient; hierarchy='hybrid' is for mode='ring'")
        if int(backward_passes_per_step) < 1:
            raise ValueError("flodl.torch.DistributedOptimizer: backward_passes_per_step %r is "
                             "not >= 1" % (backward_passes_per_step,))
        self.optimizer = optimizer
        self.compression = compression
        self.mode = mode
        self.hierarchy = hierarchy
        self._engine = None
        self.backward_passes_per_step = int(backward_passes_per_step)
        self._ps = None
        self._ps_restarts = 0
        self._buckets = []
        self._next = 0
        self._hooks = []
        self._thread = None
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
        if mode == "ps":
            if flodl._comm is not None:
                raise flodl.FlodlError("flodl.torch.DistributedOptimizer(mode='ps'): rank %d "
                                       "called flodl.init(): a process is a ring rank or a "
                                       "parameter-server client, not both" % flodl._rank)
            if flodl._psc is not None:
                raise flodl.FlodlError("flodl.torch.DistributedOptimizer(mode='ps'): rank %d "
                                       "already has one; one per process" % flodl._rank)
            self._ps = PsExchange(named, compression, timeout_ms)
            return
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
        wire = _lib.FL_FLOAT32 if compression is not None else None
        self._engine = Engine([(b.numel, wire or _dtypes()[b.dtype], b.label)
                               for b in self._buckets], hierarchy, compression)
        if flodl._comm is not None:
            self._engine.open()  # refuses ranks that disagree now, on every rank
        self._of = {}
        for b in self._buckets:
            for e in b.entries:
                self._of[id(e[1])] = b
        self._lock = threading.Lock()
        self._passes = {}         # id(param) -> backward passes since the last step
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

    @property
    def consistency(self):
        """mode="ps": the server's consistency model, "sync", "async" or "ssp"."""
        return self._ps.consistency if self._ps is not None else "sync"

    @property
    def ps_step(self):
        """mode="ps": the step whose gradient this rank computes next (the server's count)."""
        return self._ps.step_count() if self._ps is not None else None

    @property
    def ps_restarts(self):
        """mode="ps": how many steps came back with a restarted server's parameters (their
        gradient dropped): flodl-ps resumed from a checkpoint under this rank."""
        return self._ps_restarts

    @property
    def ps_shards(self):
        """mode="ps": the parameter server's shard count."""
        return self._ps.shards if self._ps is not None else 0

    def state_dict(self):
        sd = self.optimizer.state_dict()
        if self._ps is not None:
            r = self._ps.residual()
            if r is not None:
                sd["flodl_residuals"] = {"ps": {"names": [n for n, _ in self._ps.named],
                                                "residual": r}}
            return sd
        if self.compression is not None:
            res = {}
            for b in self._buckets:
                r = self._engine.residual(b.index)
                if r is not None:
                    res[b.index] = {"names": [e[0] for e in b.entries], "residual": r}
            sd["flodl_residuals"] = res
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        res = state_dict.pop("flodl_residuals", None)
        self.optimizer.load_state_dict(state_dict)
        if res and self._ps is not None and "ps" in res:
            names = [n for n, _ in self._ps.named]
            if res["ps"]["names"] != names:
                raise ValueError("flodl.torch.DistributedOptimizer.load_state_dict: the residual "
                                 "is for %s, this model has %s" % (res["ps"]["names"], names))
            self._ps.restore_residual(res["ps"]["residual"])
        elif res and self.compression is not None:
            for idx, saved in res.items():
                b = self._buckets[int(idx)]
                names = [e[0] for e in b.entries]
                if saved["names"] != names:
                    raise ValueError("flodl.torch.DistributedOptimizer.load_state_dict: residual "
                                     "of bucket %d is for %s, this model's bucket holds %s"
                                     % (b.index, saved["names"], names))
                self._engine.restore(b.index, saved["residual"])

    # ---- the exchange ----

    def _make_hook(self, p):
        def hook(*_):
            self._ready(p)
        return hook

    def _ready(self, p):
        b = self._of[id(p)]
        with self._lock:
            if id(p) not in b.waiting:
                name = next(e[0] for e in b.entries if e[1] is p)
                raise RuntimeError(
                    "flodl: rank %d: parameter '%s' got a gradient more than "
                    "backward_passes_per_step=%d times before step(); call step() after every "
                    "%d backward passes, or raise backward_passes_per_step"
                    % (flodl._rank, name, self.backward_passes_per_step,
                       self.backward_passes_per_step))
            passes = self._passes.get(id(p), 0) + 1
            self._passes[id(p)] = passes
            if passes < self.backward_passes_per_step:
                return  # accumulating in .grad: the exchange waits for the last pass
            b.waiting.discard(id(p))
            if not b.waiting:
                self._pack(b)
            self._send_ready()

    def _pack(self, b):
        parts = []
        for _, p, _, _ in b.entries:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            parts.append(g.detach().reshape(-1))
        # Reused: the exchange of the previous step is over (synchronize copied its result
        # out), and a fresh model-sized tensor each step costs its page faults again.
        if b.buf is None or b.buf.dtype != parts[0].dtype or b.buf.device != parts[0].device:
            b.buf = torch.empty(b.numel, dtype=parts[0].dtype, device=parts[0].device)
        b.flat = torch.cat(parts, out=b.buf)

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
                self._exchange(b)
            except BaseException as e:  # raised again by step() on the caller's thread
                b.error = e
            b.done.set()

    def _exchange(self, b):
        if self.compression is None:
            t = _host(b.flat)
        else:  # top-k and its residuals work in float32 on the host
            t = b.flat.to(device="cpu", dtype=torch.float32).contiguous()
        self._engine.allreduce(b.index, t)
        b.result = t

    def exchange_stats(self):
        """What this optimizer's exchange did: "hybrid" (the two-level exchange ran), this
        rank's "local_rank", "local_size", "cross_rank" and "cross_size", the "buckets"
        exchanged, "bytes_sent" and, of those, "bytes_sent_remote" (to another host)."""
        if self._engine is None:
            return {}
        return self._engine.stats()

    def synchronize(self):
        """Waits for every bucket's exchange and writes the averaged gradients into .grad.
        Buckets whose parameters got no gradient in this pass go with zeros. mode="ps": nothing
        (the exchange is step()'s)."""
        if self._ps is not None:
            return
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
                self._passes = {}
                self._next = 0

    def step(self, closure=None):
        if self._ps is not None:
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            if not self._ps.push_pull():
                self._ps_restarts += 1
            return loss
        self.synchronize()
        return self.optimizer.step(closure) if closure is not None else self.optimizer.step()

    def close(self):
        """Stops the exchange thread and frees the compressor state. mode="ps": the rank stays
        in the job until flodl.shutdown() (or the program's end)."""
        if self._ps is not None:
            self._ps.close()
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._engine is not None:
            self._engine.close()

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


def _broadcast_bytes(data, root, what):
    """root's bytes on every rank (data: root's, ignored elsewhere)."""
    comm = flodl._need()
    n = torch.tensor([len(data) if flodl.rank() == root else 0], dtype=torch.int64)
    with flodl._lock:
        flodl._check(_lib.fl_broadcast(comm, n.data_ptr(), 8, _lib.FL_UINT8, int(root)),
                     "broadcast of the size of %s from rank %d" % (what, root))
    buf = torch.empty(int(n.item()), dtype=torch.uint8)
    if flodl.rank() == root:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    if buf.numel() > 0:
        with flodl._lock:
            flodl._check(_lib.fl_broadcast(comm, buf.data_ptr(), buf.numel(), _lib.FL_UINT8,
                                           int(root)),
                         "broadcast of %s from rank %d" % (what, root))
    return buf.numpy().tobytes()


def broadcast_optimizer_state(optimizer, root=0):
    """Makes every rank's optimizer state and hyperparameters root's, as Horovod's function of
    that name: the state tensors (momentum buffers, Adam's moments and step counts) and every
    scalar of the parameter groups (lr, momentum, betas, ...). optimizer: a torch.optim
    optimizer or a DistributedOptimizer (its wrapped optimizer; top-k residuals are each rank's
    own and stay). Root's state_dict travels whole, so a rank whose optimizer has no state yet
    (never stepped) gets root's, created by load_state_dict, without Horovod's zero-gradient
    step (which would count one Adam step and apply weight decay once); root's empty state
    empties the others'. A rank whose optimizer does not match root's (another count of
    parameter groups or parameters) makes every rank raise, naming it."""
    if isinstance(optimizer, DistributedOptimizer):
        if optimizer._ps is not None:
            raise flodl.FlodlError("flodl.torch.broadcast_optimizer_state: rank %d trains "
                                   "through the parameter server, whose optimizer state is the "
                                   "server's" % flodl._rank)
        optimizer = optimizer.optimizer
    me = flodl.rank()
    data = b""
    if me == root:
        f = io.BytesIO()
        torch.save(optimizer.state_dict(), f)
        data = f.getvalue()
    data = _broadcast_bytes(data, root, "the optimizer state")
    error = None
    if me != root:
        try:
            # A full unpickle: PyTorch 1.13's weights_only loader refuses floats (the
            # hyperparameters). Root is a member of this job (CurveZMQ-authenticated by
            # default), as trusted as the code every rank runs.
            sd = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
            mine = optimizer.state_dict()["param_groups"]
            got = [len(g["params"]) for g in sd["param_groups"]]
            have = [len(g["params"]) for g in mine]
            if got != have:
                raise ValueError("rank %d's optimizer has parameter groups of %s parameters, "
                                 "rank %d's %s" % (me, have, root, got))
            optimizer.load_state_dict(sd)
        except Exception as e:  # every rank must hear it, or the others would go on alone
            error = e
    flag = torch.tensor([1.0 if error is not None else 0.0])
    failed = flodl.allgather(flag, name="broadcast_optimizer_state: failed")
    if failed.sum().item() > 0:
        ranks = [r for r in range(flodl.size()) if failed[r].item() > 0]
        raise ValueError("flodl.torch.broadcast_optimizer_state from rank %d failed on rank(s) "
                         "%s%s" % (root, ",".join(str(r) for r in ranks),
                                   ": %s" % error if error is not None else ""))
