#!/usr/bin/python3
"""eval_reference.py — the independent check of train_gpt's multiple-choice
eval (--eval-file: HellaSwag and sets of its shape), in PyTorch float64.

    /usr/bin/python3 scripts/eval_reference.py make-jsonl OUT.jsonl
        a small HellaSwag-shaped set (37 examples: "ctx", "endings", "label"),
        made here, deterministic: plain sentences, punctuation, digits,
        quotes and escapes, accents, CJK and an emoji, double spaces, long
        contexts (truncated at small T), short and long endings
    /usr/bin/python3 scripts/eval_reference.py tokens SET.jsonl SET.bin
        the eval file prepare_eval wrote holds, for every example, the ids
        that the reference GPT-2 tokenizer (gpt-3-encoder's encode, in node)
        gives for the context and for " " + each ending, and the label
    /usr/bin/python3 scripts/eval_reference.py make-model OUT.bin
        a small GPT-2 (L=2, C=32, NH=2, maxT=64, V=50257) with large random
        weights (std 0.3), so the endings' losses are far apart
    /usr/bin/python3 scripts/eval_reference.py check MODEL.bin SET.bin DETAIL.jsonl@T[@S] ... [--plant]
        scores every ending here and compares with each train_gpt
        --eval-detail file, run at sequence length T (its lines of step S,
        default 0); --plant: then the first file with one sum raised by 5e-4
        relative must fail the check (test the tester)

The scoring (train_gpt.c's eval_choices says the same): the row of ending k
is context + ending, its last T tokens when longer; each ending token whose
predecessor is in the row is scored with -log p(token | the row before it);
sum_k adds them, m_k counts them, mean_k = sum_k / m_k. acc picks
argmin sum_k, acc_norm argmin mean_k (ties to the lowest k). Here each row
is run alone, unpadded, through gpt2_reference.py's float64 model: nothing
of train_gpt's batching, padding or rank split is shared.

check passes when every sum agrees to 1e-4 relative (+1e-6 absolute), every
count exactly, and both picks agree on every example except near-ties: an
example whose best two scores (sums for acc, means for acc_norm) are within
1e-4 relative is skipped for that pick and counted; at most 1 in 10 may be.
Exit 0 on success, 1 with the first differences printed.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

EVAL_MAGIC, EVAL_VERSION = 20240522, 1
REL_TOL, ABS_TOL, TIE_REL = 1e-4, 1e-6, 1e-4


def die(msg):
    print(f"eval_reference: error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------
# the eval file (llm.c's format, as gptc/eval_data.h describes it)

def eval_read(path):
    """Returns [(label, ctx ids, [4 lists of ending ids])]."""
    raw = open(path, "rb").read()
    if len(raw) < 1024:
        die(f"{path}: shorter than the 1024-byte header")
    hdr = np.frombuffer(raw[:1024], dtype="<i4")
    if hdr[0] != EVAL_MAGIC or hdr[1] != EVAL_VERSION:
        die(f"{path}: magic {hdr[0]} version {hdr[1]}, expected {EVAL_MAGIC} version {EVAL_VERSION}")
    n, longest = int(hdr[2]), int(hdr[3])
    w = np.frombuffer(raw[1024:], dtype="<u2").astype(np.int64)
    out, p = [], 0
    for i in range(n):
        if w[p] != 65535 or w[p + 2] != i or w[p + 4] != 4:
            die(f"{path}: example {i}: bad delimiter, index or ending count")
        nbytes, label = int(w[p + 1]), int(w[p + 3])
        if nbytes > longest:
            die(f"{path}: example {i}: {nbytes} bytes, header says the longest is {longest}")
        end, p = p + nbytes // 2, p + 5
        parts = []
        for _ in range(5):
            k = int(w[p])
            parts.append([int(t) for t in w[p + 1:p + 1 + k]])
            p += 1 + k
        if p != end:
            die(f"{path}: example {i}: its size does not match its contents")
        out.append((label, parts[0], parts[1:]))
    if p != len(w):
        die(f"{path}: {len(w) - p} words after the last example")
    return out


# ---------------------------------------------------------------------------
# make-jsonl: a small set, HellaSwag's shape

WORDS = ("the man woman dog child team player chef she he they then slowly quickly picks up puts down "
         "a ball knife rope bowl guitar ladder roof kitchen field water paint brush camera towel "
         "and while after before into onto from with his her their its over under").split()
ODD = ["[header] How to clean a grill", "it's", "\"quoted\" text", "3.5 kg, 12 eggs & 2,000 m",
       "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "\u4e2d\u6587\u5b57", "\U0001F600 smiles", "tab\there",
       "new\nline", "two  spaces", "ends with space ", "back\\slash", "  leading", "don't stop",
       "e.g. (parenthesis) -- dash", "Mr. Smith's 1990s"]


def make_jsonl(path):
    rng = np.random.default_rng(16)

    def sentence(lo, hi):
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(lo, hi + 1)))]
        if rng.random() < 0.5:
            words.insert(int(rng.integers(0, len(words) + 1)), ODD[int(rng.integers(0, len(ODD)))])
        s = " ".join(words)
        return s[0].upper() + s[1:] + rng.choice([".", "!", "?", ",", ""])

    rows = [{"ind": 24, "ctx": "A man is sitting on a roof. he", "label": 3,
             "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                         "is holding a rubik's cube.", "starts pulling up roofing on a roof."]}]
    for i in range(36):  # 37 in all: the 2 ranks get 19 and 18
        long_ctx = i % 6 == 5  # contexts past T = 24 tokens: truncated rows
        ctx = " ".join(sentence(4, 9) for _ in range(int(rng.integers(4, 7)) if long_ctx else int(rng.integers(1, 3))))
        endings = [sentence(1, 14) for _ in range(4)]
        rows.append({"ind": 1000 + i, "activity_label": "made up", "ctx": ctx, "endings": endings,
                     "label": int(rng.integers(0, 4)) if i % 7 else str(int(rng.integers(0, 4)))})
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=bool(len(r["ctx"]) % 2)) + "\n")
            if r["ind"] == 1003:
                f.write("\n")  # a blank line is skipped
    print(f"eval_reference: {path}: {len(rows)} examples")


# ---------------------------------------------------------------------------
# tokens: the eval file against the reference tokenizer (gpt-3-encoder in node)

NODE_ENCODE = r"""
const path = require('path'), fs = require('fs');
const enc = require(path.resolve(process.argv[1], 'gpt-3-encoder'));
const out = [];
for (const line of fs.readFileSync(process.argv[2], 'utf8').split('\n')) {
  if (!line.trim()) continue;
  const ex = JSON.parse(line);
  out.push([enc.encode(ex.ctx), ex.endings.map(e => enc.encode(' ' + e)), Number(ex.label)]);
}
process.stdout.write(JSON.stringify(out));
"""


def tokens(jsonl, binpath):
    tok_dir = os.environ.get("TOKENIZER_DIR", "data/tokenizer")
    try:
        res = subprocess.run(["node", "-e", NODE_ENCODE, tok_dir, jsonl], capture_output=True, check=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        die(f"node with {tok_dir}/gpt-3-encoder failed ({e}): scripts/fetch_tokenizer.sh fetches it")
    want = json.loads(res.stdout)
    got = eval_read(binpath)
    if len(want) != len(got):
        die(f"{binpath}: {len(got)} examples, the reference reads {len(want)} from {jsonl}")
    bad = 0
    for i, ((wctx, wends, wlabel), (glabel, gctx, gends)) in enumerate(zip(want, got)):
        if wctx != gctx or wends != gends or wlabel != glabel:
            bad += 1
            if bad <= 3:
                print(f"example {i}: reference ctx {wctx} endings {wends} label {wlabel}\n"
                      f"           file      ctx {gctx} endings {gends} label {glabel}")
    ntok = sum(len(c) + sum(map(len, e)) for _, c, e in got)
    if bad:
        die(f"{bad} of {len(got)} examples differ from the reference tokenizer")
    print(f"eval_reference: tokens: {len(got)} examples, {ntok} tokens: identical to gpt-3-encoder's "
          f"encode(ctx) and encode(' ' + ending)")


# ---------------------------------------------------------------------------
# make-model and check

def make_model(path):
    """llm.c's model file (magic 20240326, version 3 = fp32), written here with
    numpy alone (no torch import: seconds saved); gpt2_reference.py reads it."""
    L, C, NH, maxT, V, Vp = 2, 32, 2, 64, 50257, 50304
    shapes = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)), ("qkvw", (L, 3 * C, C)),
              ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)),
              ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
              ("lnfw", (C,)), ("lnfb", (C,))]
    rng = np.random.default_rng(7)
    hdr = np.zeros(256, dtype="<i4")
    hdr[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        for name, shape in shapes:
            t = 1.0 + 0.1 * rng.standard_normal(shape) if name in ("ln1w", "ln2w", "lnfw") else 0.3 * rng.standard_normal(shape)
            f.write(t.astype("<f4").tobytes())
    print(f"eval_reference: {path}: L={L} C={C} NH={NH} maxT={maxT} V={V} Vp={Vp}")


def score(path_model, examples, T):
    """[(sums[4], counts[4])] in float64, each row alone."""
    import torch
    import gpt2_reference as ref
    cfg, tensors = ref.model_read(path_model)
    params = [torch.tensor(t, dtype=torch.float64) for t in tensors]
    out = []
    with torch.no_grad():
        for _, ctx, ends in examples:
            sums, counts = [], []
            for e in ends:
                row = (ctx + e)[-T:]
                nc = len(ctx) - (len(ctx) + len(e) - len(row))  # the ending starts here in the row
                x = torch.tensor([row], dtype=torch.int64)
                logits, _ = ref.gpt2_forward(params, x, x, cfg)  # (the loss of x on x is not used)
                logp = torch.log_softmax(logits[0, :, :cfg.V], dim=1)
                first = max(nc, 1)
                s = -sum(float(logp[t - 1, row[t]]) for t in range(first, len(row)))
                sums.append(s)
                counts.append(len(row) - first)
            out.append((sums, counts))
    return out


SCORES = {}  # (model, T) -> score(): a check of two files at the same T scores once


def picks(sums, counts):
    means = [s / c for s, c in zip(sums, counts)]
    return int(np.argmin(sums)), int(np.argmin(means)), means


def near_tie(values):
    a, b = sorted(values)[:2]
    return abs(b - a) <= TIE_REL * max(abs(a), 1e-12)


def check(model, binpath, detail, T, step, plant=False):
    """Returns the number of differences (0: passed); with plant, one sum of
    the file is first raised by 5 in 10^4 (test the tester: must be caught)."""
    examples = eval_read(binpath)
    if (model, T) not in SCORES:
        SCORES[(model, T)] = score(model, examples, T)
    ref = SCORES[(model, T)]
    lines = [json.loads(x) for x in open(detail) if x.strip()]
    lines = [x for x in lines if x["step"] == step]
    if plant:
        lines[5]["sum"][2] *= 1.0005
        print(f"eval_reference: planted: example 5 ending 2's sum raised by 5e-4 relative in {detail}")
    if len(lines) != len(examples):
        die(f"{detail}: {len(lines)} lines for step {step}, the eval file has {len(examples)} examples")
    worst, bad, ties, correct, correct_norm = 0.0, 0, 0, 0, 0
    for i, (line, (label, _, _), (rsums, rcounts)) in enumerate(zip(lines, examples, ref)):
        if line["example"] != i or line["label"] != label:
            die(f"{detail}: line {i} is example {line['example']} label {line['label']}, expected {i} label {label}")
        csums, ccounts = line["sum"], [int(c) for c in line["count"]]
        for k in range(4):
            err = abs(csums[k] - rsums[k])
            worst = max(worst, err / max(abs(rsums[k]), 1e-12))
            if err > REL_TOL * abs(rsums[k]) + ABS_TOL or ccounts[k] != rcounts[k]:
                bad += 1
                if bad <= 5:
                    print(f"example {i} ending {k}: train_gpt sum {csums[k]:.9g} over {ccounts[k]} tokens, "
                          f"reference {rsums[k]:.9g} over {rcounts[k]}")
        rp, rpn, rmeans = picks(rsums, rcounts)
        cp, cpn, _ = picks(csums, ccounts)
        for name, r, c, values in (("acc", rp, cp, rsums), ("acc_norm", rpn, cpn, rmeans)):
            if near_tie(values):
                ties += 1
            elif r != c:
                bad += 1
                print(f"example {i}: {name} pick: train_gpt {c}, reference {r}")
        correct += rp == label
        correct_norm += rpn == label
    n = len(examples)
    print(f"eval_reference: check {'planted ' if plant else ''}{detail} (T={T}): {n} examples, worst relative difference of a sum {worst:.2e}; "
          f"{ties} near-tie pick(s) skipped; reference acc {correct}/{n}, acc_norm {correct_norm}/{n}")
    if bad or ties > 2 * n // 10:
        print(f"eval_reference: {bad} difference(s), {ties} near-ties (at most {2 * n // 10})")
        return bad + (ties > 2 * n // 10)
    print("eval_reference: check passed")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("make-jsonl"); a.add_argument("out")
    a = sub.add_parser("tokens"); a.add_argument("jsonl"); a.add_argument("bin")
    a = sub.add_parser("make-model"); a.add_argument("out")
    a = sub.add_parser("check"); a.add_argument("model"); a.add_argument("bin")
    a.add_argument("details", nargs="+", help="DETAIL.jsonl@T or DETAIL.jsonl@T@STEP")
    a.add_argument("--plant", action="store_true",
                   help="then check the first file again with one sum changed: it must fail (test the tester)")
    args = ap.parse_args()
    if args.cmd == "make-jsonl":
        make_jsonl(args.out)
    elif args.cmd == "tokens":
        tokens(args.jsonl, args.bin)
    elif args.cmd == "make-model":
        make_model(args.out)
    else:
        specs = []
        for spec in args.details:
            parts = spec.split("@")
            if len(parts) not in (2, 3):
                die(f"{spec}: expected DETAIL.jsonl@T or DETAIL.jsonl@T@STEP")
            specs.append((parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 0))
        failures = sum(check(args.model, args.bin, *sp) != 0 for sp in specs)
        if failures:
            die(f"{failures} of {len(specs)} file(s) differ from the reference")
        if args.plant:
            if check(args.model, args.bin, *specs[0], plant=True) == 0:
                die("the planted difference was NOT caught: the checker is broken")
            print("eval_reference: the planted difference was caught (test the tester)")


if __name__ == "__main__":
    main()
