#!/usr/bin/env python3
"""The ZeRO report's CSV (common/bench/zero_report.cpp --csv) -> two plots for the beyond-DDP
deck. Python standard library only.

  plot_zero.py --out DIR [--label TEXT] CSV    writes DIR/zero-memory.svg (bytes held per rank,
                                               by category, DDP and ZeRO-1/2/3 on 1, 2, 4 ranks;
                                               a dash marks the formula's total) and
                                               DIR/zero-comm.svg (bytes sent per step, relative
                                               to DDP's, measured and in theory)
  plot_zero.py --check --out DIR [--label TEXT] CSV
                                               exit 1 if the files in DIR differ from a fresh plot
"""
import csv
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "images"))
from plot import Axes, tool_main  # noqa: E402
from style import COLORS, INK, MUTED  # noqa: E402

STAGES = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
PARTS = [("params", "parameters"), ("grads", "gradients"), ("optimizer", "AdamW state"),
         ("gathered_peak", "one gathered unit")]


def read(path):
    with open(path, newline="") as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def stage_ticks(group):
    """The x axis: `group` slots per stage (its bars and a gap); a tick at each stage's middle,
    labelled with the stage, and unlabelled ticks at both ends to span every slot."""
    last = len(STAGES) * group - 1
    middles = {group * i + (group - 1) / 2 - 0.5: name for i, name in enumerate(STAGES)}
    return {"xticks": [0] + sorted(middles) + [last], "xfmt": lambda v: middles.get(v, "")}


def memory(rows, label):
    ranks = sorted({int(r["ranks"]) for r in rows})
    mb = 1e6
    top = max(sum(r[k] for k, _ in PARTS) for r in rows) / mb
    group = len(ranks) + 1
    ax = Axes(f"Bytes held per rank{' — ' + label if label else ''}", "stage (bars: 1, 2, 4 ranks)",
              "MB per rank", [0, 1], [0, top * 1.45], width=960, height=500,
              **stage_ticks(group), legend_at="top right")
    w = (ax.x(1) - ax.x(0)) * 0.8
    for r in rows:
        i = STAGES.index(STAGES[int(r["stage"])]) * (len(ranks) + 1) + ranks.index(int(r["ranks"]))
        x0 = ax.x(i + 0.1)
        y = 0.0
        for c, (key, _) in enumerate(PARTS):
            h = r[key] / mb
            if h > 0:
                ax.svg.rect(x0, ax.y(y + h), w, ax.y(y) - ax.y(y + h), fill=COLORS[c], stroke="none", rx=0)
            y += h
        formula = (r["formula_params"] + r["formula_grads"] + r["formula_optimizer"] + r["gathered_peak"]) / mb
        ax.svg.line(x0 - 3, ax.y(formula), x0 + w + 3, ax.y(formula), stroke=INK, sw=2)
        ax.svg.text(x0 + w / 2, ax.y(y) - 6, f"N={int(r['ranks'])}", size=11, fill=MUTED)
    for c, (_, name) in enumerate(PARTS):
        ax.legend(name, COLORS[c])
    ax.legend("formula (total)", INK)
    return ax.svg.render()


def comm(rows, label):
    ranks = sorted({int(r["ranks"]) for r in rows if r["ranks"] > 1})
    ddp = {int(r["ranks"]): r["sent"] for r in rows if int(r["stage"]) == 0}
    pts = [(int(r["stage"]), int(r["ranks"]), r["sent"] / ddp[int(r["ranks"])],
            r["theory_sent"] / ddp[int(r["ranks"])]) for r in rows if r["ranks"] > 1]
    group = len(ranks) + 1
    ax = Axes(f"Bytes sent per step vs DDP{' — ' + label if label else ''}",
              "stage (bars: 2, 4 ranks; ring model of each collective)", "x DDP's bytes",
              [0, 1], [0, 2], width=960, height=460, **stage_ticks(group))
    w = (ax.x(1) - ax.x(0)) * 0.8
    for stage, n, measured, theory in pts:
        x0 = ax.x(stage * group + ranks.index(n) + 0.1)
        ax.svg.rect(x0, ax.y(measured), w, ax.y(0) - ax.y(measured), fill=COLORS[ranks.index(n)],
                    stroke="none", rx=0)
        ax.svg.line(x0 - 3, ax.y(theory), x0 + w + 3, ax.y(theory), stroke=INK, sw=2)
        ax.svg.text(x0 + w / 2, ax.y(measured) - 6, f"{measured:.2f}", size=12, fill=MUTED)
    for i, n in enumerate(ranks):
        ax.legend(f"{n} ranks, measured", COLORS[i])
    ax.legend("theory", INK)
    return ax.svg.render()


def main(argv):
    def render(a):
        rows = read(a.csv)
        return {"zero-memory.svg": memory(rows, a.label), "zero-comm.svg": comm(rows, a.label)}
    return tool_main(argv, "plot_zero.py", "zero_report CSV -> memory and communication plots",
                     ("csv",), render, label_help="the machine, for the titles")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
