#!/usr/bin/python3
"""
bench_torch.py -- PyTorch CPU baseline for gpt.c: GPT-2 124M training steps.

Times full fp32 training steps (forward, backward, gradient clipping, AdamW
step) of GPT-2 as a PyTorch user writes it (--model nanogpt, the default: a
nanoGPT-style nn.Module with nn.Linear's fused bias, F.gelu(approximate="tanh"),
a causal mask, weight-tied head, torch.optim.AdamW with foreach=True: the
fastest attention and AdamW torch 1.13 offers on a CPU, which has no
scaled_dot_product_attention), or the functional model that
scripts/gpt2_reference.py defines for float64 parity (--model functional),
using all cores. --from DIR takes the weights and the batch that dev/cpu/
bench_train wrote (BENCH_DUMP=DIR) and prints the first step's loss (loss0=),
which make bench compares with gpt.c's on the same weights and batch; without
it, random init and a random batch:

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

Left out on purpose: the lr schedule (microseconds next to a step), data
loading.
"""

import argparse
import math
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# gpt2_reference.py lives one folder up, in scripts/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpt2_reference import Config, DECAYED, TENSOR_NAMES, gpt2_forward, model_init, model_read  # noqa: E402

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


def cpu_capability():
    """The vector kernels ATen runs (ATEN_CPU_CAPABILITY chooses them): AVX512, AVX2, NO_AVX."""
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip().replace(" ", "_")
    return "unknown"


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
          f"blas={blas_loaded()} threads={torch.get_num_threads()} "
          f"coretype={os.environ.get('OPENBLAS_CORETYPE', 'auto')}", flush=True)


# ---- the model a PyTorch user writes (nanoGPT's shape) ----
class SelfAttention(nn.Module):
    def __init__(self, C, NH, maxT):
        super().__init__()
        self.NH = NH
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.register_buffer("mask", torch.tril(torch.ones(maxT, maxT, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))  # (B, NH, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.NH))
        att = F.softmax(att.masked_fill(~self.mask[:T, :T], float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, C, NH, maxT):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(C), SelfAttention(C, NH, maxT), nn.LayerNorm(C)
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class NanoGPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.V = cfg.V
        self.wte, self.wpe = nn.Embedding(cfg.Vp, cfg.C), nn.Embedding(cfg.maxT, cfg.C)
        self.h = nn.ModuleList(Block(cfg.C, cfg.NH, cfg.maxT) for _ in range(cfg.L))
        self.ln_f = nn.LayerNorm(cfg.C)

    def forward(self, x, y):
        pos = torch.arange(x.shape[1])
        h = self.wte(x) + self.wpe(pos)
        for block in self.h:
            h = block(h)
        logits = F.linear(self.ln_f(h), self.wte.weight)  # the head shares wte; pad rows are never targets
        return logits, F.cross_entropy(logits[..., :self.V].reshape(-1, self.V), y.reshape(-1))

    def load(self, tensors):
        """tensors: the 16 arrays of the llm.c model file, in file order (layers stacked)."""
        t = dict(zip(TENSOR_NAMES, (torch.from_numpy(a) for a in tensors)))
        with torch.no_grad():
            self.wte.weight.copy_(t["wte"])
            self.wpe.weight.copy_(t["wpe"])
            self.ln_f.weight.copy_(t["lnfw"])
            self.ln_f.bias.copy_(t["lnfb"])
            for l, b in enumerate(self.h):
                for mod, w, bias in ((b.ln_1, "ln1w", "ln1b"), (b.attn.c_attn, "qkvw", "qkvb"),
                                     (b.attn.c_proj, "attprojw", "attprojb"), (b.ln_2, "ln2w", "ln2b"),
                                     (b.c_fc, "fcw", "fcb"), (b.c_proj, "fcprojw", "fcprojb")):
                    mod.weight.copy_(t[w][l])
                    mod.bias.copy_(t[bias][l])


def bench(B, T, steps, warmup_steps, seed, model_kind, from_dir):
    if from_dir:
        cfg, tensors = model_read(os.path.join(from_dir, "model.bin"))
        xy = np.fromfile(os.path.join(from_dir, "batch.bin"), dtype="<i4")
        if xy.size != 2 * B * T:
            sys.exit(f"error: {from_dir}/batch.bin holds {xy.size} tokens, expected 2 x B x T = {2 * B * T}")
        x = torch.from_numpy(xy[:B * T].astype(np.int64)).view(B, T)
        y = torch.from_numpy(xy[B * T:].astype(np.int64)).view(B, T)
    else:
        cfg = Config(**GPT2_124M)
        tensors = model_init(cfg, seed)
        g = torch.Generator().manual_seed(seed + 1)
        x = torch.randint(0, cfg.V, (B, T), generator=g)
        y = torch.randint(0, cfg.V, (B, T), generator=g)
    if T > cfg.maxT:
        sys.exit(f"error: --T {T} > maxT {cfg.maxT}")
    P = cfg.num_params()
    if model_kind == "nanogpt":
        model = NanoGPT(cfg)
        model.load(tensors)
        named = list(model.named_parameters())
        decay = [p for n, p in named if p.dim() >= 2]  # matrices and embeddings, as DECAYED
        nodecay = [p for n, p in named if p.dim() < 2]
        params = [p for _, p in named]
        run = lambda: model(x, y)  # noqa: E731
    else:
        params = [torch.from_numpy(t).requires_grad_(True) for t in tensors]
        decay = [p for n, p in zip(TENSOR_NAMES, params) if n in DECAYED]
        nodecay = [p for n, p in zip(TENSOR_NAMES, params) if n not in DECAYED]
        run = lambda: gpt2_forward(params, x, y, cfg)  # noqa: E731
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)

    times, loss0 = [], None
    for s in range(warmup_steps + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = run()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if s == 0:
            loss0 = loss.item()
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
          f"best_gflops={flops / (best * 1e-3) / 1e9:.1f} steps={len(times)} model={model_kind} "
          f"loss0={loss0:.6f} isa={cpu_capability()}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("--B", type=int, default=4, help="batch size")
    ap.add_argument("--T", type=int, default=64, help="sequence length")
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--warmup-steps", type=int, default=1, help="untimed steps first")
    ap.add_argument("--seed", type=int, default=1337, help="init and data seed")
    ap.add_argument("--model", choices=("nanogpt", "functional"), default="nanogpt",
                    help="nanogpt: the nn.Module a user writes; functional: gpt2_reference.py's")
    ap.add_argument("--from", dest="from_dir", metavar="DIR",
                    help="weights and batch from dev/cpu/bench_train's BENCH_DUMP=DIR")
    ap.add_argument("--ceiling", action="store_true",
                    help="measure the fp32 matmul ceiling (torch.mm 2048^3) instead")
    a = ap.parse_args()
    if a.B < 1 or a.T < 1 or a.steps < 1 or a.warmup_steps < 0:
        ap.error("--B, --T, --steps must be >= 1, --warmup-steps >= 0")
    torch.set_num_threads(os.cpu_count())
    if a.ceiling:
        ceiling()
    else:
        bench(a.B, a.T, a.steps, a.warmup_steps, a.seed, a.model, a.from_dir)


if __name__ == "__main__":
    main()
