#!/usr/bin/env python3
"""Compare two llm.c model files (fp32, version 3), for the data-parallel tests.

    /usr/bin/python3 scripts/compare_models.py A.bin B.bin INIT.bin TOL

Prints the largest ||A - B|| / ||B - INIT|| over the 16 tensors (the error of
the training update, the measure test_gpt.c uses) and exits 1 if it exceeds
TOL or the headers differ. Bitwise-equal files print 0. The key bias
(qkvb[l, C:2C]) is left out, as in test_gpt.c: its gradient is zero in exact
arithmetic (softmax ignores a constant added to a row of scores), so it holds
nothing but round-off, which AdamW scales up to whole steps.
"""
import sys

import numpy as np


def load(path):
    with open(path, "rb") as f:
        h = np.frombuffer(f.read(1024), dtype="<i4")
        if h[0] != 20240326 or h[1] != 3:
            sys.exit(f"error: {path}: not an fp32 llm.c model (magic {h[0]}, version {h[1]})")
        w = np.frombuffer(f.read(), dtype="<f4")
    return h, w


def sizes(h):
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    return [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C,
            L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    (ha, a), (hb, b), (hi, init) = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
    tol = float(sys.argv[4])
    if not (np.array_equal(ha, hb) and np.array_equal(ha, hi)) or a.size != b.size or a.size != init.size:
        print("headers differ")
        sys.exit(1)
    L, C = int(ha[4]), int(ha[6])
    keep = np.ones(a.size, dtype=bool)
    qkvb = sum(sizes(ha)[:5])
    for layer in range(L):
        keep[qkvb + layer * 3 * C + C: qkvb + layer * 3 * C + 2 * C] = False
    worst, off = 0.0, 0
    for n in sizes(ha):
        k = keep[off:off + n]
        d = np.linalg.norm((a[off:off + n].astype(np.float64) - b[off:off + n])[k])
        u = np.linalg.norm((b[off:off + n].astype(np.float64) - init[off:off + n])[k])
        worst = max(worst, d / u if u > 0 else d)
        off += n
    bitwise = np.array_equal(a.view(np.uint32), b.view(np.uint32))
    print(f"{worst:.3e}{' (bitwise equal)' if bitwise else ''}")
    sys.exit(0 if worst <= tol else 1)


if __name__ == "__main__":
    main()
