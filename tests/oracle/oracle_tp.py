#!/usr/bin/env python3
"""An independent oracle for the kit's tensor parallelism: PyTorch's own
(torch.distributed.tensor.parallel: ColwiseParallel and RowwiseParallel on a DeviceMesh, Gloo,
CPU) trains the same model from the same weights on the same batches.

  1. kit_tp_probe (tests/oracle/tp_probe.cpp) trains kit::ParallelTransformerLM on N ranks, tp = N
     (ddprun), with its run trace on; it writes the weights it starts from (gathered from its
     shards into exercise 01's TransformerLM names), the batches, each rank's per-step loss and,
     after the first backward, each rank's shard of every gradient and where that shard sits in
     the tp = 1 tensor;
  2. this script, on N ranks of its own (ddprun again, torch.distributed on Gloo), builds the model
     in Python with q, k and v as separate nn.Linear layers (ColwiseParallel takes only nn.Linear
     and nn.Embedding: on nn.MultiheadAttention, torch 2.13 raises NotImplementedError; and a row
     split of its packed [3 d, d] matrix would not follow the heads), loads those weights, and lets
     parallelize_module split every block: q, k, v and linear1 ColwiseParallel, the attention's
     output projection and linear2 RowwiseParallel; embedding, norms and head stay whole, as in
     the kit. Each rank computes its heads' attention on local tensors. AdamW (foreach=False, the
     C++ optimizer's arithmetic) steps the DTensors and the plain tensors alike;
  3. checked: every per-step loss of every kit rank against PyTorch's within --tolerance
     (relative; default 1e-5); every kit rank's shard of every gradient after the first backward
     against the same elements of PyTorch's gradient (DTensor.full_tensor()), within
     --grad-tolerance of the gradient's largest element; and, from the kit's trace, Megatron's
     count: 2 all-reduces in forward and 2 in backward per block and step on the tp group, each of
     [batch, seq, d_model] floats, made at the line of tp_probe.cpp that built the model, and none
     on the world.

The attention's key bias is held at zero on both sides (kit/models/transformer_lm.h says why):
the kit uses zeros in its place, PyTorch gets a gradient hook that returns zeros.

usage: oracle_tp.py --probe KIT_TP_PROBE --ddprun DDPRUN --ranks N --work DIR
                    [--tolerance 1e-5] [--grad-tolerance 1e-5]
       (oracle_tp.py --worker DIR: one rank of PyTorch's run, started by the above)
"""
import argparse
import math
import os
import re
import shutil
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish  # noqa: E402 (tests/support)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_runs import clean_env, collectives, run  # noqa: E402 (tests/oracle)

MODEL = dict(d_model=32, heads=4, layers=2, feedforward=64, vocab=97, seq=16)
BATCH, STEPS, SEED, LR = 4, 4, 5, 1e-3


class Block(nn.Module):
    """torch's post-norm TransformerEncoderLayer (ReLU, no dropout), with q, k, v apart."""

    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads  # this rank's, once parallelized
        self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))
        self.linear1, self.linear2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x, mask):
        b, t, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)  # [b, t, this rank's heads x head_dim]
        hd = q.shape[-1] // self.heads

        def per_head(z):
            return z.reshape(b, t, self.heads, hd).transpose(1, 2)

        q = per_head(q * (1 / math.sqrt(hd)))
        weights = torch.softmax(q @ per_head(k).transpose(-2, -1) + mask, dim=-1)
        mixed = (weights @ per_head(v)).transpose(1, 2).reshape(b, t, -1)
        x = self.norm1(x + self.out(mixed))
        return self.norm2(x + self.linear2(torch.relu(self.linear1(x))))


class LanguageModel(nn.Module):
    def __init__(self, vocab, d_model, heads, layers, feedforward, seq):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, feedforward) for _ in range(layers))
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("positions", torch.zeros(seq, d_model))

    def forward(self, tokens):
        t = tokens.size(1)
        x = self.embed(tokens) * math.sqrt(self.d_model) + self.positions[:t].unsqueeze(0)
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)

    def load_kit(self, w):
        """The kit's weights, in exercise 01's TransformerLM names."""
        d = self.d_model
        with torch.no_grad():
            self.embed.weight.copy_(w["embed.weight"])
            self.head.weight.copy_(w["head.weight"])
            self.head.bias.copy_(w["head.bias"])
            self.positions.copy_(w["positions"][:self.positions.size(0)])
            for i, blk in enumerate(self.blocks):
                p = f"encoder.layers.{i}."
                for j, lin in enumerate((blk.q, blk.k, blk.v)):
                    lin.weight.copy_(w[p + "self_attn.in_proj_weight"][j * d:(j + 1) * d])
                    lin.bias.copy_(w[p + "self_attn.in_proj_bias"][j * d:(j + 1) * d])
                for mine, theirs in ((blk.out, "self_attn.out_proj"), (blk.linear1, "linear1"),
                                     (blk.linear2, "linear2"), (blk.norm1, "norm1"), (blk.norm2, "norm2")):
                    mine.weight.copy_(w[p + theirs + ".weight"])
                    mine.bias.copy_(w[p + theirs + ".bias"])

    def full_grads(self):
        """Every gradient, whole (DTensor.full_tensor(): collective), in TransformerLM's names."""
        def whole(t):
            return t.full_tensor() if hasattr(t, "full_tensor") else t

        g = {"embed.weight": whole(self.embed.weight.grad), "head.weight": whole(self.head.weight.grad),
             "head.bias": whole(self.head.bias.grad)}
        for i, blk in enumerate(self.blocks):
            p = f"encoder.layers.{i}."
            g[p + "self_attn.in_proj_weight"] = torch.cat([whole(l.weight.grad) for l in (blk.q, blk.k, blk.v)])
            g[p + "self_attn.in_proj_bias"] = torch.cat([whole(l.bias.grad) for l in (blk.q, blk.k, blk.v)])
            for mine, theirs in ((blk.out, "self_attn.out_proj"), (blk.linear1, "linear1"),
                                 (blk.linear2, "linear2"), (blk.norm1, "norm1"), (blk.norm2, "norm2")):
                g[p + theirs + ".weight"] = whole(mine.weight.grad)
                g[p + theirs + ".bias"] = whole(mine.bias.grad)
        return g


def worker(work):
    """One rank of PyTorch's tensor-parallel run (under ddprun: RANK, WORLD_SIZE, MASTER_*)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    tp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    model = LanguageModel(MODEL["vocab"], MODEL["d_model"], MODEL["heads"], MODEL["layers"],
                          MODEL["feedforward"], MODEL["seq"])
    model.load_kit(torch.load(os.path.join(work, "kit", "weights.pt"), weights_only=False))
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
            "out": RowwiseParallel(), "linear1": ColwiseParallel(), "linear2": RowwiseParallel()}
    for blk in model.blocks:
        parallelize_module(blk, mesh, plan)
        blk.heads = MODEL["heads"] // tp
        blk.k.bias.register_hook(torch.zeros_like)  # the key bias held at zero, as the kit holds it
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, foreach=False)
    batches = torch.load(os.path.join(work, "kit", "batches.pt"), weights_only=False)
    losses, grads = [], None
    for k in range(STEPS):
        x, y = batches[f"input{k}"], batches[f"target{k}"]
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        if k == 0:
            grads = model.full_grads()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    if dist.get_rank() == 0:
        torch.save({"losses": torch.stack(losses), "grads": grads}, os.path.join(work, "torch.pt"))
    dist.destroy_process_group()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker")
    ap.add_argument("--probe")
    ap.add_argument("--ddprun")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--work")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    ap.add_argument("--grad-tolerance", type=float, default=1e-5)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    shutil.rmtree(args.work, ignore_errors=True)
    kit_dir, trace = os.path.join(args.work, "kit"), os.path.join(args.work, "trace")
    os.makedirs(kit_dir)
    os.makedirs(trace)
    n = args.ranks
    flags = ["--out", kit_dir, "--steps", str(STEPS), "--seed", str(SEED), "--batch", str(BATCH),
             "--d-model", str(MODEL["d_model"]), "--heads", str(MODEL["heads"]),
             "--layers", str(MODEL["layers"]), "--feedforward", str(MODEL["feedforward"]),
             "--vocab", str(MODEL["vocab"]), "--seq", str(MODEL["seq"])]
    run([args.ddprun, "--nproc-per-node", str(n), "--", args.probe] + flags,
        dict(clean_env(), KIT_TRACE_DIR=trace))
    run([args.ddprun, "--nproc-per-node", str(n), "--", sys.executable, os.path.abspath(__file__),
         "--worker", args.work], clean_env())

    ref = torch.load(os.path.join(args.work, "torch.pt"), weights_only=False)
    kit = [torch.load(os.path.join(kit_dir, f"rank{r}.pt"), weights_only=False) for r in range(n)]
    mine = [[kit[r][f"loss{k}"].item() for k in range(STEPS)] for r in range(n)]
    theirs = ref["losses"].tolist()
    worst = max(abs(a - b) / abs(b) for m in mine for a, b in zip(m, theirs))
    expect(abs(theirs[0] - theirs[-1]) > 1e-3, "the run trains (the loss moves), so the comparison means something",
           f"losses {theirs}")
    expect(worst <= args.tolerance,
           f"tp {n}: every rank's loss at every step matches PyTorch's tensor parallelism "
           f"(worst relative difference {worst:.1e}, tolerance {args.tolerance:g})",
           "\n".join(f"rank {r}: kit {m}" for r, m in enumerate(mine)) + f"\nPyTorch {theirs}")

    worst_grad, bad = 0.0, []
    for r in range(n):
        for key in kit[r]:
            if not key.startswith("grad/"):
                continue
            name = key[len("grad/"):]
            full = bytes(kit[r]["full/" + name].tolist()).decode()
            want = ref["grads"][full].reshape(-1)[kit[r]["index/" + name]].reshape(kit[r][key].shape)
            scale = max(want.abs().max().item(), 1e-12)
            diff = (kit[r][key] - want).abs().max().item() / scale
            worst_grad = max(worst_grad, diff)
            if diff > args.grad_tolerance:
                bad.append(f"rank {r} {name} ({full}): {diff:.1e}")
    expect(not bad, f"tp {n}: every rank's shard of every gradient after the first backward is "
           f"PyTorch's gradient there (worst {worst_grad:.1e} of the gradient's largest element, "
           f"tolerance {args.grad_tolerance:g})", "\n".join(bad[:10]))

    # Megatron's count, from the kit's trace: per block and step 2 all-reduces forward, 2 backward.
    d, layers = MODEL["d_model"], MODEL["layers"]
    tp_group = ",".join(str(r) for r in range(n))
    made_at = None
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp_probe.cpp")) as f:
        for i, line in enumerate(f, 1):
            if "kit::ParallelTransformerLM model(" in line:
                made_at = f"tp_probe.cpp:{i}"
    for r in range(n):
        coll = collectives(os.path.join(trace, f"rank{r}.trace"))
        tp_reduces = [c for c in coll if c["group"] == tp_group and c["kind"] == "all_reduce"]
        expect(len(tp_reduces) == 4 * layers * STEPS and
               all(c["shape"] == f"[{BATCH},{MODEL['seq']},{d}]" and c["site"] == made_at for c in tp_reduces),
               f"rank {r}: {4 * layers * STEPS} all-reduces of [{BATCH},{MODEL['seq']},{d}] on the tp group "
               f"{tp_group} ({layers} blocks x 4 x {STEPS} steps), each naming {made_at}",
               f"{len(tp_reduces)}: {sorted(set((c['shape'], c['site']) for c in tp_reduces))}")
        on_world = [c for c in coll if c["group"] == "world" and c["kind"] == "all_reduce"]
        expect(not on_world, f"rank {r}: no all-reduce on the world", str(on_world[:3]))
    print(f"tp {n}: {STEPS} steps, losses within {worst:.1e} of PyTorch's, gradients within {worst_grad:.1e}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
