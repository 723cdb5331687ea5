#!/usr/bin/python3
"""plot_loss.py — draws training runs from their JSONL logs: one run, or several overlaid.

    /usr/bin/python3 scripts/plot_loss.py LOG.jsonl [LOG2.jsonl ...] OUT.png [--label NAME ...] [--title T] [--smooth N]
    e.g. scripts/plot_loss.py out/z0/log.jsonl out/z2/log.jsonl zero.png --label "--zero 0" --label "--zero 2"

LOG.jsonl is what `train_gpt --log-file` writes, one JSON object a line:
    {"step": 12, "loss": 5.1, "lr": 3e-4, "norm": 1.2, "ms": 50.1, "tokens_per_s": 8100, "mfu": 41.2}
                                                                     a training step ("mfu": the CUDA twin's)
    {"step": 20, "val_loss": 4.9}                                    a validation
    {"step": 20, "eval_acc_norm": 0.29, "eval_acc": 0.28, ...}       a multiple-choice eval (--eval-file)
Other keys, other objects and blank lines are ignored (older logs, without
tokens_per_s or the eval, draw what they have); a line that is not a JSON
object, or whose "step" or a drawn value is not a number, stops the script
with its line number. Bare nan/inf (as C's printf writes them) are read as
non-finite values: they are left out of the plot and counted in the legend.
When a step appears twice (a run resumed from a checkpoint appends to its
log), the later line wins.

Draws, against step: a panel of loss — the training loss as a thin line, its
mean over a window of N steps centred on each step as a thick line (default
N: 1/50 of the steps, at most 101; the window shrinks symmetrically at the
ends, so the line does not lag a falling loss), the validation loss as
markers — then one panel for each of these the logs hold: the eval's
accuracy (acc_norm and acc, in %), the learning rate, the gradient norm,
tokens/s and MFU. With several logs each run has its colour, named in every
panel's legend, so two runs that should match (--zero 0 against --zero 2,
CPU against GPU) lie on each other. Writes OUT.png (matplotlib, Agg backend,
no display needed). Exits 1 with a message when a log cannot be read or has
no step lines. Needs Debian's python3-matplotlib: apt-get install python3-matplotlib
"""
import argparse
import json
import math
import os
import re
import sys


def die(msg):
    print(f"plot_loss: error: {msg}", file=sys.stderr)
    sys.exit(1)


try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
except ImportError:
    die("matplotlib is missing: apt-get install python3-matplotlib (and run with /usr/bin/python3)")

# C's printf spells non-finite numbers nan, -nan, inf, -inf; JSON has none of
# them, Python's json reads NaN, Infinity, -Infinity.
BARE_NONFINITE = re.compile(r'(?<=[:\[,\s])\s*(-?)(nan|inf|infinity)(?=\s*[,}\]])', re.IGNORECASE)


def number(obj, key, lineno, path):
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        die(f"{path}:{lineno}: \"{key}\" is {json.dumps(v)}, not a number")
    return v


SERIES = ("loss", "val_loss", "eval_acc_norm", "eval_acc", "lr", "norm", "tokens_per_s", "mfu")


def read_log(path):
    """Returns ({key: {step: value}} for the keys of SERIES, lines read)."""
    series = {k: {} for k in SERIES}
    try:
        f = open(path, "rb")
    except OSError as e:
        die(f"cannot open {path}: {e.strerror}")
    with f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                die(f"{path}:{lineno}: not UTF-8 text")
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                fixed = BARE_NONFINITE.sub(lambda m: ("-Infinity" if m.group(1) else "Infinity")
                                           if m.group(2).lower().startswith("inf") else "NaN", line)
                try:
                    obj = json.loads(fixed)
                except json.JSONDecodeError as e:
                    die(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}): {line[:80]}")
            if not isinstance(obj, dict):
                die(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}: {line[:80]}")
            if "step" not in obj or not any(k in obj for k in SERIES):
                continue
            step = number(obj, "step", lineno, path)
            for k in SERIES:
                if k in obj:
                    series[k][step] = float(number(obj, k, lineno, path))
    return series


def centered_mean(values, window):
    """Mean over a window centred on each point; near either end the window
    shrinks symmetrically, so the curve neither lags nor leads the data (a
    trailing average sits above a falling loss)."""
    n, half = len(values), int(window) // 2
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    out = []
    for i in range(n):
        h = min(half, i, n - 1 - i)
        out.append((prefix[i + h + 1] - prefix[i - h]) / (2 * h + 1))
    return out


def finite_points(d):
    steps = sorted(d)
    pts = [(x, d[x]) for x in steps if math.isfinite(d[x])]
    return pts, len(steps) - len(pts)


def draw_loss(ax, run, color, name, smooth, many):
    train, val = run["loss"], run["val_loss"]
    if train:
        finite, bad = finite_points(train)
        if finite:
            xs, ys = zip(*finite)
            span = smooth if smooth > 0 else min(101, max(1, len(xs) // 50))
            label = f"{name}train (last {ys[-1]:.4f})"
            if bad:
                label += f", {bad} non-finite left out"
            few = len(xs) < 30     # a short log: show each point, or one point shows nothing
            ax.plot(xs, ys, ".-" if few else "-", lw=0.7, alpha=0.8 if few else 0.45, color=color, label=label)
            if len(xs) >= 5 and span >= 3:
                ax.plot(xs, centered_mean(ys, span), lw=2.0, color=color,
                        label=None if many else f"train, mean of {int(span) // 2 * 2 + 1} steps around each")
        else:
            ax.plot([], [], " ", label=f"{name}train: all {bad} losses non-finite")
    if val:
        finite, _ = finite_points(val)
        if finite:
            vsteps, vys = zip(*finite)
            best = min(range(len(vys)), key=vys.__getitem__)
            ax.plot(vsteps, vys, "o--" if many else "o", ms=6, lw=1.0, color=color if many else "tab:orange", zorder=3,
                    label=f"{name}val (last {vys[-1]:.4f}, best {vys[best]:.4f} at step {vsteps[best]})")


# the panels after the loss: (title, [(key, style, legend text, scale)])
PANELS = [
    ("multiple choice (--eval-file, HellaSwag), %", [("eval_acc_norm", "o-", "acc_norm", 100.0),
                                                     ("eval_acc", "s:", "acc", 100.0)]),
    ("learning rate", [("lr", "-", "", 1.0)]),
    ("gradient norm (before clipping)", [("norm", "-", "", 1.0)]),
    ("tokens/s (all ranks)", [("tokens_per_s", "-", "", 1.0)]),
    ("MFU, % of peak (GPU runs)", [("mfu", "-", "", 1.0)]),
]


def main():
    ap = argparse.ArgumentParser(
        description="Plot one or several train_gpt JSONL logs: loss and val loss, then whichever of eval "
                    "accuracy, learning rate, gradient norm, tokens/s and MFU the logs hold; several logs overlay.")
    ap.add_argument("files", nargs="+", metavar="LOG.jsonl ... OUT.png",
                    help="one or more JSONL logs written by train_gpt --log-file, then the PNG file to write")
    ap.add_argument("--label", action="append", default=[],
                    help="legend name of each log, in order (default: the log's folder/name)")
    ap.add_argument("--title", default=None, help="plot title (default: the log's file name)")
    ap.add_argument("--smooth", type=int, default=0,
                    help="window in steps of the smoothed train loss (a centred mean); 0 = automatic: "
                         "1/50 of the steps, at most 101; below 3 = no smoothed line [0]")
    args = ap.parse_args()
    if len(args.files) < 2:
        ap.error("give at least one log and the PNG to write")
    logs, out = args.files[:-1], args.files[-1]
    if not out.lower().endswith(".png"):
        die(f"the last argument is the picture to write, and should end in .png: {out}")
    if args.label and len(args.label) != len(logs):
        die(f"{len(args.label)} --label for {len(logs)} logs: give one per log, or none")
    runs = [read_log(p) for p in logs]
    for path, run in zip(logs, runs):
        if not run["loss"] and not run["val_loss"]:
            die(f"{path} has no step lines (objects with \"step\" and \"loss\" or \"val_loss\"): "
                "is it the file given to train_gpt --log-file?")
    many = len(runs) > 1
    names = args.label or [os.path.join(os.path.basename(os.path.dirname(p)), os.path.basename(p)) for p in logs]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = [pn for pn in PANELS if any(run[k] for run in runs for k, _, _, _ in pn[1])]

    n = 1 + len(panels)
    cols = 1 if n == 1 else 2
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(9 if cols == 1 else 14, 5.5 if n == 1 else 3.6 * rows + 0.6),
                             dpi=120, squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    ax = flat[0]
    for i, run in enumerate(runs):
        draw_loss(ax, run, colors[i % len(colors)] if many else "tab:blue", f"{names[i]}: " if many else "",
                  args.smooth, many)
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("loss")
    for a, (title, keys) in zip(flat[1:], panels):
        for i, run in enumerate(runs):
            for k, style, what, scale in keys:
                pts, _ = finite_points(run[k])
                if not pts:
                    continue
                xs, ys = zip(*pts)
                label = ", ".join(t for t in (names[i] if many else "", what) if t) or None
                last = f" (last {ys[-1] * scale:.4g})" if k.startswith("eval") else ""
                a.plot(xs, [y * scale for y in ys], style if len(xs) < 30 or k.startswith("eval") else "-",
                       ms=4, lw=1.0, color=colors[i % len(colors)], label=(label or "") + last or None)
        a.set_title(title)
        if keys[0][0] == "lr":
            a.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    for a in flat[:n]:
        a.grid(True, alpha=0.3)
        a.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))
        a.set_xlabel("step")
        if a.get_legend_handles_labels()[0]:
            a.legend(loc="best", fontsize=8)
    fig.suptitle(args.title if args.title is not None else " vs ".join(logs))
    fig.tight_layout()
    try:
        fig.savefig(out)
    except OSError as e:
        die(f"cannot write {out}: {e.strerror}")
    for path, run in zip(logs, runs):
        print(f"plot_loss: {out}: {path}: {len(run['loss'])} train steps, {len(run['val_loss'])} validations, "
              f"{len(run['eval_acc_norm'])} evals")


if __name__ == "__main__":
    main()
