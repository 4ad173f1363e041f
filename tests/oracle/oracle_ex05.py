#!/usr/bin/env python3
"""An independent oracle for exercise 05: PyTorch's own pipeline parallelism
(torch.distributed.pipelining: ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, one
PipelineStage per model chunk, Gloo, CPU) trains the same model, cut the same way, from the same
weights on the same batches, and its per-step losses must be the kit's.

  1. the initial weights: exercise 01's solution, alone, for one step with KIT_TRACE_WEIGHTS=1
     (the trace's initial-weights file). Exercise 05 does not write them (its chunks never run
     TransformerLM::forward, which saves them), but kit::pp::whole_model(options, seed) promises
     "the whole model as rank 0 of a one-rank run makes it" (kit/pipeline/stage.h): the same
     options and seed give exercise 01's weights, since exercise 01 draws nothing from torch's
     generator between setup() and its model. This test relies on that promise, and so checks
     it: other weights move the very first loss (planted, whole_model seeded with seed + 1 fails
     every step, 2.6e-2 at worst);
  2. exercise 05's solution trains on pp ranks (ddprun) with the given --schedule, --chunks and
     --micro-batches, its run trace on for the batches each step read (rank 0's; every stage of
     the pipeline reads the same);
  3. this script, on pp processes of its own (forked, torch.distributed on Gloo), builds exercise
     01's model in Python (oracle_ex01.LanguageModel: torch.nn, the key bias held at zero), loads
     those weights, cuts it into the kit's chunks (the first chunk the embedding, the last the
     output layer, the blocks shared out as kit::pp::split_layers does: the first chunks one more),
     wraps each of this rank's chunks in a PipelineStage (rank r holds chunks r, r + pp, ...) and
     lets PyTorch's schedule run each batch, with its own micro-batching (tensor_split along the
     batch) and the mean cross-entropy of each micro-batch as the loss; AdamW (foreach=False, the
     C++ optimizer's arithmetic) steps each rank's chunks;
  4. checked: every step's loss (the kit's metrics.csv, broadcast from its last stage; PyTorch's
     mean of the last stage's micro-batch losses) within --tolerance relative.

Where the kit and PyTorch differ. PyTorch sums each micro-batch's gradient and divides the sum by
the number of micro-batches (scale_grads=True, its default); the kit weights each micro-batch's
loss by its share of the batch's words. For equal micro-batches these are the same gradient; the
trainer refuses --micro-batches that do not divide --batch-size, but an epoch's short last batch
splits unevenly, where the kit's step is the unsplit step and PyTorch's is not: the run stops
(--max-steps) before it, and the script checks that every batch it compares splits evenly.

What it cannot see: the order of forwards and backwards (any order gives the same numbers:
oracle_pp_orders.py and `kit check 05` judge it), and a gradient wrong by one factor for the whole
model (AdamW divides every update by the gradient's own scale; only the gradients themselves
would show it, and exercise 05 writes none to compare).

Tolerance. Measured on 2026-11-27 (torch 2.13, CPU; 6 steps): at most 2.0e-7 relative on each
of the four runs of tests/oracle/CMakeLists.txt; the test allows 1e-5. Planted in the trainer, a
backward that receives the next micro-batch's gradient differs from step 2 on (2.8e-3 at pp 2,
2.6e-3 at pp 4; interleaved deadlocks and is killed after TIMEOUT); micro-batch losses summed
instead of weighted differ by 3.0 (the loss 4 times too large); the loss weighted but not its
gradient (4 times too large) passes, at 3.3e-7: the blind spot above.

usage: oracle_ex05.py --ex01 EX01_SOLUTION --ex05 EX05_SOLUTION --ddprun DDPRUN
                      --make-corpus MAKE_CORPUS --pp N --schedule gpipe|1f1b|interleaved
                      [--chunks V] [--micro-batches M] --work DIR [--tolerance 1e-5]
"""
import argparse
import json
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_ex01 as ex01  # noqa: E402 (the data, the model and the run's files, read as there)
from verdict import expect, finish  # noqa: E402 (tests/support, on the path oracle_ex01 set)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_runs import clean_env  # noqa: E402 (tests/oracle)

# Small and quick, dropout off (a random mask could not be replayed); 4 blocks for pp 4 and for
# 2 x 2 chunks. The sequence length is oracle_ex01's (its windows read it).
MODEL = dict(d_model=32, heads=2, layers=4, feedforward=64)
STEPS, BATCH, LR = 6, 8, 1e-3
TIMEOUT = 120  # seconds for each run, the kit's and PyTorch's: a hang fails with its own line
FLAGS = ["--batch-size", str(BATCH), "--eval-batch-size", "16", "--seq-len", str(ex01.SEQ_LEN),
         "--dropout", "0", "--seed", "7", "--lr", str(LR), "--epochs", "1"] + \
        [f for k, v in MODEL.items() for f in ("--" + k.replace("_", "-"), str(v))]


# --- The model cut into chunks, as kit/pipeline/stage.h cuts it

def split_layers(layers, chunks):
    """Blocks per chunk: as even as they go, the first chunks one more."""
    return [layers // chunks + (1 if c < layers % chunks else 0) for c in range(chunks)]


class Chunk(nn.Module):
    """Chunk c of a LanguageModel: its blocks, the first chunk also the embedding, the last the
    output layer. The parameters are the model's own (shared, not copied), so the key bias hook
    that LanguageModel registered still holds. Between chunks: [seq, micro-batch, d_model]."""

    def __init__(self, lm, c, chunks):
        super().__init__()
        counts = split_layers(len(lm.encoder.layers), chunks)
        start = sum(counts[:c])
        self.first, self.last, self.d_model = c == 0, c == chunks - 1, lm.d_model
        self.blocks = nn.ModuleList(lm.encoder.layers[start:start + counts[c]])
        if self.first:
            self.embed = lm.embed
            self.register_buffer("positions", lm.positions)
        if self.last:
            self.head = lm.head

    def forward(self, x):
        if self.first:  # what LanguageModel.forward does before its encoder
            seq = x.size(1)
            x = self.embed(x) * math.sqrt(self.d_model) + self.positions[:seq].unsqueeze(0)
            x = x.transpose(0, 1)
        seq = x.size(0)
        causal = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
        for block in self.blocks:  # as nn.TransformerEncoder calls its layers with a causal mask
            x = block(x, src_mask=causal, is_causal=True)
        return self.head(x.transpose(0, 1)) if self.last else x


def loss_fn(logits, target):  # one micro-batch's mean cross-entropy, as ex01.loss_of
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


def worker(work, rank, pp):
    """Rank `rank` of PyTorch's pipeline of `pp`: a process forked from this script, so that it
    does not import torch again (seconds a rank); the ranks meet in a file store."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(work, "store"),
                            rank=rank, world_size=pp)
    with open(os.path.join(work, "config.json")) as f:
        cfg = json.load(f)
    weights = torch.load(os.path.join(work, "initial-weights.pt"), weights_only=False)
    lm = ex01.LanguageModel(weights["embed.weight"].size(0), **MODEL)
    lm.load_state_dict(weights, strict=True)
    v, micro = cfg["chunks"], cfg["micro_batches"]
    total = pp * v
    mine = [c for c in range(total) if c % pp == rank]  # rank r: chunks r, r + pp, ...
    modules = [Chunk(lm, c, total) for c in mine]
    stages = [PipelineStage(m, c, total, torch.device("cpu")) for m, c in zip(modules, mine)]
    if cfg["schedule"] == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, micro, loss_fn=loss_fn)
    else:
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[cfg["schedule"]]
        schedule = kind(stages[0], micro, loss_fn=loss_fn)
    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=LR, foreach=False)
    batches = torch.load(os.path.join(work, "batches.pt"), weights_only=False)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        mb = []
        schedule.step(*([x] if 0 in mine else []), target=y if total - 1 in mine else None,
                      losses=mb if total - 1 in mine else None)
        optimizer.step()
        if mb:
            losses.append(torch.stack([l.detach() for l in mb]).mean())
    d = MODEL["d_model"]
    key_bias = max(b.self_attn.in_proj_bias[d:2 * d].abs().max().item() for m in modules for b in m.blocks)
    torch.save({"losses": torch.stack(losses) if losses else None, "key_bias": key_bias},
               os.path.join(work, f"torch-rank{rank}.pt"))
    dist.destroy_process_group()


def run_pytorch(work, pp):
    """PyTorch's pipeline on pp forked processes; one that fails or hangs fails the test."""
    ctx = multiprocessing.get_context("fork")
    ranks = [ctx.Process(target=worker, args=(work, r, pp)) for r in range(pp)]
    for p in ranks:
        p.start()
    deadline = time.monotonic() + TIMEOUT
    for p in ranks:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in ranks:
        if p.is_alive():
            p.kill()
    codes = [p.exitcode for p in ranks]
    if any(c != 0 for c in codes):
        sys.exit(f"PyTorch's pipeline failed: exit codes {codes} (None: killed after {TIMEOUT} s)")


# --- The kit's runs

def run(cmd, env):
    """Runs a kit program (in a session of its own, so that a hang is killed with its ranks)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        sys.exit(f"{' '.join(cmd[:6])} ... did not finish in {TIMEOUT} s (a hang?): killed\n{out}\n{err}")
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:6])} ... failed (exit {p.returncode}):\n{out}\n{err}")
    return out


def initial_weights(args, data):
    """Exercise 01's one-rank model, from its first (and only) step's trace."""
    trace = os.path.join(args.work, "ex01-trace")
    os.makedirs(trace)
    run([args.ex01, "--data-dir", data, "--out-dir", os.path.join(args.work, "ex01-out"),
         "--max-steps", "1"] + FLAGS, dict(clean_env(), KIT_TRACE_DIR=trace, KIT_TRACE_WEIGHTS="1"))
    found = [n for n in os.listdir(trace) if n.startswith("initial-weights")]
    if len(found) != 1:
        sys.exit(f"exercise 01 wrote no initial weights in {trace} (found {os.listdir(trace)})")
    return os.path.join(trace, found[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ex01")
    ap.add_argument("--ex05")
    ap.add_argument("--ddprun")
    ap.add_argument("--make-corpus")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved"])
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--work")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    torch.set_num_threads(1)
    data = os.path.join(args.work, "data")
    run([args.make_corpus, "--out", data] + ex01.CORPUS, clean_env())
    shutil.copy(initial_weights(args, data), os.path.join(args.work, "initial-weights.pt"))

    trace, out = os.path.join(args.work, "ex05-trace"), os.path.join(args.work, "ex05-out")
    os.makedirs(trace)
    pp_flags = ["--pp", str(args.pp), "--schedule", args.schedule, "--chunks", str(args.chunks),
                "--micro-batches", str(args.micro_batches)]
    run([args.ddprun, "--nproc-per-node", str(args.pp), "--", args.ex05, "--data-dir", data,
         "--out-dir", out, "--max-steps", str(STEPS)] + FLAGS + pp_flags,
        dict(clean_env(), KIT_TRACE_DIR=trace))
    logged = ex01.step_losses(os.path.join(out, "metrics.csv"))
    train = [idx for split, idx in ex01.batches_of(os.path.join(trace, "rank0.trace")) if split == "train"]
    expect(len(train) == STEPS and len(logged) == STEPS,
           f"the kit's run took {STEPS} steps, each with its batch in the trace",
           f"{len(logged)} losses, {len(train)} batches")
    expect(all(len(b) % args.micro_batches == 0 for b in train),
           f"every batch splits into {args.micro_batches} equal micro-batches (where PyTorch's "
           "average of micro-batch gradients is the kit's)", f"batch sizes {[len(b) for b in train]}")
    _, splits = ex01.load_corpus(data)
    torch.save([ex01.batch(splits["train"], b) for b in train], os.path.join(args.work, "batches.pt"))
    with open(os.path.join(args.work, "config.json"), "w") as f:
        json.dump({"schedule": args.schedule, "chunks": args.chunks,
                   "micro_batches": args.micro_batches}, f)
    run_pytorch(args.work, args.pp)

    ranks = [torch.load(os.path.join(args.work, f"torch-rank{r}.pt"), weights_only=False)
             for r in range(args.pp)]
    theirs = ranks[(args.pp * args.chunks - 1) % args.pp]["losses"].tolist()  # the last chunk's rank
    key_bias = max(r["key_bias"] for r in ranks)
    what = f"pp {args.pp}, {args.schedule}" + (f", {args.chunks} chunks per rank" if args.chunks > 1 else "")
    expect(key_bias == 0, "PyTorch's key bias stayed at zero on every rank, as the kit's (the hook held)",
           f"largest |key bias| {key_bias}")
    expect(len(theirs) == len(logged) and abs(theirs[0] - theirs[-1]) > 1e-2,
           "PyTorch ran every step and its loss moves, so the comparison means something",
           f"PyTorch {theirs}")
    worst = max((abs(a - b) / abs(b) for a, b in zip(logged, theirs)), default=float("inf"))
    bad = [(i + 1, a, b) for i, (a, b) in enumerate(zip(logged, theirs)) if not ex01.close(a, b, args.tolerance)]
    expect(not bad and len(theirs) == len(logged),
           f"{what}: the loss at every step matches torch.distributed.pipelining's "
           f"(worst relative difference {worst:.1e}, tolerance {args.tolerance:g})",
           "\n".join(f"step {s}: kit {a:.7f}, PyTorch {b:.7f}" +
                     (" (the first step: are exercise 05's weights exercise 01's?)" if s == 1 else "")
                     for s, a, b in bad[:6]))
    print(f"{what}, {args.micro_batches} micro-batches: {len(logged)} steps, "
          f"worst relative difference {worst:.2e}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
