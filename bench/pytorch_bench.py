"""flodl's DistributedOptimizer beside PyTorch DDP (gloo) on the same model and data, in one run:
each rank trains an MLP of 12.6 M parameters (1024-2048-2048-2048-1024-10, ReLU, cross-entropy,
SGD with momentum) on its own fixed random batch, in turns of ROUNDS rounds: DDP with the gloo
backend, flodl dense, flodl top-k 1% (error feedback). Each round runs WARMUP steps and then
STEPS timed ones; rank 0 prints the median step time of each (over every round's timed steps)
and its ratio to DDP's. Both sides bucket at 25 MiB and overlap the exchange with backward.
Run under flodl-launch (the flodl side's ranks, and the gloo rendezvous's address, which rank 0
broadcasts through flodl):
    PYTHONPATH=python ./build/launch/flodl-launch --workers 4 -- /usr/bin/python3 \
        bench/pytorch_bench.py [--steps 10] [--warmup 3] [--rounds 2] [--batch 32]
or ./build/bench/flodl-bench pytorch [same flags] (which runs that command);
scripts/netns-pytorch.sh runs it with every rank in a network namespace of its own, or
(--hosts 2 --nproc-per-host 2) 2 ranks in each host's namespace, on emulated 1 Gbit/s links.
--hierarchy (auto, flat, hybrid) is the flodl rows' DistributedOptimizer(hierarchy=...);
--flat-dense adds a row of flodl dense with hierarchy="flat", a reference for hybrid. Each row
prints the bytes it sent across hosts per step, summed over ranks: flodl's from
exchange_stats()["bytes_sent_remote"]; with --host-if IFACE (netns-pytorch.sh passes eth0,
the host's link) also every row's, DDP's included, from IFACE's transmit counter in
/proc/net/dev, read by each host's local rank 0 (wire bytes: TCP/IP headers and flodl's
barriers and heartbeats included). PyTorch 1.13 or 2.x; CPU only."""
import argparse
import os
import socket
import statistics
import sys
import time


def _find_package():
    """From the source or build tree without PYTHONPATH: the python/ folder above this file."""
    try:
        import flodl  # noqa: F401
        return
    except ImportError:
        pass
    d = os.path.dirname(os.path.abspath(__file__))
    while d != os.path.dirname(d):
        if os.path.exists(os.path.join(d, "python", "flodl", "__init__.py")):
            sys.path.insert(0, os.path.join(d, "python"))
            return
        d = os.path.dirname(d)


_find_package()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flodl  # noqa: E402
import flodl.torch  # noqa: E402

WIDTHS = (1024, 2048, 2048, 2048, 1024, 10)


def mlp():
    torch.manual_seed(0)
    layers = []
    for i in range(len(WIDTHS) - 1):
        layers.append(torch.nn.Linear(WIDTHS[i], WIDTHS[i + 1]))
        if i + 2 < len(WIDTHS):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def tx_bytes(iface):
    """IFACE's transmit byte counter in this network namespace (/proc/net/dev), or 0."""
    if not iface:
        return 0
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if rest and name.strip() == iface:
                return int(rest.split()[8])
    raise SystemExit("pytorch_bench: --host-if %s: no such interface in /proc/net/dev" % iface)


def timed(model, opt, x, y, warmup, steps, barrier):
    times = []
    for s in range(warmup + steps):
        barrier()  # every rank starts the step together: a step time, not a drift
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def gloo_init(rank, size):
    """gloo's rendezvous on rank 0's address (FLODL_HOST, as flodl's, or 127.0.0.1) and a free
    port there, which rank 0 broadcasts through flodl."""
    where = torch.zeros(5)  # port, then the IPv4 address's four bytes
    if rank == 0:
        host = os.environ.get("FLODL_HOST") or "127.0.0.1"
        s = socket.socket()
        s.bind((host, 0))
        where[0] = s.getsockname()[1]
        where[1:] = torch.tensor([float(b) for b in socket.inet_aton(host)])
        s.close()
    flodl.broadcast(where, root=0, name="gloo address")
    host = ".".join(str(int(b)) for b in where[1:].tolist())
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (host, int(where[0].item())),
                            rank=rank, world_size=size)


def across_hosts(runs, wire, nsteps):
    """Per row: (flodl's bytes across hosts per step in MiB, whether it ran hybrid, the host
    links' bytes per step in MiB), summed over ranks through gloo (int64, exact); '-' where
    not measured."""
    labels = list(runs)
    mine = torch.zeros(3 * len(labels), dtype=torch.int64)
    for i, label in enumerate(labels):
        opt = runs[label][1]
        st = opt.exchange_stats() if isinstance(opt, flodl.torch.DistributedOptimizer) else {}
        mine[3 * i] = st.get("bytes_sent_remote", -1)
        mine[3 * i + 1] = int(st.get("hybrid", False))
        mine[3 * i + 2] = wire[label]
    dist.all_reduce(mine)
    size = dist.get_world_size()
    mib = 1024.0 * 1024 * nsteps
    out = {}
    for i, label in enumerate(labels):
        remote = mine[3 * i].item()
        out[label] = ("-" if remote < 0 else "%.2f" % (remote / mib),
                      "-" if remote < 0 else ("yes" if mine[3 * i + 1].item() == size else "no"),
                      "%.2f" % (mine[3 * i + 2].item() / mib) if mine[3 * i + 2].item() else "-")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per round")
    ap.add_argument("--rounds", type=int, default=2, help="turns of the three")
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--hierarchy", choices=("auto", "flat", "hybrid"), default="auto",
                    help="the flodl rows' DistributedOptimizer(hierarchy=...)")
    ap.add_argument("--flat-dense", action="store_true",
                    help="also a row of flodl dense with hierarchy='flat' (a reference)")
    ap.add_argument("--host-if", default="",
                    help="the host's link: count every row's bytes sent on it (/proc/net/dev)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # ranks share the machine's cores
    flodl.init()
    rank, size = flodl.rank(), flodl.size()
    gloo_init(rank, size)
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(args.batch, WIDTHS[0], generator=gen)
    y = torch.randint(0, WIDTHS[-1], (args.batch,), generator=gen)

    ddp_model = mlp()
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model, bucket_cap_mb=25)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    runs = {"PyTorch DDP (gloo)": (ddp, ddp_opt, dist.barrier)}
    h = "" if args.hierarchy == "auto" else args.hierarchy + " "
    flodl_rows = [("flodl %sdense" % h, None, args.hierarchy),
                  ("flodl %stop-k %g%%" % (h, 100 * args.density), flodl.TopK(args.density),
                   args.hierarchy)]
    if args.flat_dense:
        flodl_rows.append(("flodl flat dense", None, "flat"))
    for label, comp, hier in flodl_rows:
        m = mlp()
        opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01,
                                                               momentum=0.9),
                                               m.named_parameters(), compression=comp,
                                               bucket_mb=25, hierarchy=hier)
        runs[label] = (m, opt, flodl.barrier)
    nparams = sum(p.numel() for p in ddp_model.parameters())
    times = {k: [] for k in runs}
    # Each host's link is counted once: by its local rank 0.
    iface = args.host_if if flodl.local_rank() == 0 else ""
    wire = {k: 0 for k in runs}
    for _ in range(args.rounds):
        for label, (m, opt, barrier) in runs.items():
            t0 = tx_bytes(iface)
            times[label] += timed(m, opt, x, y, args.warmup, args.steps, barrier)
            wire[label] += tx_bytes(iface) - t0
    across = across_hosts(runs, wire, args.rounds * (args.warmup + args.steps))
    if rank == 0:
        base = statistics.median(times["PyTorch DDP (gloo)"])
        print("pytorch_bench: %d ranks, MLP %s (%.1f M parameters), batch %d per rank, "
              "PyTorch %s, %d round(s) x (%d warm-up + %d timed steps) each; flodl %s, gloo "
              "plain text"
              % (size, "-".join(str(w) for w in WIDTHS), nparams / 1e6, args.batch,
                 torch.__version__, args.rounds, args.warmup, args.steps,
                 "encrypted (CurveZMQ)" if os.environ.get("FLODL_CURVE_DIR") else "plain text"))
        print("%-22s %10s %8s %8s %7s %11s %11s %8s" % (
            "exchange", "median ms", "p10 ms", "p90 ms", "hybrid", "remote MiB", "wire MiB",
            "vs DDP"))
        for label, ts in times.items():
            ts = sorted(ts)
            med = statistics.median(ts)
            remote, hybrid, link = across[label]
            print("%-22s %10.1f %8.1f %8.1f %7s %11s %11s %7.2fx" % (
                label, 1e3 * med, 1e3 * ts[len(ts) // 10], 1e3 * ts[(9 * len(ts)) // 10],
                hybrid, remote, link, base / med), flush=True)
        print("(vs DDP: DDP's median step time / this one's; above 1 is faster than DDP. remote "
              "MiB: flodl's exchange_stats() bytes_sent_remote per step, summed over ranks; wire "
              "MiB: bytes sent on --host-if per step, summed over hosts; -: not measured)",
              flush=True)
    for label, (m, opt, _) in runs.items():
        if isinstance(opt, flodl.torch.DistributedOptimizer):
            opt.close()
    # DDP's reducer holds the process group: drop it before the group goes.
    del runs, ddp, ddp_opt
    dist.destroy_process_group()
    flodl.shutdown()


if __name__ == "__main__":
    main()
