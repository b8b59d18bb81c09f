#!/usr/bin/env python3
"""Compares two safetensors checkpoints (flodl-worker --save) parameter by parameter, with the
criterion of tests/wkdata.c fl_test_params_diff: |a - b| <= BOUND * (1e-3 + |a|) for every
entry, A the reference. Reads the format itself (8-byte little-endian header length, a JSON
header, raw little-endian data): no safetensors package; numpy is used when it imports.

Usage: params_diff.py A.safetensors B.safetensors [--bound 1e-4]
Prints the worst relative difference, the tensor and the entry where it is; exit 0 within the
bound, 1 over it, 2 when the files cannot be read or do not hold the same tensors."""
import argparse
import json
import math
import struct
import sys

try:
    import numpy as np
except ImportError:  # the plain-Python path is slower, fine for the worker's models
    np = None

FORMATS = {"F32": ("<f", 4), "F64": ("<d", 8), "F16": ("<e", 2), "BF16": (None, 2)}


class Bad(Exception):
    pass


def load(path):
    """{name: (dtype, shape, raw bytes)} in file order."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise Bad("%s: shorter than the 8-byte header length" % path)
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    if 8 + hlen > len(blob):
        raise Bad("%s: header length %d past the end of the file (%d bytes)"
                  % (path, hlen, len(blob)))
    try:
        header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise Bad("%s: header is not JSON: %s" % (path, e))
    data = blob[8 + hlen:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dtype = t.get("dtype")
        if dtype not in FORMATS:
            raise Bad("%s: %s: dtype %s (F32, F64, F16, BF16 are read)" % (path, name, dtype))
        begin, end = t["data_offsets"]
        count = 1
        for d in t["shape"]:
            count *= d
        if not (0 <= begin <= end <= len(data)) or end - begin != count * FORMATS[dtype][1]:
            raise Bad("%s: %s: data_offsets %s do not fit shape %s of %s"
                      % (path, name, t["data_offsets"], t["shape"], dtype))
        out[name] = (dtype, list(t["shape"]), data[begin:end])
    return out


def values(dtype, raw):
    """The entries as float64 (a numpy array, or a list)."""
    if np is not None:
        if dtype == "BF16":
            return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view("<f4") \
                .astype(np.float64)
        return np.frombuffer(raw, dtype={"F32": "<f4", "F64": "<f8", "F16": "<f2"}[dtype]) \
            .astype(np.float64)
    if dtype == "BF16":
        half = struct.unpack("<%dH" % (len(raw) // 2), raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in half]
    fmt, size = FORMATS[dtype]
    return list(struct.unpack("<%d%s" % (len(raw) // size, fmt[1]), raw))


def worst_of(a, b):
    """(worst relative difference, its index); NaN anywhere counts as infinitely far."""
    if np is not None:
        with np.errstate(invalid="ignore"):
            rel = np.abs(a - b) / (1e-3 + np.abs(a))
        rel = np.where(np.isnan(rel), np.inf, rel)
        if rel.size == 0:
            return 0.0, -1
        i = int(np.argmax(rel))
        return float(rel[i]), i
    worst, at = 0.0, -1
    for i, (x, y) in enumerate(zip(a, b)):
        d = abs(x - y) / (1e-3 + abs(x))
        if math.isnan(d):
            d = math.inf
        if d > worst or at < 0:
            worst, at = d, i
    return worst, at


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--bound", type=float, default=1e-4)
    args = ap.parse_args()
    try:
        ta, tb = load(args.a), load(args.b)
    except (OSError, Bad, KeyError, TypeError, ValueError) as e:
        print("params_diff: %s" % e, file=sys.stderr)
        return 2
    if set(ta) != set(tb):
        print("params_diff: the files hold different tensors: only in %s: %s; only in %s: %s"
              % (args.a, sorted(set(ta) - set(tb)), args.b, sorted(set(tb) - set(ta))),
              file=sys.stderr)
        return 2
    worst, where, count = -1.0, None, 0
    for name in ta:
        (da, sa, ra), (db, sb, rb) = ta[name], tb[name]
        if sa != sb:
            print("params_diff: %s: shape %s in %s, %s in %s" % (name, sa, args.a, sb, args.b),
                  file=sys.stderr)
            return 2
        va, vb = values(da, ra), values(db, rb)
        count += len(va)
        w, i = worst_of(va, vb)
        if w > worst:
            worst, where = w, (name, i, va[i] if i >= 0 else 0.0, vb[i] if i >= 0 else 0.0)
    if where is None:
        print("params_diff: no parameters in %s" % args.a, file=sys.stderr)
        return 2
    name, i, x, y = where
    ok = worst <= args.bound
    print("params_diff: %d tensors, %d parameters; worst relative difference %.3g in %s[%d] "
          "(%.9g against %.9g); bound %.3g: %s"
          % (len(ta), count, worst, name, i, x, y, args.bound, "within" if ok else "OVER"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
