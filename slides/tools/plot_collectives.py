#!/usr/bin/env python3
"""The collectives benchmark's CSV (common/bench/bench_collectives.cpp) -> a plot of the bus
bandwidth against the message size, with the latency-bandwidth (alpha-beta) model fitted to
each collective. Python standard library only.

  plot_collectives.py --out DIR [--label TEXT] CSV      writes DIR/collectives-busbw.svg and
                                                        DIR/collectives-fit.md; prints the fits
  plot_collectives.py --check --out DIR [--label TEXT] CSV
                                                        exit 1 if the files in DIR differ from a
                                                        fresh plot (the committed figures)

The model: one call of a collective of S bytes on n ranks takes

    t(S) = alpha + f * S / beta

alpha is the fixed cost of a call (latency: software, synchronisation, the first byte's trip),
beta the bandwidth of the links, and f the collective's bus factor (2(n-1)/n for all_reduce,
(n-1)/n for all_gather and reduce_scatter, 1 for broadcast): the bytes each rank must move per
byte of message. busbw = f * S / t approaches beta for large messages and falls off once alpha
dominates, below about alpha * beta / f bytes. The fit minimises the relative error of t over
all sizes, so small messages weigh as much as large ones.
"""
import csv
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "images"))
from plot import Axes, fmt_bytes, tool_main  # noqa: E402
from style import COLORS  # noqa: E402

FIELDS = ["collective", "bytes", "elements", "ranks", "backend", "device", "iterations",
          "time_us", "algbw_gbps", "busbw_gbps"]
ORDER = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]


def bus_factor(name, n):
    return {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(name, (n - 1) / n)


def read(path):
    """{collective: [(bytes, time in s, busbw in GB/s)]}, ranks, backend."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != FIELDS:
            raise ValueError(f"{path}: header is {reader.fieldnames}, expected {','.join(FIELDS)}")
        rows = list(reader)
    if not rows:
        raise ValueError(f"{path}: no rows")
    ranks = {int(r["ranks"]) for r in rows}
    backends = {r["backend"] for r in rows}
    if len(ranks) != 1 or len(backends) != 1:
        raise ValueError(f"{path}: rows of several runs (ranks {sorted(ranks)}, backends {sorted(backends)})")
    series = {}
    for r in rows:
        series.setdefault(r["collective"], []).append(
            (int(r["bytes"]), float(r["time_us"]) * 1e-6, float(r["busbw_gbps"])))
    return series, ranks.pop(), backends.pop()


def fit(points, factor):
    """(alpha in s, beta in bytes/s) of t = alpha + factor * S / beta, by least squares on the
    relative error: minimise sum(((alpha + c S) - t)^2 / t^2) over alpha >= 0 and c = factor / beta > 0."""
    w = [1 / t ** 2 for _, t, _ in points]
    x = [s for s, _, _ in points]
    y = [t for _, t, _ in points]
    sw = sum(w)
    sx = sum(wi * xi for wi, xi in zip(w, x))
    sy = sum(wi * yi for wi, yi in zip(w, y))
    sxx = sum(wi * xi * xi for wi, xi in zip(w, x))
    sxy = sum(wi * xi * yi for wi, xi, yi in zip(w, x, y))
    det = sw * sxx - sx * sx
    alpha, c = ((sxx * sy - sx * sxy) / det, (sw * sxy - sx * sy) / det) if det > 0 else (0, 0)
    if alpha < 0 or c <= 0:  # no latency to see (or no bandwidth): fit the other alone
        alpha = max(0.0, alpha)
        c = max(sum(wi * xi * (yi - alpha) for wi, xi, yi in zip(w, x, y)) / sxx, 1e-30)
    return alpha, factor / c


def fits(series, ranks):
    return {name: fit(pts, bus_factor(name, ranks)) for name, pts in series.items()}


def plot(series, ranks, backend, label, fitted):
    names = [n for n in ORDER if n in series]
    sizes = sorted({s for pts in series.values() for s, _, _ in pts})
    busbw = [b for pts in series.values() for _, _, b in pts]
    models = {n: [bus_factor(n, ranks) * s / (fitted[n][0] + bus_factor(n, ranks) * s / fitted[n][1]) / 1e9
                  for s, _, _ in series[n]] for n in names}
    top = max(busbw + [v for m in models.values() for v in m])
    lo, hi = 2 ** math.floor(math.log2(sizes[0])), 2 ** math.ceil(math.log2(sizes[-1]))
    step = max(1, round(math.log2(hi / lo) / 8))
    ticks = [lo * 2 ** k for k in range(0, int(math.log2(hi / lo)) + 1, step)]
    if ticks[-1] < hi:
        ticks.append(ticks[-1] * 2 ** step)
    title = f"Bus bandwidth, {ranks} ranks, {backend}" + (f": {label}" if label else "")
    ax = Axes(title, "message size", "busbw (GB/s)",
              ticks, [0, top], width=1000, height=540, xticks=ticks, legend_at="top left",
              logx=True, xfmt=fmt_bytes)
    for i, n in enumerate(names):
        c = COLORS[i % len(COLORS)]
        pts = [(ax.x(s), ax.y(b)) for s, _, b in series[n]]
        ax.svg.polyline(pts, stroke=c, sw=3)
        for x, y in pts:
            ax.svg.circle(x, y, 4, fill=c)
        ax.svg.polyline([(ax.x(s), ax.y(m)) for (s, _, _), m in zip(series[n], models[n])],
                        stroke=c, sw=2, dash="6 5")
        alpha, beta = fitted[n]
        ax.legend(f"{n}: \u03b1 {alpha * 1e6:.0f} \u00b5s, \u03b2 {beta / 1e9:.2f} GB/s", c)
    ax.legend("dashed: the \u03b1\u2013\u03b2 model", "#52606d", dash="6 5")
    return ax.svg.render()


def table(series, ranks, backend, label, fitted):
    lines = [f"Fitted t = \u03b1 + f \u00d7 S / \u03b2 on {ranks} ranks, {backend}"
             + (f" ({label})" if label else "") + ".", "",
             "| collective | bus factor f | \u03b1 (\u00b5s) | \u03b2 (GB/s) | largest busbw measured (GB/s) |",
             "|---|---:|---:|---:|---:|"]
    for n in [n for n in ORDER if n in series]:
        alpha, beta = fitted[n]
        lines.append(f"| {n} | {bus_factor(n, ranks):.2f} | {alpha * 1e6:.0f} | {beta / 1e9:.2f} | "
                     f"{max(b for _, _, b in series[n]):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv):
    def render(a):
        series, ranks, backend = read(a.csv)
        if ranks < 2:
            raise ValueError("a run of one rank moves no bytes: run on 2 or more")
        fitted = fits(series, ranks)
        for n in [n for n in ORDER if n in series]:
            alpha, beta = fitted[n]
            print(f"{n}: alpha = {alpha * 1e6:.1f} us, beta = {beta / 1e9:.3f} GB/s")
        return {"collectives-busbw.svg": plot(series, ranks, backend, a.label, fitted),
                "collectives-fit.md": table(series, ranks, backend, a.label, fitted)}
    return tool_main(argv, "plot_collectives.py", "bench_collectives CSV -> busbw plot with the alpha-beta fit",
                     ("csv",), render, label_help="the machine, for the title (e.g. '2-core VM, 2026-11-24')")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
