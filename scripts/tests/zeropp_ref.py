#!/usr/bin/env python3
"""zeropp_ref.py — an independent numpy re-implementation of ZeRO++'s wire
(gptc/zeropp.h on gptc/quant.h), checked against a GPTC_ZEROPP_DUMP=dir run.

    zeropp_ref.py DIR --np W --topology NxK --params P --steps S
                  [--qwz 0|4|8] [--qgz 0|4|8] [--feedback 0|1] [--hpz 0|1] [--block B]
                  [--layout flat|buckets] [--gather fp32|bf16]

--layout buckets --gather bf16: train_gpt_cu's dumps (gptc/cuda/zeropp.cuh, "ZeRO++
on --zero 3"): the shard is the dump's own (the buckets' pieces, padded),
a gathered or reduced record is a whole bucket, a = its offset in every
rank's shard, n = W x its piece, rank q's piece at q n / W of the record
and at q shard + a of the masters; the gathers and the secondary hold bf16
values, so they are compared with deq(q(.)) (or the master) rounded to
nearest bf16. The default (flat, fp32) is the CPU trainer's.

Written from the documented format only (gptc/quant.h's and gptc/zeropp.h's
header comments; the record layout is zeropp.h's "GPTC_ZEROPP_DUMP"):
  - the shard: ceil(P / W) floats, rank q's at q shard; rank r is node r / K,
    local index r % K (--topology NxK); a range [a, a + n) is cut into the
    ranks' pieces, and each piece quantises on its own, its blocks starting
    at the piece's first element;
  - a block of m = max|x|: s = fl(m / qmax) (qmax 127 INT8, 7 INT4; raised
    an ulp while subnormal and qmax s < m), q = round-half-even(x / s in
    double), deq = fl(q s); all zeros: s = 0; any non-finite: NaN;
  - qwZ: every rank ends with deq(q(piece)) of every rank's piece, placed at
    the piece's offset; hpZ: after a step's first forward every gather (and
    the secondary, rank local j holding [j N shard, (j + 1) N shard)) comes
    from the node, equal to that forward's weights;
  - qgZ: hop 0 inside the node, rank (p, j) sums in fp32 its own values and
    deq(q(.)) of each node peer's values of the pieces owned by local index
    j (peers in the order j - 1, j - 2, ... mod K); hop 1 across nodes, the
    owner (p, j) adds deq(q(partial)) of the other nodes' partial sums of its
    piece (in the order p - 1, p - 2, ... mod N), each partial sum quantised
    once; the result is added into its grad_shard; with error feedback the
    sender quantises v = value + residual and keeps v - deq (0 in a block
    whose s is 0 or NaN): hop 0's residuals by flat index, hop 1's by
    (destination node, place in the shard), zero at the start.
The comparison is bit for bit (uint32 views): fixed rounding everywhere
(fp32 products and sums, one rounding each, no FMA contraction under
-std=c11) and, on a 2x2 machine, every fp32 sum has two terms, so its order
cannot matter either; on larger machines the order above is the code's.
Prints one line per check and "N passed, N failed" last; exit 1 on failure.
"""
import argparse
import os
import sys

import numpy as np

MAGIC = 0x5A505044554D5031
F32 = np.float32


def read_dump(path):
    raw = open(path, "rb").read()
    recs, at = [], 0
    while at < len(raw):
        h = np.frombuffer(raw, dtype="<i8", count=8, offset=at)
        at += 64
        if int(h[0]) != MAGIC:
            raise ValueError(f"{path}: bad record magic at byte {at - 64}")
        tag, step, bwd, src, a, n = (int(v) for v in h[1:7])
        if tag == 0:
            extra = [int(v) for v in np.frombuffer(raw, dtype="<i8", count=8, offset=at)]
            at += 64
            recs.append(dict(tag=0, shard=step, K=bwd, W=src, N=a, flags=extra))
            continue
        x = np.frombuffer(raw, dtype="<f4", count=n, offset=at).copy()
        at += 4 * n
        recs.append(dict(tag=tag, step=step, bwd=bwd, src=src, a=a, n=n, x=x))
    return recs


def scale_of(m, qmax):
    """gptc/quant.h's scale, one block at a time for the rare subnormal case."""
    s = (m / F32(qmax)).astype(F32)
    tiny = (m > 0) & np.isfinite(m) & (s < np.finfo(F32).tiny)
    for i in np.flatnonzero(tiny):
        while float(s[i]) * qmax < float(m[i]):
            s[i] = np.nextafter(s[i], F32(np.inf))
    with np.errstate(over="ignore"):
        big = np.isinf(F32(qmax) * s) & np.isfinite(m)
    for i in np.flatnonzero(big):
        while np.isinf(F32(qmax) * s[i]):
            s[i] = np.nextafter(s[i], F32(0))
    s[m == 0] = 0
    return s


def quant(x, bits, block, res=None):
    """(deq, new residual or None) of one piece x (fp32), blocks from x[0]."""
    qmax = 127 if bits == 8 else 7
    v = x if res is None else (x + res).astype(F32)
    n = v.size
    nb = -(-n // block)
    pad = np.zeros(nb * block, F32)
    pad[:n] = v
    blk = pad.reshape(nb, block)
    finite = np.isfinite(blk).all(axis=1)
    m = np.where(finite, np.abs(np.where(np.isfinite(blk), blk, 0)).max(axis=1), F32(0)).astype(F32)
    s = scale_of(m, qmax)
    s[~finite] = np.nan
    good = s > 0
    q = np.zeros(blk.shape, np.int32)  # integers, as in C: a code 0 dequantises to +0, never -0
    q[good] = np.rint(blk[good].astype(np.float64) / s[good, None].astype(np.float64)).astype(np.int32)
    if np.abs(q).max(initial=0) > qmax:
        raise AssertionError("a code beyond qmax: the scale rule is wrong")
    with np.errstate(invalid="ignore"):
        deq = (q.astype(F32) * s[:, None]).astype(F32)
    deq = deq.reshape(-1)[:n]
    if res is None:
        return deq, None
    r = (v - deq).astype(F32)
    dead = np.repeat(~good, block)[:n]
    r[dead] = 0
    return deq, r


def pieces(a, n, shard, W, buckets=False):
    """[(q, lo, hi, at)] of the ranks whose shard meets the record (a, n):
    [lo, hi) in the masters' indices (rank q's shard at q shard), at = where
    the piece starts in the record. Flat: the range [a, a + n); buckets: one
    piece of n / W a rank, at q shard + a."""
    out = []
    for q in range(W):
        if buckets:
            c = n // W
            out.append((q, q * shard + a, q * shard + a + c, q * c))
            continue
        lo, hi = max(a, q * shard), min(a + n, (q + 1) * shard)
        if hi > lo:
            out.append((q, lo, hi, lo - a))
    return out


def bf16(x):
    """fp32 -> the nearest bf16 (ties to even), as fp32; NaN stays NaN"""
    u = x.astype(F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(F32)
    return np.where(np.isnan(x), x, r).astype(F32)


def bits_equal(x, y):
    return x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32))


def diff_note(got, want):
    if got.shape != want.shape:
        return f"{got.size} floats, want {want.size}"
    bad = got.view(np.uint32) != want.view(np.uint32)
    if not bad.any():
        return "bit for bit"
    i = int(np.flatnonzero(bad)[0])
    d = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return (f"{int(bad.sum())} of {got.size} floats differ, first at {i} (got {got[i]!r}, want {want[i]!r}), "
            f"max |diff| {np.nanmax(d[bad]):.3g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--np", type=int, required=True)
    ap.add_argument("--topology", required=True)
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--qwz", type=int, default=0)
    ap.add_argument("--qgz", type=int, default=0)
    ap.add_argument("--feedback", type=int, default=0)
    ap.add_argument("--hpz", type=int, default=0)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--layout", choices=["flat", "buckets"], default="flat")
    ap.add_argument("--gather", choices=["fp32", "bf16"], default="fp32")
    o = ap.parse_args()
    N, K = (int(v) for v in o.topology.split("x"))
    W, P = o.np, o.params
    assert N * K == W
    bk = o.layout == "buckets"
    rnd = bf16 if o.gather == "bf16" else (lambda x: x)
    shard = -(-P // W)
    results = []

    def check(ok, what, note=""):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f" | {note}" if note else ""))

    dumps = [read_dump(os.path.join(o.dir, f"rank{r}.bin")) for r in range(W)]
    if bk:  # the buckets' padded pieces: the shard is what the dump says (at least ceil(P / W))
        shard = max(shard, dumps[0][0]["shard"])
    M = W * shard  # the masters' indices
    # the config each rank wrote, against what this script was told
    cfg_ok = True
    for r, d in enumerate(dumps):
        c = d[0]
        want = dict(tag=0, shard=shard, K=K, W=W, N=N, flags=[o.qwz, o.qgz, o.feedback, o.hpz, o.block, r // K, r % K, P])
        cfg_ok &= c == want
    check(cfg_ok, "every rank's dump header = the flags, shard ceil(P/W), node r/K, local r%K",
          "" if cfg_ok else f"rank 0: {dumps[0][0]}")
    seqs = [[(x["tag"], x["step"], x["bwd"], x["src"], x["n"]) + ((x["a"],) if x["tag"] in (2, 4) else ())
             for x in d[1:]] for d in dumps]
    same = all(s == seqs[0] for s in seqs)
    check(same, "every rank made the same sequence of gathers and reductions", f"{len(seqs[0])} records a rank")
    if not same:
        return finish(results)
    recs = [d[1:] for d in dumps]

    steps = sorted({x["step"] for x in recs[0]})
    check(steps == list(range(o.steps)), f"records in steps 0..{o.steps - 1}", f"steps {steps}")
    gather_hook = o.qwz or o.hpz
    res0 = [np.zeros(M, F32) for _ in range(W)] if o.feedback else None
    res1 = [np.zeros((N, shard), F32) for _ in range(W)] if o.feedback else None
    stats = dict(gather=[0, 0], secondary=[0, 0], grad=[0, 0])
    first_bad = {}

    def tally(kind, ok, note):
        stats[kind][0 if ok else 1] += 1
        if not ok and kind not in first_bad:
            first_bad[kind] = note

    for step in steps:
        idx = [i for i, x in enumerate(recs[0]) if x["step"] == step]
        # the masters (the weights this step's gathers must reproduce)
        if gather_hook:
            ms = [[recs[r][i] for i in idx if recs[r][i]["tag"] == 1] for r in range(W)]
            ok = all(len(m) == 1 and m[0]["n"] == shard and m[0]["a"] == r * shard for r, m in enumerate(ms))
            check(ok, f"step {step}: one master shard a rank, [r shard, +shard)")
            if not ok:
                continue
            master = np.concatenate([m[0]["x"] for m in ms])
            if not bk:  # (buckets: the padding is inside each bucket, and gathered like the rest)
                check(not master[P:].any(), f"step {step}: the shards' padding beyond P is zero")
        # gathers: every one against deq(q(master pieces)) (or the master in fp32)
        gi = [i for i in idx if recs[0][i]["tag"] == 2]
        want_full = np.full(M, np.nan, F32)
        covered = np.zeros(M, np.int32)
        seen_bwd = False
        for i in gi:
            x0 = recs[0][i]
            a, n, bwd = x0["a"], x0["n"], x0["bwd"]
            want = np.zeros(n, F32)
            ps = pieces(a, n, shard, W, bk)
            for q, lo, hi, at in ps:
                piece = master[lo:hi]
                want[at:at + hi - lo] = rnd(quant(piece, o.qwz, o.block)[0] if o.qwz else piece)
            seen_bwd |= bool(bwd)
            src_want = 2 if (o.hpz and seen_bwd) else (1 if o.qwz else 0)
            if not seen_bwd:
                for q, lo, hi, at in ps:
                    covered[lo:hi] += 1
                    want_full[lo:hi] = want[at:at + hi - lo]
            for r in range(W):
                g = recs[r][i]
                ok = g["src"] == src_want and bits_equal(g["x"], want)
                tally("gather", ok, f"rank {r} step {step} {'backward' if bwd else 'forward'} [{a}, +{n}) source "
                      f"{g['src']} (want {src_want}): " + (diff_note(g["x"], want) if not bits_equal(g["x"], want) else "same"))
        if gather_hook:
            # a forward before the first backward: each micro-batch's forward covers [0, P) once
            cov = covered if bk else covered[:P]
            ok = cov.min() >= 1 and np.all(cov == cov[0])
            check(ok, f"step {step}: the forward gathers before the first backward cover [0, P) evenly",
                  f"each element {covered.min()}..{covered.max()} times")
        # hpZ's secondary: this node rank's part of the step's first forward weights
        for r in range(W):
            sec = [recs[r][i] for i in idx if recs[r][i]["tag"] == 3]
            if not o.hpz:
                continue
            j, lo = r % K, (r % K) * N * shard
            want = want_full[lo:lo + N * shard].copy()
            if not bk:
                want[np.maximum(P - lo, 0):] = 0  # the padding beyond P
            ok = len(sec) == 1 and sec[0]["a"] == lo and bits_equal(sec[0]["x"], want)
            tally("secondary", ok, f"rank {r} (local {j}) step {step}: " +
                  (diff_note(sec[0]["x"], want) if len(sec) == 1 else f"{len(sec)} secondary records"))
        # qgZ: each reduction recomputed from every rank's local gradients
        if o.qgz:
            grad = [np.zeros(shard, F32) for _ in range(W)]
            ri = [i for i in idx if recs[0][i]["tag"] in (4, 5)]
            reduced = np.zeros(M, np.int32)
            for k in range(0, len(ri), 2):
                i, i5 = ri[k], ri[k + 1] if k + 1 < len(ri) else None
                x0 = recs[0][i]
                a, n = x0["a"], x0["n"]
                srcs = [recs[r][i]["x"] for r in range(W)]
                ps = pieces(a, n, shard, W, bk)
                own = {q: (lo, hi) for q, lo, hi, at in ps}
                rat = {q: at - lo for q, lo, hi, at in ps}  # master index + rat[q] = the place in the record
                for q, lo, hi, at in ps:
                    reduced[lo:hi] += 1
                partial = {}  # (rank, node of the owner) -> fp32 partial sum
                for r in range(W):  # hop 0: inside node p, onto local index j
                    p, j = divmod(r, K)
                    for pp in range(N):
                        q = pp * K + j
                        if q not in own:
                            continue
                        lo, hi = own[q]
                        acc = srcs[r][lo + rat[q]:hi + rat[q]].copy()
                        for t in range(1, K):
                            s = p * K + (j - t) % K
                            rr = res0[s][lo:hi] if res0 is not None else None
                            deq, nr = quant(srcs[s][lo + rat[q]:hi + rat[q]], o.qgz, o.block, rr)
                            if nr is not None:
                                res0[s][lo:hi] = nr
                            acc = (acc + deq).astype(F32)
                        partial[(r, pp)] = acc
                for r in range(W):  # hop 1: across nodes, onto the owner r = (p, j)
                    p, j = divmod(r, K)
                    if r not in own:
                        continue
                    lo, hi = own[r]
                    acc = partial[(r, p)].copy()
                    for t in range(1, N):
                        s = ((p - t) % N) * K + j
                        rr = res1[s][p, lo - r * shard:hi - r * shard] if res1 is not None else None
                        deq, nr = quant(partial[(s, p)], o.qgz, o.block, rr)
                        if nr is not None:
                            res1[s][p, lo - r * shard:hi - r * shard] = nr
                        acc = (acc + deq).astype(F32)
                    grad[r][lo - r * shard:hi - r * shard] = (grad[r][lo - r * shard:hi - r * shard] + acc).astype(F32)
                for r in range(W):
                    g = recs[r][i5] if i5 is not None else None
                    ok = g is not None and g["tag"] == 5 and bits_equal(g["x"], grad[r])
                    tally("grad", ok, f"rank {r} step {step} after reducing [{a}, +{n}): " +
                          (diff_note(g["x"], grad[r]) if g is not None and g["tag"] == 5 else "no grad_shard record"))
            red = reduced if bk else reduced[:P]
            check(red.min() >= 1, f"step {step}: the reductions cover [0, P)",
                  f"each element {red.min()}..{red.max()} times")
    names = dict(gather="gathered weights (forward and backward) = deq(q(master pieces)) at their offsets",
                 secondary="hpZ's secondary = the step's first forward weights, this node rank's part",
                 grad="grad_shard after each qgZ reduction = the hierarchical quantised sum, bit for bit")
    for kind, (good, bad) in stats.items():
        if good + bad:
            check(bad == 0, f"{names[kind]}: {good} of {good + bad} records", first_bad.get(kind, ""))
    return finish(results)


def finish(results):
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
