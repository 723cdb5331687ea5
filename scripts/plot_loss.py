#!/usr/bin/python3
"""plot_loss.py — draws a training run's loss curves from its JSONL log.

    /usr/bin/python3 scripts/plot_loss.py LOG.jsonl OUT.png [--title T] [--smooth N]

LOG.jsonl is what `train_gpt --log-file` writes, one JSON object a line:
    {"step": 12, "loss": 5.1, "lr": 3e-4, "norm": 1.2, "ms": 50.1}   a training step
    {"step": 20, "val_loss": 4.9}                                    a validation
Other keys, other objects and blank lines are ignored; a line that is not a
JSON object, or whose "step", "loss" or "val_loss" is not a number, stops the
script with its line number. Bare nan/inf (as C's printf writes them) are read
as non-finite values: they are left out of the plot and counted in the legend.
When a step appears twice (a run resumed from a checkpoint appends to its
log), the later line wins.

Draws on one axes, against step: the training loss as a thin line, its mean
over a window of N steps centred on each step as a thick line (default N: 1/50
of the steps, at most 101; the window shrinks symmetrically at the ends, so
the line does not lag a falling loss), and the validation loss as markers. Writes OUT.png (matplotlib, Agg backend,
no display needed). Exits 1 with a message when the log cannot be read or has
no step lines. Needs Debian's python3-matplotlib: apt-get install python3-matplotlib
"""
import argparse
import json
import math
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


def read_log(path):
    """Returns ({step: loss}, {step: val_loss}, lines read)."""
    train, val = {}, {}
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
            if "step" not in obj or ("loss" not in obj and "val_loss" not in obj):
                continue
            step = number(obj, "step", lineno, path)
            if "loss" in obj:
                train[step] = float(number(obj, "loss", lineno, path))
            if "val_loss" in obj:
                val[step] = float(number(obj, "val_loss", lineno, path))
    return train, val


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


def main():
    ap = argparse.ArgumentParser(description="Plot train and validation loss from a train_gpt JSONL log.")
    ap.add_argument("log", help="JSONL log written by train_gpt --log-file")
    ap.add_argument("out", help="PNG file to write")
    ap.add_argument("--title", default=None, help="plot title (default: the log's file name)")
    ap.add_argument("--smooth", type=int, default=0,
                    help="window in steps of the smoothed train loss (a centred mean); 0 = automatic: "
                         "1/50 of the steps, at most 101; below 3 = no smoothed line [0]")
    args = ap.parse_args()

    train, val = read_log(args.log)
    if not train and not val:
        die(f"{args.log} has no step lines (objects with \"step\" and \"loss\" or \"val_loss\"): "
            "is it the file given to train_gpt --log-file?")

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    ax.grid(True, alpha=0.3)

    if train:
        steps = sorted(train)
        finite = [(s, train[s]) for s in steps if math.isfinite(train[s])]
        bad = len(steps) - len(finite)
        if finite:
            xs, ys = zip(*finite)
            span = args.smooth if args.smooth > 0 else min(101, max(1, len(xs) // 50))
            label = f"train (last {ys[-1]:.4f})"
            if bad:
                label += f", {bad} non-finite left out"
            few = len(xs) < 30     # a short log: show each point, or one point shows nothing
            ax.plot(xs, ys, ".-" if few else "-", lw=0.7, alpha=0.8 if few else 0.45,
                    color="tab:blue", label=label)
            if len(xs) >= 5 and span >= 3:
                sm = centered_mean(ys, span)
                ax.plot(xs, sm, lw=2.0, color="tab:blue",
                        label=f"train, mean of {int(span) // 2 * 2 + 1} steps around each")
        else:
            ax.plot([], [], " ", label=f"train: all {bad} losses non-finite")

    if val:
        vsteps = [s for s in sorted(val) if math.isfinite(val[s])]
        if vsteps:
            vys = [val[s] for s in vsteps]
            best = min(range(len(vys)), key=vys.__getitem__)
            ax.plot(vsteps, vys, "o", ms=6, color="tab:orange", zorder=3,
                    label=f"val (last {vys[-1]:.4f}, best {vys[best]:.4f} at step {vsteps[best]})")

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 2.5, 5, 10]))
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, nats per token)")
    ax.set_title(args.title if args.title is not None else args.log)
    ax.legend(loc="upper right")
    fig.tight_layout()
    try:
        fig.savefig(args.out)
    except OSError as e:
        die(f"cannot write {args.out}: {e.strerror}")
    n_train, n_val = len(train), len(val)
    print(f"plot_loss: {args.out}: {n_train} train steps, {n_val} validations")


if __name__ == "__main__":
    main()
