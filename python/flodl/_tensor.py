"""Collectives on torch tensors: CPU tensors reduced in place through their data_ptr() (no copy),
CUDA tensors staged through pinned host memory. float32, float16 and bfloat16; other dtypes and
non-contiguous tensors are refused, naming the tensor."""
import flodl
from . import _lib


def _dtypes():
    import torch
    return {torch.float32: _lib.FL_FLOAT32, torch.float16: _lib.FL_FLOAT16,
            torch.bfloat16: _lib.FL_BFLOAT16}


def describe(t, name):
    shape = ",".join(str(d) for d in t.shape)
    what = "%s[%s]" % (str(t.dtype).replace("torch.", ""), shape)
    return "tensor '%s' (%s)" % (name, what) if name else "tensor %s" % what


def _check_tensor(t, name, op):
    import torch
    if not isinstance(t, torch.Tensor):
        raise TypeError("flodl.%s: expected a torch.Tensor, got %s" % (op, type(t).__name__))
    dt = _dtypes().get(t.dtype)
    if dt is None:
        raise TypeError("flodl.%s: %s: dtype %s is not supported (float32, float16, bfloat16)"
                        % (op, describe(t, name), t.dtype))
    if not t.is_contiguous():
        raise ValueError("flodl.%s: %s is not contiguous; pass t.contiguous() and copy the "
                         "result back" % (op, describe(t, name)))
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError("flodl.%s: %s is on device %s; only cpu and cuda tensors are supported"
                         % (op, describe(t, name), t.device))
    return dt


def _host(t):
    """t itself on the CPU; a pinned host copy of a CUDA tensor."""
    import torch
    if t.device.type == "cpu":
        return t
    h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    h.copy_(t)
    return h


def _run(what, fn, *args):
    comm = flodl._need()
    with flodl._lock:
        rc = fn(comm, *args)
        if rc != flodl._lib.FL_OK:
            # A failed collective breaks the communicator (every later one fails): the job hears
            # it now, as flodl-worker's ranks do, instead of the others waiting for this rank
            # until their deadline while the caller handles the exception.
            detail = flodl._text(flodl._lib.fl_last_error())
            try:
                flodl._check(rc, what)
            finally:
                flodl._lib.fl_comm_abort(comm, rc, ("%s: %s" % (what, detail)).encode())


def allreduce(t, op="avg", name=None):
    """Reduces t over all ranks in place (op "sum" or "avg") and returns it."""
    dt = _check_tensor(t, name, "allreduce")
    fop = flodl._OPS.get(op)
    if fop is None:
        raise ValueError("flodl.allreduce: op %r is not 'sum' or 'avg'" % (op,))
    h = _host(t)
    p = h.data_ptr()
    _run("allreduce of %s" % describe(t, name), _lib.fl_allreduce, p, p, h.numel(), dt, fop)
    if h is not t:
        t.copy_(h)
    return t


def broadcast(t, root=0, name=None):
    """Copies root's t into every rank's t, in place, and returns it."""
    dt = _check_tensor(t, name, "broadcast")
    h = _host(t)
    _run("broadcast of %s from rank %d" % (describe(t, name), root), _lib.fl_broadcast,
         h.data_ptr(), h.numel(), dt, int(root))
    if h is not t:
        t.copy_(h)
    return t


def allgather(t, name=None):
    """Returns a new tensor: every rank's t concatenated along dimension 0, rank order (every
    rank's t must have the same shape)."""
    import torch
    dt = _check_tensor(t, name, "allgather")
    n = flodl.size()
    r = flodl.rank()
    shape = (n * t.shape[0],) + tuple(t.shape[1:]) if t.dim() > 0 else (n,)
    out = torch.empty(shape, dtype=t.dtype)
    m = t.numel()
    flat = out.view(-1)
    flat[r * m:(r + 1) * m].copy_(t.reshape(-1))
    p = out.data_ptr()
    mine = p + r * m * out.element_size()  # in place: this rank's shard inside the result
    _run("allgather of %s" % describe(t, name), _lib.fl_allgather, mine, p, n * m, dt)
    return out.to(t.device) if t.device.type != "cpu" else out


def barrier():
    """Returns once every rank has entered the barrier."""
    _run("barrier", _lib.fl_barrier)
