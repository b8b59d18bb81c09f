"""torch.topk beside `flodl-bench topk`: the k largest |x| of n float32 N(0,1) entries on the
CPU with one thread, as DGC implementations call it. Usage: torch_topk.py SIZES DENSITIES REPS
(comma lists; k = ceil(density * n)). Prints "RESULT torch VERSION", then one
"RESULT N K MEDIAN_SECONDS" per size and density (median of REPS after a warm-up)."""
import math
import statistics
import sys
import time

import torch


def main():
    sizes = [int(s) for s in sys.argv[1].split(",")]
    densities = [float(d) for d in sys.argv[2].split(",")]
    reps = int(sys.argv[3])
    torch.set_num_threads(1)
    torch.manual_seed(1)
    print("RESULT torch", torch.__version__, flush=True)
    data = torch.randn(max(sizes), dtype=torch.float32)
    for n in sizes:
        x = data[:n]
        for d in densities:
            k = max(1, math.ceil(d * n))
            times = []
            for rep in range(reps + 1):  # the first run warms up
                t0 = time.perf_counter()
                _, idx = torch.topk(x.abs(), k, sorted=False)
                x[idx]  # the signed values, as fl_cmp_topk returns them
                if rep > 0:
                    times.append(time.perf_counter() - t0)
            print(f"RESULT {n} {k} {statistics.median(times):.9f}", flush=True)


if __name__ == "__main__":
    main()
