#!/usr/bin/env python3
"""gpu_metrics.py — GPU kernel efficiency without a GPU: the CPU execution
layer's counts (CUDA_CPU_COUNT=1), the real compiler's resources (ptxas -v),
occupancy by the CUDA rules, and an ESTIMATE of each kernel's time and of a
step's on an H200. `make gpu-metrics` runs it (dev/cuda/cpu/cpu.mk).

    python3 dev/cuda/gpu_metrics.py --counts COUNTS.tsv --ptxas90 PTXAS90.txt [--ptxas80 PTXAS80.txt] \
        --run B,T,L,V,maxT --out .test/gpu_metrics.tsv

COUNTS.tsv: the layer's table (dev/cuda/cpu/counters.cpp) for one training
step of train_gpt_cu_cpu at the --run shape (C=768 NH=12 hs=64). Each
kernel's counts are scaled to GPT-2 124M at B=64 T=1024 (L=12, Vp=50304) by
what its work grows with (SCALE below); per-request ratios (sectors per
request, wavefronts per request) are the measured ones. What the estimate
models and what only a GPU proves: docs/gpu.md.
"""
import argparse
import math
import os
import re
import subprocess
import sys

C, NH = 768, 12
TARGET = dict(B=64, T=1024, L=12, Vp=50304, maxT=1024)

# H200 SXM (and H100 SXM: same SM): CUDA C++ Programming Guide, "Compute
# Capabilities", table "Technical Specifications per Compute Capability" (9.0)
# and the occupancy rules of the CUDA Occupancy Calculator.
H200 = dict(sms=132, clock_hz=1.755e9, regs_per_sm=65536, reg_unit=256, max_regs_thread=255, max_warps=64,
            max_blocks=32, smem_per_sm=233472, smem_reserved=1024, dram_bps=4.8e12)
A100 = dict(sms=108, clock_hz=1.41e9, regs_per_sm=65536, reg_unit=256, max_regs_thread=255, max_warps=64,
            max_blocks=32, smem_per_sm=167936, smem_reserved=1024, dram_bps=2.0e12)

# The estimate's rates (ESTIMATES, named here once): the DRAM bandwidth a
# streaming kernel reaches (about 80% of 4.8 TB/s), one shared-memory
# wavefront per clock per SM, 192 bytes of L1 per clock per SM (128, the datasheet's, times 1.5:
# fitted on the lab's two L1-bound readings, LayerNorm forward and classifier variant 1), mma.sync-class tensor work (WMMA: no wgmma) at
# 2/3 of the 989 TFLOP/s dense bf16 peak, cuBLASLt's GEMMs at 600 TFLOP/s
# (measured cuBLAS bf16 GEMMs at these shapes reach 550-700 on an H100/H200),
# the special-function unit's 16 results per clock per SM (exp, log, tanh,
# sqrt: the CUDA C++ Programming Guide's arithmetic-instruction throughput
# table, compute capability 9.0), and 2 us per kernel launch (launch and tail).
RATE = dict(dram=0.80 * 4.8e12, l1=132 * 1.755e9 * 192, smem_wavefronts=132 * 1.755e9, mma=0.66 * 989e12, gemm=600e12,
            sfu=132 * 1.755e9 * 16, launch_s=2e-6)
PEAK_BF16 = 989e12
# A round trip's loaded latency (counters.cpp: a warp's batches of loads in
# program order): 1.2 us from DRAM, 0.25 us from L1/L2. Fitted (the smallest
# worst error over a grid) on the lab's readings other than LayerNorm
# backward variant 4, which no latency explains; unloaded latencies on Hopper
# are about 0.3 us and 0.15 us (published microbenchmarks), queueing under
# load adds the rest.
LATENCY = dict(dram=1.2e-6, cache=0.25e-6)


def die(msg):
    print(f"gpu_metrics.py: {msg}", file=sys.stderr)
    sys.exit(1)


def params(Vp, maxT, L):
    return Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C


# What each kernel's work grows with, and how many launches a step makes of
# it: (size, per-layer launches share): size one of tokens (B*T), attn
# (B*NH*T^2), logits (B*T*Vp), params (P), one; `layer` True when its
# launches repeat per layer (counted at L=1, once-per-step launches
# included: their share is small), False when per step.
SCALE = {
    "adamw_kernel": ("params", False), "float_to_bf16_kernel": ("params", False),
    "norm_squares_partial_kernel": ("params", False), "norm_finish_kernel": ("one", False),
    "mean_kernel": ("one", False), "update_gate_kernel": ("one", False),
    "attention_forward_kernel": ("attn", True), "attention_forward_mma_kernel": ("attn", True),
    "attention_backward_dkv_kernel": ("attn", True), "attention_backward_dkv_mma_kernel": ("attn", True),
    "attention_backward_dq_mma_kernel": ("attn", True),
    "attention_backward_dq_kernel": ("attn", True), "attention_backward_d_kernel": ("tokens", True),
    "classifier_kernel": ("logits", False), "classifier_scalar_kernel": ("logits", False),
    "encoder_forward_kernel": ("tokens", False), "encoder_backward_wpe_kernel": ("tokens", False),
    "encoder_backward_wte_chunk_kernel": ("tokens", False), "encoder_backward_wte_finish_kernel": ("tokens", False),
    "layernorm_forward_kernel": ("tokens", True), "layernorm_backward_kernel": ("tokens", True),
    "layernorm_forward_scalar_kernel": ("tokens", True), "layernorm_backward_dx_kernel": ("tokens", True),
    "column_sums_finish_kernel": ("tokens", True), "column_sums_partial_vec_kernel": ("tokens", True),
    "column_sums_partial_kernel": ("tokens", True), "bias_add_kernel": ("tokens", True),
    "gelu_forward_kernel": ("tokens", True), "gelu_forward_vec8_kernel": ("tokens", True),
    "gelu_backward_kernel": ("tokens", True), "gelu_backward_vec8_kernel": ("tokens", True),
    "accumulate_kernel": ("tokens", True), "bf16_round_stochastic_kernel": ("params", False),
    "bf16_to_float_kernel": ("params", False), "encoder_backward_kernel": ("tokens", False),
}


# Template kernels whose instantiations differ in resources: the one the
# target (GPT-2 124M: hs 64, C 768) runs, by its template argument (the
# LayerNorms' K = layernorm_packs(768) = 3 packs of 8 channels a lane).
INSTANCE = {"attention_forward_mma_kernel": 64, "attention_backward_dkv_mma_kernel": 64,
            "attention_backward_dq_mma_kernel": 64, "layernorm_forward_kernel": 3, "layernorm_backward_kernel": 3}


def base_name(name):
    return re.sub(r"<.*", "", name.strip("()")).strip()


def read_counts(path):
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        die(f"{path}: cannot read the counts ({e.strerror}): run train_gpt_cu_cpu with CUDA_CPU_COUNT=1 CUDA_CPU_COUNT_FILE={path}")
    if not lines or not lines[0].startswith("kernel\t"):
        die(f"{path}, line 1: not the layer's counts table (no 'kernel' header): rerun with CUDA_CPU_COUNT=1")
    head = lines[0].split("\t")
    rows = {}
    for n, line in enumerate(lines[1:], 2):
        f = line.split("\t")
        if len(f) != len(head):
            die(f"{path}, line {n}: {len(f)} fields, the header has {len(head)}: the file is truncated or not the layer's")
        r = dict(zip(head[1:], map(int, f[1:])))
        b = base_name(f[0])
        if b in rows:  # template instantiations: one kernel
            for k in r:
                rows[b][k] = rows[b][k] + r[k] if k not in ("threads_per_block", "dynamic_smem") else max(rows[b][k], r[k])
        else:
            rows[b] = r
    return rows


def read_ptxas(path):
    """kernel base name -> dict(registers, spill_bytes, stack, smem), the most of its instantiations."""
    try:
        text = open(path).read()
    except OSError as e:
        die(f"{path}: cannot read ptxas -v output ({e.strerror}): rebuild it with make gpu-metrics")
    out, cur = {}, None
    mangled = re.findall(r"Compiling entry function '([^']+)'", text)
    if not mangled:
        die(f"{path}: no 'Compiling entry function' line: not the output of nvcc -Xptxas -v")
    try:
        dem = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True).stdout.split("\n")
    except OSError:
        dem = mangled
    names = dict(zip(mangled, dem))
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            d = re.sub(r"^void ", "", names.get(m.group(1), m.group(1)))  # templates demangle with their return type
            full = re.sub(r"\(.*", "", d).strip()
            cur = base_name(full.split("<")[0])
            out.setdefault(cur, dict(registers=0, spill_bytes=0, stack=0, smem=0))
            inst = full.replace(" ", "") if "<" in full else None  # an instantiation apart too: "k<64>"
            if inst:
                out.setdefault(inst, dict(registers=0, spill_bytes=0, stack=0, smem=0))
            continue
        if cur is None:
            continue
        for e in [out[cur]] + ([out[inst]] if inst else []):
            m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m:
                e["stack"] = max(e["stack"], int(m.group(1)))
                e["spill_bytes"] = max(e["spill_bytes"], int(m.group(2)) + int(m.group(3)))
            m = re.search(r"Used (\d+) registers", line)
            if m:
                e["registers"] = max(e["registers"], int(m.group(1)))
            m = re.search(r"(\d+) bytes smem", line)
            if m:
                e["smem"] = max(e["smem"], int(m.group(1)))
    return out


def occupancy(dev, regs, threads, smem):
    """blocks per SM by the occupancy rules: warps, registers (per warp, in units of 256), shared memory (+1 KB per block)."""
    warps = math.ceil(threads / 32)
    by_warps = dev["max_warps"] // warps
    per_warp = math.ceil(max(regs, 1) * 32 / dev["reg_unit"]) * dev["reg_unit"]
    by_regs = dev["regs_per_sm"] // (per_warp * warps)
    by_smem = dev["smem_per_sm"] // (smem + dev["smem_reserved"]) if smem else dev["max_blocks"]
    return max(0, min(dev["max_blocks"], by_warps, by_regs, by_smem)), warps


def estimate(k, bps, warps, blocks):
    """seconds and the bound, for counts already scaled to the target (blocks: per launch)."""
    if bps == 0:
        return float("inf"), "does not fit"
    sms = min(H200["sms"], max(blocks, 1))                  # SMs with work
    resident = min(bps, math.ceil(max(blocks, 1) / sms)) * warps  # warps in flight per such SM
    share = sms / H200["sms"]
    sectors = k["global_load_sectors"] + k["global_store_sectors"] + 4 * k["atomic_requests"]
    t_mem = k["distinct_sectors"] * 32 / RATE["dram"]  # each sector from DRAM once; re-reads hit L1/L2
    t_l1 = sectors * 32 / (RATE["l1"] * share)           # every request's sectors through L1
    t_smem = (k["shared_load_wavefronts"] + k["shared_store_wavefronts"]) / (RATE["smem_wavefronts"] * share)
    t_mma = k["tensor_flops"] / (RATE["mma"] * share)
    t_sfu = k.get("sfu_ops", 0) / (RATE["sfu"] * share)
    # Little's law: each warp waits for its round trips in turn, `resident` warps per SM overlap
    t_lat = (k["dram_round_trips"] * LATENCY["dram"] + k["cache_round_trips"] * LATENCY["cache"]) / (sms * resident)
    hide_sm = min(1.0, resident / 16)    # shared memory and mma latency want about 16 warps per SM
    parts = {"dram": t_mem, "l1": t_l1, "shared": t_smem / hide_sm, "tensor": t_mma / hide_sm, "sfu": t_sfu / hide_sm,
             "latency": t_lat}
    bound = max(parts, key=parts.get)
    t = parts[bound] + k["launches"] * RATE["launch_s"]
    if resident < 16:
        bound += f" ({resident} warps per SM)"
    return t, bound


# Production kernels that spill today, by ptxas -v (sm_90, -O3: 255 registers and
# 432 bytes of spill stores + loads). check-cuda fails on a spill of any other
# kernel, and on one of these that no longer spills (so the entry goes).
SPILL_KNOWN = {"layernorm_backward_kernel"}


def check_spills(paths):
    bad = 0
    for path in paths:
        res = {n: r for n, r in read_ptxas(path).items() if "<" not in n}  # (instantiations: in their kernel's maximum)
        for name, r in sorted(res.items()):
            if r["spill_bytes"] and name not in SPILL_KNOWN:
                print(f"{path}: kernel {name} spills {r['spill_bytes']} bytes ({r['registers']} registers): "
                      "reduce its live values or its unrolling, or give it __launch_bounds__ with fewer threads")
                bad += 1
        for name in sorted(SPILL_KNOWN):
            if name in res and not res[name]["spill_bytes"]:
                print(f"{path}: kernel {name} no longer spills: remove it from SPILL_KNOWN in dev/cuda/gpu_metrics.py")
                bad += 1
            elif name in res:
                print(f"{path}: kernel {name} spills {res[name]['spill_bytes']} bytes (known, SPILL_KNOWN)")
    print(f"spill check: {sum(len([n for n in read_ptxas(p) if '<' not in n]) for p in paths)} kernel builds, "
          f"{bad} problems")
    return 1 if bad else 0


# The lab's H200 readings (dev/cuda/RESULTS.md, 2026-11-30), counted again
# here with the kernels that ran then: the "production" kernels of that
# reading are today's lab variants 2 (LayerNorm forward, classifier: scalar,
# 2-byte loads) and 4 (LayerNorm backward: the dx kernel, then column sums).
# The classifier's lab timed each call with the device-to-device copy that
# restores its logits (N x Vp bf16 read and written), so that copy's DRAM
# time is added. Each: (kernels timed together, lab program, its argv, factor
# from the counted size to the read size, bytes of the timed copy, reading in
# seconds, label).
LAB_READINGS = [
    (["layernorm_forward_naive_kernel"], "layernorm", "1 1 256 768", 16384 / 256, 0, 0.346e-3,
     "LayerNorm forward variant 1, N=16384 C=768"),
    (["layernorm_forward_scalar_kernel"], "layernorm", "2 1 256 768", 16384 / 256, 0, 0.032e-3,
     "LayerNorm forward variant 2 (production then), N=16384 C=768"),
    (["layernorm_backward_dx_kernel", "column_sums_partial_kernel", "column_sums_finish_kernel"], "layernorm",
     "4 1 256 768", 16384 / 256, 0, 0.461e-3, "LayerNorm backward variant 4 (production then), N=16384 C=768"),
    (["classifier_naive_kernel"], "classifier", "1 64 50257 50304", 8192 / 64, 2 * 2 * 8192 * 50304, 16.6e-3,
     "classifier variant 1 + copy, N=8192 V=50257"),
    (["classifier_scalar_kernel"], "classifier", "2 8 50257 50304", 8192 / 8, 2 * 2 * 8192 * 50304, 2.24e-3,
     "classifier variant 2 (production then) + copy, N=8192 V=50257"),
]


def lab_check(build, outdir, ptxas):
    """Counts each reading's kernels with the lab program (build/<prog>, CUDA_CPU_COUNT=1), estimates them, prints
    the errors and the worst. ptxas: lab program -> its ptxas -v output."""
    print("ESTIMATES against the lab's H200 readings (dev/cuda/RESULTS.md, 2026-11-30), one call each:")
    worst = 0.0
    for names, prog, argv, f, copy_bytes, reading, label in LAB_READINGS:
        cpath = f"{outdir}/lab_{prog}_{argv.split()[0]}.tsv"
        env = dict(os.environ, CUDA_CPU_COUNT="1", CUDA_CPU_COUNT_FILE=cpath, DEV_CUDA_REPS="1")
        with open(cpath + ".log", "w") as log:
            rc = subprocess.run([f"{build}/{prog}"] + argv.split(), env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            die(f"{build}/{prog} {argv} failed (exit {rc}): see {cpath}.log")
        counts, res = read_counts(cpath), read_ptxas(ptxas[prog])
        calls = None
        t, bounds = copy_bytes / RATE["dram"], []
        for name in names:
            if name not in counts or name not in res:
                die(f"{cpath}: no kernel '{name}' counted by {build}/{prog} {argv}, or not in {ptxas[prog]}")
            c = counts[name]
            r = res.get(f"{name}<{INSTANCE[name]}>", res[name]) if name in INSTANCE else res[name]  # (C = 768)
            calls = calls or c["launches"]  # the first kernel launches once per call
            k = {x: c[x] * f / calls for x in c}
            k["launches"] = c["launches"] / calls
            bps, warps = occupancy(H200, r["registers"], c["threads_per_block"], r["smem"] + c["dynamic_smem"])
            tk, bound = estimate(k, bps, warps, c["blocks"] / c["launches"] * f)
            t += tk
            bounds.append(bound)
        err = 100 * (t - reading) / reading
        worst = max(worst, abs(err))
        print(f"  {label}: ESTIMATE {t * 1e3:.3f} ms ({', '.join(bounds)}), reading {reading * 1e3:.3f} ms, "
              f"error {err:+.0f}%")
    print(f"lab check: worst error {worst:.0f}% (aim: 25%)")
    return worst


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--lab-check":
        if len(sys.argv) != 6:
            die("--lab-check BUILD OUTDIR PTXAS_LAYERNORM PTXAS_CLASSIFIER: the lab programs' folder, where the counts go, "
                "and the labs' ptxas -v outputs")
        lab_check(sys.argv[2], sys.argv[3], {"layernorm": sys.argv[4], "classifier": sys.argv[5]})
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--check-spills":
        if len(sys.argv) < 3:
            die("--check-spills PTXAS.txt...: the outputs of nvcc -Xptxas -v to check")
        sys.exit(check_spills(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", required=True)
    ap.add_argument("--ptxas90", required=True)
    ap.add_argument("--ptxas80")
    ap.add_argument("--run", required=True, help="B,T,L,V,maxT of the counted run")
    ap.add_argument("--out", required=True)
    ap.add_argument("--classifier", metavar="COUNTS:ROWS",
                    help="the production classifier counted at GPT-2's vocabulary (V=50257, Vp=50304) by its lab "
                         "program over ROWS rows: used in place of the step's (its per-row merges do not grow with V)")
    a = ap.parse_args()
    try:
        B, T, L, V, maxT = map(int, a.run.split(","))
    except ValueError:
        die(f"--run {a.run}: want B,T,L,V,maxT (five integers), e.g. 1,256,1,1024,256")
    Vp = (V + 127) // 128 * 128
    counts, res90 = read_counts(a.counts), read_ptxas(a.ptxas90)
    res80 = read_ptxas(a.ptxas80) if a.ptxas80 else {}
    tg = TARGET
    size = {"tokens": tg["B"] * tg["T"] / (B * T), "attn": tg["B"] * tg["T"] ** 2 / (B * T * T),
            "logits": tg["B"] * tg["T"] * tg["Vp"] / (B * T * Vp),
            "params": params(tg["Vp"], tg["maxT"], tg["L"]) / params(Vp, maxT, L), "one": 1.0}
    cols = ["kernel", "launches", "shared_requests", "shared_wavefronts", "global_load_requests", "global_load_sectors",
            "global_store_requests", "global_store_sectors", "atomic_requests", "tensor_flops", "registers", "spill_bytes",
            "smem_bytes", "blocks_per_sm", "warps_per_sm", "blocks_per_sm_a100", "sectors_per_request",
            "wavefronts_per_request", "bank_conflict", "dram_round_trips", "cache_round_trips", "round_trips_per_warp", "sfu_ops",
            "bound", "est_us_h200"]
    rows, total = [], 0.0
    if a.classifier:
        path, nrows = a.classifier.rsplit(":", 1)
        lab = read_counts(path)
        if "classifier_kernel" not in lab:
            die(f"{path}: no classifier_kernel counted: run the classifier lab's variant 3 with CUDA_CPU_COUNT=1")
        c, n = lab["classifier_kernel"], lab["classifier_kernel"]["launches"]
        # one launch's counts over ROWS rows, as if from the counted step (B*T rows at Vp): the "logits" factor
        # then scales them to B*T*Vp at the target
        f = B * T / int(nrows) * Vp / 50304
        counts["classifier_kernel"] = {x: (c[x] if x in ("threads_per_block", "dynamic_smem") else
                                           1 if x == "launches" else c[x] / n * f) for x in c}
    for name in sorted(counts):
        if name not in SCALE:
            die(f"kernel '{name}' has no scaling rule: add it to SCALE in dev/cuda/gpu_metrics.py (what its work grows with)")
        if name not in res90:
            die(f"kernel '{name}' is not in {a.ptxas90}: the ptxas output is of another train_gpt.cu; rerun make gpu-metrics")
        kind, per_layer = SCALE[name]
        c = counts[name]
        f = size[kind] * (tg["L"] / L if per_layer else 1.0)
        lf = tg["L"] / L if per_layer else 1.0
        k = {x: c[x] * f for x in c if x not in ("launches", "blocks", "threads_per_block", "dynamic_smem")}
        k["launches"] = c["launches"] * lf
        inst = f"{name}<{INSTANCE[name]}>" if name in INSTANCE else name  # the instantiation the target runs
        r = res90.get(inst, res90[name])
        smem = r["smem"] + c["dynamic_smem"]
        bps, warps = occupancy(H200, r["registers"], c["threads_per_block"], smem)
        r80 = res80.get(inst, res80.get(name))
        bps80 = occupancy(A100, r80["registers"], c["threads_per_block"], smem)[0] if r80 else -1
        blocks_per_launch = c["blocks"] / c["launches"] * size[kind]
        t, bound = estimate(k, bps, warps, blocks_per_launch)
        total += t
        sh_req = c["shared_load_requests"] + c["shared_store_requests"]
        sh_wav = c["shared_load_wavefronts"] + c["shared_store_wavefronts"]
        g_req = c["global_load_requests"] + c["global_store_requests"]
        g_sec = c["global_load_sectors"] + c["global_store_sectors"]
        warps_run = c["blocks"] * math.ceil(c["threads_per_block"] / 32)
        rt_warp = (c["dram_round_trips"] + c["cache_round_trips"]) / warps_run if warps_run else 0
        rows.append([name, round(k["launches"]), round(k["shared_load_requests"] + k["shared_store_requests"]),
                     round(k["shared_load_wavefronts"] + k["shared_store_wavefronts"]), round(k["global_load_requests"]),
                     round(k["global_load_sectors"]), round(k["global_store_requests"]), round(k["global_store_sectors"]),
                     round(k["atomic_requests"]), round(k["tensor_flops"]), r["registers"], r["spill_bytes"], smem, bps,
                     bps * warps, bps80, f"{g_sec / g_req:.2f}" if g_req else "-",
                     f"{sh_wav / sh_req:.2f}" if sh_req else "-",
                     f"{sh_wav / c['shared_ideal_wavefronts']:.2f}" if c.get("shared_ideal_wavefronts") else "-",
                     round(k["dram_round_trips"]),
                     round(k["cache_round_trips"]), f"{rt_warp:.1f}", round(k["sfu_ops"]), bound, f"{t * 1e6:.1f}"])
    # cuBLASLt's GEMMs: not our kernels; FLOPs over the stated rate
    BT = tg["B"] * tg["T"]
    gemm_flops = 3 * (tg["L"] * 24 * BT * C * C + 2 * BT * C * tg["Vp"])  # forward, and backward's two per GEMM
    t_gemm = gemm_flops / RATE["gemm"]
    total += t_gemm
    rows.append(["cublaslt_gemms (estimated from FLOPs)", tg["L"] * 4 * 3 + 3, "-", "-", "-", "-", "-", "-", "-",
                 round(gemm_flops), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "tensor (cuBLASLt, 600 TFLOP/s)",
                 f"{t_gemm * 1e6:.1f}"])
    w = [max(len(str(r[i])) for r in rows + [cols]) for i in range(len(cols))]
    show = [0, 1, 3, 5, 7, 9, 10, 11, 12, 13, 14, 16, 17, 18, 21, 22, 23, 24]
    print("ESTIMATES for GPT-2 124M, B=64 T=1024, on an H200 (counts measured on the CPU layer at "
          f"B={B} T={T} L={L} Vp={Vp}, scaled; registers from ptxas sm_90):")
    print("  ".join(cols[i].ljust(w[i]) for i in show))
    for r in rows:
        print("  ".join(str(r[i]).ljust(w[i]) for i in show))
    spills = [r[0] for r in rows if isinstance(r[11], int) and r[11] > 0]
    if spills:
        print(f"spills: {', '.join(spills)}")
    flops = (6 * params(tg["Vp"], tg["maxT"], tg["L"]) + 6 * tg["L"] * C * tg["T"]) * BT
    step = f"step estimate: {total * 1e3:.0f} ms at B=64 T=1024 on H200 (MFU {100 * flops / total / PEAK_BF16:.1f}%)"
    print(step)
    with open(a.out, "w") as fo:  # the table, then the step's estimate as its last line
        fo.write("\t".join(cols) + "\n")
        for r in rows:
            fo.write("\t".join(map(str, r)) + "\n")
        fo.write(step + "\n")


if __name__ == "__main__":
    main()
