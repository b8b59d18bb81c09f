"""A small CNN trained data-parallel with flodl on synthetic "MNIST-like" data it makes itself
(28x28 images of 10 classes: a fixed random pattern per class plus noise), top-k 1% with error
feedback. Every rank draws its own part of each batch; rank 0 prints the loss and accuracy.
With several processes on each of several hosts the exchange is two-level (hierarchy "auto"):
the processes of a host reduce-scatter each bucket and only their shards cross hosts.
    flodl-launch --hosts 2 --nproc-per-host 2 -- /usr/bin/python3 examples/pytorch_mnist_like.py
(from the source tree: PYTHONPATH=python and ./build/launch/flodl-launch)."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import flodl
import flodl.torch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def batch(patterns, n, gen):
    y = torch.randint(0, 10, (n,), generator=gen)
    x = patterns[y] + 2.0 * torch.randn(n, 1, 28, 28, generator=gen)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--density", type=float, default=0.01, help="top-k density; 1: dense")
    ap.add_argument("--hierarchy", default="auto", choices=("auto", "flat", "hybrid"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    flodl.init()
    rank, size = flodl.rank(), flodl.size()
    patterns = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1000 + rank)
    torch.manual_seed(0)  # the same run twice: rank 0's initial weights, sent to every rank
    model = Net()
    flodl.torch.broadcast_parameters(model.state_dict(), root=0)
    compression = flodl.TopK(args.density) if args.density < 1 else None
    opt = flodl.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        model.named_parameters(), compression=compression, bucket_mb=1,
        hierarchy=args.hierarchy)
    t0 = time.time()
    for step in range(1, args.steps + 1):
        x, y = batch(patterns, args.batch, gen)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if rank == 0 and (step % 50 == 0 or step == args.steps):
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
    x, y = batch(patterns, 512, torch.Generator().manual_seed(7))
    with torch.no_grad():
        correct = torch.tensor([(model(x).argmax(1) == y).sum().item()], dtype=torch.float32)
    flodl.allreduce(correct, op="avg", name="correct")  # the same weights everywhere: a check
    st = opt.exchange_stats()
    sent = torch.tensor([float(st["bytes_sent_remote"])])
    flodl.allreduce(sent, op="sum", name="bytes across hosts")
    if rank == 0:
        how = "hybrid, %d hosts x %d" % (st["cross_size"], st["local_size"]) if st["hybrid"] \
            else "flat"
        print("rank 0 summary: %d ranks, %d steps, %s, %s, %.1f MiB across hosts, %.1f s, "
              "test accuracy %.1f%%" % (size, args.steps, compression or "dense", how,
                                        sent.item() / 2**20, time.time() - t0,
                                        100.0 * correct.item() / 512), flush=True)
    opt.close()
    flodl.shutdown()


if __name__ == "__main__":
    main()
