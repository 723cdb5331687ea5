#!/usr/bin/python3
"""
hf_reference.py -- Hugging Face GPT-2 checkpoints for test_gpt's --hf check,
made and read back without transformers or the safetensors package.

  # a small random GPT-2 in HF's layout, its checkpoints and its logits
  /usr/bin/python3 scripts/hf_reference.py make DIR
  ./test_gpt --hf DIR               # imports them, compares logits, exports DIR/export
  # read the export back with the reader below and compare every tensor exactly
  /usr/bin/python3 scripts/hf_reference.py check DIR

`make` builds GPT-2 (L=2, C=64, NH=4, V=100, maxT=32) in float64, with random
weights rounded to fp32, in the layout of transformers' GPT2Model: Conv1D
weights (in, out), y = x W + b. It writes, each a folder with config.json
and model.safetensors (the format: an 8-byte little-endian header length, a
JSON header of {name: {dtype, shape, data_offsets}}, the raw tensors):
  f32/      F32, names as the gpt2 repo's file: wte.weight, h.0.attn.bias ...
  f64/      the same values as F64, names transformer.* (GPT2LMHeadModel)
  f16/      F16 (values rounded to half), with lm_head.weight tied to wte
  f16_f32/  the same half values, stored F32 (what f16/ must import as)
  bf16/ bf16_f32/  the same for bfloat16
and ref.bin: 256 int32 (magic 20261130, version 1, B, T, V), the tokens
(B, T) as int32, the float64 forward's logits (B, T, V) as float32.

`check` reads DIR/export/model.safetensors (what gpt.c wrote) with the reader
below: the __metadata__, the names GPT2LMHeadModel.from_pretrained loads
(transformer.*), F32, HF's shapes, contiguous 8-byte-aligned data, every
tensor bit-equal to f32/'s; and config.json's fields; then the float64
forward on the exported weights gives ref.bin's logits exactly.
"""
import json
import math
import os
import struct
import sys

import torch

L, C, NH, V, MAXT = 2, 64, 4, 100, 32
B, T = 2, 16
REF_MAGIC = 20261130


# ---- the model, in HF's layout (Conv1D: x @ W + b, W (in, out)) -----------

def hf_names(prefix=""):
    names = [prefix + "wte.weight", prefix + "wpe.weight"]
    for i in range(L):
        for n in ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]:
            names.append(f"{prefix}h.{i}.{n}")
    return names + [prefix + "ln_f.weight", prefix + "ln_f.bias"]


def hf_shape(name):
    n = name.split(".", 1)[1] if name.startswith("transformer.") else name
    if n == "wte.weight": return (V, C)
    if n == "wpe.weight": return (MAXT, C)
    if n.startswith("ln_f"): return (C,)
    n = n.split(".", 2)[2]  # drop "h.{i}."
    return {"ln_1.weight": (C,), "ln_1.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
            "attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,),
            "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,),
            "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,),
            "mlp.c_proj.weight": (4 * C, C), "mlp.c_proj.bias": (C,)}[n]


def random_weights(seed):
    """float64 values that fp32 holds exactly; biases and LayerNorms random too,
    so that a tensor mapped to the wrong place shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name in hf_names():
        shape = hf_shape(name)
        if name.endswith("weight") and len(shape) == 1:  # LayerNorm gain
            w = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif len(shape) == 1:
            w = 0.05 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            w = 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        sd[name] = w.float().double()
    return sd


def forward(sd, x):
    """GPT-2's forward in float64 (GPT2LMHeadModel, eval mode), logits (B, T, V)."""
    def ln(h, w, b):
        return torch.nn.functional.layer_norm(h, (C,), w, b, eps=1e-5)
    def gelu(u):  # "gelu_new": the tanh form
        return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))
    b_, t_ = x.shape
    h = sd["wte.weight"][x] + sd["wpe.weight"][:t_]
    hs = C // NH
    mask = torch.tril(torch.ones(t_, t_, dtype=torch.bool))
    for i in range(L):
        p = lambda n: sd[f"h.{i}.{n}"]
        a = ln(h, p("ln_1.weight"), p("ln_1.bias"))
        qkv = a @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (z.view(b_, t_, NH, hs).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        s = s.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (s @ v).transpose(1, 2).reshape(b_, t_, C)
        h = h + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        m = ln(h, p("ln_2.weight"), p("ln_2.bias"))
        h = h + gelu(m @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias")) @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    h = ln(h, sd["ln_f.weight"], sd["ln_f.bias"])
    return h @ sd["wte.weight"].T


# ---- safetensors, written and read by hand --------------------------------

DTYPES = {"F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2),
          "BF16": (torch.bfloat16, 2)}


def tensor_bytes(t):
    """little-endian raw bytes of a contiguous tensor (this machine is little-endian)"""
    assert sys.byteorder == "little"
    t = t.contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits as int16
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def safetensors_write(path, tensors, dtype):
    """tensors: {name: float64 tensor}, written as `dtype` in the order given"""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        raw = tensor_bytes(t.to(DTYPES[dtype][0]))
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def safetensors_read(path):
    """{name: (dtype, tensor)}, the header's metadata and the header length"""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    buf = data[8 + n:]
    out, spans = {}, []
    for name, e in header.items():
        tdtype, size = DTYPES[e["dtype"]]
        b, end = e["data_offsets"]
        count = math.prod(e["shape"])
        assert end - b == count * size, name
        raw = bytearray(buf[b:end])
        t = torch.frombuffer(raw, dtype=torch.int16 if tdtype == torch.bfloat16 else tdtype) if count else torch.zeros(0)
        if tdtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out[name] = (e["dtype"], t.reshape(e["shape"]).clone())
        spans.append((b, end))
    spans.sort()
    contiguous = all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1)) and \
        (not spans or (spans[0][0] == 0 and spans[-1][1] == len(buf)))
    return out, meta, n, contiguous


def config_json(path, extra=None):
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_embd": C, "n_head": NH,
           "n_positions": MAXT, "n_ctx": MAXT, "vocab_size": V, "activation_function": "gelu_new",
           "layer_norm_epsilon": 1e-05, "n_inner": None, "resid_pdrop": 0.1, "summary_type": "cls_index",
           "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}}
    cfg.update(extra or {})
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


# ---- make and check --------------------------------------------------------

def make(d):
    sd = random_weights(1234)
    x = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(5))
    logits = forward(sd, x)

    def folder(name, tensors, dtype):
        os.makedirs(os.path.join(d, name), exist_ok=True)
        config_json(os.path.join(d, name, "config.json"))
        safetensors_write(os.path.join(d, name, "model.safetensors"), tensors, dtype)

    with_buffers = {}
    for name, t in sd.items():  # the gpt2 repo's file: plain names, the causal masks beside each layer
        with_buffers[name] = t
        if name.endswith("ln_1.weight"):
            i = name.split(".")[1]
            with_buffers[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, MAXT, MAXT, dtype=torch.float64))
    folder("f32", with_buffers, "F32")
    folder("f64", {"transformer." + k: v for k, v in sd.items()}, "F64")
    for low, tdtype in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        rounded = {k: v.to(tdtype).double() for k, v in sd.items()}
        tied = {"transformer." + k: v for k, v in rounded.items()}
        tied["lm_head.weight"] = rounded["wte.weight"]
        folder(low, tied, low.upper())
        folder(low + "_f32", rounded, "F32")
    with open(os.path.join(d, "ref.bin"), "wb") as f:
        h = [0] * 256
        h[0:5] = [REF_MAGIC, 1, B, T, V]
        f.write(struct.pack("<256i", *h))
        f.write(x.to(torch.int32).numpy().tobytes())
        f.write(logits.float().numpy().tobytes())
    print(f"hf_reference: wrote {d}/{{f32,f64,f16,f16_f32,bf16,bf16_f32}}/ and ref.bin "
          f"(L={L} C={C} NH={NH} V={V} maxT={MAXT}; logits max|.| {logits.abs().max().item():.3f})")


def check(d):
    fails = 0

    def ok(cond, what):
        nonlocal fails
        print(("ok   " if cond else "FAIL ") + what)
        fails += not cond

    sd = random_weights(1234)
    got, meta, n, contiguous = safetensors_read(os.path.join(d, "export", "model.safetensors"))
    ok(meta == {"format": "pt"}, f"export: __metadata__ is {meta}")
    ok(n % 8 == 0 and contiguous, f"export: header {n} bytes (a multiple of 8), data contiguous from 0 to the end")
    want = hf_names("transformer.")
    ok(sorted(got) == sorted(want), f"export: {len(got)} tensors named as GPT2LMHeadModel's (transformer.*), lm_head tied")
    exact = all(name in got and got[name][0] == "F32" and tuple(got[name][1].shape) == hf_shape(name)
                and torch.equal(got[name][1], sd[name[len("transformer."):]].float()) for name in want)
    ok(exact, "export: every tensor F32, HF's shape (Conv1D (in, out), wte (V, C)), bit-equal to the imported one")
    with open(os.path.join(d, "export", "config.json")) as f:
        cfg = json.load(f)
    ok(all(cfg.get(k) == v for k, v in {"model_type": "gpt2", "n_layer": L, "n_embd": C, "n_head": NH,
                                        "n_positions": MAXT, "vocab_size": V, "activation_function": "gelu_new",
                                        "architectures": ["GPT2LMHeadModel"]}.items()), f"export: config.json {cfg}")
    if exact:
        with open(os.path.join(d, "ref.bin"), "rb") as f:
            f.read(1024)
            x = torch.frombuffer(bytearray(f.read(4 * B * T)), dtype=torch.int32).long().view(B, T)
            ref = torch.frombuffer(bytearray(f.read(4 * B * T * V)), dtype=torch.float32).view(B, T, V)
        back = {k[len("transformer."):]: t.double() for k, (_, t) in got.items()}
        ok(torch.equal(forward(back, x).float(), ref), "export: PyTorch's forward on the exported weights gives the same logits")
    print(f"hf_reference check: {fails} failed")
    return fails


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "check"):
        sys.exit(__doc__)
    if sys.argv[1] == "make":
        os.makedirs(sys.argv[2], exist_ok=True)
        make(sys.argv[2])
    else:
        sys.exit(1 if check(sys.argv[2]) else 0)
