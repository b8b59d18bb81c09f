"""One rank of a tests/python/run.py case: rank, world size and coordinator come from the
environment (flodl-launch's or the driver's). Prints one line "RESULT <json>" at the end;
exits non-zero on a failed check."""
import io
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


def save_params(m, tag):
    """Rank 0 leaves the parameters for run.py to compare between jobs (FLODL_TEST_OUT)."""
    out = os.environ.get("FLODL_TEST_OUT")
    if out and flodl.rank() == 0:
        torch.save([p.detach().clone() for p in m.parameters()],
                   "%s.%s%d" % (out, tag, flodl.size()))


def equivalence(compression, mode="ring", save=None):
    """n ranks, each with its part of every batch, end with the parameters of one process that
    trains on the combined batches. mode="ps": through flodl-ps, whose optimizer (SGD, lr 0.1,
    momentum 0.9) is run.py's flags; the server then gives every rank rank 0's start."""
    steps, per = 4, 8
    m = model()
    r = int(os.environ["FLODL_RANK"])
    if r != 0:  # differs until broadcast_parameters (or the server) makes it rank 0's
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1.0)
    if mode == "ring":
        flodl.torch.broadcast_parameters(m.state_dict(), root=0)
    opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                           m.named_parameters(), compression=compression,
                                           bucket_mb=0.002, mode=mode)
    n = flodl.size()
    assert mode == "ps" or len(opt._buckets) >= 3, len(opt._buckets)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(steps, per * n, 10, generator=gen)
    y = torch.randn(steps, per * n, 1, generator=gen)
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
    if save:
        save_params(m, save)
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
    worst, buckets = equivalence(None, save="ring")
    worst_topk, _ = equivalence(flodl.TopK(1.0))
    norm = topk_sparse()
    flodl.shutdown()
    result(ok=True, worst=worst, worst_topk=worst_topk, buckets=buckets, residual_norm=norm)


def ps():
    """DistributedOptimizer(mode="ps") under flodl-launch with flodl-ps shards: the same
    parameters as one process (and, run.py checks, as the dense ring)."""
    worst, _ = equivalence(None, mode="ps", save="ps")
    flodl.shutdown()
    result(ok=True, worst=worst)


def ps_async():
    """The server's --consistency async (or ssp, FLODL_TEST_CONSISTENCY): it learns (a linear
    target), with top-k 50% pushes."""
    m = torch.nn.Linear(10, 1)
    opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0),
                                           m.named_parameters(), mode="ps",
                                           compression=flodl.TopK(0.5))
    want = os.environ.get("FLODL_TEST_CONSISTENCY", "async")
    assert opt.consistency == want, (opt.consistency, want)
    assert want != "ssp" or opt._ps.staleness == 1, opt._ps.staleness
    gen = torch.Generator().manual_seed(3 + flodl.rank())
    w = torch.arange(10, dtype=torch.float32).view(1, 10) / 10
    first = None
    for s in range(60):
        x = torch.randn(16, 10, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), x @ w.t())
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < first / 5, (first, loss.item())
    assert opt.state_dict()["flodl_residuals"]["ps"]["residual"].numel() == 11
    # A NaN in a gradient is refused before anything is sent, naming the rank and the tensor;
    # the server (async) and the other rank do not wait for it.
    m.weight.grad[0, 3] = float("nan")
    expect(flodl.FlodlError, ["rank %d" % flodl.rank(), "'weight'", "NaN"], opt.step)
    flodl.shutdown()
    result(ok=True, first=first, last=loss.item())


def ps_restart():
    """Trains through flodl-ps while run.py kills it (kill -9) and starts it again with
    --resume: step() comes back with the checkpoint's parameters and ps_step goes on from the
    checkpoint's step, to the end."""
    m = torch.nn.Linear(10, 1)
    opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0),
                                           m.named_parameters(), mode="ps")
    gen = torch.Generator().manual_seed(11 + flodl.rank())
    w = torch.arange(10, dtype=torch.float32).view(1, 10) / 10
    back = 0
    while opt.ps_step < 40:
        before = opt.ps_step
        x = torch.randn(16, 10, generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), x @ w.t())
        loss.backward()
        restarts = opt.ps_restarts
        opt.step()
        if opt.ps_restarts != restarts:
            # the checkpoint's step may be the one this rank was about to reach: count what
            # step() says, not a jump in ps_step
            back += 1
            print("resumed at step %d (was at %d)" % (opt.ps_step, before), flush=True)
        print("STEP %d" % opt.ps_step, flush=True)
        time.sleep(0.05)
    assert back >= 1, "no restart seen"
    flodl.shutdown()
    result(ok=True, resumes=back, last=loss.item())


def ps_bad():
    """The last rank's model has another shape: every rank's DistributedOptimizer(mode="ps")
    raises at the rendezvous, naming the tensor."""
    n = int(os.environ["FLODL_WORLD_SIZE"])
    r = int(os.environ["FLODL_RANK"])
    m = model() if r != n - 1 else torch.nn.Sequential(torch.nn.Linear(10, 33))
    t0 = time.monotonic()
    text = expect(flodl.FlodlError, ["rank"], lambda: flodl.torch.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), mode="ps",
        timeout_ms=20000))
    result(ok=True, elapsed=time.monotonic() - t0, text=text)


def same_state(a, b, what):
    """Two optimizers' state_dicts hold the same bits and hyperparameters."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"], (what, sa["param_groups"],
                                                      sb["param_groups"])
    assert sa["state"].keys() == sb["state"].keys(), (what, sa["state"].keys(),
                                                      sb["state"].keys())
    for k in sa["state"]:
        for f, v in sa["state"][k].items():
            w = sb["state"][k][f]
            ok = torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w
            assert ok, "%s: state %s.%s differs: %r, %r" % (what, k, f, v, w)


def optstate():
    """broadcast_optimizer_state: every rank trains its own number of steps (rank 0 none, so
    its optimizer has no state) at its own learning rate; then all hold root's state and
    hyperparameters, as root's own replay gives them, for SGD with momentum and Adam (step
    counts included), plain or wrapped in a DistributedOptimizer."""
    r, n = flodl.rank(), flodl.size()
    root = n - 1

    def trained(make, rank):
        m = model()
        opt = make(m, 0.01 * (rank + 1))
        gen = torch.Generator().manual_seed(5)
        for _ in range(rank):
            x = torch.randn(8, 10, generator=gen)
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
        return m, opt

    makers = {
        "sgd": lambda m, lr: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9),
        "adam": lambda m, lr: torch.optim.Adam(m.parameters(), lr=lr, betas=(0.8, 0.99)),
    }
    for name, make in makers.items():
        for wrapped in (False, True):
            m, opt = trained(make, r)
            if wrapped:
                opt = flodl.torch.DistributedOptimizer(opt, m.named_parameters())
            flodl.torch.broadcast_optimizer_state(opt, root=root)
            _, want = trained(make, root)
            same_state(opt.optimizer if wrapped else opt, want, "%s%s" % (
                name, " wrapped" if wrapped else ""))
            if wrapped:
                opt.close()
    # A rank whose optimizer holds another number of parameters: every rank raises.
    m = model()
    params = list(m.parameters())
    opt = torch.optim.SGD(params if r != 0 else params[:2], lr=0.1, momentum=0.9)
    expect(ValueError, ["rank(s) 0", "broadcast_optimizer_state"],
           lambda: flodl.torch.broadcast_optimizer_state(opt, root=root))


def run_topk(m, opt, x, y, first, last):
    for s in range(first, last):
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x[s]), y[s]).backward()
        opt.step()


def checkpoint():
    """Top-k 5% with SGD momentum: 4 steps, a checkpoint (model and optimizer state_dict with
    the residuals, through torch.save), a fresh model and optimizer loading it and 4 more
    steps end with the bits of 8 steps uninterrupted."""
    r = flodl.rank()
    gen = torch.Generator().manual_seed(7 + r)
    x = torch.randn(8, 16, 10, generator=gen)
    y = x.sum(dim=2, keepdim=True) * 0.1

    def fresh(perturb):
        m = model()
        if perturb:  # a restarted process: what it had is overwritten by the checkpoint
            with torch.no_grad():
                for p in m.parameters():
                    p.mul_(-3.0)
        opt = flodl.torch.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), m.named_parameters(),
            compression=flodl.TopK(0.05), bucket_mb=0.002)
        return m, opt

    m, opt = fresh(False)
    run_topk(m, opt, x, y, 0, 8)
    whole = [p.detach().clone() for p in m.parameters()]
    opt.close()
    m, opt = fresh(False)
    run_topk(m, opt, x, y, 0, 4)
    f = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, f)
    nres = len(opt.state_dict()["flodl_residuals"])
    opt.close()
    m, opt = fresh(True)
    f.seek(0)
    ck = torch.load(f)
    m.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    run_topk(m, opt, x, y, 4, 8)
    for i, (p, q) in enumerate(zip(m.parameters(), whole)):
        assert torch.equal(p, q), "parameter %d: resumed differs from uninterrupted by %g" % (
            i, (p - q).abs().max().item())
    opt.close()
    return nres


def accumulate():
    """backward_passes_per_step=2: nothing leaves on the first backward pass, every bucket on
    the second; the parameters are those of one process accumulating the combined micro-
    batches; a third pass before step() raises, naming the parameter."""
    r, n = flodl.rank(), flodl.size()
    steps, k, per = 3, 2, 4
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(steps, k, per * n, 10, generator=gen)
    y = torch.randn(steps, k, per * n, 1, generator=gen)
    m = model()
    opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                           m.named_parameters(), bucket_mb=0.002,
                                           backward_passes_per_step=k)
    ref = model()
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    mine = slice(r * per, (r + 1) * per)
    for s in range(steps):
        opt.zero_grad()
        ropt.zero_grad()
        for j in range(k):
            torch.nn.functional.mse_loss(m(x[s, j, mine]), y[s, j, mine]).backward()
            sent = opt._next
            assert sent == (len(opt._buckets) if j == k - 1 else 0), (j, sent)
            torch.nn.functional.mse_loss(ref(x[s, j]), y[s, j]).backward()
        opt.step()
        ropt.step()
    worst = 0.0
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        rel = ((p - q).abs().max() / q.abs().max()).item()
        worst = max(worst, rel)
        assert rel <= 1e-5, "%s differs from one process by %g (relative)" % (name, rel)
    opt.zero_grad()
    for j in range(k):
        m(x[0, 0, mine]).sum().backward()
    expect(RuntimeError, ["rank %d" % r, "parameter '4.", "backward_passes_per_step=2"],
           lambda: m(x[0, 0, mine]).sum().backward())
    opt.synchronize()  # every rank sent the same buckets: the exchange completes
    opt.close()
    return worst


def state():
    """One job for broadcast_optimizer_state, the top-k checkpoint and gradient accumulation."""
    flodl.init(timeout_ms=20000)
    optstate()
    nres = checkpoint()
    worst = accumulate()
    flodl.shutdown()
    result(ok=True, residuals=nres, worst_accumulate=worst)


# ---- two hosts of two processes (FLODL_HOST 127.0.0.1 and 127.0.0.2) ----


def accumulated(make, xs, ys, steps):
    """The reference: one process accumulating every rank's batch of each step, each batch's
    loss divided by the number of ranks (the average DistributedOptimizer makes)."""
    ref = model()
    opt = make(ref)
    for s in range(steps):
        opt.zero_grad()
        for x, y in zip(xs, ys):
            (torch.nn.functional.mse_loss(ref(x[s]), y[s]) / len(xs)).backward()
        opt.step()
    return ref


def hier_parity(make, hierarchy):
    """This rank's part of each step through DistributedOptimizer(hierarchy=...): the
    parameters of one process accumulating the per-process batches, within 1e-5 relative."""
    steps, per = 4, 8
    r, n = flodl.rank(), flodl.size()
    m = model()
    gen = torch.Generator().manual_seed(11)
    xs = [torch.randn(steps, per, 10, generator=gen) for _ in range(n)]
    ys = [torch.randn(steps, per, 1, generator=gen) for _ in range(n)]
    opt = flodl.torch.DistributedOptimizer(make(m), m.named_parameters(), bucket_mb=0.002,
                                           hierarchy=hierarchy)
    assert len(opt._buckets) >= 3, len(opt._buckets)
    train(m, opt, xs[r], ys[r], steps)
    st = opt.exchange_stats()
    assert st["hybrid"] == (hierarchy == "hybrid"), st
    opt.close()
    ref = accumulated(make, xs, ys, steps)
    worst = 0.0
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        rel = ((p - q).abs().max() / q.abs().max()).item()
        worst = max(worst, rel)
        assert rel <= 1e-5, "%s %s: %s differs from one process accumulating by %g" % (
            hierarchy, make.__name__, name, rel)
    return worst, [p.detach().clone() for p in m.parameters()]


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def adam(m):
    return torch.optim.Adam(m.parameters(), lr=0.01)


def cross_bytes(hierarchy, compression):
    """Bytes this rank sent to the other host in 3 steps of a 200k-parameter model."""
    torch.manual_seed(3)
    m = torch.nn.Sequential(torch.nn.Linear(400, 500), torch.nn.Tanh(), torch.nn.Linear(500, 1))
    opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01),
                                           m.named_parameters(), compression=compression,
                                           hierarchy=hierarchy)
    gen = torch.Generator().manual_seed(20 + flodl.rank())
    x = torch.randn(3, 16, 400, generator=gen)
    for s in range(3):
        opt.zero_grad()
        m(x[s]).pow(2).mean().backward()
        opt.step()
    st = opt.exchange_stats()
    opt.close()
    return st["bytes_sent_remote"]


def topk_on(device, hierarchy):
    """Top-k 5% through hierarchy with its selection on FLODL_DEVICE=device: the parameters
    and residuals after 4 steps."""
    os.environ["FLODL_DEVICE"] = device
    m = model()
    opt = flodl.torch.DistributedOptimizer(sgd(m), m.named_parameters(), bucket_mb=0.002,
                                           compression=flodl.TopK(0.05), hierarchy=hierarchy)
    gen = torch.Generator().manual_seed(30 + flodl.rank())
    train(m, opt, torch.randn(4, 8, 10, generator=gen), torch.randn(4, 8, 1, generator=gen), 4)
    res = [v["residual"] for _, v in sorted(opt.state_dict()["flodl_residuals"].items())]
    opt.close()
    del os.environ["FLODL_DEVICE"]
    return [p.detach().clone() for p in m.parameters()] + res


def hybrid():
    """2 hosts x 2 processes: where each rank sits, hybrid and flat against one process
    accumulating (SGD with momentum, Adam), top-k on the sim device against the host (the same
    bits), the bytes across hosts, and a rank asking for another hierarchy refused on every
    rank."""
    flodl.init(timeout_ms=20000)
    r = flodl.rank()
    where = (flodl.local_rank(), flodl.local_size(), flodl.cross_rank(), flodl.cross_size())
    assert where == (r % 2, 2, r // 2, 2), "rank %d sits at %s" % (r, where)
    worst = 0.0
    for make in (sgd, adam):
        w_flat, flat = hier_parity(make, "flat")
        w_hyb, hyb = hier_parity(make, "hybrid")
        worst = max(worst, w_flat, w_hyb)
        for i, (a, b) in enumerate(zip(flat, hyb)):
            rel = ((a - b).abs().max() / b.abs().max()).item()
            assert rel <= 1e-5, "%s: parameter %d: hybrid and flat differ by %g" % (
                make.__name__, i, rel)
    for hierarchy in ("hybrid", "flat"):
        host, sim = topk_on("cpu", hierarchy), topk_on("sim", hierarchy)
        for i, (a, b) in enumerate(zip(host, sim)):
            assert torch.equal(a, b), "%s top-k: tensor %d differs between cpu and sim by %g" % (
                hierarchy, i, (a - b).abs().max().item())
    sent = {"flat": cross_bytes("flat", None), "hybrid": cross_bytes("hybrid", None),
            "hybrid top-k 1%": cross_bytes("hybrid", flodl.TopK(0.01))}
    total = {}
    for k, v in sent.items():
        total[k] = flodl.allgather(torch.tensor([float(v)])).sum().item()
    m = model()
    text = expect(flodl.FlodlError, ["rank 3 (host 127.0.0.2) has hierarchy=flat",
                                     "rank 0 (host 127.0.0.1) has hierarchy=hybrid"],
                  lambda: flodl.torch.DistributedOptimizer(
                      sgd(m), m.named_parameters(), hierarchy="flat" if r == 3 else "hybrid"))
    flodl.shutdown()
    result(ok=True, worst=worst, bytes=total, refused=text)


def hybrid_kill():
    """The last rank dies (SIGKILL) while the others exchange through the two-level engine:
    each of them raises, naming it, within the heartbeat timeout plus 2 s."""
    flodl.init(timeout_ms=60000)
    r, n = flodl.rank(), flodl.size()
    m = model()
    opt = flodl.torch.DistributedOptimizer(sgd(m), m.named_parameters(), bucket_mb=0.002,
                                           hierarchy="hybrid")
    x, y = torch.randn(8, 10), torch.randn(8, 1)

    def step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()

    step()
    if r == n - 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    text = expect(flodl.FlodlError, ["rank %d" % (n - 1)], lambda: [step() for _ in range(10**6)])
    elapsed = time.monotonic() - t0
    flodl.shutdown()
    result(ok=True, elapsed=elapsed, text=text)


if __name__ == "__main__":
    globals()[sys.argv[1]]()
