#!/usr/bin/env python3
"""A run's metrics.csv as TensorBoard event files, so that an instructor watches the course's jobs
in the usual dashboard (`tensorboard --logdir runs`), as NERSC's course does with PyTorch.

    python3 metrics_tensorboard.py RUN [RUN ...] [--out LOGDIR]

RUN is a run folder (a trainer's --out-dir, e.g. runs/ex01-<job id>, holding metrics.csv) or a
metrics.csv itself. The events go to RUN/tensorboard/, or with --out to LOGDIR/<run folder's
name>/; converting again replaces them. metrics.csv's format is kit/train/metrics.h's: a row per
training step (`rank` empty) and, at each epoch's end, a row per rank. Scalars written:
  train/loss, train/samples_per_s, train/epoch      per step (rank 0's loss, all ranks' rate)
  rank<R>/samples_per_s, rank<R>/peak_mem_mib, rank<R>/gpu_busy_pct
                                                    per rank, at each epoch's last step
The wall time of an event is the file's time less the run's elapsed seconds still to come, so the
dashboard's relative time axis is the run's own (elapsed_s).

The event files are written by PyPI's tensorboard package (its EventFileWriter and protocol
buffers), not by code of the kit: `pip install tensorboard` (requirements.txt pins it), or a
site module that has it. Exit 0; 2 with one line for a run without metrics.csv, a file that is
not the kit's metrics.csv, or no tensorboard package.
"""
import argparse
import csv
import glob
import os
import sys

FIELDS = ("step", "epoch", "loss", "samples_per_s", "ranks", "elapsed_s")  # the first six columns


def fail(msg):
    sys.stderr.write(f"tensorboard: error: {msg}\n")
    sys.exit(2)


def read_rows(path):
    """metrics.csv's rows as dicts; one line and exit 2 when it is not the kit's."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
            header = rows and list(rows[0].keys()) or []
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    if not rows:
        fail(f"{path} has no rows (a run that has not finished a step yet?)")
    if tuple(header[:len(FIELDS)]) != FIELDS:
        fail(f"{path} is not a kit metrics.csv: its header is {','.join(header)}, expected "
             f"{','.join(FIELDS)},... (kit/train/metrics.h)")
    return rows


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def scalars(rows):
    """(tag, step, value, elapsed_s) for every number in the rows."""
    out = []
    for n, row in enumerate(rows, 2):
        step, elapsed = number(row["step"]), number(row["elapsed_s"])
        if step is None:
            fail(f"line {n} of metrics.csv has no step number: {row}")
        rank = (row.get("rank") or "").strip()
        if rank:
            for col in ("samples_per_s", "peak_mem_mib", "gpu_busy_pct"):
                v = number(row.get(col))
                if v is not None:
                    out.append((f"rank{rank}/{col}", int(step), v, elapsed))
            continue
        for tag, col in (("train/loss", "loss"), ("train/samples_per_s", "samples_per_s"),
                         ("train/epoch", "epoch")):
            v = number(row.get(col))
            if v is not None:
                out.append((tag, int(step), v, elapsed))
    return out


def convert(csv_path, logdir):
    """Writes csv_path's scalars as one event file in logdir (old event files there removed)."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as e:
        fail(f"the tensorboard package is not installed for {sys.executable} ({e}): pip install "
             "tensorboard (its pinned version is in requirements.txt), or load a module that has it")
    points = scalars(read_rows(csv_path))
    os.makedirs(logdir, exist_ok=True)
    for old in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        os.remove(old)
    end = os.path.getmtime(csv_path)
    last = max((e for *_, e in points if e is not None), default=0.0)
    writer = EventFileWriter(logdir)
    for tag, step, value, elapsed in points:
        wall = end - last + (elapsed if elapsed is not None else last)
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))
    writer.close()
    return len(points)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN", help="a run folder or its metrics.csv")
    ap.add_argument("--out", metavar="LOGDIR", help="write LOGDIR/<run>/ instead of RUN/tensorboard/")
    a = ap.parse_args(argv)
    targets = []
    for run in a.runs:
        path = os.path.join(run, "metrics.csv") if os.path.isdir(run) else run
        if not os.path.isfile(path):
            fail(f"{run} has no metrics.csv (a trainer's --out-dir, e.g. runs/ex01-<job id>, or "
                 "the file itself)")
        folder = os.path.dirname(os.path.abspath(path))
        logdir = (os.path.join(a.out, os.path.basename(folder)) if a.out
                  else os.path.join(folder, "tensorboard"))
        targets.append((path, logdir))
    for path, logdir in targets:
        n = convert(path, logdir)
        print(f"tensorboard: {path}: {n} scalars -> {logdir}")
    where = a.out or (os.path.dirname(os.path.dirname(targets[0][1])) if len(targets) == 1
                      else "<the runs' parent folder>")
    print(f"tensorboard: open them with: tensorboard --logdir {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
