#!/usr/bin/env python3
"""Check a trainer build of an exercise by what it DOES, TODO by TODO.

Runs the trainer once alone and once on several ranks (ddprun, Gloo on CPU here; the GPUs on a
cluster node), with the run trace switched on (KIT_TRACE_DIR, see common/kit/trace.h), and runs
the solution on the same data and seed. Then it judges every TODO from the traces and the ranks'
output, prints one line per TODO (✔ or ✘ with the reason) and exits 1 if any fails.

This is the one implementation of "student code reaches the same loss and uses every GPU": the
test suite (tests/student) and `./kit check` both call it.

usage: check.py --exercise NAME --binary PROG --solution PROG --ddprun PROG --make-corpus PROG
                [--source FILE] [--ranks N] [--workdir DIR] [--keep]
"""
import argparse
import glob
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Small and quick: the checks look at behaviour, not at model quality.
RUN_FLAGS = ["--epochs", "2", "--batch-size", "8", "--eval-batch-size", "16", "--seq-len", "16",
             "--d-model", "32", "--heads", "2", "--layers", "1", "--feedforward", "64",
             "--dropout", "0", "--seed", "7"]
CORPUS_FLAGS = ["--train-tokens", "4000", "--valid-tokens", "1200", "--test-tokens", "1200",
                "--seed", "3"]
LOSS_LINE = re.compile(r"train loss ([0-9.]+), validation loss ([0-9.]+)")
TEST_LINE = re.compile(r"test loss ([0-9.]+)")
RUN_TIMEOUT = 300


class Run:
    """One launch of a trainer: its exit code, per-rank logs and per-rank traces."""

    def __init__(self, binary, ranks, workdir, data, ddprun, name):
        self.dir = os.path.join(workdir, name)
        shutil.rmtree(self.dir, ignore_errors=True)
        trace_dir, log_dir, out_dir = (os.path.join(self.dir, d) for d in ("trace", "log", "out"))
        for d in (trace_dir, log_dir, out_dir):
            os.makedirs(d)
        env = dict(os.environ, KIT_TRACE_DIR=trace_dir, KIT_TIMEOUT="60", OMP_NUM_THREADS="1")
        for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
            env.pop(var, None)
        cmd = [binary, "--data-dir", data, "--out-dir", out_dir] + RUN_FLAGS
        if ranks > 1:
            cmd = [ddprun, "--nproc-per-node", str(ranks), "--log-dir", log_dir, "--"] + cmd
        try:
            p = subprocess.run(cmd, env=env, cwd=self.dir, capture_output=True, text=True,
                               timeout=RUN_TIMEOUT)
            self.code, self.stdout, self.stderr = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            self.code, self.stdout, self.stderr = -1, "", f"timed out after {RUN_TIMEOUT} s"
        if ranks == 1:
            with open(os.path.join(log_dir, "rank0.log"), "w") as f:
                f.write(self.stdout + self.stderr)
        self.ranks, self.out_dir = ranks, out_dir
        self.logs = {r: read(os.path.join(log_dir, f"rank{r}.log")) for r in range(ranks)}
        self.traces = {r: parse_trace(os.path.join(trace_dir, f"rank{r}.trace"))
                       for r in range(ranks)}
        if ranks == 1:  # no launcher, no RANK: the trace is named after the process id
            self.traces = {0: [e for p in glob.glob(os.path.join(trace_dir, "*.trace"))
                               for e in parse_trace(p)]}

    def events(self, rank, kind):
        return [fields for k, fields in self.traces[rank] if k == kind]

    def failure(self):
        """One line about a crash, or None."""
        if self.code == 0:
            return None
        lines = [l for l in (self.stderr + self.stdout).splitlines() if l.strip()]
        return f"exit code {self.code}: " + (lines[-1] if lines else "no output")

    def reported(self, rank):
        """The loss lines this rank printed or would have printed (print0 records them all)."""
        lines = self.events(rank, "print0") or self.logs[rank].splitlines()
        epochs = [tuple(map(float, m.groups())) for m in map(LOSS_LINE.search, lines) if m]
        tests = [float(m.group(1)) for m in map(TEST_LINE.search, lines) if m]
        return epochs, tests


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def parse_trace(path):
    events = []
    for line in read(path).splitlines():
        kind, _, fields = line.partition(" ")
        events.append((kind, fields))
    return events


def kv(fields):
    return dict(part.split("=", 1) for part in fields.split() if "=" in part)


def batches(run, rank, split):
    """Indices of `split` that `rank` read, batch by batch."""
    out = []
    for fields in run.events(rank, "batch"):
        name, _, idx = fields.partition(" ")
        if name == split:
            out.append([int(i) for i in idx.split(",") if i])
    return out


class Verdicts:
    def __init__(self):
        self.rows = []

    def add(self, todo, ok, what, why=""):
        self.rows.append((todo, ok, what, why))

    def print(self, out=sys.stdout):
        for todo, ok, what, why in self.rows:
            mark = "\u2714" if ok else "\u2718"
            out.write(f"  {mark} TODO {todo:<5} {what}" + (f": {why}" if why else "") + "\n")


def check_setup(v, run, source, ranks):
    setups = {r: run.events(r, "setup") for r in range(ranks)}
    included = source is not None and re.search(r'#\s*include\s+"kit/distributed\.h"',
                                                 read(source))
    called = all(setups[r] for r in range(ranks))
    if included or called:
        v.add("1", True, "the kit's distributed headers are included")
    else:
        v.add("1", False, "the kit's distributed headers are included",
              "kit/distributed.h is not included, so setup() cannot be called")
    if not called:
        v.add("2-3", False, "every rank joins the job with kit::setup()",
              f"setup() never ran: each of the {ranks} processes trained alone, as a world of 1")
        return False
    bad = []
    for r in range(ranks):
        s = kv(setups[r][0])
        want_device = s.get("device", "")
        if s.get("world_size") != str(ranks) or s.get("rank") != str(r):
            bad.append(f"rank {r} reports rank {s.get('rank')} of {s.get('world_size')}")
        elif want_device.startswith("cuda") and want_device != f"cuda:{s.get('local_rank')}":
            bad.append(f"rank {r} runs on {want_device}, not cuda:{s.get('local_rank')}")
    devices = [kv(setups[r][0]).get("device") for r in range(ranks)]
    if any(d.startswith("cuda") for d in devices) and len(set(devices)) < ranks:
        bad.append(f"ranks share GPUs: {devices}")
    v.add("2-3", not bad, "every rank joins the job with kit::setup() and drives its own device",
          "; ".join(bad))
    return True


def check_samplers(v, run, ranks):
    samplers = [kv(f) for f in run.events(0, "sampler")]
    if len(samplers) < 3:
        v.add("4", False, "a DistributedSampler for each split",
              f"{len(samplers)} sampler(s) created on rank 0, expected 3 (train, validation, test)")
    else:
        v.add("4", True, "a DistributedSampler for each split")
    results = {}
    for todo, split in (("5", "train"), ("6", "valid"), ("7", "test")):
        # One epoch's worth (the train and validation splits are read once per epoch).
        epochs = 2 if split != "test" else 1
        per_rank = []
        for r in range(ranks):
            b = batches(run, r, split)
            per_rank.append(set(i for batch in b[:len(b) // epochs] for i in batch))
        union = set().union(*per_rank)
        shared = set.intersection(*per_rank) if ranks > 1 else set()
        total = sum(len(s) for s in per_rank)
        what = f"each rank reads its own part of the {split} split"
        if not union:
            v.add(todo, False, what, f"no {split} batches were read")
            results[split] = False
        elif ranks > 1 and len(shared) == len(union):
            v.add(todo, False, what, f"all {ranks} ranks read all {len(union)} {split} samples: "
                  "the loader has no sampler")
            results[split] = False
        elif total - len(union) > ranks - 1:  # a DistributedSampler pads by at most ranks-1
            v.add(todo, False, what, f"{total - len(union)} {split} samples were read by more "
                  "than one rank")
            results[split] = False
        else:
            v.add(todo, True, what)
            results[split] = True
    return results


def check_ddp(v, run, ranks):
    what = "the model copies stay identical (DistributedDataParallel)"
    fps = [{kv(f)["step"]: kv(f)["params"] for f in run.events(r, "forward")} for r in range(ranks)]
    steps = sorted(set.intersection(*(set(f) for f in fps)), key=int) if fps else []
    if not steps:
        v.add("8", False, what, "no training step was traced")
        return
    differ = [s for s in steps if len({f[s] for f in fps}) > 1]
    if differ:
        v.add("8", False, what, f"the ranks start step {differ[0]} with different weights "
              "(rank 0 vs rank 1 fingerprint differs): wrap the model in DistributedDataParallel")
    elif not all(run.events(r, "ddp_step") for r in range(ranks)):
        v.add("8", False, what, "the weights agree, but gradients were never averaged")
    else:
        v.add("8", True, what, "")


def check_set_epoch(v, run, ranks, sampled):
    what = "a new shuffle in every epoch (set_epoch)"
    if not sampled:
        v.add("9", False, what, "needs the training sampler first (TODOs 4 and 5)")
        return
    b = batches(run, 0, "train")
    half = len(b) // 2
    first, second = b[:half], b[half:]
    if first == second:
        v.add("9", False, what, "epoch 2 read the training samples in exactly the order of "
              "epoch 1: the sampler was not told the epoch")
    else:
        v.add("9", True, what)


def check_all_reduce(v, run, ranks):
    what = "reported losses are averaged over all ranks"
    reports = [run.reported(r) for r in range(ranks)]
    if not reports[0][0] or not reports[0][1]:
        v.add("10", False, what, "rank 0 reported no loss lines")
        return
    if any(rep != reports[0] for rep in reports[1:]):
        r = next(i for i, rep in enumerate(reports) if rep != reports[0])
        v.add("10", False, what, f"rank 0 and rank {r} report different losses "
              f"({reports[0][1][0]:.5f} vs {reports[r][1][0]:.5f} test loss): "
              "each reported only its own share")
        return
    # The reduction must be an average: compare every all-reduce with the ranks' inputs.
    calls = [[kv(f) for f in run.events(r, "all_reduce")] for r in range(ranks)]
    n = min(len(c) for c in calls)
    if n == 0:
        v.add("10", False, what, "no all_reduce was called")
        return
    for k in range(n):
        mean = sum(float(calls[r][k]["in"]) for r in range(ranks)) / ranks
        out = float(calls[0][k]["out"])
        if not math.isclose(out, mean, rel_tol=1e-4, abs_tol=1e-6):
            v.add("10", False, what, f"all-reduce {k + 1} returned {out:.5f}, but the ranks' mean "
                  f"is {mean:.5f}: use kit::ReduceOp::AVG")
            return
    expected = 2 * 2 + 1  # train and validation per epoch (2 epochs), then test
    if n < expected:
        v.add("10", False, what, f"only {n} of the {expected} losses were all-reduced")
        return
    v.add("10", True, what)


def check_print0(v, run, ranks):
    what = "only rank 0 prints the losses (print0)"
    noisy = [r for r in range(1, ranks)
             if LOSS_LINE.search(run.logs[r]) or TEST_LINE.search(run.logs[r])]
    if noisy:
        v.add("11", False, what, f"rank {noisy[0]} printed loss lines too, so the job output "
              f"has every line {ranks} times")
    elif not LOSS_LINE.search(run.logs[0]) or not TEST_LINE.search(run.logs[0]):
        v.add("11", False, what, "rank 0 printed no loss lines")
    else:
        v.add("11", True, what)


def check_save0(v, run, ranks):
    what = "only rank 0 writes the checkpoints (save0)"
    missing = [f for f in ("model-best.pt", "model-final.pt")
               if not os.path.isfile(os.path.join(run.out_dir, f))]
    saves = [run.events(r, "save0") for r in range(ranks)]
    wrote = [r for r in range(ranks) if any(s.endswith(" wrote") for s in saves[r])]
    if missing:
        v.add("12", False, what, f"{', '.join(missing)} missing")
    elif not all(saves):
        v.add("12", False, what, "the checkpoints were written with torch::save by every rank")
    elif wrote != [0]:
        v.add("12", False, what, f"ranks {wrote} wrote checkpoints")
    else:
        v.add("12", True, what)


def check_destroy(v, run, ranks):
    what = "the process group is closed at the end"
    exits = [run.events(r, "exit") for r in range(ranks)]
    if not all(exits):
        v.add("13", False, what, "needs setup() first (TODOs 2-3)")
    elif any("group_alive=1" in e[-1] for e in exits):
        v.add("13", False, what, "the process group was still alive when the program ended")
    else:
        v.add("13", True, what)


def final_test_loss(run):
    _, tests = run.reported(0)
    return tests[-1] if tests else None


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exercise", required=True)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--solution", required=True)
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--make-corpus", required=True)
    ap.add_argument("--source", help="the trainer's source file (only TODO 1 looks at it)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    a = ap.parse_args(argv)
    a.binary, a.solution, a.ddprun, a.make_corpus = map(
        os.path.abspath, (a.binary, a.solution, a.ddprun, a.make_corpus))
    for prog in (a.binary, a.solution, a.ddprun, a.make_corpus):
        if not os.access(prog, os.X_OK):
            sys.stderr.write(f"check: {prog} is not built\n")
            return 2
    if a.ranks < 2:
        sys.stderr.write("check: --ranks must be at least 2\n")
        return 2
    workdir = a.workdir or tempfile.mkdtemp(prefix="kit-check-")
    os.makedirs(workdir, exist_ok=True)
    data = os.path.join(workdir, "corpus")
    if not os.path.isfile(os.path.join(data, "wiki.test.tokens")):
        subprocess.run([a.make_corpus, "--out", data] + CORPUS_FLAGS, check=True,
                       capture_output=True)

    print(f"check {a.exercise}: {a.binary}")
    alone = Run(a.binary, 1, workdir, data, a.ddprun, "alone")
    if alone.failure():
        print(f"  \u2718 the trainer does not run on its own: {alone.failure()}")
        return 1
    many = Run(a.binary, a.ranks, workdir, data, a.ddprun, f"ranks{a.ranks}")
    if many.failure():
        print(f"  \u2718 the trainer fails on {a.ranks} ranks: {many.failure()}")
        return 1
    reference = Run(a.solution, a.ranks, workdir, data, a.ddprun, f"solution{a.ranks}")
    if reference.failure():
        print(f"  \u2718 the solution itself fails: {reference.failure()}")
        return 1

    v = Verdicts()
    ranks = a.ranks
    if check_setup(v, many, a.source, ranks):
        sampled = check_samplers(v, many, ranks)
        check_ddp(v, many, ranks)
        check_set_epoch(v, many, ranks, sampled.get("train"))
    else:
        for todo in ("4", "5", "6", "7", "8", "9"):
            v.add(todo, False, "needs setup()", "without it every process is rank 0 of 1")
    check_all_reduce(v, many, ranks)
    check_print0(v, many, ranks)
    check_save0(v, many, ranks)
    check_destroy(v, many, ranks)
    mine, theirs = final_test_loss(many), final_test_loss(reference)
    same = mine is not None and theirs is not None and math.isclose(mine, theirs, rel_tol=1e-4)
    v.add("all", same, f"final test loss on {ranks} ranks matches the solution's",
          "" if same else f"{mine} vs the solution's {theirs}; the first ✘ above is the place to look")
    v.print()
    failed = [t for t, ok, _, _ in v.rows if not ok]
    passed = [t for t, ok, _, _ in v.rows if ok]
    print(f"passed: {','.join(passed) or '-'}")
    print(f"failed: {','.join(failed) or '-'}")
    if not a.keep and not a.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
