#!/usr/bin/env python3
"""The DDP benchmark's printed output (tests/bench/run_bench.py, as kept in slides/results/bench/)
-> one plot for the results deck: step time of the kit's DDP and of PyTorch's, at each batch of
the run, relative to PyTorch's DDP step at that batch. Python standard library only.

  plot_bench.py --out DIR [--label TEXT] OUTPUT.txt          writes DIR/bench-ddp.svg
  plot_bench.py --check --out DIR [--label TEXT] OUTPUT.txt  exit 1 if it differs from a fresh plot

Each bar is a configuration's median step time (over the repeats); its dark part is the compute
floor of the same side (the same ranks computing without DDP), the light part what DDP adds. The
whisker is the range of the step time over the repeats. The number in the bar is the median step
over PyTorch DDP's median step (a ratio of medians: the driver's ratios, medians of per-repeat
ratios, can differ by a point or two). The dashed line is issue 14's goal, 0.95.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "images"))
from plot import Axes, tool_main  # noqa: E402
from style import COLORS, INK, LIGHT, MUTED  # noqa: E402

GOAL = 0.95
# (role, name in the table without the batch suffix, floor's name, legend)
BARS = [("overlap", "cpp 2x1 overlap", "cpp 2x1 floor (no DDP)", "C++ kit DDP, overlapped"),
        ("no_overlap", "cpp 2x1 no-overlap", "cpp 2x1 floor (no DDP)", "C++ kit DDP, after backward"),
        ("py_ddp", "py 2x1 DDP", "py 2x1 floor (no DDP)", "PyTorch DDP")]
ROW = re.compile(r"^(?P<label>\S.{0,29}?)\s+(?P<step>[\d.]+)\s+(?P<lo>[\d.]+) to (?P<hi>[\d.]+)\s")


def read(path):
    """{label: (median, lo, hi)} from the table, the batches in order of their sections, and the
    run's header line (what ran, where)."""
    rows, batches = {}, []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        m = ROW.match(line)
        if m:
            rows[m["label"].strip()] = (float(m["step"]), float(m["lo"]), float(m["hi"]))
        b = re.match(r"^batch (\d+) per rank: DDP overhead", line)
        if b:
            batches.append(int(b.group(1)))
    if not rows or not batches:
        raise ValueError(f"{path}: no benchmark table in it (run_bench.py's output expected)")
    return rows, batches


def name_at(rows, name, batch, first):
    """The table's label of `name` at `batch`: the first batch has no suffix, others " bN"."""
    label = name if first else f"{name} b{batch}"
    if label not in rows:
        raise ValueError(f"no row '{label}' in the table")
    return rows[label]


def plot(rows, batches, label):
    slots = len(BARS) + 1
    ax = Axes(f"Step time vs PyTorch DDP{' — ' + label if label else ''}",
              "sequences per rank (2 ranks x 1 thread, Gloo)", "x PyTorch DDP's step",
              [0, 1], [0, 1.6], width=960, height=500,
              xticks=[-0.5] + [i * slots + (len(BARS) - 1) / 2 for i in range(len(batches))] +
                     [len(batches) * slots - 1.5],
              xfmt=lambda v: next((f"batch {b}" for i, b in enumerate(batches)
                                   if abs(v - (i * slots + (len(BARS) - 1) / 2)) < 1e-9), ""),
              legend_at="top left")
    w = (ax.x(1) - ax.x(0)) * 0.7
    for i, batch in enumerate(batches):
        ref = name_at(rows, "py 2x1 DDP", batch, i == 0)[0]
        for k, (_, name, floor_name, _) in enumerate(BARS):
            step, lo, hi = (v / ref for v in name_at(rows, name, batch, i == 0))
            floor = min(name_at(rows, floor_name, batch, i == 0)[0] / ref, step)
            xc = ax.x(i * slots + k)
            x0 = xc - w / 2
            ax.svg.rect(x0, ax.y(step), w, ax.y(floor) - ax.y(step), fill=LIGHT[k], stroke="none", rx=0)
            ax.svg.rect(x0, ax.y(floor), w, ax.y(0) - ax.y(floor), fill=COLORS[k], stroke="none", rx=0)
            ax.svg.line(xc, ax.y(lo), xc, ax.y(hi), stroke=INK, sw=1.5)
            for v in (lo, hi):
                ax.svg.line(xc - 6, ax.y(v), xc + 6, ax.y(v), stroke=INK, sw=1.5)
            ax.svg.text(xc, ax.y(floor) + 20, f"{step:.2f}", size=15, fill="#ffffff", weight="bold")
    ax.svg.line(ax.l, ax.y(GOAL), ax.r, ax.y(GOAL), stroke=INK, sw=1.5, dash="6 4")
    ax.svg.text(ax.x(len(BARS)), ax.y(GOAL) - 8, f"goal {GOAL:g}", size=13, fill=INK)
    for k, (_, _, _, legend) in enumerate(BARS):
        ax.legend(legend, COLORS[k])
    ax.legend("light part: DDP's cost over its floor", LIGHT[0])
    return ax.svg.render()


def main(argv):
    def render(a):
        rows, batches = read(a.output)
        return {"bench-ddp.svg": plot(rows, batches, a.label)}
    return tool_main(argv, "plot_bench.py", "DDP benchmark output -> step time plot",
                     ("output", {"help": "run_bench.py's output, as kept in slides/results/bench/"}),
                     render, label_help="the machine, for the title")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
