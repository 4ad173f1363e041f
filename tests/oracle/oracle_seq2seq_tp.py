#!/usr/bin/env python3
"""An independent oracle for tensor parallelism on the summariser's model (kit/seq2seq/parallel.h):
PyTorch's own (torch.distributed.tensor.parallel: ColwiseParallel and RowwiseParallel on a
DeviceMesh, Gloo, CPU) trains the same encoder-decoder from the same weights on the same batches.

  1. kit_seq2seq_tp_probe (tests/oracle/seq2seq_tp_probe.cpp) trains kit::ParallelSeq2Seq on N
     ranks, tp = N (ddprun), with its run trace on, for 3 SGD steps on padded batches; it writes
     the starting weights (kit::Seq2Seq's, under torch.nn.Transformer's names), the batches, each
     rank's per-step loss and every weight after the last step as write_full() gathers it;
  2. this script, on N ranks of its own (ddprun again, torch.distributed on Gloo), builds the same
     post-norm encoder-decoder in Python, batch-first, with every attention's q, k and v as
     separate nn.Linear layers (ColwiseParallel takes only nn.Linear and nn.Embedding: on
     nn.MultiheadAttention, torch 2.13 raises NotImplementedError), loads those weights, and lets
     parallelize_module split every layer: q, k, v (in cross-attention k and v read the
     encoder's memory) and linear1 ColwiseParallel, each attention's output projection and
     linear2 RowwiseParallel; the tied embedding, the positions and the norms stay whole, as in
     the kit. Each rank computes its heads' attention on local tensors. SGD (lr 0.5: a step is
     the gradient itself, so the weights after it show every gradient) steps DTensors and plain
     tensors alike;
  3. checked: every kit rank's loss at every step against PyTorch's, and every weight after the
     last step against PyTorch's (DTensor.full_tensor()), within --tolerance relative to the
     tensor's largest element (default 1e-5); that the steps moved the weights; and, from the
     kit's trace, the all-reduces on the tp group named with the probe's line that made the
     model: per step 4 per encoder layer (2 forward, 2 backward) and 7 per decoder layer (3
     forward; 4 backward: the memory's gradient from cross-attention's k and v is one of them).

Measured on 2026-11-28 (torch 2.13, CPU): at tp 2 the losses equal, the weights within 4.4e-7;
at tp 4 within 6.2e-7. Planted on PyTorch's side: cross-attention's padding mask left out moves
the losses by 3.9e-2 and the weights by 0.65 (both checks fail).

usage: oracle_seq2seq_tp.py --probe KIT_SEQ2SEQ_TP_PROBE --ddprun DDPRUN --ranks N --work DIR
                            [--tolerance 1e-5]
       (oracle_seq2seq_tp.py --worker DIR: one rank of PyTorch's run, started by the above)
"""
import argparse
import math
import os
import shutil
import sys

import torch
from torch import nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish  # noqa: E402 (tests/support)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_runs import clean_env, collectives, run  # noqa: E402 (tests/oracle)

# seq2seq_tp_probe.cpp's model and run.
MODEL = dict(vocab=37, d_model=32, heads=4, encoder_layers=2, decoder_layers=2, feedforward=48)
PAD, STEPS, SEED, LR = 0, 3, 5, 0.5


class Attention(nn.Module):
    """torch's MultiheadAttention (no dropout) with q, k and v apart, batch-first."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads  # this rank's, once parallelized
        self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x, memory, mask, key_pad):
        b, n, s = x.size(0), x.size(1), memory.size(1)
        q, k, v = self.q(x), self.k(memory), self.v(memory)  # [b, len, this rank's heads x hd]
        hd = q.shape[-1] // self.heads

        def per_head(z, length):
            return z.reshape(b, length, self.heads, hd).transpose(1, 2)

        scores = per_head(q * (1 / math.sqrt(hd)), n) @ per_head(k, s).transpose(-2, -1)
        if mask is not None:
            scores = scores + mask
        scores = scores.masked_fill(key_pad.view(b, 1, 1, s), float("-inf"))
        mixed = (torch.softmax(scores, dim=-1) @ per_head(v, s)).transpose(1, 2).reshape(b, n, -1)
        return self.out(mixed)


class Layer(nn.Module):
    """torch's post-norm TransformerEncoderLayer, or TransformerDecoderLayer with `cross`."""

    def __init__(self, d, heads, ff, cross):
        super().__init__()
        self.self_attn = Attention(d, heads)
        self.cross_attn = Attention(d, heads) if cross else None
        self.linear1, self.linear2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(3 if cross else 2))

    def forward(self, x, memory, causal, self_pad, memory_pad):
        x = self.norms[0](x + self.self_attn(x, x, causal, self_pad))
        if self.cross_attn is not None:
            x = self.norms[1](x + self.cross_attn(x, memory, None, memory_pad))
        return self.norms[-1](x + self.linear2(torch.relu(self.linear1(x))))


class Summariser(nn.Module):
    def __init__(self, vocab, d_model, heads, encoder_layers, decoder_layers, feedforward):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        self.encoder = nn.ModuleList(Layer(d_model, heads, feedforward, False) for _ in range(encoder_layers))
        self.decoder = nn.ModuleList(Layer(d_model, heads, feedforward, True) for _ in range(decoder_layers))
        self.encoder_norm, self.decoder_norm = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.register_buffer("positions", torch.zeros(1, d_model))

    def embed_ids(self, ids):
        return self.embed(ids) * math.sqrt(self.d_model) + self.positions[:ids.size(1)].unsqueeze(0)

    def forward(self, src, tgt_in):
        src_pad, tgt_pad = src.eq(PAD), tgt_in.eq(PAD)
        memory = self.embed_ids(src)
        for layer in self.encoder:
            memory = layer(memory, None, None, src_pad, None)
        memory = self.encoder_norm(memory)
        t = tgt_in.size(1)
        causal = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        h = self.embed_ids(tgt_in)
        for layer in self.decoder:
            h = layer(h, memory, causal, tgt_pad, src_pad)
        return F.linear(self.decoder_norm(h), self.embed.weight)  # the tied output projection

    def places(self):
        """(torch.nn.Transformer's name prefix, this model's attention or layer) pairs."""
        for stack, layers in (("encoder", self.encoder), ("decoder", self.decoder)):
            for i, layer in enumerate(layers):
                p = f"transformer.{stack}.layers.{i}."
                yield p, layer

    def load_kit(self, w):
        """The kit's starting weights, under torch.nn.Transformer's names."""
        d = self.d_model
        with torch.no_grad():
            self.embed.weight.copy_(w["embed.weight"])
            self.positions = w["positions"].clone()
            for p, layer in self.places():
                for theirs, attn in (("self_attn", layer.self_attn), ("multihead_attn", layer.cross_attn)):
                    if attn is None:
                        continue
                    for j, lin in enumerate((attn.q, attn.k, attn.v)):
                        lin.weight.copy_(w[p + theirs + ".in_proj_weight"][j * d:(j + 1) * d])
                        lin.bias.copy_(w[p + theirs + ".in_proj_bias"][j * d:(j + 1) * d])
                    attn.out.weight.copy_(w[p + theirs + ".out_proj.weight"])
                    attn.out.bias.copy_(w[p + theirs + ".out_proj.bias"])
                for j, norm in enumerate(layer.norms):
                    norm.weight.copy_(w[p + f"norm{j + 1}.weight"])
                    norm.bias.copy_(w[p + f"norm{j + 1}.bias"])
                for lin in ("linear1", "linear2"):
                    getattr(layer, lin).weight.copy_(w[p + lin + ".weight"])
                    getattr(layer, lin).bias.copy_(w[p + lin + ".bias"])
            for stack, norm in (("encoder", self.encoder_norm), ("decoder", self.decoder_norm)):
                norm.weight.copy_(w[f"transformer.{stack}.norm.weight"])
                norm.bias.copy_(w[f"transformer.{stack}.norm.bias"])

    def full_weights(self):
        """Every weight, whole (DTensor.full_tensor(): collective), under torch's names."""
        def whole(t):
            t = t.detach()
            return t.full_tensor() if hasattr(t, "full_tensor") else t

        out = {"embed.weight": whole(self.embed.weight)}
        for p, layer in self.places():
            for theirs, attn in (("self_attn", layer.self_attn), ("multihead_attn", layer.cross_attn)):
                if attn is None:
                    continue
                out[p + theirs + ".in_proj_weight"] = torch.cat([whole(l.weight) for l in (attn.q, attn.k, attn.v)])
                out[p + theirs + ".in_proj_bias"] = torch.cat([whole(l.bias) for l in (attn.q, attn.k, attn.v)])
                out[p + theirs + ".out_proj.weight"] = whole(attn.out.weight)
                out[p + theirs + ".out_proj.bias"] = whole(attn.out.bias)
            for j, norm in enumerate(layer.norms):
                out[p + f"norm{j + 1}.weight"] = whole(norm.weight)
                out[p + f"norm{j + 1}.bias"] = whole(norm.bias)
            for lin in ("linear1", "linear2"):
                out[p + lin + ".weight"] = whole(getattr(layer, lin).weight)
                out[p + lin + ".bias"] = whole(getattr(layer, lin).bias)
        for stack, norm in (("encoder", self.encoder_norm), ("decoder", self.decoder_norm)):
            out[f"transformer.{stack}.norm.weight"] = whole(norm.weight)
            out[f"transformer.{stack}.norm.bias"] = whole(norm.bias)
        return out


def worker(work):
    """One rank of PyTorch's tensor-parallel run (under ddprun: RANK, WORLD_SIZE, MASTER_*)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    tp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    model = Summariser(**MODEL)
    model.load_kit(torch.load(os.path.join(work, "kit", "weights.pt"), weights_only=False))
    for _, layer in model.places():
        plan = {"linear1": ColwiseParallel(), "linear2": RowwiseParallel()}
        for name in ("self_attn", "cross_attn"):
            if getattr(layer, name) is not None:
                plan.update({f"{name}.q": ColwiseParallel(), f"{name}.k": ColwiseParallel(),
                             f"{name}.v": ColwiseParallel(), f"{name}.out": RowwiseParallel()})
                getattr(layer, name).heads = MODEL["heads"] // tp
        parallelize_module(layer, mesh, plan)
    start = {k: v.clone() for k, v in model.full_weights().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    batches = torch.load(os.path.join(work, "kit", "batches.pt"), weights_only=False)
    losses = []
    for k in range(STEPS):
        logits = model(batches[f"src{k}"], batches[f"tgt_in{k}"])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batches[f"tgt_out{k}"].reshape(-1),
                               ignore_index=PAD)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    final = model.full_weights()
    if dist.get_rank() == 0:
        torch.save({"losses": torch.stack(losses), "final": final, "start": start},
                   os.path.join(work, "torch.pt"))
    dist.destroy_process_group()
    return 0


def relative(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker")
    ap.add_argument("--probe")
    ap.add_argument("--ddprun")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--work")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    shutil.rmtree(args.work, ignore_errors=True)
    kit_dir, trace = os.path.join(args.work, "kit"), os.path.join(args.work, "trace")
    os.makedirs(kit_dir)
    os.makedirs(trace)
    n = args.ranks
    run([args.ddprun, "--nproc-per-node", str(n), "--", args.probe, "--out", kit_dir,
         "--steps", str(STEPS), "--seed", str(SEED)], dict(clean_env(), KIT_TRACE_DIR=trace))
    run([args.ddprun, "--nproc-per-node", str(n), "--", sys.executable, os.path.abspath(__file__),
         "--worker", args.work], clean_env())

    ref = torch.load(os.path.join(args.work, "torch.pt"), weights_only=False)
    kit = [torch.load(os.path.join(kit_dir, f"rank{r}.pt"), weights_only=False) for r in range(n)]
    mine = [[kit[r][f"loss{k}"].item() for k in range(STEPS)] for r in range(n)]
    theirs = ref["losses"].tolist()
    worst = max(abs(a - b) / abs(b) for m in mine for a, b in zip(m, theirs))
    expect(worst <= args.tolerance,
           f"tp {n}: every rank's loss at every step matches PyTorch's tensor parallelism "
           f"(worst relative difference {worst:.1e}, tolerance {args.tolerance:g})",
           "\n".join(f"rank {r}: kit {m}" for r, m in enumerate(mine)) + f"\nPyTorch {theirs}")

    # (the biases that start at zero left out: relative to nothing)
    moved = min(relative(ref["final"][k], ref["start"][k]) for k in ref["final"]
                if ref["start"][k].abs().max() > 0)
    expect(moved > 1e-4, f"the {STEPS} SGD steps move every weight (each tensor by at least "
           f"{moved:.1e} of its largest element), so comparing them after the steps compares "
           "every gradient", "")
    worst_w, bad, missing = 0.0, [], []
    for r in range(n):
        for name, want in ref["final"].items():
            got = kit[r].get("final/" + name)
            if got is None:
                missing.append(f"rank {r}: {name}")
                continue
            diff = relative(got, want)
            worst_w = max(worst_w, diff)
            if diff > args.tolerance:
                bad.append(f"rank {r} {name}: {diff:.1e}")
    expect(not missing and not bad,
           f"tp {n}: every rank's weights after {STEPS} steps, gathered by write_full(), are "
           f"PyTorch's (worst {worst_w:.1e} of the tensor's largest element, tolerance "
           f"{args.tolerance:g})", "\n".join((missing + bad)[:10]))

    # The all-reduces of the model's layers on the tp group: 4 per encoder layer, 7 per decoder.
    tp_group = ",".join(str(r) for r in range(n))
    made_at = None
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "seq2seq_tp_probe.cpp")) as f:
        for i, line in enumerate(f, 1):
            if "kit::ParallelSeq2Seq model(" in line:
                made_at = f"seq2seq_tp_probe.cpp:{i}"
    want = (4 * MODEL["encoder_layers"] + 7 * MODEL["decoder_layers"]) * STEPS
    for r in range(n):
        coll = collectives(os.path.join(trace, f"rank{r}.trace"))
        reduces = [c for c in coll if c["kind"] == "all_reduce" and c.get("site") == made_at]
        expect(len(reduces) == want and all(c["group"] == tp_group for c in reduces),
               f"rank {r}: {want} all-reduces on the tp group {tp_group} named {made_at} "
               f"({MODEL['encoder_layers']} encoder layers x 4 + {MODEL['decoder_layers']} decoder "
               f"layers x 7, x {STEPS} steps)",
               f"found {len(reduces)}, groups {sorted(set(c['group'] for c in reduces))}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
