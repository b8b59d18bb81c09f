"""One rank of a tests/python/run.py case: rank, world size and coordinator come from the
environment (flodl-launch's or the driver's). Prints one line "RESULT <json>" at the end;
exits non-zero on a failed check."""
import json
import os
import signal
import sys
import time

import torch

import flodl
import flodl.torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def collectives():
    flodl.init(timeout_ms=20000)
    r, n = flodl.rank(), flodl.size()
    for dt in DTYPES:
        # Small integers: exact in every dtype, so every sum is exact too.
        t = torch.arange(7, dtype=torch.float32).to(dt) + r
        ptr = t.data_ptr()
        assert flodl.allreduce(t, op="sum", name="s") is t and t.data_ptr() == ptr
        want = (torch.arange(7, dtype=torch.float32) * n + n * (n - 1) / 2).to(dt)
        assert torch.equal(t, want), (dt, t, want)
        a = torch.full((3, 2), float(2 * r), dtype=dt)
        flodl.allreduce(a, op="avg", name="a")
        assert torch.equal(a, torch.full((3, 2), float(n - 1), dtype=dt)), (dt, a)
        b = torch.full((5,), float(r + 10), dtype=dt)
        flodl.broadcast(b, root=n - 1, name="b")
        assert torch.equal(b, torch.full((5,), float(n - 1 + 10), dtype=dt)), (dt, b)
        g = flodl.allgather(torch.full((2, 3), float(r), dtype=dt), name="g")
        want = torch.cat([torch.full((2, 3), float(k), dtype=dt) for k in range(n)])
        assert g.dtype == dt and torch.equal(g, want), (dt, g)
        e = torch.empty(0, dtype=dt)
        flodl.allreduce(e, name="empty")
    flodl.barrier()
    flodl.shutdown()
    result(ok=True)


def expect(exc, words, fn):
    try:
        fn()
    except exc as e:
        text = str(e)
        missing = [w for w in words if w not in text]
        assert not missing, "%r lacks %s" % (text, missing)
        return text
    raise AssertionError("no %s raised" % exc.__name__)


def bad():
    flodl.init(timeout_ms=15000)  # the deadline the mismatch must fail within (it is at once)
    r = flodl.rank()
    nc = torch.zeros(4, 4).t()
    expect(ValueError, ["'nc'", "not contiguous"], lambda: flodl.allreduce(nc, name="nc"))
    i64 = torch.zeros(4, dtype=torch.int64)
    expect(TypeError, ["'ids'", "int64"], lambda: flodl.allreduce(i64, name="ids"))
    expect(TypeError, ["float64"], lambda: flodl.broadcast(torch.zeros(2, dtype=torch.float64)))
    t = torch.ones(100 + r)  # a different size on every rank
    t0 = time.monotonic()
    # A rank whose allreduce meets the mismatch names the tensor and the ranks; the first to
    # fail tells the job at once, so a rank still finishing the barrier (its last message
    # from a failed peer may go down with that peer's sockets) hears the failure from the
    # coordinator, naming the failed rank, instead of waiting for it until its deadline.
    try:
        flodl.barrier()  # the refusals above sent nothing: the communicator is still whole
        flodl.allreduce(t, name="w")
    except flodl.FlodlError as e:
        text = str(e)
    else:
        raise AssertionError("no FlodlError raised")
    ok = ("'w'" in text and "rank %d" % r in text) or " failed: allreduce of tensor 'w'" in text
    assert ok, "%r names neither this rank's tensor nor a failed rank's" % text
    elapsed = time.monotonic() - t0
    flodl.shutdown()
    result(ok=True, elapsed=elapsed, text=text)


def kill():
    flodl.init(timeout_ms=60000)
    r, n = flodl.rank(), flodl.size()
    t = torch.ones(1000)
    flodl.allreduce(t, name="x")
    if r == n - 1:
        time.sleep(0.5)  # let the allreduce's last sends leave: the others must complete it
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    text = expect(flodl.FlodlError, ["rank %d" % (n - 1), "'x'"],
                  lambda: [flodl.allreduce(t, name="x") for _ in range(100000)])
    elapsed = time.monotonic() - t0
    flodl.shutdown()
    result(ok=True, elapsed=elapsed, text=text)


def uncaught():
    """The last rank ends on an uncaught exception without calling shutdown: the others' next
    collective fails at once, naming it and the exception."""
    flodl.init(timeout_ms=60000)
    r, n = flodl.rank(), flodl.size()
    t = torch.ones(10)
    flodl.allreduce(t, name="x")
    if r == n - 1:
        time.sleep(0.5)
        raise RuntimeError("the data loader broke")
    t0 = time.monotonic()
    text = expect(flodl.FlodlError, ["rank %d" % (n - 1), "the data loader broke"],
                  lambda: flodl.allreduce(t, name="x"))
    result(ok=True, elapsed=time.monotonic() - t0, text=text)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 1))


def train(m, opt, x, y, steps):
    for s in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x[s]), y[s])
        loss.backward()
        if isinstance(opt, flodl.torch.DistributedOptimizer):
            # The hooks handed every bucket to the exchange thread during backward.
            assert opt._next == len(opt._buckets), "buckets left for step(): %d of %d sent" % (
                opt._next, len(opt._buckets))
        opt.step()
    return loss.item()


def equivalence(compression):
    """n ranks, each with its part of every batch, end with the parameters of one process that
    trains on the combined batches."""
    r, n = flodl.rank(), flodl.size()
    steps, per = 4, 8
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(steps, per * n, 10, generator=gen)
    y = torch.randn(steps, per * n, 1, generator=gen)
    m = model()
    if r != 0:  # differs until broadcast_parameters makes it root's
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1.0)
    flodl.torch.broadcast_parameters(m.state_dict(), root=0)
    opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                           m.named_parameters(), compression=compression,
                                           bucket_mb=0.002)
    assert len(opt._buckets) >= 3, len(opt._buckets)
    mine = slice(r * per, (r + 1) * per)
    train(m, opt, x[:, mine], y[:, mine], steps)
    ref = model()
    train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), x, y, steps)
    worst = 0.0
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        rel = ((p - q).abs().max() / q.abs().max()).item()
        worst = max(worst, rel)
        assert rel <= 1e-5, "%s: %s differs from the one-process run by %g (relative)" % (
            compression, name, rel)
    buckets = len(opt._buckets)
    opt.close()
    return worst, buckets


def topk_sparse():
    """Top-k 1% (float16 values) trains, keeping residuals that state_dict saves and
    load_state_dict restores."""
    r = flodl.rank()
    m = model()
    opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05),
                                           m.named_parameters(),
                                           compression=flodl.TopK(0.01, values="float16"))
    gen = torch.Generator().manual_seed(2 + r)
    x = torch.randn(6, 16, 10, generator=gen)
    y = x.sum(dim=2, keepdim=True) * 0.1
    train(m, opt, x, y, 6)
    sd = opt.state_dict()
    res = sd["flodl_residuals"][0]["residual"]
    assert res.abs().sum() > 0, "no residual kept"
    opt.load_state_dict(sd)
    assert torch.equal(opt.state_dict()["flodl_residuals"][0]["residual"], res)
    opt.close()
    return res.norm().item()


def optimizer():
    """Dense averaging, then top-k at density 1 (which must equal it), then top-k 1%."""
    flodl.init(timeout_ms=20000)
    worst, buckets = equivalence(None)
    worst_topk, _ = equivalence(flodl.TopK(1.0))
    norm = topk_sparse()
    flodl.shutdown()
    result(ok=True, worst=worst, worst_topk=worst_topk, buckets=buckets, residual_norm=norm)


if __name__ == "__main__":
    globals()[sys.argv[1]]()
