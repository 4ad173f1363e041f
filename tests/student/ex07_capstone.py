#!/usr/bin/env python3
"""The capstone's solution on a generated XSum corpus, prepared as a participant prepares one
(`./kit data xsum generate`, then `prepare`): two properties that `./kit check 07` does not judge.

  eval    Evaluation does not depend on the number of ranks. The solution runs on 1, 2 and 4
          ranks with --lr 0 (AdamW then leaves the weights as they are, so every run evaluates
          the same model) and prints the same validation and test loss and ROUGE-1, -2 and -L.
          The evaluation batches are cut by length with a fixed seed, whatever the ranks, and
          batch k is evaluated by rank k % ranks: 21 examples in batches of 8 are 3 batches, 2
          on rank 0 and 1 on rank 1 of 2, none on rank 3 of 4 (a rank with no batch adds zeros).
  learns  The model learns the generated task: the summary copies the names of the article's
          first sentence (common/data/XSUM.md), so ROUGE rises far above an untrained model's in
          a short CPU run. The solution trains on 2 ranks; the test ROUGE-L of the last epoch
          must be at least FLOOR, and above the first epoch's.

usage: ex07_capstone.py eval|learns --trainer TRAINER --ddprun DDPRUN --kit KIT --work DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish  # noqa: E402 (tests/support)

SMALL = ["--d-model", "32", "--heads", "2", "--encoder-layers", "1", "--decoder-layers", "1",
         "--feedforward", "64", "--dropout", "0", "--seed", "7", "--max-document-len", "48",
         "--max-summary-len", "12"]
EVAL_FLAGS = SMALL + ["--epochs", "1", "--max-steps", "2", "--batch-size", "4",
                      "--eval-batch-size", "8", "--train-examples", "40", "--eval-examples",
                      "21", "--lr", "0", "--show", "0"]
# Measured (2026-11-28, torch 2.13 CPU, 2 ranks on 2 busy cores, 8.6 s): validation ROUGE-L by
# epoch 0.0, 0.039, 0.207, 0.504, 0.569, 0.628, 0.709, 0.738, test ROUGE-L 0.815 (an untrained
# model's greedy summary is empty or a full stop: 0). The floor is well below what the run
# reaches, far above what a model that does not learn gets.
LEARN_FLAGS = ["--d-model", "64", "--heads", "4", "--encoder-layers", "1", "--decoder-layers",
               "1", "--feedforward", "128", "--dropout", "0", "--seed", "7",
               "--max-document-len", "96", "--max-summary-len", "16", "--epochs", "8",
               "--batch-size", "16", "--eval-batch-size", "32", "--train-examples", "800",
               "--eval-examples", "64", "--lr", "0.003", "--show", "2"]
FLOOR = 0.5
CORPUS = ["--train", "800", "--validation", "64", "--test", "64", "--seed", "5"]
NUM = r"([0-9.]+|nan)"
EPOCH = re.compile(rf"validation loss {NUM}, ROUGE-1 {NUM}, ROUGE-2 {NUM}, ROUGE-L {NUM}")
FINAL = re.compile(rf"final test loss {NUM}, ROUGE-1 {NUM}, ROUGE-2 {NUM}, ROUGE-L {NUM}")


def prepare(args, data):
    for step, flags in (("generate", CORPUS), ("prepare", ["--vocab-size", "1000"])):
        p = subprocess.run([args.kit, "data", "xsum", step, data] + flags, capture_output=True,
                           text=True)
        if p.returncode != 0:
            sys.exit(f"./kit data xsum {step} failed:\n{p.stdout}\n{p.stderr}")


def run(args, data, ranks, flags, name):
    out = os.path.join(args.work, name)
    env = dict(os.environ, OMP_NUM_THREADS="1", KIT_TIMEOUT="60")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        env.pop(var, None)
    cmd = [args.trainer, "--data-dir", data, "--out-dir", out] + flags
    if ranks > 1:
        cmd = [args.ddprun, "--nproc-per-node", str(ranks), "--"] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"the trainer failed on {ranks} ranks (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


def numbers(text):
    return ([[float(x) for x in m.groups()] for m in EPOCH.finditer(text)],
            [[float(x) for x in m.groups()] for m in FINAL.finditer(text)])


def check_eval(args, data):
    printed = {n: numbers(run(args, data, n, EVAL_FLAGS, f"eval-{n}")) for n in (1, 2, 4)}
    expect(all(len(e) == 1 and len(f) == 1 for e, f in printed.values()),
           "every run printed one validation line and one final test line", str(printed))
    flat = {n: e[0] + f[0] for n, (e, f) in printed.items() if e and f}
    if len(flat) == 3:
        worst = max(abs(a - b) for n in (2, 4) for a, b in zip(flat[n], flat[1]))
        expect(worst <= 1e-5, "the validation and test loss and ROUGE-1, -2, -L are the same on "
               f"1, 2 and 4 ranks (largest difference {worst:.1e}; printed to 5 decimals)",
               "\n".join(f"{n} ranks: {v}" for n, v in flat.items()))


def check_learns(args, data):
    out = run(args, data, 2, LEARN_FLAGS, "learns")
    epochs, final = numbers(out)
    expect(len(epochs) == 8 and len(final) == 1, "the run printed 8 epochs and a final line", out)
    if epochs and final:
        first, last = epochs[0][3], final[0][3]
        print(f"validation ROUGE-L by epoch: {[e[3] for e in epochs]}; test ROUGE-L {last}")
        expect(last >= FLOOR, f"the test ROUGE-L {last:.3f} is at least {FLOOR}", out)
        expect(last > first, f"the test ROUGE-L {last:.3f} is above the first epoch's "
               f"validation ROUGE-L {first:.3f}")
        shown = re.findall(r"generated: (.*)", out)
        expect(len(shown) >= 2, "rank 0 printed generated summaries beside their references")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("eval", "learns"))
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--kit", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    data = os.path.join(args.work, "xsum")
    prepare(args, data)
    (check_eval if args.what == "eval" else check_learns)(args, data)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
