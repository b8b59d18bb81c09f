"""The small CNN of pytorch_mnist_like.py trained through flodl's parameter server: flodl-ps
holds the parameters and runs the optimizer (SGD with momentum, its flags), every rank pushes
the gradient of its part of each batch (top-k 1% with error feedback) and pulls the new
parameters. No flodl.init(): DistributedOptimizer(mode="ps") joins the job.
    flodl-launch --workers 4 --ps-flag=--shards=2 --ps-flag=--lr=0.02 --ps-flag=--momentum=0.9 \
        -- /usr/bin/python3 examples/pytorch_ps.py [--steps N] [--density D]
(from the source tree: PYTHONPATH=python and ./build/launch/flodl-launch). Add
--ps-flag=--consistency=async (or ssp with --ps-flag=--staleness=S) for the other models."""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import flodl
import flodl.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_mnist_like import Net, batch  # noqa: E402  (the same model and data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--density", type=float, default=0.01, help="top-k density; 1: dense")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = Net()
    compression = flodl.TopK(args.density) if args.density < 1 else None
    # The learning rate and momentum are flodl-ps's (--lr, --momentum): the wrapped optimizer
    # never steps in this mode; it serves zero_grad().
    opt = flodl.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                           model.named_parameters(), compression=compression,
                                           mode="ps")
    rank, size = flodl.rank(), flodl.size()  # the job's, from the parameter-server client
    patterns = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1000 + rank)
    t0 = time.time()
    while opt.ps_step < args.steps:  # the server's step: a restarted server resumes it
        x, y = batch(patterns, args.batch, gen)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        step = opt.ps_step
        if rank == 0 and (step % 50 == 0 or step == args.steps):
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
    x, y = batch(patterns, 512, torch.Generator().manual_seed(7))
    with torch.no_grad():
        acc = 100.0 * (model(x).argmax(1) == y).sum().item() / 512
    if rank == 0:
        print("rank 0 summary: %d ranks, %d steps, parameter server (%d shards, %s), %s, "
              "%.1f s, test accuracy %.1f%%" % (size, args.steps, opt.ps_shards,
                                               opt.consistency, compression or "dense",
                                               time.time() - t0, acc), flush=True)
    opt.close()
    flodl.shutdown()


if __name__ == "__main__":
    main()
