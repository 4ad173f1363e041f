#!/usr/bin/env python3
"""The tensor-parallel report's CSV (common/bench/tp_report.cpp --csv) -> two plots for the
tensor-parallelism deck. Python standard library only.

  plot_tp.py --out DIR [--label TEXT] CSV    writes DIR/tp-memory.svg (bytes held per rank by
                                             category, and the peak, for each mesh of the report;
                                             a dash marks the formulas' total) and DIR/tp-comm.svg
                                             (bytes sent per rank and step, by group: tp's
                                             all-reduces, cp's all-gathers and reduce-scatters,
                                             DDP's all-reduce over dp x cp; a dash marks the theory)
  plot_tp.py --check --out DIR [--label TEXT] CSV
                                             exit 1 if the files in DIR differ from a fresh plot
Rows of meshes that ran out of memory (--cap) are left out.
"""
import csv
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "images"))
from plot import Axes, tool_main  # noqa: E402
from style import COLORS, INK, MUTED  # noqa: E402

HELD = [("param_bytes", "parameters"), ("grad_bytes", "gradients"), ("optimizer_bytes", "AdamW state"),
        ("activations", "activations")]
SENT = [("sent_tp", "tp: all-reduces"), ("sent_cp", "cp: keys and values"), ("sent_dp", "dp x cp: DDP")]


def read(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if not r["out_of_memory"]]
    if not rows:
        raise ValueError(f"{path}: no rows that ran")
    for r in rows:
        for k, v in r.items():
            if k not in ("run", "out_of_memory"):
                r[k] = float(v)
    return rows


def ticks(rows):
    names = {i: r["run"] for i, r in enumerate(rows)}
    return {"xticks": [-0.5] + list(names) + [len(rows) - 0.5], "xfmt": lambda v: names.get(v, "")}


def bars(ax, rows, parts, scale, formula):
    w = (ax.x(1) - ax.x(0)) * 0.6
    for i, r in enumerate(rows):
        x0 = ax.x(i) - w / 2
        y = 0.0
        for c, (key, _) in enumerate(parts):
            h = r[key] / scale
            if h > 0:
                ax.svg.rect(x0, ax.y(y + h), w, ax.y(y) - ax.y(y + h), fill=COLORS[c], stroke="none", rx=0)
            y += h
        ax.svg.line(x0 - 4, ax.y(formula(r) / scale), x0 + w + 4, ax.y(formula(r) / scale), stroke=INK, sw=2)
        yield i, r, x0, w, y


def memory(rows, label):
    mb = 1e6
    top = max(r["peak"] for r in rows) / mb
    ax = Axes(f"Bytes held per rank{' — ' + label if label else ''}", "mesh", "MB per rank",
              [0, 1], [0, top * 1.35], width=960, height=500, **ticks(rows), legend_at="top right")
    for i, r, x0, w, y in bars(ax, rows, HELD, mb, lambda r: r["formula_state"] + r["formula_activations"]):
        ax.svg.line(x0, ax.y(r["peak"] / mb), x0 + w, ax.y(r["peak"] / mb), stroke=MUTED, sw=2, dash="5,4")
        ax.svg.text(x0 + w / 2, ax.y(r["peak"] / mb) - 6, f"peak {r['peak'] / mb:.0f}", size=12, fill=MUTED)
    for c, (_, name) in enumerate(HELD):
        ax.legend(name, COLORS[c])
    ax.legend("formula (total)", INK)
    ax.legend("peak in a step", MUTED, dash="5,4")
    return ax.svg.render()


def comm(rows, label):
    mb = 1e6
    top = max(max(r["theory_sent"], r["sent_tp"] + r["sent_cp"] + r["sent_dp"]) for r in rows) / mb
    ax = Axes(f"Bytes sent per rank and step{' — ' + label if label else ''}",
              "mesh (ring model of each collective)", "MB per step", [0, 1], [0, max(top, 1e-6) * 1.35],
              width=960, height=460, **ticks(rows), legend_at="top right")
    for i, r, x0, w, y in bars(ax, rows, SENT, mb, lambda r: r["theory_sent"]):
        ax.svg.text(x0 + w / 2, ax.y(y) - 6, f"{y:.1f}", size=12, fill=MUTED)
    for c, (_, name) in enumerate(SENT):
        ax.legend(name, COLORS[c])
    ax.legend("theory", INK)
    return ax.svg.render()


def main(argv):
    def render(a):
        rows = read(a.csv)
        return {"tp-memory.svg": memory(rows, a.label), "tp-comm.svg": comm(rows, a.label)}
    return tool_main(argv, "plot_tp.py", "tp_report CSV -> memory and communication plots",
                     ("csv",), render, label_help="the machine, for the titles")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
