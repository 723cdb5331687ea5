#!/usr/bin/env python3
"""zeropp_bytes.py — the bytes per level per step of --zero 3 with ZeRO++'s
modes (gptc/zeropp.h's header formulas), computed here from the model shape
alone, independently of the trainer, for scripts/tests/test_zeropp.sh and
scripts/bench/bench_zero.sh to compare with the trainer's counters.

  zeropp_bytes.py L C Vp maxT W N K qwz qgz hpz block [A]
prints "intra inter bwd_intra bwd_inter": bytes per step summed over the
ranks (all of it, and of it backward's weight gathers), A micro-batches.

  zeropp_bytes.py --gpu HIER L C Vp maxT W N K qwz qgz hpz block A
the same for train_gpt_cu's --zero 3 (gptc/cuda/zeropp.cuh, "ZeRO++ on --zero 3"),
HIER = its --hierarchical as resolved (1: fp32 gradients by level): the
ranges are its buckets (a layer's 12 slices, or wte | wpe | lnf), each of
W equal pieces padded to a multiple of 64 (so every slot has one size);
the weights travel in bf16 (2 bytes) unless qwZ; the head is gathered at
every micro-batch's forward and every bucket, the head's too, is reduced
at every micro-batch (ZeRO-2's reduction).
"""
import sys


def slot(c, bits, block):
    """one quantised piece of c floats: fp32 scales, payload padded to 4 bytes"""
    if c == 0:
        return 0
    payload = c if bits == 8 else (c + 1) // 2
    return 4 * (-(-c // block)) + 4 * (-(-payload // 4))


def ranges(L, C, Vp, maxT):
    """the flat ranges ZeRO-3 gathers and reduces: the head's two, each layer's slices"""
    per_layer = [C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C]  # ln1w .. fcprojb
    sizes = [Vp * C, maxT * C] + [L * s for s in per_layer] + [C, C]
    P = sum(sizes)
    offsets = [sum(sizes[:k]) for k in range(len(sizes))]
    head = [(0, sizes[0] + sizes[1]), (P - 2 * C, 2 * C)]
    layers = [(offsets[k] + l * per_layer[k - 2], per_layer[k - 2]) for k in range(2, 14) for l in range(L)]
    return P, head, layers


def pieces(a, n, shard, W):
    return [max(0, min(a + n, (q + 1) * shard) - max(a, q * shard)) for q in range(W)]


def step_bytes(L, C, Vp, maxT, W, N, K, qwz, qgz, hpz, block, A=1, hier=None):
    P, head, layers = ranges(L, C, Vp, maxT)
    shard = -(-P // W)
    if hier is None:
        hier = N > 1  # --hierarchical -1: on with more than one node
    S = lambda r, bits: sum(slot(c, bits, block) for c in pieces(r[0], r[1], shard, W))
    out = [0, 0, 0, 0]

    def gather(r, secondary, backward):
        if secondary:
            i, e = 4 * N * (K - 1) * r[1], 0
        elif qwz:
            i, e = (K - 1) * N * S(r, qwz), (N - 1) * S(r, qwz)
        else:
            i, e = 4 * (K - 1) * r[1], 4 * (N - 1) * K * r[1]
        out[0] += i
        out[1] += e
        if backward:
            out[2] += i
            out[3] += e

    def reduce(r):
        if qgz:
            i, e = N * (K - 1) * S(r, qgz), (N - 1) * S(r, qgz)
        elif hier:
            i, e = 4 * N * (K - 1) * r[1], 4 * (N - 1) * r[1]
        else:
            i, e = 4 * (K - 1) * r[1], 4 * (N - 1) * K * r[1]
        out[0] += i
        out[1] += e

    for m in range(A):
        for r in head + layers:  # forward: the head, every layer (micro-batch 0 cuts hpZ's secondary)
            gather(r, hpz and m > 0, False)
        for r in layers:  # backward: every layer again (the head is held)
            gather(r, hpz, True)
        for r in layers:  # each micro-batch's layer gradients
            reduce(r)
    for r in head:  # the head's gradients, once a step
        reduce(r)
    return out


def gpu_step_bytes(hier, L, C, Vp, maxT, W, N, K, qwz, qgz, hpz, block, A):
    layer, rest = 12 * C * C + 13 * C, Vp * C + maxT * C + 2 * C
    piece = lambda n: -(-n // (64 * W)) * 64  # each rank's piece of a bucket (DP_ALIGN = 64)
    out = [0, 0, 0, 0]

    def add(i, e, backward=False):
        out[0] += i
        out[1] += e
        if backward:
            out[2] += i
            out[3] += e

    def gather(p, secondary, backward):
        n = W * p
        if secondary:
            add(2 * N * (K - 1) * n, 0, backward)
        elif qwz:
            sb = slot(p, qwz, block)
            add(W * (K - 1) * N * sb, W * (N - 1) * sb, backward)
        else:
            add(2 * (K - 1) * n, 2 * (N - 1) * K * n, backward)

    def reduce(p):
        n = W * p
        if qgz:
            sb = slot(p, qgz, block)
            add(W * (K - 1) * N * sb, W * (N - 1) * sb)
        elif hier:
            add(4 * N * (K - 1) * n, 4 * (N - 1) * n)
        else:
            add(4 * (K - 1) * n, 4 * (N - 1) * K * n)

    pl, pr = piece(layer), piece(rest)
    for m in range(A):
        gather(pr, hpz and m > 0, False)  # forward: the head, then every layer (micro-batch 0 cuts the secondary)
        for _ in range(L):
            gather(pl, hpz and m > 0, False)
        for _ in range(L):  # backward: every layer again
            gather(pl, hpz, True)
        for _ in range(L):  # every bucket's gradients, each micro-batch
            reduce(pl)
        reduce(pr)
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--gpu":
        print(*gpu_step_bytes(*[int(x) for x in sys.argv[2:]]))
    else:
        a = [int(x) for x in sys.argv[1:]]
        print(*step_bytes(*a))
