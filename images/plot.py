"""Plots for the course's slides: axes with ticks, grid, labels and a legend, drawn with the
course's style (images/style.py). Python standard library only. Used by
slides/tools/plot_metrics.py and every other tool that draws a plot; add what a new plot needs
here rather than beside it."""
import argparse
import math
import os
import sys

from style import GRID, INK, MUTED, Svg


def nice_ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def fmt(v):
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.0e}"


def fmt_bytes(v):
    """8 -> "8 B", 65536 -> "64 KiB": the message sizes of a benchmark."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{v:g} {unit}"
        v /= 1024
    return f"{v:g}"


class Axes:
    """A plot area with linear axes (logx: a logarithmic x axis, with the given xticks), grid,
    labels and a legend. xfmt writes the x ticks' labels."""

    def __init__(self, title, xlabel, ylabel, xs, ys, width=900, height=480, xticks=None,
                 legend_at="top right", logx=False, xfmt=None):
        self.svg = Svg(width, height, title)
        self.l, self.r, self.t, self.b = 90, width - 30, 50, height - 70
        self.logx = logx
        self.xt = xticks or nice_ticks(min(xs), max(xs))
        xfmt = xfmt or fmt
        self.yt = nice_ticks(min(ys), max(ys))
        s = self.svg
        s.text(self.l, 30, title, size=19, anchor="start", weight="bold")
        for v in self.yt:
            y = self.y(v)
            s.line(self.l, y, self.r, y, stroke=GRID, sw=1)
            s.text(self.l - 10, y + 5, fmt(v), size=14, anchor="end", fill=MUTED)
        for v in self.xt:
            x = self.x(v)
            s.line(x, self.t, x, self.b, stroke=GRID, sw=1)
            s.text(x, self.b + 22, xfmt(v), size=14, fill=MUTED)
        s.line(self.l, self.b, self.r, self.b, stroke=INK, sw=1.5)
        s.line(self.l, self.t, self.l, self.b, stroke=INK, sw=1.5)
        s.text((self.l + self.r) / 2, height - 20, xlabel, size=16, fill=INK)
        s.text(24, (self.t + self.b) / 2, ylabel, size=16, fill=INK, rotate=-90)
        self.legend_x = self.r - 210 if "right" in legend_at else self.l + 30
        self.legend_y = self.t + 12 if "top" in legend_at else self.b - 60

    def x(self, v):
        f = math.log if self.logx else float
        return self.l + (f(v) - f(self.xt[0])) / (f(self.xt[-1]) - f(self.xt[0])) * (self.r - self.l)

    def y(self, v):
        return self.b - (v - self.yt[0]) / (self.yt[-1] - self.yt[0]) * (self.b - self.t)

    def legend(self, label, color, dash=None):
        x = self.legend_x
        self.svg.line(x, self.legend_y, x + 34, self.legend_y, stroke=color, sw=3, dash=dash)
        self.svg.text(x + 44, self.legend_y + 5, label, size=15, anchor="start")
        self.legend_y += 24


def write_outputs(outputs, out_dir, check, prog):
    """{file name: text} into out_dir, rewriting only what changed; with check, write nothing and
    fail (1, one line) when a file differs from its fresh rendering. Returns the exit status."""
    stale = []
    for name, text in outputs.items():
        path = os.path.join(out_dir, name)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old == text:
            continue
        if check:
            stale.append(name)
            continue
        os.makedirs(out_dir, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path}")
    if stale:
        sys.stderr.write(f"{prog}: {', '.join(stale)} in {out_dir} differ from what it draws "
                         "now (run it without --check to rewrite them)\n")
        return 1
    return 0


def tool_main(argv, prog, description, inputs, render, label_help=None):
    """The command line every plot tool has: --out DIR, --check, --label TEXT when label_help is
    given, then its inputs (inputs: add_argument's arguments for them, e.g. ("csv",) or
    ("runs", {"nargs": "+"})). render(args) reads the inputs and returns {file name: text}; a
    file it cannot read or make sense of (OSError, ValueError, KeyError) is one line on stderr
    and exit status 1. Returns the exit status."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--out", required=True, help="the folder the plots go into")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a file in --out differs from a fresh plot")
    if label_help:
        p.add_argument("--label", default="", help=label_help)
    name, options = (inputs[0], inputs[1] if len(inputs) > 1 else {})
    p.add_argument(name, **options)
    a = p.parse_args(argv[1:])
    try:
        outputs = render(a)
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write(f"{prog}: {e}\n")
        return 1
    return write_outputs(outputs, a.out, a.check, prog)
