#!/usr/bin/env python3
"""
ncu_breakdown.py -- where one training step's GPU time goes, from an Nsight
Compute CSV of `ncu --csv --metrics gpu__time_duration.sum` over a run of
train_gpt_cu (scripts/gpu_check.sh's profile step writes one).

  python3 scripts/ncu_breakdown.py ncu.csv [--top 25]

A step starts at encoder_forward_kernel; the last complete step is reported
(the first carries cuBLASLt's heuristics and lazy loading). Kernels are
grouped by name (template arguments and cuBLASLt's tile names kept, so two
GEMM shapes stay apart); each line: total microseconds, share of the step,
launches, name. Exit status 1 when the file holds no step.
"""
import argparse
import collections
import csv
import sys


def read_kernels(path):
    """[(name, microseconds)] in launch order, from ncu's CSV (other lines skipped)."""
    out = []
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) > 10]
    if not rows:
        return out
    head = rows[0]
    try:
        ki, ui, vi = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
    except ValueError:
        return out
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
    for r in rows[1:]:
        if r[ui] not in scale:
            continue
        out.append((r[ki].split("(")[0].strip(), float(r[vi].replace(",", "")) * scale[r[ui]]))
    return out


def last_step(kernels):
    """The kernels from the last encoder_forward_kernel to the end, if a step before it exists."""
    starts = [i for i, (n, _) in enumerate(kernels) if n.startswith("encoder_forward")]
    if len(starts) < 2:
        return kernels[starts[0]:] if starts else []
    return kernels[starts[-1]:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    step = last_step(read_kernels(a.csv))
    if not step:
        print(f"ncu_breakdown: no training step found in {a.csv}")
        return 1
    groups = collections.defaultdict(lambda: [0, 0.0])
    for name, us in step:
        g = groups[name[:90]]
        g[0] += 1
        g[1] += us
    total = sum(us for _, us in step)
    print(f"one step: {len(step)} kernels, {total / 1e3:.2f} ms of kernel time")
    for name, (n, us) in sorted(groups.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{us:9.0f} us {100 * us / total:5.1f}% x{n:<4d} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
