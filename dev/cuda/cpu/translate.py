#!/usr/bin/env python3
"""translate.py — the one source change the CPU execution layer needs: CUDA's
launch syntax, which no host C++ compiler reads.

    python3 dev/cuda/cpu/translate.py IN.cu OUT.cu

rewrites, keeping every line where it was (so the compiler's messages point
at the original file, which a #line directive names):
    k<<<grid, block>>>(args);              ->  CPU_LAUNCH("k", (k), grid, block, 0, 0, args);
    k<T, 4><<<grid, block, smem, s>>>(a);  ->  CPU_LAUNCH("k<T, 4>", (k<T, 4>), grid, block, smem, s, a);
    extern __shared__ float buf[];         ->  CPU_EXTERN_SHARED(float, buf);
Everything else is left alone: the kernels compile as they are against
dev/cuda/cpu/include/cuda_runtime.h (CPU_LAUNCH, CPU_EXTERN_SHARED). Used by
the CPU layer's build (dev/cuda/cpu/cpu.mk; dev/cuda/cpu/README.md); it fails loudly on a
launch it cannot parse rather than passing it through.
"""
import re
import sys

EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:<>, ]*?)\s+(\w+)\s*\[\s*\]\s*;")


def fail(path, text, at, what):
    line = text.count("\n", 0, at) + 1
    sys.exit(f"translate.py: {path}:{line}: {what}")


def kernel_start(text, end):
    """Index where the kernel expression ending at `end` (just before <<<) starts:
    an identifier (with ::) and optional template arguments <...>."""
    i = end
    if i > 0 and text[i - 1] == ">":  # template arguments: match back to their '<'
        depth = 0
        while i > 0:
            i -= 1
            c = text[i]
            if c == ">":
                depth += 1
            elif c == "<":
                depth -= 1
                if depth == 0:
                    break
        if depth != 0:
            return None
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_:"):
        i -= 1
    return i


def split_top(s):
    """Split on commas outside (), [], {} and <...> is not tracked (launch configs use no templates)."""
    parts, depth, cur = [], 0, ""
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts]


def matching_paren(text, open_at):
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def translate(path, text):
    out, pos = [], 0
    while True:
        at = text.find("<<<", pos)
        if at < 0:
            break
        line_start = text.rfind("\n", 0, at) + 1
        if text[line_start:at].lstrip().startswith(("//", "*", "/*")):  # in a comment
            out.append(text[pos:at + 3])
            pos = at + 3
            continue
        close = text.find(">>>", at)
        if close < 0:
            fail(path, text, at, "<<< without >>>")
        start = kernel_start(text, at)
        if start is None or start == at:
            fail(path, text, at, "cannot find the kernel name before <<<")
        kernel = text[start:at]
        config = split_top(text[at + 3:close])
        if not 2 <= len(config) <= 4:
            fail(path, text, at, f"a launch takes 2 to 4 configuration values, found {len(config)}")
        config += ["0"] * (4 - len(config))
        paren = close + 3
        while paren < len(text) and text[paren] in " \t":
            paren += 1
        if paren >= len(text) or text[paren] != "(":
            fail(path, text, at, "expected the kernel's arguments in parentheses after >>>")
        end = matching_paren(text, paren)
        if end is None:
            fail(path, text, at, "unbalanced parentheses in the kernel's arguments")
        args = text[paren + 1:end]
        name = " ".join(kernel.split())
        newlines = text.count("\n", start, paren + 1)  # keep the line count: config spread over lines
        call = f'CPU_LAUNCH("{name}", ({kernel}), {", ".join(config)}' + (", " if args.strip() else "")
        out.append(text[pos:start])
        out.append(call + "\n" * newlines + args + ")")
        pos = end + 1
    out.append(text[pos:])
    result = "".join(out)
    result = EXTERN_SHARED.sub(lambda m: f"CPU_EXTERN_SHARED({m.group(1)}, {m.group(2)});", result)
    return result


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: translate.py IN.cu OUT.cu")
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    body = translate(src, text)
    with open(dst, "w") as f:
        f.write(f'#line 1 "{src}"\n' + body)


if __name__ == "__main__":
    main()
