#!/usr/bin/python3
"""fill-torch-bench.py: familyd's normal fill against torch's normal_, same threads, same run.

    /usr/bin/python3 tests/bench/fill-torch-bench.py [--build-dir build-bench] [--size-mib 1024]
                                                     [--threads N] [--rounds 3] [--baseline BENCH]

Both fill SIZE MiB of float32 normal(0, 1) on warm pages (the buffer written once before the
timed runs) with N threads (default: all online CPUs): familyd through fill-bench (fill_run(),
"warm" column), torch with torch.set_num_threads(N) and Tensor.normal_(). Rounds alternate the
two; the best round of each is compared. Prints one line per round and the ratio. --baseline
names another fill-bench binary (another build, e.g. of main) that takes its turn in every
round too, so a change's speed-up comes from the same run.
"""

import argparse
import os
import re
import subprocess
import sys
import time


def familyd_round(bench, size_mib, threads):
    out = subprocess.run([bench, "--size-mib", str(size_mib), "--threads", str(threads),
                          "--only", "normal", "--small-fills", "0"],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"normal\(0,1\).*warm\s+([0-9.]+) GB/s.*verified", out)
    if not m:
        raise SystemExit("fill-bench printed no verified normal line:\n" + out)
    return float(m.group(1))


def torch_round(torch, t, size_mib):
    t0 = time.monotonic()
    t.normal_(0.0, 1.0)
    return (size_mib << 20) / 1e9 / (time.monotonic() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build-bench")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", help="another fill-bench binary, measured in the same rounds")
    a = ap.parse_args()
    bench = os.path.join(a.build_dir, "tests", "bench", "fill-bench")
    if not os.path.exists(bench):
        raise SystemExit("no %s: ninja -C %s tests/bench/fill-bench" % (bench, a.build_dir))
    import torch
    torch.set_num_threads(a.threads)
    t = torch.empty((a.size_mib << 20) // 4, dtype=torch.float32)
    t.normal_(0.0, 1.0)  # warm pages, as fill-bench's warm pass
    ours, theirs, base = [], [], []
    for r in range(a.rounds):
        ours.append(familyd_round(bench, a.size_mib, a.threads))
        theirs.append(torch_round(torch, t, a.size_mib))
        line = "round %d: familyd %.2f GB/s, torch %s normal_ %.2f GB/s" % (
            r + 1, ours[-1], torch.__version__, theirs[-1])
        if a.baseline:
            base.append(familyd_round(a.baseline, a.size_mib, a.threads))
            line += ", baseline %.2f GB/s" % base[-1]
        print(line)
    print("normal(0,1), %d MiB float32 warm, %d threads: familyd %.2f GB/s, torch %.2f GB/s: "
          "%.2fx" % (a.size_mib, a.threads, max(ours), max(theirs), max(ours) / max(theirs)))
    if base:
        print("baseline %s: %.2f GB/s: familyd / baseline %.2fx, baseline / torch %.2fx"
              % (a.baseline, max(base), max(ours) / max(base), max(base) / max(theirs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
