#!/usr/bin/env python3
"""runtime_closed_form.py — gptc/runtime.h's step-time model recomputed
independently, in closed form, from a planted calibration, for
scripts/tests/test_plan.sh: each candidate row of a --plan table must carry the
idle ms (and the bytes sent per level) written here, and each "step by part"
line its parts (one node, exact modes) adding up to its row.

  runtime_closed_form.py PLAN_OUTPUT L C NH maxT V T S W N K BLOCK NUMS...

PLAN_OUTPUT: --plan's output (run with --overlap 1, the default) (its "network" and "links" lines give the
latencies and rates measured or stated at that start, every digit); the
model's shape; T, S (sequences per rank per step); W ranks as N nodes of K
(N = 1: one node); the quantisation block; NUMS: the planted cache line's
numbers (gptc/runtime.h's calib_numbers order). Prints "candidates n, wrong
k" and one line per wrong figure.

The model, as gptc/runtime.h's header states it:
  compute = accum (GEMMs + attention + elementwise + cross-entropy
            + ZeRO-2/3's buckets) + optimizer + ZeRO++'s codec, the
            layers' GEMMs, attention and elementwise times the layer
            factor f;
  one node, no stated links: ZeRO 0 allreduce alpha + 4P/allreduce rate;
            ZeRO-1 reduce + all-gather of 4P; ZeRO-2 per micro-batch 13 L
            messages and 4 L layer bytes at the reduce rate, the head's 2
            messages, the all-gather of 4P; ZeRO-3 per micro-batch 2 + 24 L
            gathers of head + 2 L layer floats at the all-gather rate and
            the layers' reductions (a message per owner piece), the head's
            once; plus the loss's and the norm's sums (2 alpha); with several
            ranks, every path: the meetings x calib_sync's cost ("a meeting of the
            ranks amid compute now");
  by level (several nodes): per level (the ranks' mean messages x its
            latency + the ranks' mean bytes sent / its rate), plus 2 latencies
            of the inter level; bytes from scripts/zeropp_bytes.py (ZeRO-3)
            or zero3.h's header formulas (ZeRO 0-2, hierarchical); messages
            counted from zero3.h's and zeropp.h's headers; a "+flat" row
            (--hierarchical 0, weighed beside the hierarchical one) reduces
            flat: each range's owner pieces sent straight to their owners
            (4 (K - 1) n bytes inside the nodes and 4 (W - K) n across,
            summed over the ranks; plain: an allreduce per layer slice,
            twice that), one message per owner piece on every rank, at the
            inter level's latency (a world collective's).
"""
import os
import re
import sys

# zeropp_bytes.py lives one folder up, in scripts/ (bench_zero.sh uses it too)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import zeropp_bytes as zb  # noqa: E402


def main():
    out = sys.argv[1]
    L, C, NH, maxT, V, T, S, W, N, K, block = (int(x) for x in sys.argv[2:13])
    v = [float(x) for x in sys.argv[13:]]
    Vp = (V + 127) // 128 * 128
    P = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
    layer = 12 * C * C + 13 * C
    head = P - L * layer
    embed = Vp * C + maxT * C
    fixed = [[v[2 + 10 * p + 2 * s] for s in range(5)] for p in range(2)]
    row = [[v[3 + 10 * p + 2 * s] for s in range(5)] for p in range(2)]
    attn, elem, ce, zero_ns, norm_ns, adamw_ns = v[22:28]
    qenc = {8: v[30], 4: v[31]}
    qdec = {8: v[32], 4: v[33]}
    lf = v[34]  # a layer inside the step over its kernels alone: the layers' GEMMs, attention, elementwise times f
    Tc = min(T, 128)
    net = links = None
    for line in open(out):
        if line.startswith("network ("):
            f = line.replace(",", " ").split()
            num = [float(x) for x in f if x.replace(".", "", 1).replace("e-", "", 1).replace("e+", "", 1).isdigit()]
            net = dict(zip(["alpha", "alpha_now", "ar", "red", "ag", "sync"], num))
        if line.startswith("links ("):
            body = line.split("):", 1)[1]
            links = {}
            for part in body.split(";"):
                f = part.split()
                links[0 if f[0] == "intra-node" else 1] = (float(f[1]), float(f[3]))
    shard = -(-P // W)
    _, head_ranges, layer_ranges = zb.ranges(L, C, Vp, maxT)

    def owners(a, n):
        return (a + n - 1) // shard - a // shard + 1

    def parts(B, z):
        """a micro-batch's GEMMs, attention, elementwise, cross-entropy; the step's optimizer (ms)"""
        Nr = B * T
        gemm = sum((1 if s == 4 else L * lf) * (fixed[p][s] + row[p][s] * Nr) for s in range(5) for p in range(2))
        n = P if (z == 0 or W == 1) else min(shard, P)
        grad_alloc = P if z == 0 else shard * W if z == 1 else head
        if W == 1 and z in (1, 2):
            grad_alloc = shard if z == 1 else head
        opt = (grad_alloc * zero_ns + (shard * zero_ns if z else 0.0) + n * (2 * norm_ns + zero_ns + adamw_ns) +
               (2.0 * n * zero_ns if z == 1 else 0.0)) * 1e-6
        return {"GEMMs": gemm, "attention": lf * B * L * attn * (T / Tc) ** 2,
                "elementwise": lf * 152.0 * C * Nr * L / (elem * 1e6), "cross-entropy": 28.0 * Nr * Vp / (ce * 1e6),
                "optimizer": opt}

    def compute(B, accum, z):
        Nr = B * T
        gemm = sum((1 if s == 4 else L * lf) * (fixed[p][s] + row[p][s] * Nr) for s in range(5) for p in range(2))
        micro = gemm + lf * (B * L * attn * (T / Tc) ** 2 + 152.0 * C * Nr * L / (elem * 1e6)) + 28.0 * Nr * Vp / (ce * 1e6)
        n = P if (z == 0 or W == 1) else min(shard, P)  # rank 0's parameters to update
        grad_alloc = P if z == 0 else shard * W if z == 1 else head
        if W == 1 and z in (1, 2):  # (one rank: the same shard geometry)
            grad_alloc = shard if z == 1 else head
        buckets = (L * layer * zero_ns + 2.0 * n * zero_ns) * 1e-6 if z >= 2 else 0.0
        opt = (grad_alloc * zero_ns + (shard * zero_ns if z else 0.0) + n * (2 * norm_ns + zero_ns + adamw_ns) +
               (2.0 * n * zero_ns if z == 1 else 0.0)) * 1e-6
        return accum * (micro + buckets) + opt

    def one_level_comm(accum, z):
        a = net["alpha"] * 1e-3
        ms = lambda msgs, nbytes, gbs: msgs * a + nbytes / (gbs * 1e6)
        if z == 0:  # (--overlap 1, the default: an allreduce per layer slice, then the head's two)
            c = ms(12 * L + 2, 4 * P, net["ar"])
        elif z in (1, 2):  # (ZeRO-1 with --overlap 1: the layers' reductions once a step)
            c = (accum if z == 2 else 1) * ms(13 * L, 4 * layer * L, net["red"]) + ms(2, 4 * head, net["red"]) + \
                ms(1, 4 * P, net["ag"])
        else:
            layer_msgs = sum(owners(a_, n_) for a_, n_ in layer_ranges)
            head_msgs = sum(owners(a_, n_) for a_, n_ in head_ranges)
            c = accum * (ms(2 + 24 * L, 4 * (head + 2 * L * layer), net["ag"]) + ms(layer_msgs, 4 * layer * L, net["red"])) \
                + ms(head_msgs, 4 * head, net["red"])
        return c + 2 * a

    def zero3_levels(accum, qwz, hpz, qgz, hier):
        """messages and codec elements summed over the ranks (zeropp.h's header), then the bytes (zeropp_bytes)"""
        msgs = [0.0, 0.0]
        enc = {8: 0.0, 4: 0.0}
        dec = {8: 0.0, 4: 0.0}
        for m in range(accum):
            for backward, rs in ((0, head_ranges + layer_ranges), (1, layer_ranges)):
                for a_, n_ in rs:
                    if hpz and (m > 0 or backward):
                        msgs[0] += W if K > 1 else 0
                    elif qwz:
                        msgs[1] += W * (N - 1)
                        msgs[0] += W * (K - 1)
                        enc[qwz] += n_
                        dec[qwz] += W * n_
                    else:
                        msgs[1] += W
        for a_, n_ in layer_ranges * accum + head_ranges:
            if qgz:
                if K > 1:
                    msgs[0] += W * (K - 1)
                    enc[qgz] += (K - 1) * N * n_
                    dec[qgz] += (K - 1) * N * n_
                msgs[1] += W * (N - 1)
                enc[qgz] += (N - 1) * n_
                dec[qgz] += (N - 1) * n_
            elif hier:
                pieces = owners(a_, n_)
                msgs[0] += pieces * W if K > 1 else 0
                msgs[1] += pieces * N
            else:
                msgs[1] += owners(a_, n_) * W
        sent = zb.step_bytes(L, C, Vp, maxT, W, N, K, qwz, qgz, hpz, block, accum, hier=hier)[:2]
        quant = sum(enc[b] * qenc[b] + dec[b] * qdec[b] for b in (8, 4)) / W * 1e-6
        return sent, msgs, quant

    def level_messages(z, accum, hier):
        """ZeRO 0-2 by level, hierarchical, summed over the ranks: plain, the allreduce of P (K reduces of its
        nonzero pieces and an all-gather inside the node, an allreduce across); ZeRO-1/2 an intra reduce per owner
        piece on every rank and an inter one on the N ranks of the owner's index; the all-gather (a world collective:
        the inter level's latency)"""
        if z == 0 and not hier:  # (--overlap 1: an allreduce per layer slice, then the head's two)
            return [0, W * (12 * L + 2)]
        if z == 0:
            s_ = -(-P // K)
            nonzero = sum(1 for i in range(K) if min(P, (i + 1) * s_) > i * s_)
            return [W * (nonzero + 1), N * nonzero]
        msgs = [0, W]
        for a_, n_ in layer_ranges * (accum if z == 2 else 1) + head_ranges:
            if hier:
                msgs[0] += owners(a_, n_) * W
                msgs[1] += owners(a_, n_) * N
            else:
                msgs[1] += owners(a_, n_) * W
        return msgs

    def level_bytes(z, hier):
        """ZeRO 0-2 by level, hierarchical (gptc/zero3.h's header) or flat: flat all-gather of the padded shards"""
        gather = [4 * W * (K - 1) * shard, 4 * W * (W - K) * shard]
        if z == 0:
            return [8 * N * (K - 1) * P, 8 * (N - 1) * P] if hier else [8 * (K - 1) * P, 8 * (W - K) * P]
        red = (lambda n: [4 * N * (K - 1) * n, 4 * (N - 1) * n]) if hier else (lambda n: [4 * (K - 1) * n, 4 * (W - K) * n])
        r = [0, 0]  # (--overlap 1: ZeRO-1 reduces the layers' ranges once a step, ZeRO-2 every micro-batch)
        for a_, n_ in layer_ranges * (accum_now[0] if z == 2 else 1) + head_ranges:
            x = red(n_)
            r = [r[0] + x[0], r[1] + x[1]]
        return [r[0] + gather[0], r[1] + gather[1]]

    def meetings(z, accum, opt):
        """the ranks' meetings amid compute a step (--overlap 1), each calib_sync's cost on an idle machine too:
        the loss's sum; ZeRO-1/2 the all-gather after AdamW (its part of a 2 ms segment); ZeRO-1 a wait in every
        layer's hook; ZeRO-2 every layer's bucket, every micro-batch; ZeRO-3 3 L + 1 a micro-batch"""
        m = 1.0 + (min(1.0, opt / 2.0) if z in (1, 2) else 0.0) + (L if z == 1 else 0) + (accum * L if z == 2 else 0)
        return m + (accum * (3.0 * L + 1.0) if z == 3 else 0.0)

    accum_now = [1]
    bad, n = [], 0
    for line in open(out):
        f = line.split()
        if not (len(f) == 11 and f[0].isdigit() and f[5] in ("yes", "no")):
            continue
        B, accum, mode, idle = int(f[0]), int(f[1]), f[2], float(f[8])
        sent_printed = [float(f[9]), float(f[10])]
        z = int(mode[0])
        qwz = 8 if "qwZ8" in mode else 4 if "qwZ4" in mode else 0
        qgz = 4 if "qgZ4" in mode else 8 if "qgZ8" in mode else 0
        hpz = 1 if "hpZ" in mode else 0
        hier = 0 if "+flat" in mode else 1
        accum_now[0] = accum
        want = compute(B, accum, z)
        if W > 1:
            want += meetings(z, accum, parts(B, z)["optimizer"]) * net["sync"]
        check_time = True  # (every row's time is checked)
        if W == 1:
            want_sent = [0, 0]
        elif N == 1:
            want += one_level_comm(accum, z)
            want_sent = None
        elif z == 3:
            sent, msgs, quant = zero3_levels(accum, qwz, hpz, qgz, hier)
            want_sent = sent
            want += quant + 2 * links[1][0] * 1e-3
            for e in (0, 1):
                want += (msgs[e] * links[e][0] * 1e-3 + sent[e] / (links[e][1] * 1e6)) / W
        else:  # ZeRO 0-2 by level (hierarchical)
            want_sent = level_bytes(z, hier)
            msgs = level_messages(z, accum, hier)
            want += 2 * links[1][0] * 1e-3
            for e in (0, 1):
                want += (msgs[e] * links[e][0] * 1e-3 + want_sent[e] / (links[e][1] * 1e6)) / W
        n += 1
        if check_time and abs(idle - want) > 0.006 + 1e-6 * want:
            bad.append("B=%d ZeRO %s: --plan says %.2f idle ms, the closed form %.4f" % (B, mode, idle, want))
        if want_sent is not None and [round(x) for x in want_sent] != [round(x) for x in sent_printed]:
            bad.append("B=%d ZeRO %s: --plan says %s bytes sent (intra, inter), the closed form %s"
                       % (B, mode, sent_printed, want_sent))
    # the "step by part" lines (the choice, and the flags' own configuration): each part as the formula, and the
    # parts' sum (accum x the micro-batch's + optimizer + quantising + collectives) the idle ms of the row
    idle_of, lines = {}, 0
    for line in open(out):
        f = line.split()
        if len(f) == 11 and f[0].isdigit() and f[5] in ("yes", "no"):
            idle_of[(int(f[0]), f[2])] = (int(f[1]), float(f[8]))
    for line in open(out):
        if not line.startswith("step by part, "):
            continue
        head_, body = line.split("), ms on an idle machine: ")
        B, mode = int(head_.split("(B=")[1].split(",")[0]), head_.split("ZeRO ")[-1]
        z = int(mode[0])
        got = {k_: float(re.search(k_ + r"[a-z ]* ([0-9.]+)", body).group(1))
               for k_ in ("GEMMs", "attention", "elementwise", "cross-entropy", "ZeRO", "optimizer", "quantising",
                          "collectives")}
        lines += 1
        accum, idle = idle_of[(B, mode)]
        want = parts(B, z) if not mode[1:] else {}  # (ZeRO++'s and +flat's parts: their sum only)
        for k_, x in want.items():
            if abs(got[k_] - x) > 0.006 + 1e-6 * x:
                bad.append("step by part B=%d ZeRO %d: %s %.2f, the closed form %.4f" % (B, z, k_, got[k_], x))
        total = accum * (got["GEMMs"] + got["attention"] + got["elementwise"] + got["cross-entropy"] + got["ZeRO"]) + \
            got["optimizer"] + got["quantising"] + got["collectives"]
        if abs(total - idle) > 0.006 * (5 + 4 * accum):
            bad.append("step by part B=%d ZeRO %d: the parts add up to %.2f, the row says %.2f idle ms" % (B, z, total, idle))
    print("candidates %d, wrong %d; step-by-part lines %d" % (n, len(bad), lines))
    for b in bad:
        print(b)


if __name__ == "__main__":
    main()
