#!/usr/bin/env python3
"""
bench_torch_gpu.py -- the PyTorch side of scripts/gpu_check.sh: GPT-2 training
steps on one GPU, the same model and batch as train_gpt_cu, so the two
tokens/s figures can be compared as a ratio.

  python3 scripts/bench/bench_torch_gpu.py --B 16 --T 1024 --steps 20 [--no-compile]
  torch B=16 T=1024 ms/step=... tok/s=... mfu=...% compile=1 sdpa=flash

Model: GPT-2 (L=12, C=768, NH=12, Vp=50304, tied LM head, tanh GELU, LN eps 1e-5),
bf16 autocast with fp32 master weights (torch's usual mixed precision),
F.scaled_dot_product_attention(is_causal=True) (flash attention on sm80+),
torch.compile, fused AdamW, clip_grad_norm_(1.0). One random batch, reused.
MFU uses the same FLOPs per token as train_gpt_cu: 6 P + 6 L C T.
STATUS: ran on an H200 on 2026-11-30 (dev/cuda/RESULTS.md): B=64 T=1024,
538,659 tok/s (compile=1), before GPT-2's init was added here (timing unaffected).
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attproj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, C=768, NH=12, maxT=1024, Vp=50304):
        super().__init__()
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        # GPT-2's init, as train_gpt.c's: N(0, 0.02), the two projections into
        # the residual stream N(0, 0.02 / sqrt(2 L)), biases 0 (PyTorch's own
        # defaults gave a loss near 77 on the first H200 run: N(0, 1) embeddings)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # LayerNorm weights 1, biases 0 (set below for Linear)
            std = 0.02 / math.sqrt(2 * L) if name.endswith(("attproj.weight", "fcproj.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT().to(dev)
    P = sum(p.numel() for p in model.parameters())
    L, C = 12, 768
    fpt = 6 * P + 6 * L * C * a.T
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    step_model = model if a.no_compile else torch.compile(model)
    x = torch.randint(0, 50257, (a.B, a.T), device=dev)
    y = torch.randint(0, 50257, (a.B, a.T), device=dev)
    times = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    tps = a.B * a.T / (ms / 1e3)
    name = torch.cuda.get_device_name()
    peak = 756e12 if ("H100" in name and "PCIe" in name) else 989e12 if any(s in name for s in ("H100", "H200", "H800")) \
        else 312e12 if any(s in name for s in ("A100", "A800")) else 0
    mfu = f"{100 * tps * fpt / peak:.1f}%" if peak else "n/a"
    print(f"torch B={a.B} T={a.T} ms/step={ms:.1f} tok/s={tps:.0f} mfu={mfu} compile={int(not a.no_compile)} "
          f"loss={loss.item():.4f} device={name.replace(' ', '_')} P={P}")
    assert math.isfinite(loss.item())


if __name__ == "__main__":
    main()
