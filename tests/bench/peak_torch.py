#!/usr/bin/env python3
"""peak_torch.py -- PyTorch's counterparts of zero_report's peak (common/bench/zero_report.cpp):
the most bytes of live CPU tensors a rank has during a step, counted by the kit's own counting
allocator (common/kit/train/memory.cpp, built into this process as a torch extension, so that the
method is the same), on bench_ddp.py's model (= kit::TransformerLM).

    ddprun --nproc-per-node 2 -- .venv/bin/python tests/bench/peak_torch.py --mode M [sizes]

--mode ddp     DistributedDataParallel + torch.optim.AdamW (kit: DDP)
       zero1   DistributedDataParallel + ZeroRedundancyOptimizer(AdamW) (kit: ZeRO-1)
       fsdp2   fully_shard on every encoder layer and the root, AdamW (kit: ZeRO-3)
       fsdp2-grad  the same with reshard_after_forward=False: parameters stay gathered between
               forward and backward, gradients sharded (ZeRO-2-like; torch has no ZeRO-2 proper)
Sizes as zero_report's: --vocab --d-model --heads --layers --feedforward --seq --batch (global)
--steps; dropout 0. Output, rank 0: one line "PEAK mode M ranks N P parameters peak B bytes"
(B: the highest rank's peak, over the steps; the peak is reset at the start of each step).
The extension is built once into --build-dir (default build/peak_torch_ext).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.cpp_extension import load

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ddp import TransformerLM, lm_loss  # noqa: E402  the same model as the C++ side

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

BINDING = """
#include <torch/extension.h>
#include "kit/train/memory.h"
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &kit::memory::install);
  m.def("live", &kit::memory::live_bytes);
  m.def("peak", &kit::memory::peak_live_bytes);
  m.def("reset_peak", &kit::memory::reset_peak);
}
"""


def counter(build_dir, rank):
    """The counting allocator's functions: rank 0 builds the extension, the others load it."""
    def build():
        os.makedirs(build_dir, exist_ok=True)
        binding = os.path.join(build_dir, "binding.cpp")
        if rank == 0:
            with open(binding, "w") as f:
                f.write(BINDING)
        return load("kit_memory_ext", [os.path.join(ROOT, "common/kit/train/memory.cpp"), binding],
                    extra_include_paths=[os.path.join(ROOT, "common"),
                                         # kit/compat.h includes c10d's Gloo header
                                         os.path.join(ROOT, "common", "gloo-declarations")],
                    build_directory=build_dir, extra_cflags=["-O2", "-DUSE_C10D_GLOO"],
                    verbose=False)
    if rank == 0:
        mod = build()
        dist.barrier()
    else:
        dist.barrier()
        mod = build()
    return mod


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["ddp", "zero1", "fsdp2", "fsdp2-grad"], required=True)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--feedforward", type=int, default=0, help="0: 4 d_model")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="global batch")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build", "peak_torch_ext"))
    a = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.batch % world:
        print(f"peak_torch: --batch {a.batch} does not divide by {world} ranks", file=sys.stderr)
        return 2
    mem = counter(a.build_dir, rank)
    mem.install()  # before the model: every tensor of it is counted

    torch.manual_seed(1)
    ff = a.feedforward or 4 * a.d_model
    model = TransformerLM(a.vocab, a.d_model, a.heads, a.layers, ff, dropout=0.0, max_len=a.seq)
    P = sum(t.numel() for t in model.parameters())
    if a.mode in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, broadcast_buffers=False)
        if a.mode == "ddp":
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        reshard = a.mode == "fsdp2"
        for layer in model.encoder.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    per_rank = a.batch // world
    peak = 0
    for k in range(a.steps):
        gen = torch.Generator().manual_seed(1000 + k)
        ids = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
        mine = ids[rank * per_rank:(rank + 1) * per_rank]
        inputs, targets = mine[:, :-1], mine[:, 1:]
        mem.reset_peak()
        loss = lm_loss(model(inputs), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        peak = max(peak, mem.peak())
        del loss
    most = torch.tensor([peak], dtype=torch.long)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"PEAK mode {a.mode} ranks {world} P {P} parameters peak {int(most.item())} bytes", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
