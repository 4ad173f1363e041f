#!/usr/bin/env python3
"""Plots from the trainers' metrics files: metrics.csv -> SVG, Python standard library only.

  plot_metrics.py --out DIR RUN [RUN ...]     RUN: a metrics.csv, or a folder that holds one
  plot_metrics.py --check --out DIR RUN ...   exit 1 if the files in DIR differ from a fresh plot

metrics.csv (written by rank 0 of a trainer, one row per training step):
    step,epoch,loss,samples_per_s,ranks,elapsed_s[,rank,device,host,peak_mem_mib,gpu_busy_pct]
step counts from 1 over the whole run, epoch from 1; samples_per_s counts all ranks together.
The rows with a `rank` (each rank's own figures at an epoch's end, kit/train/metrics.h) are not steps
and are left out here; files from before those columns existed plot the same.

Writes into DIR:
  loss-vs-step.svg     training loss against optimizer steps, one curve per rank count
  loss-vs-epoch.svg    the same against epochs (each rank count does an epoch in fewer steps)
  throughput.svg       samples per second against ranks, with perfect scaling for comparison
  epoch-time.svg       training time per epoch against ranks, with perfect scaling
  summary.md           the numbers behind the plots, as a Markdown table
"""
import csv
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "images"))
from plot import Axes, tool_main  # noqa: E402
from style import COLORS, INK, MUTED  # noqa: E402

FIELDS = ["step", "epoch", "loss", "samples_per_s", "ranks", "elapsed_s"]
RANK_FIELDS = ["rank", "device", "host", "peak_mem_mib", "gpu_busy_pct"]


class Run:
    def __init__(self, path):
        self.path = path
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames not in (FIELDS, FIELDS + RANK_FIELDS):
                raise ValueError(f"{path}: header is {reader.fieldnames}, expected "
                                 f"{','.join(FIELDS + RANK_FIELDS)}")
            rows = [r for r in reader if not r.get("rank")]
        if not rows:
            raise ValueError(f"{path}: no training steps")
        self.step = [int(r["step"]) for r in rows]
        self.epoch = [int(r["epoch"]) for r in rows]
        self.loss = [float(r["loss"]) for r in rows]
        self.rate = [float(r["samples_per_s"]) for r in rows]
        self.elapsed = [float(r["elapsed_s"]) for r in rows]
        ranks = {int(r["ranks"]) for r in rows}
        if len(ranks) != 1:
            raise ValueError(f"{path}: rows disagree on the number of ranks: {sorted(ranks)}")
        self.ranks = ranks.pop()
        self.epochs = sorted(set(self.epoch))
        self.steps_per_epoch = {e: self.epoch.count(e) for e in self.epochs}
        # Time between steps; the first step of an epoch also contains the previous evaluation,
        # so the typical (median) step time stands in for it.
        dt = [self.elapsed[0]] + [b - a for a, b in zip(self.elapsed, self.elapsed[1:])]
        self.step_s = statistics.median(dt[1:]) if len(dt) > 1 else dt[0]
        first = {e: self.epoch.index(e) for e in self.epochs}
        self.epoch_s = {e: sum(dt[i] for i in range(len(dt)) if self.epoch[i] == e and i != first[e])
                        + self.step_s for e in self.epochs}
        self.samples_per_s = statistics.median(self.rate)

    def epoch_fraction(self):
        """x for loss-vs-epoch: 0.5 = half way through the first epoch."""
        out, seen = [], {}
        for e in self.epoch:
            seen[e] = seen.get(e, 0) + 1
            out.append(e - 1 + seen[e] / self.steps_per_epoch[e])
        return out


def smooth(values, window):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def color_of(runs, run):
    return COLORS[sorted(r.ranks for r in runs).index(run.ranks) % len(COLORS)]


def loss_plot(runs, xkey, title, xlabel):
    xs = [x for r in runs for x in (r.step if xkey == "step" else r.epoch_fraction())]
    ys = [v for r in runs for v in r.loss]
    lo, hi = min(ys), max(ys)
    ax = Axes(title, xlabel, "training loss (rank 0's batch)", [0] + xs, [lo, hi])
    for run in sorted(runs, key=lambda r: r.ranks):
        c = color_of(runs, run)
        x = run.step if xkey == "step" else run.epoch_fraction()
        pts = list(zip(map(ax.x, x), map(ax.y, run.loss)))
        ax.svg.polyline(pts, stroke=c, sw=1, opacity=0.35)
        window = max(1, len(run.loss) // 25)
        ax.svg.polyline(list(zip(map(ax.x, x), map(ax.y, smooth(run.loss, window)))), stroke=c, sw=3)
        ax.legend(f"{run.ranks} rank{'s' if run.ranks > 1 else ''}", c)
    return ax.svg


def scaling_plot(runs, title, ylabel, value, ideal, legend_at):
    runs = sorted(runs, key=lambda r: r.ranks)
    ranks = [r.ranks for r in runs]
    vals = [value(r) for r in runs]
    base = next((r for r in runs if r.ranks == 1), runs[0])
    ideals = [ideal(value(base), base.ranks, n) for n in ranks]
    ax = Axes(title, "ranks", ylabel, [0] + ranks, [0] + vals + ideals,
              xticks=list(range(0, max(ranks) + 1)), legend_at=legend_at)
    ax.svg.polyline([(ax.x(n), ax.y(v)) for n, v in zip(ranks, ideals)], stroke=MUTED, sw=2, dash="7 5")
    ax.svg.polyline([(ax.x(n), ax.y(v)) for n, v in zip(ranks, vals)], stroke=COLORS[0], sw=3)
    for run, n, v in zip(runs, ranks, vals):
        ax.svg.circle(ax.x(n), ax.y(v), 7, fill=color_of(runs, run), stroke=INK, sw=1.5)
        ax.svg.text(ax.x(n), ax.y(v) - 14, f"{v:.3g}", size=14, fill=INK)
    ax.legend("measured", COLORS[0])
    ax.legend("perfect scaling", MUTED, dash="7 5")
    return ax.svg


def summary(runs):
    runs = sorted(runs, key=lambda r: r.ranks)
    base = next((r for r in runs if r.ranks == 1), runs[0])
    t1 = statistics.mean(base.epoch_s.values())
    lines = ["| ranks | steps per epoch | samples/s | s per epoch | speed-up | efficiency | last loss |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        t = statistics.mean(r.epoch_s.values())
        speedup = t1 / t
        eff = speedup / (r.ranks / base.ranks)
        spe = statistics.mean(r.steps_per_epoch.values())
        lines.append(f"| {r.ranks} | {spe:.0f} | {r.samples_per_s:.0f} | {t:.1f} | {speedup:.2f}× | "
                     f"{100 * eff:.0f} % | {statistics.mean(r.loss[-5:]):.2f} |")
    if truncated(runs):
        lines += ["", "Every rank count did the same number of steps per epoch: the epochs were cut short "
                  "(--max-steps), so compare samples/s, not seconds per epoch."]
    return "\n".join(lines) + "\n"


def truncated(runs):
    """Epochs cut by --max-steps: N ranks should need N times fewer steps for a whole epoch."""
    spe = {r.ranks: statistics.mean(r.steps_per_epoch.values()) for r in runs}
    return len(spe) > 1 and len(set(round(v) for v in spe.values())) == 1


def render_all(runs):
    cut = " (epochs cut short by --max-steps)" if truncated(runs) else ""
    return {
        "loss-vs-step.svg": loss_plot(runs, "step", "Training loss against optimizer steps",
                                      "optimizer step").render(),
        "loss-vs-epoch.svg": loss_plot(runs, "epoch", "Training loss against epochs", "epoch").render(),
        "throughput.svg": scaling_plot(runs, "Training throughput", "samples per second (all ranks)",
                                       lambda r: r.samples_per_s, lambda v, b, n: v * n / b,
                                       "top left").render(),
        "epoch-time.svg": scaling_plot(runs, "Training time per epoch" + cut, "seconds per epoch",
                                       lambda r: statistics.mean(r.epoch_s.values()),
                                       lambda v, b, n: v * b / n, "bottom left").render(),
        "summary.md": summary(runs),
    }


def main(argv):
    def render(a):
        runs = [Run(os.path.join(r, "metrics.csv") if os.path.isdir(r) else r) for r in a.runs]
        if len({r.ranks for r in runs}) != len(runs):
            raise ValueError("give one run per number of ranks")
        return render_all(runs)
    return tool_main(argv, "plot_metrics.py", "metrics.csv files -> SVG plots", ("runs", {"nargs": "+"}), render)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
