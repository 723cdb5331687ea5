#!/usr/bin/python3
"""
gpt2_reference.py -- the PyTorch reference for gpt.c.

Builds GPT-2 in PyTorch (float64 by default), runs a few training steps on one
fixed random batch, and writes every number the C test (test_gpt.c) compares
against: the batch, step 0's logits, loss and gradients, then each step's loss
and gradient norm, and the parameters after the last AdamW step.

Run it with Debian's python (torch 1.13, numpy):

  # a fresh tiny model and its reference (what scripts/tests/make_fixtures.sh does)
  /usr/bin/python3 scripts/gpt2_reference.py --init 2,36,3,11,131 --seed 1337 \
      --out-model dev/fixtures/tiny_model.bin \
      --B 3 --T 9 --steps 10 --data-seed 42 --out-ref dev/fixtures/tiny_ref.bin
  # a reference for an existing llm.c checkpoint (version 3 = fp32 or 5 = bf16)
  /usr/bin/python3 scripts/gpt2_reference.py --model gpt2_124M.bin \
      --B 2 --T 64 --steps 3 --out-ref gpt2_124M_ref.bin
  # self-checks: autograd vs finite differences, hand AdamW vs torch.optim.AdamW
  /usr/bin/python3 scripts/gpt2_reference.py --init 2,36,3,11,131 --seed 1 --selfcheck

What it leaves out on purpose: dropout (none in gpt.c), data loading (the batch
is random tokens), gradient accumulation, bf16 arithmetic. The same batch (x, y)
is used for every step.

Contents (banners below, in this order):
  1. model definition        -- the exact GPT-2 that gpt.c implements
  2. checkpoint file         -- llm.c model format, read and write
  3. init                    -- GPT-2 initialisation from torch's RNG
  4. optimizer and schedule  -- AdamW written out by hand, cosine schedule
  5. reference file          -- our format, written for test_gpt.c
  6. self-checks             -- finite differences, torch.optim.AdamW
  7. CLI and main

The model (must match train_gpt.c exactly)
------------------------------------------
  h = wte[x] + wpe[0:T]                                  (B,T,C)
  for each layer l:
    h = h + attproj(attn(ln1(h)))
    h = h + fcproj(gelu_tanh(fc(ln2(h))))
  logits = lnf(h) @ wte^T                                (B,T,Vp)  LM head tied to wte
  loss = mean over B*T of cross-entropy(logits[..., :V], y)  (padded columns never predicted)
LayerNorm: eps 1e-5, biased variance, weight and bias. GELU: tanh approximation
(F.gelu(x, approximate='tanh')). Attention: qkv = ln1(h) @ qkvw^T + qkvb gives
q, k, v in that order along the 3C output dim; each of q, k, v is split into NH
contiguous chunks of hs = C/NH channels (head 0 = channels 0..hs-1); causal
softmax(q k^T / sqrt(hs)) v; heads concatenated back in order. All weights are
(out, in) row-major and a linear layer computes y = x W^T + b.

Model file (llm.c format, little-endian)
----------------------------------------
  header: 256 int32: [0] = 20240326 magic, [1] = version (3 = fp32 params,
          5 = bf16 params; both are read, only 3 is written), [2] = maxT,
          [3] = V, [4] = L, [5] = NH, [6] = C, [7] = Vp; the rest zero.
  body:   the 16 tensors below, each concatenated over layers, in this order
          (P elements in total, fp32 or bf16 each):
            wte (Vp,C) wpe (maxT,C) ln1w (L,C) ln1b (L,C) qkvw (L,3C,C)
            qkvb (L,3C) attprojw (L,C,C) attprojb (L,C) ln2w (L,C) ln2b (L,C)
            fcw (L,4C,C) fcb (L,4C) fcprojw (L,C,4C) fcprojb (L,C) lnfw (C) lnfb (C)
  P = Vp*C + maxT*C + L*(12C^2 + 13C) + 2C  (124,475,904 for GPT-2 small).

Reference file (ours, little-endian)
------------------------------------
  header: 256 int32:
    [0] = 20261101 magic     [1] = 1 version       [2] = B        [3] = T
    [4] = steps              [5] = V               [6] = Vp       [7] = P
    [8] = warmup steps       [9] = schedule id (0 = warmup + cosine, below)
    [10] = L   [11] = C   [12] = NH   [13] = maxT
    float32 bit patterns: [16] = lr [17] = beta1 [18] = beta2 [19] = eps
    [20] = weight_decay [21] = grad_clip [22] = final_lr_frac;  the rest zero.
  body, in order:
    x         int32   (B*T)      input tokens, uniform in [0, V)
    y         int32   (B*T)      target tokens, uniform in [0, V)
    logits    float32 (B*T*Vp)   step 0's forward, all Vp columns
    loss      float32 (1)        step 0's loss
    grads     float32 (P)        step 0's gradients (before clipping), in the
                                 model file's tensor order
    losses    float32 (steps)    loss of each step, before its update
    gradnorms float32 (steps)    global gradient norm of each step, before clipping
    params    float32 (P)        parameters after the last step, model file order
  The file size is exactly 1024 + 4*(2*B*T + B*T*Vp + 1 + 2*P + 2*steps).

Training step s = 0 .. steps-1 (t = s + 1)
------------------------------------------
  forward + backward on (x, y); loss_s; g_s = sqrt(sum of all grads squared)
  clip:  scale = grad_clip / (g_s + 1e-6); if scale < 1, grads *= scale
         (the same rule as torch.nn.utils.clip_grad_norm_)
  lr_s = lr * (s+1) / warmup                                    if s < warmup
       = min_lr + 0.5 * (1 + cos(pi * (s-warmup) / (steps-warmup))) * (lr - min_lr)
                                                                otherwise
         with min_lr = lr * final_lr_frac
  AdamW, per parameter p with gradient g (decoupled weight decay, Loshchilov &
  Hutter 2019, Algorithm 2; the same as torch.optim.AdamW):
    p -= lr_s * wd * p          wd = weight_decay for wte, wpe, qkvw, attprojw,
                                fcw, fcprojw; 0 for biases and LayerNorm tensors
    m  = beta1 * m + (1 - beta1) * g
    v  = beta2 * v + (1 - beta2) * g^2
    p -= lr_s * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
"""

import argparse
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# 1. model definition

MODEL_MAGIC = 20240326
REF_MAGIC = 20261101
REF_VERSION = 1
HEADER_INTS = 256
LN_EPS = 1e-5

TENSOR_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
# the tensors AdamW decays (matrices and embeddings); all others get wd = 0
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


class Config:
    def __init__(self, L, C, NH, maxT, V, Vp=None):
        self.L, self.C, self.NH, self.maxT, self.V = L, C, NH, maxT, V
        self.Vp = Vp if Vp is not None else (V + 127) // 128 * 128
        if C % NH != 0:
            sys.exit(f"error: C={C} is not a multiple of NH={NH}: pick C = NH * head size")
        if self.Vp < V:
            sys.exit(f"error: padded vocab Vp={self.Vp} < V={V}")

    def shapes(self):
        """Shape of each of the 16 tensors, in model file order."""
        L, C, maxT, Vp = self.L, self.C, self.maxT, self.Vp
        return [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C),
                (L, C, C), (L, C), (L, C), (L, C), (L, 4 * C, C), (L, 4 * C),
                (L, C, 4 * C), (L, C), (C,), (C,)]

    def num_params(self):
        return sum(math.prod(s) for s in self.shapes())

    def __str__(self):
        return (f"L={self.L} C={self.C} NH={self.NH} maxT={self.maxT} V={self.V} "
                f"Vp={self.Vp} P={self.num_params()}")


def gpt2_forward(params, x, y, cfg):
    """params: the 16 tensors in file order. x, y: (B,T) int64.
    Returns (logits (B,T,Vp), loss scalar)."""
    (wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb,
     ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb) = params
    B, T = x.shape
    C, NH = cfg.C, cfg.NH
    hs = C // NH
    # causal mask: position t attends to positions 0..t
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)

    h = wte[x] + wpe[:T]                                           # (B,T,C)
    for l in range(cfg.L):
        # attention block
        a = F.layer_norm(h, (C,), ln1w[l], ln1b[l], LN_EPS)        # (B,T,C)
        qkv = a @ qkvw[l].t() + qkvb[l]                            # (B,T,3C)
        q, k, v = qkv.split(C, dim=2)                              # 3 x (B,T,C)
        q = q.reshape(B, T, NH, hs).transpose(1, 2)                # (B,NH,T,hs)
        k = k.reshape(B, T, NH, hs).transpose(1, 2)
        v = v.reshape(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(2, 3)) * (1.0 / math.sqrt(hs))      # (B,NH,T,T)
        att = att.masked_fill(future, float("-inf"))
        att = torch.softmax(att, dim=3)
        o = (att @ v).transpose(1, 2).reshape(B, T, C)             # (B,T,C)
        h = h + o @ attprojw[l].t() + attprojb[l]
        # MLP block
        a = F.layer_norm(h, (C,), ln2w[l], ln2b[l], LN_EPS)
        f = F.gelu(a @ fcw[l].t() + fcb[l], approximate="tanh")    # (B,T,4C)
        h = h + f @ fcprojw[l].t() + fcprojb[l]
    h = F.layer_norm(h, (C,), lnfw, lnfb, LN_EPS)
    logits = h @ wte.t()                                           # (B,T,Vp)
    # only the first V columns are real tokens; padded ones are never predicted
    loss = F.cross_entropy(logits[:, :, :cfg.V].reshape(B * T, cfg.V), y.reshape(B * T))
    return logits, loss


# -----------------------------------------------------------------------------
# 2. checkpoint file (llm.c model format)

def bf16_to_fp32(u16):
    """bf16 bit patterns (uint16 array) -> float32: bf16 is the top half of fp32."""
    return (u16.astype(np.uint32) << 16).view(np.float32)


def model_read(path):
    """Returns (cfg, list of 16 float32 numpy arrays in file order)."""
    with open(path, "rb") as f:
        raw = f.read(4 * HEADER_INTS)
        if len(raw) != 4 * HEADER_INTS:
            sys.exit(f"error: {path}: too short for a 1024-byte header ({len(raw)} bytes)")
        hdr = np.frombuffer(raw, dtype="<i4")
        if hdr[0] != MODEL_MAGIC:
            sys.exit(f"error: {path}: magic {hdr[0]}, expected {MODEL_MAGIC}: not an llm.c model file")
        version = int(hdr[1])
        if version not in (3, 5):
            sys.exit(f"error: {path}: version {version}, this script reads 3 (fp32) or 5 (bf16)")
        maxT, V, L, NH, C, Vp = (int(v) for v in hdr[2:8])
        for name, val in (("maxT", maxT), ("V", V), ("L", L), ("NH", NH), ("C", C), ("Vp", Vp)):
            if not 0 < val <= 1 << 20:
                sys.exit(f"error: {path}: header {name}={val} is out of range")
        cfg = Config(L, C, NH, maxT, V, Vp)
        P = cfg.num_params()
        dtype, size = ("<f4", 4) if version == 3 else ("<u2", 2)
        body = f.read()
        if len(body) != P * size:
            sys.exit(f"error: {path}: body has {len(body)} bytes, expected {P * size} "
                     f"for {cfg} at {size} bytes per parameter")
        flat = np.frombuffer(body, dtype=dtype)
        flat = flat.astype(np.float32) if version == 3 else bf16_to_fp32(flat)
    tensors, off = [], 0
    for shape in cfg.shapes():
        n = math.prod(shape)
        tensors.append(flat[off:off + n].reshape(shape).copy())
        off += n
    return cfg, tensors


def model_header(cfg, version):
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[0:8] = [MODEL_MAGIC, version, cfg.maxT, cfg.V, cfg.L, cfg.NH, cfg.C, cfg.Vp]
    return hdr


def write_atomically(path, chunks):
    """Writes byte chunks to path via a temporary name, then renames."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


def model_write(path, cfg, tensors):
    """Writes a version 3 (fp32) model file."""
    chunks = [model_header(cfg, 3).tobytes()]
    for t, shape in zip(tensors, cfg.shapes()):
        assert t.shape == shape, (t.shape, shape)
        chunks.append(np.ascontiguousarray(t, dtype="<f4").tobytes())
    write_atomically(path, chunks)


# -----------------------------------------------------------------------------
# 3. init (GPT-2: Radford et al. 2019, section 2.3, as in the released code)

def model_init(cfg, seed):
    """All weight matrices and both embeddings ~ N(0, 0.02); the two residual
    projections (attprojw, fcprojw) ~ N(0, 0.02/sqrt(2L)); biases 0; LayerNorm
    weights 1, biases 0; padded wte rows (>= V) 0. Random tensors are drawn from
    torch's CPU generator seeded with `seed`, in file order, each stacked tensor
    (all layers) in one normal_() call, in float32."""
    g = torch.Generator().manual_seed(seed)
    resid_std = 0.02 / math.sqrt(2 * cfg.L)
    tensors = []
    for name, shape in zip(TENSOR_NAMES, cfg.shapes()):
        if name in ("wte", "wpe", "qkvw", "fcw"):
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, 0.02, generator=g)
        elif name in ("attprojw", "fcprojw"):
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, resid_std, generator=g)
        elif name in ("ln1w", "ln2w", "lnfw"):
            t = torch.ones(shape, dtype=torch.float32)
        else:
            t = torch.zeros(shape, dtype=torch.float32)
        if name == "wte":
            t[cfg.V:] = 0.0
        tensors.append(t.numpy())
    return tensors


# -----------------------------------------------------------------------------
# 4. optimizer and schedule

class Hyper:
    def __init__(self, a):
        self.lr, self.beta1, self.beta2, self.eps = a.lr, a.beta1, a.beta2, a.eps
        self.weight_decay, self.grad_clip = a.weight_decay, a.grad_clip
        self.warmup, self.final_lr_frac = a.warmup, a.final_lr_frac


def lr_at(step, steps, hp):
    """Linear warmup over `warmup` steps, then cosine decay to lr*final_lr_frac
    at step == steps (never reached: the last step is steps-1)."""
    if step < hp.warmup:
        return hp.lr * (step + 1) / hp.warmup
    min_lr = hp.lr * hp.final_lr_frac
    ratio = (step - hp.warmup) / (steps - hp.warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (hp.lr - min_lr)


def clip_grads(params, max_norm):
    """Returns the global norm before clipping; scales grads in place if needed."""
    norm = torch.sqrt(sum((p.grad * p.grad).sum() for p in params)).item()
    scale = max_norm / (norm + 1e-6)
    if scale < 1.0:
        for p in params:
            p.grad.mul_(scale)
    return norm


class AdamW:
    """AdamW written out: the definition the C trainer follows."""

    def __init__(self, params, hp):
        self.params, self.hp, self.t = params, hp, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.wd = [hp.weight_decay if n in DECAYED else 0.0 for n in TENSOR_NAMES]

    @torch.no_grad()
    def step(self, lr):
        hp = self.hp
        self.t += 1
        bc1 = 1.0 - hp.beta1 ** self.t
        bc2 = 1.0 - hp.beta2 ** self.t
        for p, m, v, wd in zip(self.params, self.m, self.v, self.wd):
            g = p.grad
            p.sub_(lr * wd * p)                                # decoupled weight decay
            m.mul_(hp.beta1).add_((1.0 - hp.beta1) * g)         # first moment
            v.mul_(hp.beta2).add_((1.0 - hp.beta2) * g * g)     # second moment
            p.sub_(lr * (m / bc1) / (torch.sqrt(v / bc2) + hp.eps))


def make_batch(cfg, B, T, data_seed):
    """x then y, each (B,T), uniform in [0, V), numpy PCG64 seeded by data_seed."""
    rng = np.random.default_rng(data_seed)
    x = rng.integers(0, cfg.V, size=(B, T), dtype=np.int64)
    y = rng.integers(0, cfg.V, size=(B, T), dtype=np.int64)
    return x, y


def to_params(tensors, dtype):
    return [torch.tensor(t, dtype=dtype).requires_grad_(True) for t in tensors]


def train(cfg, tensors, x, y, steps, hp, dtype, optimizer="hand", log=True):
    """Runs `steps` AdamW steps on the same batch. optimizer: 'hand' (ours) or
    'torch' (torch.optim.AdamW + clip_grad_norm_, for the self-check).
    Returns a dict with step 0's logits, loss, grads, and per-step losses,
    grad norms and the final params."""
    params = to_params(tensors, dtype)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    if optimizer == "hand":
        opt = AdamW(params, hp)
    else:
        decay = [p for n, p in zip(TENSOR_NAMES, params) if n in DECAYED]
        nodecay = [p for n, p in zip(TENSOR_NAMES, params) if n not in DECAYED]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp.weight_decay},
                                 {"params": nodecay, "weight_decay": 0.0}],
                                lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps)
    out = {"losses": [], "gradnorms": []}
    for s in range(steps):
        t0 = time.time()
        for p in params:
            p.grad = None
        logits, loss = gpt2_forward(params, xt, yt, cfg)
        loss.backward()
        if s == 0:
            out["logits"] = logits.detach().clone()
            out["loss"] = loss.item()
            out["grads"] = [p.grad.detach().clone() for p in params]
        lr = lr_at(s, steps, hp)
        if optimizer == "hand":
            norm = clip_grads(params, hp.grad_clip)
            opt.step(lr)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, hp.grad_clip).item()
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
        out["losses"].append(loss.item())
        out["gradnorms"].append(norm)
        if log:
            print(f"step {s:3d}  loss {loss.item():.9f}  gradnorm {norm:.6e}  "
                  f"lr {lr:.6e}  {time.time() - t0:.2f}s", flush=True)
    out["params"] = [p.detach().clone() for p in params]
    return out


# -----------------------------------------------------------------------------
# 5. reference file

def f32_bits(v):
    return struct.unpack("<i", struct.pack("<f", v))[0]


def ref_write(path, cfg, B, T, steps, hp, x, y, out):
    P = cfg.num_params()
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[0:14] = [REF_MAGIC, REF_VERSION, B, T, steps, cfg.V, cfg.Vp, P,
                 hp.warmup, 0, cfg.L, cfg.C, cfg.NH, cfg.maxT]
    for i, v in enumerate([hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay,
                           hp.grad_clip, hp.final_lr_frac]):
        hdr[16 + i] = f32_bits(v)

    def f32(t):
        return np.ascontiguousarray(np.asarray(t, dtype=np.float64).reshape(-1), dtype="<f4").tobytes()

    def flat(ts):
        return np.concatenate([t.reshape(-1).double().numpy() for t in ts])

    chunks = [hdr.tobytes(),
              x.astype("<i4").tobytes(), y.astype("<i4").tobytes(),
              f32(out["logits"].double().numpy()),
              f32([out["loss"]]),
              f32(flat(out["grads"])),
              f32(out["losses"]), f32(out["gradnorms"]),
              f32(flat(out["params"]))]
    write_atomically(path, chunks)
    expect = 1024 + 4 * (2 * B * T + B * T * cfg.Vp + 1 + 2 * P + 2 * steps)
    size = os.path.getsize(path)
    assert size == expect, f"reference file is {size} bytes, expected {expect}"
    print(f"wrote {path} ({size} bytes)")


# -----------------------------------------------------------------------------
# 6. self-checks

def fd_check(cfg, tensors, x, y, per_tensor=4, h=1e-5, tol=1e-6, seed=0, plant=False):
    """Compares autograd gradients (float64) with central finite differences
    (f(p+h) - f(p-h)) / 2h on a few random elements of each tensor. Returns the
    number of failures. plant=True corrupts one analytic gradient to show the
    checker rejects it (test the tester)."""
    params = to_params(tensors, torch.float64)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    _, loss = gpt2_forward(params, xt, yt, cfg)
    loss.backward()
    rng = np.random.default_rng(seed)
    fails, worst = 0, 0.0
    for ti, (name, p) in enumerate(zip(TENSOR_NAMES, params)):
        flatp, flatg = p.data.view(-1), p.grad.view(-1)
        idx = list(rng.integers(0, flatp.numel(), size=per_tensor))
        if name == "wte" and cfg.Vp > cfg.V:
            idx.append(cfg.V * cfg.C)          # first element of a padded row: grad is 0
        for i in idx:
            i = int(i)
            orig = flatp[i].item()
            with torch.no_grad():
                flatp[i] = orig + h
                lp = gpt2_forward(params, xt, yt, cfg)[1].item()
                flatp[i] = orig - h
                lm = gpt2_forward(params, xt, yt, cfg)[1].item()
                flatp[i] = orig
            num = (lp - lm) / (2 * h)
            ana = flatg[i].item()
            if plant and ti == 0 and i == idx[0]:
                ana = ana * 1.01 + 1e-4
            err = abs(num - ana) / max(abs(num), abs(ana), 1e-3)
            worst = max(worst, err)
            if err > tol:
                fails += 1
                if not plant:
                    print(f"  FAIL {name}[{i}]: autograd {ana:.12e} finite-diff {num:.12e} rel {err:.2e}")
    if not plant:
        print(f"finite differences: {len(TENSOR_NAMES)} tensors, worst rel err {worst:.2e} "
              f"(tol {tol:g}), {fails} failures")
    return fails


def selfcheck(cfg, tensors, B, T, steps, hp, data_seed):
    fails = 0
    x, y = make_batch(cfg, B, T, data_seed)
    # 1. autograd vs finite differences, and a planted error the check must catch
    fails += fd_check(cfg, tensors, x, y)
    if fd_check(cfg, tensors, x, y, plant=True) == 0:
        print("  FAIL the finite-difference check accepted a planted wrong gradient")
        fails += 1
    else:
        print("finite differences: planted wrong gradient rejected (ok)")
    # 2. padded logit columns must not influence the loss: wte rows >= V get zero grad
    params = to_params(tensors, torch.float64)
    _, loss = gpt2_forward(params, torch.from_numpy(x), torch.from_numpy(y), cfg)
    loss.backward()
    pad = params[0].grad[cfg.V:].abs().max().item() if cfg.Vp > cfg.V else 0.0
    print(f"padded wte rows: max |grad| = {pad:g} (must be 0)")
    if pad != 0.0:
        fails += 1
    # 3. hand AdamW + clipping vs torch.optim.AdamW + clip_grad_norm_, float64
    a = train(cfg, tensors, x, y, steps, hp, torch.float64, "hand", log=False)
    b = train(cfg, tensors, x, y, steps, hp, torch.float64, "torch", log=False)
    dp = max((pa - pb).abs().max().item() for pa, pb in zip(a["params"], b["params"]))
    dn = max(abs(u - w) for u, w in zip(a["gradnorms"], b["gradnorms"]))
    print(f"AdamW by hand vs torch.optim.AdamW over {steps} steps: max |param diff| = {dp:.3e}, "
          f"max |gradnorm diff| = {dn:.3e} (tol 1e-12)")
    if dp > 1e-12 or dn > 1e-12:
        fails += 1
    # 4. the clip must have engaged at least once, or check 3 proved less than it claims
    clipped = sum(1 for g in a["gradnorms"] if g > hp.grad_clip)
    print(f"clipping engaged on {clipped} of {steps} steps")
    print(f"selfcheck: {'PASS' if fails == 0 else 'FAIL'} ({fails} failures)")
    return fails


# -----------------------------------------------------------------------------
# 7. CLI and main

def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="PyTorch GPT-2 reference for gpt.c: writes models and reference files.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--init", metavar="L,C,NH,maxT,V", help="build a fresh GPT-2 with this shape")
    src.add_argument("--model", metavar="PATH", help="read an llm.c model file (version 3 or 5)")
    ap.add_argument("--seed", type=int, default=1337, help="torch RNG seed for --init")
    ap.add_argument("--out-model", metavar="PATH", help="write the model (version 3, fp32) here")
    ap.add_argument("--out-ref", metavar="PATH", help="write the reference file here")
    ap.add_argument("--selfcheck", action="store_true",
                    help="finite-difference and AdamW self-checks; exit 1 on failure")
    ap.add_argument("--B", type=int, default=3, help="batch size")
    ap.add_argument("--T", type=int, default=9, help="sequence length (<= maxT)")
    ap.add_argument("--steps", type=int, default=10, help="training steps (same batch each step)")
    ap.add_argument("--data-seed", type=int, default=42, help="numpy seed for the batch x, y")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                    help="arithmetic of the reference computation")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    ap.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1")
    ap.add_argument("--beta2", type=float, default=0.95, help="AdamW beta2")
    ap.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (matrices, embeddings)")
    ap.add_argument("--grad-clip", type=float, default=1.0, help="global gradient norm clip")
    ap.add_argument("--warmup", type=int, default=3, help="linear warmup steps")
    ap.add_argument("--final-lr-frac", type=float, default=0.1, help="final lr as a fraction of lr")
    a = ap.parse_args(argv)
    if not (a.out_model or a.out_ref or a.selfcheck):
        ap.error("nothing to do: give --out-model, --out-ref and/or --selfcheck")
    if a.B < 1 or a.T < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--B, --T, --steps must be >= 1 and --warmup >= 0")
    return a


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads if a.threads > 0 else os.cpu_count())
    dtype = torch.float64 if a.dtype == "float64" else torch.float32
    if a.init:
        try:
            L, C, NH, maxT, V = (int(v) for v in a.init.split(","))
        except ValueError:
            sys.exit(f"error: --init {a.init}: expected five integers L,C,NH,maxT,V")
        cfg = Config(L, C, NH, maxT, V)
        tensors = model_init(cfg, a.seed)
    else:
        cfg, tensors = model_read(a.model)
    print(f"model: {cfg}  ({a.init and 'init seed %d' % a.seed or a.model})")
    if a.T > cfg.maxT:
        sys.exit(f"error: --T {a.T} > maxT {cfg.maxT}: the position table has only maxT rows")
    if a.out_model:
        model_write(a.out_model, cfg, tensors)
        print(f"wrote {a.out_model}")
    hp = Hyper(a)
    fails = 0
    if a.selfcheck:
        fails = selfcheck(cfg, tensors, a.B, a.T, a.steps, hp, a.data_seed)
    if a.out_ref:
        x, y = make_batch(cfg, a.B, a.T, a.data_seed)
        t0 = time.time()
        out = train(cfg, tensors, x, y, a.steps, hp, dtype)
        print(f"{a.steps} steps in {a.dtype}: {time.time() - t0:.1f}s")
        ref_write(a.out_ref, cfg, a.B, a.T, a.steps, hp, x, y, out)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
