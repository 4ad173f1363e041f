#!/usr/bin/env python3
"""An independent oracle for exercise 01: PyTorch itself, not the kit, says what the C++ run's
losses must be.

The student check, the fault tests and the Slurm tests compare the kit with the kit: a bug that
shifts every run alike (a wrong loss, a wrong average over ranks, an optimizer step that is not
AdamW's, a tokeniser that numbers words differently) passes them all. This test breaks the circle,
as llm.c checks its C code against PyTorch:

  1. the C++ solution trains on N ranks (ddprun; alone for N = 1) on a small generated corpus,
     with its run trace on (KIT_TRACE_DIR) and KIT_TRACE_WEIGHTS=1, so that every rank saves the
     weights its first step starts from and records which samples each of its batches held;
  2. this script, in Python with the same torch version, re-implements the rest on its own: the
     WikiText tokeniser and vocabulary, the windows of the dataset, the model (torch.nn's
     TransformerEncoder), the loss, DDP's gradient average over ranks and AdamW. It loads those
     initial weights and replays exactly the batches the trace lists;
  3. every per-step loss of rank 0 (metrics.csv), every epoch's train and validation loss and the
     final test loss (the trainer's printed lines: the training loss averaged over ranks, the
     evaluation's that of the whole split, each sample read once) must match within the
     tolerance below.

Only the batch order is taken from the run: the sampler's shuffle is the kit's own choice (tested
elsewhere, tests/student), and a different order would be a different, equally valid training.

Tolerance. Both sides compute in float32 with the same kernels, but not always in the same order
(torch.nn's attention takes the fused scaled_dot_product_attention path, LibTorch's C++ module the
explicit one; DDP averages the ranks' gradients, Python takes the mean of the ranks' losses).
Measured on 2026-11-23 (torch 2.13, CPU): at most 1.8e-7 relative on 1, 2 and 4 ranks over 118,
60 and 30 steps. The test allows 1e-6 on every loss. Most bugs (a wrong loss, tokeniser, model,
optimizer or average of the reported losses) move losses by 1e-2 or more within a step or two.
One kind is nearly invisible here: gradients summed instead of averaged over the ranks, because
AdamW divides every update by the gradient's own scale; planted, it shows as 2.8e-6 on 2 ranks
and 1.2e-6 on 4, just caught. tests/ddp, with SGD, is the test that catches it for sure.

With --clip-grad NORM the run clips its averaged gradient (kit/train/args.h) and the replay calls
torch.nn.utils.clip_grad_norm_ on the averaged gradient before each step: the same 1e-6 holds.

usage: oracle_ex01.py --trainer EX01_SOLUTION --ddprun DDPRUN --make-corpus MAKE_CORPUS
                      --ranks N --work DIR [--tolerance 1e-6] [--clip-grad NORM]
"""
import argparse
import math
import os
import re
import shutil
import subprocess
import sys

import torch
from torch import nn
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish  # noqa: E402 (tests/support)

# The run: small and quick, dropout off (a random mask could not be replayed), the trainer's
# defaults for everything else that matters (AdamW, lr 1e-3: see kit/train/args.h).
MODEL = dict(d_model=32, heads=2, layers=1, feedforward=64)
FLAGS = ["--epochs", "2", "--batch-size", "8", "--eval-batch-size", "16", "--seq-len", "16",
         "--d-model", "32", "--heads", "2", "--layers", "1", "--feedforward", "64",
         "--dropout", "0", "--seed", "7", "--lr", "1e-3"]
SEQ_LEN, EPOCHS, LR = 16, 2, 1e-3
CORPUS = ["--train-tokens", "8000", "--valid-tokens", "1200", "--test-tokens", "1200",
          "--seed", "3"]





# --- The data, read the way the WikiText-2 files are defined (independently of kit/data/wikitext.cpp)

SPACE = re.compile(rb"[ \t\r\v\f]+")


def tokenize(path, vocab, grow):
    """Ids of a WikiText file: each line's words, then <eos>; new words get the next id when
    `grow` (the training split), unknown ones become <unk> otherwise."""
    with open(path, "rb") as f:
        text = f.read()
    lines = text.split(b"\n")
    if text.endswith(b"\n"):
        lines.pop()  # the newline ends the last line; it does not start another
    ids = []
    for line in lines:
        for word in SPACE.split(line):
            if word:
                ids.append(vocab.setdefault(word, len(vocab)) if grow else vocab.get(word, vocab[b"<unk>"]))
        ids.append(vocab.setdefault(b"<eos>", len(vocab)) if grow else vocab[b"<eos>"])
    return torch.tensor(ids, dtype=torch.long)


def load_corpus(directory):
    vocab = {}
    train = tokenize(os.path.join(directory, "wiki.train.tokens"), vocab, True)
    vocab.setdefault(b"<unk>", len(vocab))
    valid = tokenize(os.path.join(directory, "wiki.valid.tokens"), vocab, False)
    test = tokenize(os.path.join(directory, "wiki.test.tokens"), vocab, False)
    return vocab, {"train": train, "valid": valid, "test": test}


def window(ids, index):
    """Sample `index`: seq_len words and, as the target, the same window one word later."""
    start = index * (SEQ_LEN + 1)
    return ids[start:start + SEQ_LEN], ids[start + 1:start + SEQ_LEN + 1]


def batch(ids, indices):
    pairs = [window(ids, i) for i in indices]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


# --- The model, from torch.nn (the C++ side is kit/models/transformer_lm.cpp)

class LanguageModel(nn.Module):
    def __init__(self, vocab_size, d_model, heads, layers, feedforward):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, feedforward, dropout=0.0)  # post-norm, ReLU
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab_size)
        self.register_buffer("positions", torch.zeros(SEQ_LEN, d_model))  # loaded from the run
        # The attention's key bias (the middle third of in_proj_bias) is held at zero, as
        # kit::TransformerLM holds it (see kit/models/transformer_lm.h): it starts at zero (the loaded
        # weights) and its gradient, rounding noise that AdamW would blow up into +-lr steps, is
        # replaced by exact zeros, so it never moves.
        for lay in self.encoder.layers:
            lay.self_attn.in_proj_bias.register_hook(self.no_key_bias_grad)

    def no_key_bias_grad(self, grad):
        grad = grad.clone()
        grad[self.d_model:2 * self.d_model] = 0
        return grad

    def forward(self, tokens):
        seq = tokens.size(1)
        x = self.embed(tokens) * math.sqrt(self.d_model) + self.positions[:seq].unsqueeze(0)
        causal = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
        x = self.encoder(x.transpose(0, 1), mask=causal).transpose(0, 1)
        return self.head(x)


def loss_of(model, x, y):
    logits = model(x)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


# --- What the C++ run did

def run_trainer(args, data, ranks):
    trace, out = os.path.join(args.work, "trace"), os.path.join(args.work, "out")
    os.makedirs(trace)
    env = dict(os.environ, KIT_TRACE_DIR=trace, KIT_TRACE_WEIGHTS="1", OMP_NUM_THREADS="1")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        env.pop(var, None)
    cmd = [args.trainer, "--data-dir", data, "--out-dir", out] + FLAGS
    if args.clip_grad > 0:
        cmd += ["--clip-grad", repr(args.clip_grad)]
    if ranks > 1:
        cmd = [args.ddprun, "--nproc-per-node", str(ranks), "--"] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"the trainer failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
    if ranks == 1:  # alone, without a launcher, the trace is named after the pid
        for name in os.listdir(trace):
            rank0 = re.sub(r"pid[0-9]+", "rank0", name)
            os.rename(os.path.join(trace, name), os.path.join(trace, rank0))
    return trace, out, p.stdout


def batches_of(trace_file):
    """[(split, [sample indices])] in the order the rank read them."""
    found = []
    with open(trace_file) as f:
        for line in f:
            if line.startswith("batch "):
                _, split, idx = line.split(" ", 2)
                found.append((split, [int(i) for i in idx.strip().split(",") if i]))
    return found


def passes(batches):
    """Consecutive batches of one split form a pass: [(split, [[indices], ...])]."""
    out = []
    for split, idx in batches:
        if not out or out[-1][0] != split:
            out.append((split, []))
        out[-1][1].append(idx)
    return out


def step_losses(metrics_csv):
    with open(metrics_csv) as f:
        header = f.readline().strip().split(",")
        rows = [dict(zip(header, line.strip().split(","))) for line in f if line.strip()]
    return [float(r["loss"]) for r in rows if not r.get("rank")]


def printed(stdout):
    epochs = [tuple(map(float, m.groups())) for m in
              re.finditer(r"train loss ([0-9.]+), validation loss ([0-9.]+)", stdout)]
    test = [float(m.group(1)) for m in re.finditer(r"final test loss ([0-9.]+)", stdout)]
    return epochs, test


# --- The replay

def close(a, b, tol):
    return abs(a - b) <= tol * max(abs(b), 1e-12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--make-corpus", required=True)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tolerance", type=float, default=1e-6)
    ap.add_argument("--clip-grad", type=float, default=0,
                    help="pass --clip-grad to the run; PyTorch clips with clip_grad_norm_")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    torch.set_num_threads(1)
    data = os.path.join(args.work, "data")
    subprocess.run([args.make_corpus, "--out", data] + CORPUS, check=True, capture_output=True)

    trace, out, stdout = run_trainer(args, data, args.ranks)
    vocab, splits = load_corpus(data)
    weights = torch.load(os.path.join(trace, "initial-weights-rank0.pt"), weights_only=False)
    expect(weights["embed.weight"].size(0) == len(vocab),
           f"the oracle's vocabulary has the run's size ({len(vocab)} words)",
           f"run: {weights['embed.weight'].size(0)}")
    model = LanguageModel(len(vocab), **MODEL)
    model.load_state_dict(weights, strict=True)  # every name and shape must match kit's model
    d = MODEL["d_model"]
    expect(all(not lay.self_attn.in_proj_bias[d:2 * d].any() for lay in model.encoder.layers),
           "the run's attention key bias starts at zero (kit/models/transformer_lm.h)")
    # Plain AdamW, one tensor at a time (foreach=False): the C++ optimizer's arithmetic.
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)

    per_rank = [passes(batches_of(os.path.join(trace, f"rank{r}.trace"))) for r in range(args.ranks)]
    expect(all(len(p) == len(per_rank[0]) for p in per_rank), "every rank read the same passes")
    logged = step_losses(os.path.join(out, "metrics.csv"))
    epochs, test = printed(stdout)

    mine_steps, mine_epochs, mine_test = [], [], []
    clipped = 0  # steps whose gradient --clip-grad scaled down
    train_means = None
    for k, (split, _) in enumerate(per_rank[0]):
        rank_batches = [per_rank[r][k][1] for r in range(args.ranks)]
        if split == "train":
            model.train()
            sums = [0.0] * args.ranks
            for step in range(len(rank_batches[0])):
                optimizer.zero_grad()
                # DDP: each rank's mean loss on its own batch; the gradients are averaged.
                losses = [loss_of(model, *batch(splits["train"], rank_batches[r][step]))
                          for r in range(args.ranks)]
                (sum(losses) / args.ranks).backward()
                if args.clip_grad > 0:  # on the averaged gradient, as the C++ run after DDP's
                    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad, foreach=False)
                    clipped += int(norm.item() > args.clip_grad)
                optimizer.step()
                mine_steps.append(losses[0].item())
                for r in range(args.ranks):
                    sums[r] += losses[r].item()
            train_means = [s / len(rank_batches[0]) for s in sums]
        else:
            model.eval()
            # Evaluation is of the whole split: every sample once (no padding), whichever rank
            # read it, and the loss is the sum over every word divided by the number of words.
            read = sorted(i for b in rank_batches for idx in b for i in idx)
            expect(read == list(range(len(read))) and
                   len(read) == len(splits[split]) // (SEQ_LEN + 1),
                   f"pass {k + 1} ({split}): the ranks together read every sample once",
                   f"read {len(read)} samples, {len(read) - len(set(read))} of them twice")
            with torch.no_grad():
                total, words = 0.0, 0
                for b in (idx for r in range(args.ranks) for idx in rank_batches[r]):
                    x, y = batch(splits[split], b)
                    total += loss_of(model, x, y).double().item() * y.numel()
                    words += y.numel()
            value = total / words  # all_reduce(SUM) of the ranks' [loss sum, word count]
            if split == "valid":
                mine_epochs.append((sum(train_means) / args.ranks, value))
            else:
                mine_test.append(value)

    expect(len(mine_steps) == len(logged) and len(logged) > 20,
           f"the replay has the run's {len(logged)} training steps", f"replayed {len(mine_steps)}")
    if args.clip_grad > 0:
        expect(clipped >= len(mine_steps) // 2,
               f"--clip-grad {args.clip_grad:g} clips most steps, so the comparison tests it",
               f"{clipped} of {len(mine_steps)} steps clipped")
    expect(abs(logged[0] - logged[-1]) > 0.1, "the run trains (the loss moves), so the comparison means something",
           f"first {logged[:1]}, last {logged[-1:]}")
    worst = max((abs(a - b) / abs(b) for a, b in zip(logged, mine_steps)), default=float("inf"))
    bad = [(i + 1, a, b) for i, (a, b) in enumerate(zip(logged, mine_steps)) if not close(a, b, args.tolerance)]
    expect(not bad, f"rank 0's loss at every step matches PyTorch (worst relative difference {worst:.1e}, "
           f"tolerance {args.tolerance:g})",
           "\n".join(f"step {s}: C++ {a:.7f}, PyTorch {b:.7f}" for s, a, b in bad[:5]))
    # The printed figures have 5 decimals: allow that rounding on top of the tolerance.
    def near(a, b):
        return abs(a - b) <= args.tolerance * abs(b) + 6e-6
    expect(len(epochs) == EPOCHS and len(mine_epochs) == EPOCHS and
           all(near(a, b) for e, m in zip(epochs, mine_epochs) for a, b in zip(e, m)),
           "every epoch's train and validation loss (averaged over ranks) matches PyTorch",
           f"C++ {epochs}\nPyTorch {[(round(a, 5), round(b, 5)) for a, b in mine_epochs]}")
    expect(len(test) == 1 and len(mine_test) == 1 and near(test[0], mine_test[0]),
           "the final test loss matches PyTorch", f"C++ {test}, PyTorch {mine_test}")
    print(f"ranks {args.ranks}{f', --clip-grad {args.clip_grad:g} ({clipped} steps clipped)' if args.clip_grad > 0 else ''}: "
          f"{len(logged)} steps, worst per-step relative difference {worst:.2e}; "
          f"final test loss C++ {test[0] if test else '?'} vs PyTorch {mine_test[0] if mine_test else float('nan'):.5f}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
