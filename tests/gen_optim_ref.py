#!/usr/bin/python3
"""Reference trajectories for tests/test_optim.c from PyTorch 1.13 (Debian's python3-torch).

Run once by hand, not at test time:  /usr/bin/python3 tests/gen_optim_ref.py
It prints, for each optimizer configuration, the float32 parameters after STEPS steps as C
hex-float literals, to paste into test_optim.c's reference table. The inputs are exact dyadic
rationals built by the same integer formulas in test_optim.c, so both sides start from
identical bits without pinning the inputs too.

torch's CPU kernels fuse t.add(u, alpha=a) and t.addcmul(u, w, value=s) into FMAs in its AVX2
and AVX-512 builds (the dispatch it picks on any x86-64 with AVX2) but not in its "default"
build: the script refuses to run under the default kernels, whose results differ by a few
ulps after five steps (up to 5 here).
"""
import sys

import torch

N = 20
STEPS = 5


def param0(i):
    return float(((i * 37) % 19) - 9) / 8.0 * 2.0 ** ((i % 5) - 2)


def grad(step, i):
    return float(((i * 13 + step * 7) % 23) - 11) / 16.0 * 2.0 ** ((i % 3) - 1)


# name, torch class, constructor kwargs, per-step learning rates (doubles as in the C test)
CONFIGS = [
    ("sgd", torch.optim.SGD, dict(), [0.1] * STEPS),
    ("sgd_wd", torch.optim.SGD, dict(weight_decay=0.01), [0.1] * STEPS),
    ("sgd_mom", torch.optim.SGD, dict(momentum=0.9), [0.1] * STEPS),
    ("sgd_damp_wd", torch.optim.SGD, dict(momentum=0.9, dampening=0.5, weight_decay=0.01),
     [0.05] * STEPS),
    ("sgd_nesterov", torch.optim.SGD, dict(momentum=0.9, nesterov=True, weight_decay=0.001),
     [0.1] * STEPS),
    ("adam", torch.optim.Adam, dict(), [0.01] * STEPS),
    ("adam_wd", torch.optim.Adam, dict(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
     [0.01, 0.02, 0.03, 0.02, 0.01]),
    ("adamw", torch.optim.AdamW, dict(weight_decay=0.01), [0.01] * STEPS),
    ("adamw_wd", torch.optim.AdamW, dict(betas=(0.5, 0.9), eps=1e-4, weight_decay=0.3),
     [0.1, 0.05, 0.025, 0.0125, 0.1]),
]


def c_hex(x):
    """A float32 value as a C hex-float literal, e.g. 0x1.99999ap-4f."""
    h = float(x).hex()  # exact: x is a float32 value held in a double
    sign = "-" if h.startswith("-") else ""
    mant, exp = h.lstrip("-")[2:].split("p")
    if "." in mant:
        mant = mant.rstrip("0").rstrip(".")
    return "%s0x%sp%sf" % (sign, mant, exp)


def main():
    cap = torch.__config__.show()
    usage = [l.strip(" -") for l in cap.splitlines() if "CPU capability usage" in l]
    if not usage or not ("AVX2" in usage[0] or "AVX512" in usage[0]):
        sys.exit("torch runs its unfused default CPU kernels here (%s): run on an AVX2 host "
                 "without ATEN_CPU_CAPABILITY=default" % (usage[0] if usage else "unknown"))
    print("    /* torch %s, %s */" % (torch.__version__, usage[0]))
    for name, cls, kw, lrs in CONFIGS:
        p = torch.tensor([param0(i) for i in range(N)], dtype=torch.float32, requires_grad=True)
        opt = cls([p], lr=lrs[0], **kw)
        for s in range(STEPS):
            for g in opt.param_groups:
                g["lr"] = lrs[s]
            p.grad = torch.tensor([grad(s, i) for i in range(N)], dtype=torch.float32)
            opt.step()
        vals = [c_hex(v) for v in p.detach().numpy()]
        print("    /* %s */" % name)
        for k in range(0, N, 4):
            print("    " + ", ".join(vals[k:k + 4]) + ",")


if __name__ == "__main__":
    main()
