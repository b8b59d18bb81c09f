"""PyTorch beside `flodl-bench train --device cuda`: the worker's MLP (nn.Linear + ReLU, no ReLU
after the last layer), CrossEntropyLoss and SGD (momentum 0.9, lr 0.05) on random data of the
built-in dataset's shape (60000 x 64 float32, labels 0..9), held on the device, shuffled every
epoch, full batches only (as the worker's 60000 // B steps). One epoch warms up; then E epochs
are timed, synchronized on CUDA. float32 throughout, TF32 as PyTorch defaults it (off for
matmul). Runs on PyTorch 1.13 and 2.x.

Usage: torch_train.py [--device cuda|cpu] [--layers 64,4096,4096,4096,10] [--batch-size 512]
                      [--epochs 2] [--samples 60000] [--seed 1]
Prints "RESULT torch VERSION DEVICE", "RESULT device_name NAME", "RESULT tf32 BOOL",
"RESULT loss X" and "RESULT samples_per_s X"; exits 2 when the device is not usable."""
import argparse
import sys
import time

import torch
from torch import nn


def mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def epoch(model, opt, loss_fn, x, y, batch, device):
    n = x.shape[0]
    perm = torch.randperm(n, device=device)
    loss = None
    for s in range(n // batch):
        idx = perm[s * batch:(s + 1) * batch]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
    return loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--layers", default="64,4096,4096,4096,10")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    widths = [int(w) for w in a.layers.split(",")]
    if len(widths) < 2 or min(widths) < 1 or a.batch_size < 1 or a.epochs < 1:
        print("torch_train.py: bad --layers, --batch-size or --epochs", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_train.py: torch %s: torch.cuda.is_available() is False (CUDA build: %s)"
              % (torch.__version__, torch.version.cuda), file=sys.stderr)
        return 2
    device = torch.device(a.device)
    torch.manual_seed(a.seed)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print("RESULT torch %s %s" % (torch.__version__, device.type), flush=True)
    print("RESULT device_name %s" % name, flush=True)
    print("RESULT tf32 %s" % (device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32),
          flush=True)

    x = torch.randn(a.samples, widths[0], device=device, dtype=torch.float32)
    y = torch.randint(0, widths[-1], (a.samples,), device=device)
    model = mlp(widths).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    steps = a.samples // a.batch_size
    if steps == 0:
        print("torch_train.py: --batch-size above --samples", file=sys.stderr)
        return 2

    epoch(model, opt, loss_fn, x, y, a.batch_size, device)  # warm-up: kernels, allocator
    sync(device)
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        loss = epoch(model, opt, loss_fn, x, y, a.batch_size, device)
    sync(device)
    secs = time.perf_counter() - t0
    print("RESULT loss %.4f" % loss.item(), flush=True)
    print("RESULT seconds %.3f" % secs, flush=True)
    print("RESULT samples_per_s %.1f" % (steps * a.batch_size * a.epochs / secs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
