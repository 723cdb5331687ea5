#!/usr/bin/python3
"""
bench_torch.py -- PyTorch CPU baseline for gpt.c: GPT-2 124M training steps.

Times full fp32 training steps (forward, backward, AdamW step) of the same
GPT-2 that scripts/gpt2_reference.py defines (imported from it, so there is one
model definition), at random init, on one random batch, using all cores:

  /usr/bin/python3 scripts/bench/bench_torch.py --B 4 --T 64 --warmup-steps 1 --steps 3
  torch B=4 T=64 ms/step=1834.2 gflops=104.3 peak_rss_gb=2.91 blas=openblas-openmp threads=2 best_ms=... best_gflops=... steps=3

  /usr/bin/python3 scripts/bench/bench_torch.py --ceiling
  ceiling sgemm 2048^3 gflops=290.1 blas=openblas-openmp threads=2

Run it through scripts/bench/bench_torch.sh to get the OpenMP build of OpenBLAS (the
fair baseline for an OpenMP C trainer); plain python gets whatever libblas.so.3
the system alternatives point at (on Debian: openblas-pthread).

  flops/step = B*T*(6*P + 6*L*C*T)   (forward + backward, no recompute;
                                      P = 124,475,904 with Vp = 50304)
  ms/step    = median wall time of the timed steps (after --warmup-steps);
               best_ms = the fastest one, best_gflops from it
  peak_rss_gb = getrusage(RUSAGE_SELF).ru_maxrss, the whole process's peak
  blas       = the BLAS library actually mapped into this process, read from
               /proc/self/maps after a matmul: openblas-openmp, openblas-pthread,
               reference (netlib libblas), or the library's file name.

Left out on purpose: gradient clipping and the lr schedule (they cost
microseconds next to a step), data loading.
"""

import argparse
import os
import resource
import statistics
import sys
import time

import torch

# gpt2_reference.py lives one folder up, in scripts/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpt2_reference import Config, DECAYED, TENSOR_NAMES, gpt2_forward, model_init  # noqa: E402

GPT2_124M = dict(L=12, C=768, NH=12, maxT=1024, V=50257)


def blas_loaded():
    """Names the BLAS mapped into this process (call after a matmul)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            if "blas" in name or "mkl" in name:
                libs.add(path)
    kinds = set()
    for p in libs:
        if "/openblas-openmp/" in p:
            kinds.add("openblas-openmp")
        elif "/openblas-pthread/" in p:
            kinds.add("openblas-pthread")
        elif "/openblas-serial/" in p:
            kinds.add("openblas-serial")
        elif "/blas/" in p:
            kinds.add("reference")
        elif "mkl" in p:
            kinds.add("mkl")
        else:
            kinds.add(os.path.basename(p))
    return "+".join(sorted(kinds)) if kinds else "none"


def peak_rss_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024.0 * 1024.0)  # KiB -> GiB


def ceiling(n=2048, reps=10):
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    c = torch.empty(n, n)
    torch.mm(a, b, out=c)                         # warm up: threads, page faults
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    gflops = 2.0 * n ** 3 / best / 1e9
    print(f"ceiling sgemm {n}^3 gflops={gflops:.1f} best_ms={best * 1e3:.1f} "
          f"blas={blas_loaded()} threads={torch.get_num_threads()}", flush=True)


def bench(B, T, steps, warmup_steps, seed):
    cfg = Config(**GPT2_124M)
    if T > cfg.maxT:
        sys.exit(f"error: --T {T} > maxT {cfg.maxT}")
    P = cfg.num_params()
    params = [torch.from_numpy(t).requires_grad_(True) for t in model_init(cfg, seed)]
    decay = [p for n, p in zip(TENSOR_NAMES, params) if n in DECAYED]
    nodecay = [p for n, p in zip(TENSOR_NAMES, params) if n not in DECAYED]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, cfg.V, (B, T), generator=g)
    y = torch.randint(0, cfg.V, (B, T), generator=g)

    times = []
    for s in range(warmup_steps + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = gpt2_forward(params, x, y, cfg)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if s >= warmup_steps:
            times.append(dt)
        print(f"  step {s} {'(warmup) ' if s < warmup_steps else ''}loss {loss.item():.4f} "
              f"{dt * 1e3:.1f} ms", file=sys.stderr, flush=True)
    # median, not mean: on these shared VMs a step sometimes takes 2-4x longer
    # (page faults on freshly allocated memory); best_ms shows the undisturbed step
    ms = 1e3 * statistics.median(times)
    best = 1e3 * min(times)
    flops = B * T * (6.0 * P + 6.0 * cfg.L * cfg.C * T)
    print(f"torch B={B} T={T} ms/step={ms:.1f} gflops={flops / (ms * 1e-3) / 1e9:.1f} "
          f"peak_rss_gb={peak_rss_gb():.2f} blas={blas_loaded()} "
          f"threads={torch.get_num_threads()} best_ms={best:.1f} "
          f"best_gflops={flops / (best * 1e-3) / 1e9:.1f} steps={len(times)}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("--B", type=int, default=4, help="batch size")
    ap.add_argument("--T", type=int, default=64, help="sequence length")
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--warmup-steps", type=int, default=1, help="untimed steps first")
    ap.add_argument("--seed", type=int, default=1337, help="init and data seed")
    ap.add_argument("--ceiling", action="store_true",
                    help="measure the fp32 matmul ceiling (torch.mm 2048^3) instead")
    a = ap.parse_args()
    if a.B < 1 or a.T < 1 or a.steps < 1 or a.warmup_steps < 0:
        ap.error("--B, --T, --steps must be >= 1, --warmup-steps >= 0")
    torch.set_num_threads(os.cpu_count())
    if a.ceiling:
        ceiling()
    else:
        bench(a.B, a.T, a.steps, a.warmup_steps, a.seed)


if __name__ == "__main__":
    main()
