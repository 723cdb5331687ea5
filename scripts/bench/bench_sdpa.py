#!/usr/bin/env python3
"""
bench_sdpa.py -- causal attention alone, forward and backward, through
torch.nn.functional.scaled_dot_product_attention with each backend torch
offers here (flash, efficient, cuDNN, math), at the shape of
dev/cuda/attention.cu's default run (B=16, T=1024, NH=12, hs=64, bf16), so
scripts/gpu_check.sh can set our kernels' times beside them.

  python3 scripts/bench/bench_sdpa.py [--B 16 --T 1024 --NH 12 --hs 64 --reps 20] [--device cpu]
  sdpa backend=flash B=16 T=1024 NH=12 hs=64 forward_ms=... backward_ms=...
  sdpa backend=cudnn ... unavailable (...)

One line per backend; a backend that torch cannot run at this shape says so
on its line. The times are the median of --reps runs after 3 not timed
(CUDA events on a GPU; --device cpu runs the same code on the CPU, for
testing the script where there is no GPU, in float32).
STATUS: not yet run on a GPU.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def backends():
    """(name, SDPBackend or None) for each backend this torch knows."""
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:  # (torch < 2.3: only the default dispatch)
        return [("default", None)]
    out = []
    for name, attr in (("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"),
                       ("cudnn", "CUDNN_ATTENTION"), ("math", "MATH")):
        if hasattr(SDPBackend, attr):
            out.append((name, getattr(SDPBackend, attr)))
    return out


def timed(fn, reps, cuda):
    """Median ms of reps calls of fn after 3 warm-ups."""
    for _ in range(3):
        fn()
    ms = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--NH", type=int, default=12)
    ap.add_argument("--hs", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("sdpa: no CUDA device visible to torch; skipped")
        return
    dtype = torch.bfloat16 if cuda else torch.float32
    g = torch.Generator(device="cpu").manual_seed(0)
    shape = (a.B, a.NH, a.T, a.hs)
    q, k, v = (torch.randn(shape, generator=g).to(a.device, dtype).requires_grad_(True) for _ in range(3))
    dout = torch.randn(shape, generator=g).to(a.device, dtype)
    for name, backend in backends():
        label = f"sdpa backend={name} B={a.B} T={a.T} NH={a.NH} hs={a.hs}"
        try:
            if backend is None:
                ctx = torch.enable_grad
            else:
                from torch.nn.attention import sdpa_kernel
                ctx = lambda: sdpa_kernel(backend)  # noqa: E731
            with ctx():
                fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                out = fwd()

                def fwd_bwd():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    torch.autograd.grad(o, (q, k, v), dout)

                f_ms = timed(fwd, a.reps, cuda)
                fb_ms = timed(fwd_bwd, a.reps, cuda)
            print(f"{label} forward_ms={f_ms:.3f} backward_ms={fb_ms - f_ms:.3f}")
            del out
        except Exception as e:  # (a backend torch cannot run here: said, and the next one tried)
            print(f"{label} unavailable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")


if __name__ == "__main__":
    main()
