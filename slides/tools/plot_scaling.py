#!/usr/bin/env python3
"""The scaling study's CSV (exercise 02's --summary-csv rows) -> plots of throughput, speed-up,
efficiency and time to a target accuracy against the number of ranks (GPUs), each beside the
ideal. Python standard library only.

  plot_scaling.py --out DIR [--label TEXT] CSV [CSV ...]
  plot_scaling.py --check --out DIR [--label TEXT] CSV ...   exit 1 if the files in DIR differ
                                                             from a fresh plot

The CSV (one row per run, written by rank 0 of ex02-solution --summary-csv; the study scripts
sbatch/02-resnet-cifar10-ddp/scaling.sbatch and common/tools/scaling_study.py collect them):
    label,world_size,nodes,batch_per_rank,global_batch,accum_steps,workers,steps,step_time_s,
    images_per_s,images_per_s_per_rank,test_loss,test_acc,time_to_target_s,device
A run's label is "<series>-<ranks>", e.g. strong-4: the rows of one series (strong scaling: the
same global batch for every rank count; weak scaling: the same batch per rank) make one curve.

Writes into DIR:
  scaling-throughput.svg   images per second (all ranks) against ranks; ideal: linear from the
                           smallest run of each series
  scaling-speedup.svg      throughput relative to the smallest run; ideal: the ratio of ranks
  scaling-efficiency.svg   speed-up / ideal speed-up, in percent; ideal: 100 %
  scaling-time-to-target.svg   seconds until the test accuracy first reached --target-acc (runs
                           that never reached it are left out); ideal: the smallest run's time
                           divided by the ratio of ranks
  scaling-summary.md       the numbers behind the plots, as a Markdown table

Speed-up is measured with throughput, not with the time of an epoch, so that it means the same
thing for both series: for strong scaling (fixed global batch) the time per epoch falls by the
same factor; for weak scaling (fixed batch per rank) it is Gustafson's scaled speed-up, the work
per second of N ranks against one.
"""
import csv
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "images"))
from plot import Axes, tool_main  # noqa: E402
from style import COLORS, INK, MUTED  # noqa: E402

FIELDS = ["label", "world_size", "nodes", "batch_per_rank", "global_batch", "accum_steps",
          "workers", "steps", "step_time_s", "images_per_s", "images_per_s_per_rank", "test_loss",
          "test_acc", "time_to_target_s", "device"]


class Run:
    def __init__(self, row, where):
        try:
            self.label = row["label"]
            self.series = self.label.rsplit("-", 1)[0] if "-" in self.label else self.label
            self.ranks = int(row["world_size"])
            self.nodes = int(row["nodes"])
            self.batch = int(row["batch_per_rank"])
            self.global_batch = int(row["global_batch"])
            self.step_s = float(row["step_time_s"])
            self.ips = float(row["images_per_s"])
            self.acc = float(row["test_acc"])
            self.ttt = float(row["time_to_target_s"]) if row["time_to_target_s"] else None
            self.device = row["device"]
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        if self.ranks < 1 or self.ips <= 0 or not math.isfinite(self.ips):
            raise ValueError(f"{where}: world_size {self.ranks} and images_per_s {self.ips} must be > 0")


def read(paths):
    runs = []
    for path in paths:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != FIELDS:
                raise ValueError(f"{path}: header is {reader.fieldnames}, expected {','.join(FIELDS)}")
            runs += [Run(row, f"{path} line {k + 2}") for k, row in enumerate(reader)]
    if not runs:
        raise ValueError(f"{', '.join(paths)}: no runs")
    series = {}
    for r in runs:
        series.setdefault(r.series, []).append(r)
    for name, rs in series.items():
        rs.sort(key=lambda r: r.ranks)
        if len({r.ranks for r in rs}) != len(rs):
            raise ValueError(f"series '{name}' has two runs with the same number of ranks")
    return series


def speedup(rs, r):
    return r.ips / rs[0].ips


def ideal_speedup(rs, r):
    return r.ranks / rs[0].ranks


def plot(series, title, ylabel, value, ideal, legend_at, label):
    """One curve per series (measured, solid with marks) and its ideal (dashed, same colour)."""
    ranks = sorted({r.ranks for rs in series.values() for r in rs})
    points = {name: [(r.ranks, value(rs, r)) for r in rs if value(rs, r) is not None]
              for name, rs in series.items()}
    ideals = {name: [(r.ranks, ideal(rs, r)) for r in rs if ideal(rs, r) is not None]
              for name, rs in series.items()}
    ys = [0.0] + [v for p in list(points.values()) + list(ideals.values()) for _, v in p]
    ax = Axes(title + (f": {label}" if label else ""), "ranks (GPUs)", ylabel, ranks, ys,
              xticks=ranks, logx=len(ranks) > 1, legend_at=legend_at,
              xfmt=lambda v: str(int(v)))
    for k, name in enumerate(sorted(series)):
        c = COLORS[k % len(COLORS)]
        if len(ideals[name]) > 1:
            ax.svg.polyline([(ax.x(n), ax.y(v)) for n, v in ideals[name]], stroke=c, sw=2, dash="7 5")
        if points[name]:
            ax.svg.polyline([(ax.x(n), ax.y(v)) for n, v in points[name]], stroke=c, sw=3)
            for n, v in points[name]:
                ax.svg.circle(ax.x(n), ax.y(v), 6, fill=c, stroke=INK, sw=1.5)
                ax.svg.text(ax.x(n), ax.y(v) - 12, f"{v:.3g}", size=13, fill=INK)
        ax.legend(f"{name} scaling" if name in ("strong", "weak") else name, c)
    ax.legend("ideal", MUTED, dash="7 5")
    return ax.svg.render()


def summary(series, label):
    devices = sorted({r.device for rs in series.values() for r in rs})
    lines = [f"Scaling study{f' ({label})' if label else ''}; device: {', '.join(devices)}.", "",
             "| series | ranks | nodes | batch/rank | global batch | step (ms) | images/s | "
             "speed-up | efficiency | test acc | to target (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in sorted(series):
        rs = series[name]
        for r in rs:
            s = speedup(rs, r)
            ttt = f"{r.ttt:.1f}" if r.ttt is not None else "not reached"
            lines.append(f"| {name} | {r.ranks} | {r.nodes} | {r.batch} | {r.global_batch} | "
                         f"{1000 * r.step_s:.1f} | {r.ips:.0f} | {s:.2f}× | "
                         f"{100 * s / ideal_speedup(rs, r):.0f} % | {r.acc:.3f} | {ttt} |")
    return "\n".join(lines) + "\n"


def render_all(series, label):
    def ttt_ideal(rs, r):
        # Strong scaling only: the same images per step, so N times the throughput reaches the
        # same accuracy N times sooner. Weak scaling changes the global batch and with it the
        # number of steps to the target, so it has no simple ideal.
        base = rs[0].ttt
        if base is None or len({x.global_batch for x in rs}) != 1:
            return None
        return base / ideal_speedup(rs, r)
    return {
        "scaling-throughput.svg": plot(series, "Throughput", "images per second (all ranks)",
                                       lambda rs, r: r.ips,
                                       lambda rs, r: rs[0].ips * ideal_speedup(rs, r),
                                       "top left", label),
        "scaling-speedup.svg": plot(series, "Speed-up", "speed-up over the smallest run",
                                    speedup, ideal_speedup, "top left", label),
        "scaling-efficiency.svg": plot(series, "Scaling efficiency", "efficiency (%)",
                                       lambda rs, r: 100 * speedup(rs, r) / ideal_speedup(rs, r),
                                       lambda rs, r: 100.0, "bottom left", label),
        "scaling-time-to-target.svg": plot(series, "Time to the target accuracy", "seconds",
                                           lambda rs, r: r.ttt, ttt_ideal, "top right", label),
        "scaling-summary.md": summary(series, label),
    }


def main(argv):
    return tool_main(argv, "plot_scaling.py", "scaling-study CSV -> SVG plots", ("csv", {"nargs": "+"}),
                     lambda a: render_all(read(a.csv), a.label),
                     label_help="the machine and date, for the titles")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
