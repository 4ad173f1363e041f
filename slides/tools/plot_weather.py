#!/usr/bin/env python3
"""Exercise 06's benchmark (tests/bench/bench_weather.py --csv, and the Chrome trace of its
--profile run) -> two pictures for deck 08. Python standard library only.

  plot_weather.py --out DIR [--label TEXT] TABLE.csv TRACE.json[.gz]
      writes DIR/weather-speedups.svg: samples/s after each TODO, one bar per row of the table
      (the median over the repeats; the whisker their range; the speed-up over the baseline in
      the bar); a row that cannot help on the device (TF32 on a CPU) is a note, not a bar;
      and DIR/weather-profile.svg: the profiled steps of the trace on a time line, every
      operation the training thread called directly (ATen's top level) as a box, coloured by
      the part of the step it belongs to: the forward's matmuls, the rest of the forward, the
      backward (autograd's evaluate_function), the optimizer's step (what follows the last
      backward operation); zero_grad and the batch's hand-over fall in "rest of the forward"; and DIR/weather-table.md, the table in Markdown for the deck
  plot_weather.py --check --out DIR [--label TEXT] TABLE.csv TRACE.json[.gz]
      exit 1 if the files in DIR differ from a fresh plot
  plot_weather.py trim TRACE.json OUT.json.gz
      the trace as kept in slides/results/bench/: its complete events ("X": operators and the
      ProfilerStep# marks) with their name, category, thread, start and duration, gzipped; still
      a Chrome trace (Perfetto opens it), a tenth of the size
"""
import csv
import gzip
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "images"))
from plot import Axes, nice_ticks, tool_main  # noqa: E402
from style import COLORS, INK, LIGHT, MUTED, Svg  # noqa: E402

# The parts of a step in the time line: (name, colour).
PARTS = [("forward: matmuls", COLORS[0]), ("rest of the forward", LIGHT[0]),
         ("backward", COLORS[1]), ("optimizer step", COLORS[2])]
MATMULS = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm",
           "aten::conv2d", "aten::convolution", "aten::_convolution",
           "aten::scaled_dot_product_attention")


def read_table(path):
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        lines = [l for l in f if not l.startswith("#")]
    for r in csv.DictReader(lines):
        rows.append({"label": r["configuration"], "note": r["note"],
                     **{k: float(r[k]) if r[k] else None
                        for k in ("samples_s", "low", "high", "speedup", "step_ms", "peak_mib",
                                  "u10_rmse")}})
    if not rows or rows[0]["samples_s"] is None:
        raise ValueError(f"{path}: no table of bench_weather.py in it")
    return rows


def speedups(rows, label):
    top = max(r["high"] for r in rows if r["high"] is not None)
    n = len(rows)
    names = {i: r["label"].replace("baseline (the exercise as shipped)", "baseline")
             .replace("+ ", "+").split(":")[0] for i, r in enumerate(rows)}
    ax = Axes(f"Exercise 06: samples/s after each TODO{' — ' + label if label else ''}",
              "each bar adds one optimisation to the bar on its left", "samples/s",
              [0, 1], [0, top * 1.15], width=960, height=480,
              xticks=[-0.6] + list(range(n)) + [n - 0.4], xfmt=lambda v: names.get(v, ""))
    w = (ax.x(1) - ax.x(0)) * 0.6
    for i, r in enumerate(rows):
        xc = ax.x(i)
        if r["samples_s"] is None:
            ax.svg.text(xc, ax.y(top * 0.08), "GPU only", size=14, fill=MUTED)
            continue
        colour = COLORS[1] if i == 0 else COLORS[0]
        ax.svg.rect(xc - w / 2, ax.y(r["samples_s"]), w, ax.y(0) - ax.y(r["samples_s"]),
                    fill=colour, stroke="none", rx=0)
        ax.svg.line(xc, ax.y(r["low"]), xc, ax.y(r["high"]), stroke=INK, sw=1.5)
        for v in (r["low"], r["high"]):
            ax.svg.line(xc - 6, ax.y(v), xc + 6, ax.y(v), stroke=INK, sw=1.5)
        ax.svg.text(xc, ax.y(r["high"]) - 8, f"{r['samples_s']:.1f}", size=14, fill=INK)
        if ax.y(0) - ax.y(r["samples_s"]) > 30:
            ax.svg.text(xc, ax.y(0) - 12, f"{r['speedup']:.2f}x", size=14, fill="#ffffff",
                        weight="bold")
        if ax.y(0) - ax.y(r["samples_s"]) > 60:
            ax.svg.text(xc, ax.y(0) - 34, f"RMSE {r['u10_rmse']:.3f}", size=12, fill="#ffffff")
    return ax.svg.render()


def table_md(rows, label):
    out = [f"Exercise 06 on {label}" if label else "Exercise 06", "",
           "| configuration | samples/s (range) | step ms | peak MiB | u10 RMSE | speed-up |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["samples_s"] is None:
            out.append(f"| {r['label']} | {r['note']} | | | | |")
        else:
            out.append(f"| {r['label']} | {r['samples_s']:.1f} ({r['low']:.1f}-{r['high']:.1f}) | "
                       f"{r['step_ms']:.0f} | {r['peak_mib']:.0f} | {r['u10_rmse']:.3f} | "
                       f"{r['speedup']:.2f}x |")
    return "\n".join(out) + "\n"


def read_trace(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    steps = sorted((e for e in events if e.get("ph") == "X" and
                    str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    if not steps:
        raise ValueError(f"{path}: no ProfilerStep# in it (a trace of kit::StepProfiler expected)")
    tid = steps[0]["tid"]
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and
                  e.get("tid") == tid), key=lambda e: (e["ts"], -e["dur"]))
    return steps, ops


def top_level(step, ops):
    """The operations the step's thread called itself: inside the step, inside no other one."""
    out, end = [], step["ts"]
    for e in ops:
        if e["ts"] < step["ts"] or e["ts"] + e["dur"] > step["ts"] + step["dur"] + 1e-3:
            continue
        if e["ts"] >= end - 1e-3:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def part(e, after_backward):
    name = e["name"]
    if name.startswith("autograd::engine::evaluate_function"):
        return 2
    if after_backward:
        return 3
    return 0 if name in MATMULS else 1


def profile(steps, ops, label):
    """A time line (not Axes: no y axis): the steps' lane, their marks, a time axis, a legend."""
    t0 = steps[0]["ts"]
    span = (steps[-1]["ts"] + steps[-1]["dur"] - t0) / 1e3
    svg = Svg(960, 300, "profile")
    left, right, top, lane_h = 40, 930, 70, 110
    ticks = nice_ticks(0, span)
    x = lambda ms: left + ms / ticks[-1] * (right - left)  # noqa: E731
    svg.text(left, 30, f"Profile of {len(steps)} training steps{' — ' + label if label else ''}",
             size=19, anchor="start", weight="bold")
    totals = [0.0] * len(PARTS)
    for s in steps:
        x0, x1 = x((s["ts"] - t0) / 1e3), x((s["ts"] + s["dur"] - t0) / 1e3)
        svg.line(x0, top - 14, x0, top + lane_h + 8, stroke=INK, sw=1.5, dash="4 3")
        svg.text((x0 + x1) / 2, top - 4, s["name"].replace("ProfilerStep#", "step "), size=13,
                 fill=MUTED)
        level = top_level(s, ops)
        last_bwd = max((i for i, e in enumerate(level)
                        if e["name"].startswith("autograd::engine::evaluate_function")), default=-1)
        for i, e in enumerate(level):
            k = part(e, last_bwd >= 0 and i > last_bwd)
            totals[k] += e["dur"]
            ex0 = x((e["ts"] - t0) / 1e3)
            ew = max(x((e["ts"] + e["dur"] - t0) / 1e3) - ex0, 0.6)
            svg.rect(ex0, top + 4, ew, lane_h, fill=PARTS[k][1], stroke="none", rx=0)
    axis = top + lane_h + 14
    svg.line(left, axis, right, axis, stroke=INK, sw=1.5)
    for v in ticks:
        svg.line(x(v), axis, x(v), axis + 6, stroke=INK, sw=1.5)
        svg.text(x(v), axis + 24, f"{v:g}", size=14, fill=MUTED)
    svg.text((left + right) / 2, axis + 48, "ms from the first profiled step's start", size=15)
    whole = sum(s["dur"] for s in steps)
    lx, ly = left, axis + 78
    for k, (name, colour) in enumerate(PARTS):
        if totals[k] > 0:
            svg.rect(lx, ly - 12, 18, 14, fill=colour, stroke="none", rx=0)
            svg.text(lx + 26, ly, f"{name} {100 * totals[k] / whole:.0f} %", size=14,
                     anchor="start")
            lx += 225
    return svg.render()


def trim(src, dst):
    with open(src, encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    keep = [{k: e[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur") if k in e}
            for e in events if e.get("ph") == "X"]
    with gzip.open(dst, "wt", encoding="utf-8") as f:
        json.dump({"traceEvents": keep}, f, separators=(",", ":"))
    return 0


def main(argv):
    if len(argv) > 1 and argv[1] == "trim":
        if len(argv) != 4:
            sys.stderr.write("usage: plot_weather.py trim TRACE.json OUT.json.gz\n")
            return 2
        return trim(argv[2], argv[3])

    def render(a):
        table, trace = a.inputs
        steps, ops = read_trace(trace)
        rows = read_table(table)
        return {"weather-speedups.svg": speedups(rows, a.label),
                "weather-table.md": table_md(rows, a.label),
                "weather-profile.svg": profile(steps, ops, a.label)}
    return tool_main(argv, "plot_weather.py", "exercise 06's table and trace -> two plots",
                     ("inputs", {"nargs": 2, "metavar": "TABLE.csv TRACE.json"}), render,
                     label_help="the machine, for the titles")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
