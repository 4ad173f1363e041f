#!/usr/bin/env python3
"""bench_ddp.py -- the Python reference for bench_ddp (issue 2): the same model, sizes and step,
with torch.nn.parallel.DistributedDataParallel on Gloo.

    .venv/bin/python bench_ddp.py --vocab V [flags]                       one process, no DDP
    ddprun --nproc-per-node 2 -- .venv/bin/python bench_ddp.py --vocab V  2 ranks, torch DDP
    ddprun --nproc-per-node 1 -- python3 bench_ddp.py --device cuda --ddp on
                                                                          torch DDP, 1 GPU rank

Under ddprun the ranks join with init_method="env://": ddprun sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT, which is all env:// reads. Run it with the Python whose torch is the
C++ side's LibTorch (the build's KIT_TORCH_PYTHON; for ./kit's build, .venv/bin/python), so that
both sides run the same torch version.

Model = kit::TransformerLM (common/kit/models/transformer_lm.cpp): nn.Embedding, embedding * sqrt(d),
+ the same sinusoidal position codes (a buffer), dropout, nn.TransformerEncoder of post-norm
ReLU nn.TransformerEncoderLayer (sequence-first, as the C++ module) with the causal mask,
nn.Linear head; cross entropy. Trainer defaults: d_model 128, 4 heads, 2 layers, feed-forward
256, dropout 0.1, seq_len 64, batch 16 per rank, AdamW lr 1e-3.

DDP: torch's defaults (1 MiB first bucket, 25 MiB buckets, gradients copied into buckets and
back) except broadcast_buffers=False: the kit broadcasts the buffers once at construction, torch
would re-broadcast the position codes before every forward.

Output: one BENCH line on rank 0, the same fields as bench_ddp.cpp. torch's DDP exposes no
"waiting after backward" figure, so wait_ms is measured as tail_ms: from the last parameter
gradient autograd produced (a tensor hook) to the return of loss.backward(), which is where
torch's reducer waits for its buckets and copies the averages back into .grad.

The overhead parts, as bench_ddp.cpp prints them (see its header for the kit's side):
  copy_ms    torch's DDP copies every gradient into its bucket (dividing by the world size) and,
             after the all-reduce, back into .grad; it has no counter for that, so this is an
             estimate: the same two copies replayed on this run's gradients after the timed steps
             (median of 10);
  reduce_ms  torch's own "backward_comm_time" (DDP logging data): first bucket's all-reduce started
             to the last one finished, the kit's definition too. Recorded for every step because
             the run sets the logging sample rate to 1 (default: the first 10 iterations, then
             every 100th), a few clock reads per step;
  loopback_ms / loopback_mb_per_s: one all-reduce (SUM) of the gradients' bytes alone.

--device as bench_ddp.cpp: auto (cuda:LOCAL_RANK and NCCL where a GPU is visible, else the CPU
and Gloo), cpu (the GPUs hidden), or cuda (exit 2 without a GPU). On a GPU the clock is read after
torch.cuda.synchronize(), as on the C++ side, and DDP gets device_ids=[LOCAL_RANK].
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# The trainer's defaults (common/kit/train/args.h).
D_MODEL, HEADS, LAYERS, FEEDFORWARD, DROPOUT = 128, 4, 2, 256, 0.1
SEQ_LEN, BATCH, LR, SEED = 64, 16, 1e-3, 42


class TransformerLM(nn.Module):
    def __init__(self, vocab, d_model=D_MODEL, heads=HEADS, layers=LAYERS, ff=FEEDFORWARD,
                 dropout=DROPOUT, max_len=SEQ_LEN):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=ff, dropout=dropout,
                                           activation="relu", norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        pos = torch.arange(max_len, dtype=torch.float).unsqueeze(1)
        freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float) *
                         (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq)
        self.register_buffer("positions", pe)

    def forward(self, tokens):
        seq = tokens.size(1)
        x = self.embed(tokens) * math.sqrt(self.d_model)
        x = self.dropout(x + self.positions[:seq].unsqueeze(0)).transpose(0, 1)
        causal = torch.triu(torch.full((seq, seq), float("-inf"), dtype=x.dtype, device=x.device), 1)
        x = self.encoder(x, mask=causal).transpose(0, 1)
        return self.head(x)


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=BATCH, help="batch per rank")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads (0: OMP_NUM_THREADS, else cores / local ranks)")
    p.add_argument("--ddp", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--name", default="py")
    args = p.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    distributed = world > 1
    use_ddp = args.ddp == "on" or (args.ddp == "auto" and distributed)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch starts CUDA: as on a CPU machine
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no GPU visible to this process", file=sys.stderr)
        return 2
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    def sync():  # GPU work is queued: wait for it before reading the clock
        if cuda:
            torch.cuda.synchronize(device)
    # DDP needs a process group even for a world of one (--ddp on under ddprun -n 1).
    if distributed or use_ddp:
        dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank,
                                world_size=world)
    # Threads as kit::setup() does it: --threads, else OMP_NUM_THREADS, else cores / local ranks.
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or max(
        1, len(os.sched_getaffinity(0)) // local_world)
    torch.set_num_threads(threads)
    torch.manual_seed(SEED + rank)

    model = TransformerLM(args.vocab).to(device)
    model.train()
    n_params = sum(q.numel() for q in model.parameters())
    last_grad = [0.0]

    def stamp(grad):
        last_grad[0] = time.perf_counter()
    for q in model.parameters():
        q.register_hook(stamp)
    net = model
    if use_ddp:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None,
                                                  broadcast_buffers=False)
        net._set_ddp_runtime_logging_sample_rate(1)  # backward_comm_time for every step
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    gen = torch.Generator().manual_seed(1234 + rank)
    pool = [torch.randint(args.vocab, (args.batch, SEQ_LEN + 1), generator=gen).to(device)
            for _ in range(8)]

    rows = {k: [] for k in ("step", "fwd", "bwd", "opt", "tail", "cpu", "reduce")}
    loss_sum = 0.0
    if distributed:
        dist.barrier()
    for s in range(args.warmup + args.steps):
        batch = pool[s % len(pool)]
        inp, target = batch[:, :SEQ_LEN], batch[:, 1:]
        sync()
        c0 = time.process_time()
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss = lm_loss(net(inp), target)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        optimizer.step()
        sync()
        t3 = time.perf_counter()
        c3 = time.process_time()
        if s < args.warmup:
            continue
        rows["step"].append((t3 - t0) * 1e3)
        rows["fwd"].append((t1 - t0) * 1e3)
        rows["bwd"].append((t2 - t1) * 1e3)
        rows["opt"].append((t3 - t2) * 1e3)
        rows["tail"].append((t2 - last_grad[0]) * 1e3)
        rows["cpu"].append((c3 - c0) * 1e3)
        loss_sum += loss.item()
        if use_ddp:
            # DDP logs a step's times at the next forward: this is the previous step's.
            rows["reduce"].append(net._get_ddp_logging_data().get("backward_comm_time", 0) / 1e6)

    def over_ranks(values, op):
        if not distributed:
            return values
        t = torch.tensor(values, dtype=torch.double, device=device)  # NCCL: CUDA tensors only
        dist.all_reduce(t, op=op)
        return (t / world if op == dist.ReduceOp.SUM else t).tolist()

    grads = [q.grad for q in model.parameters() if q.grad is not None]
    reduce_bytes = sum(g.numel() * g.element_size() for g in grads) if use_ddp else 0
    copy_ms, loopback_ms = [0.0], [0.0]
    if use_ddp:
        # torch DDP's copies, replayed: into one flat bucket (divided by the world size), and back.
        flat = torch.empty(reduce_bytes // 4, device=device)
        views, at = [], 0
        for g in grads:
            views.append(flat[at:at + g.numel()].view_as(g))
            at += g.numel()
        copy_ms = []
        for _ in range(10):
            sync()
            t = time.perf_counter()
            for g, v in zip(grads, views):
                torch.mul(g, 1.0 / world, out=v)
            for g, v in zip(grads, views):
                g.copy_(v)
            sync()
            copy_ms.append((time.perf_counter() - t) * 1e3)
    if use_ddp and distributed:
        flat = torch.zeros(reduce_bytes // 4, device=device)
        loopback_ms = []
        for k in range(12):
            sync()
            t = time.perf_counter()
            dist.all_reduce(flat)
            sync()
            if k >= 2:  # 2 to warm up
                loopback_ms.append((time.perf_counter() - t) * 1e3)
        loopback_ms = over_ranks(loopback_ms, dist.ReduceOp.MAX)
    rows["copy"] = copy_ms
    if not rows["reduce"]:
        rows["reduce"] = [0.0]
    loopback = statistics.median(loopback_ms)

    step = over_ranks(rows["step"], dist.ReduceOp.MAX)
    med = {k: statistics.median(over_ranks(rows[k], dist.ReduceOp.SUM))
           for k in ("fwd", "bwd", "opt", "tail", "cpu", "copy", "reduce")}
    step_med = statistics.median(step)
    if rank == 0:
        buckets = "-"
        if use_ddp:
            try:  # the bucket sizes torch's reducer settled on (private API; best effort)
                data = net._get_ddp_logging_data()
                if os.environ.get("BENCH_DEBUG"):
                    print({k: v for k, v in data.items() if "bucket" in k}, file=sys.stderr)
                sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes", "")
                buckets = ",".join("%.3f" % (int(b) / 1048576) for b in str(sizes).split(", ") if b)
            except Exception:
                buckets = "?"
        print("BENCH impl=py name=%s device=%s ranks=%d threads=%d ddp=%d overlap=%d steps=%d warmup=%d "
              "batch=%d seq_len=%d vocab=%d params=%d buckets=%s step_ms_median=%.3f "
              "step_ms_min=%.3f fwd_ms_median=%.3f bwd_ms_median=%.3f opt_ms_median=%.3f "
              "wait_ms_median=%.3f tail_ms_median=%.3f cpu_ms_median=%.3f samples_per_s=%.3f loss_mean=%.3f "
              "copy_ms_median=%.3f reduce_ms_median=%.3f reduce_bytes=%d loopback_ms_median=%.3f "
              "loopback_mb_per_s=%.3f" % (
                  args.name, device.type, world, torch.get_num_threads(), int(use_ddp), int(use_ddp),
                  args.steps, args.warmup, args.batch, SEQ_LEN, args.vocab, n_params, buckets,
                  step_med, min(step), med["fwd"], med["bwd"], med["opt"], med["tail"],
                  med["tail"], med["cpu"], 1e3 * args.batch * world / step_med, loss_sum / args.steps,
                  med["copy"], med["reduce"], reduce_bytes, loopback,
                  reduce_bytes / 1048576 / (loopback / 1e3) if loopback > 0 else 0.0),
              flush=True)
    if distributed or use_ddp:
        # Leave without tearing torch's DDP down: in 1.13, destroying the Reducer (at interpreter
        # exit) joined a Gloo worker thread that waited for the GIL the main thread held, and rank
        # 0 hung forever after printing; kept, as a cheap guard for any torch a user brings.
        # Both ranks are done with every collective here.
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
