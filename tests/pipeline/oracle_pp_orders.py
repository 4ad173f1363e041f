"""The kit's pipeline schedules (kit/pipeline/schedule.h) against PyTorch's own
(torch.distributed.pipelining): for every shape below, each rank's order of forwards and
backwards printed by pp_orders equals the order PyTorch runs.

- GPipe and 1F1B: the order is what ScheduleGPipe._step_microbatches and
  Schedule1F1B._step_microbatches call on their stage (forward_one_chunk, backward_one_chunk),
  recorded here with a stand-in stage and no messages (the functions that send and receive are
  replaced by ones that do nothing). PyTorch's 1F1B refuses fewer micro-batches than stages in
  its constructor, which this bypasses; the kit runs them (with one line on the bubble), in the
  order PyTorch's loop would take.
- Interleaved 1F1B: ScheduleInterleaved1F1B._calculate_single_rank_operations, the lists its
  constructor makes, without the empty slots.

Private functions of torch, read for torch 2.13 (the pinned version): another torch may move
them; the test then fails saying which one is missing.

usage: oracle_pp_orders.py --probe PATH_TO_pp_orders
"""
import argparse
import subprocess
import sys
import types
from unittest import mock

import torch.distributed.pipelining.schedules as S


def executed(cls, p, m, rank):
    order = []

    class Stage:  # what _step_microbatches asks of its stage
        stage_index = rank
        is_first = rank == 0
        is_last = rank == p - 1

        def get_fwd_recv_ops(self, i): return []
        def get_fwd_send_ops(self, i): return []
        def get_bwd_recv_ops(self, i): return []
        def get_bwd_send_ops(self, i): return []
        def forward_one_chunk(self, i, *a, **k): order.append(f"{rank}F{i}")
        def backward_one_chunk(self, i, **k): order.append(f"{rank}B{i}")
        def perform_reduce_grad(self, *a): pass

    sch = object.__new__(cls)
    sch._stage, sch._n_microbatches, sch._num_stages, sch.scale_grads = Stage(), m, p, True
    sch._check_inputs = lambda *a: ([()] * m, [{}] * m)
    sch._initialize_stage = sch._maybe_compute_loss = sch._update_losses = lambda *a: None
    sch._maybe_get_loss = lambda *a: None
    with mock.patch.object(S, "_batch_p2p", lambda *a, **k: None), \
         mock.patch.object(S, "_sorted_batch_p2p", lambda *a, **k: {}), \
         mock.patch.object(S, "_wait_batch_p2p", lambda *a, **k: None):
        sch._step_microbatches([()] * m, [{}] * m, None, None)
    return order


def interleaved(p, v, m, rank):
    rounds = max(1, m // p)
    fake = types.SimpleNamespace(n_local_stages=v, microbatches_per_round=m // rounds,
                                 pp_group_size=p, _n_microbatches=m)
    ops = S.ScheduleInterleaved1F1B._calculate_single_rank_operations(fake, rank)
    return [str(a) for a in ops if a is not None]


def kit_lists(probe, schedule, p, v, m):
    out = subprocess.run([probe, schedule, str(p), str(v), str(m)], capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip()
    return [line.split(":", 1)[1].split() for line in out.stdout.splitlines()], ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    args = ap.parse_args()
    cases, failures = 0, []
    shapes = [("gpipe", p, 1, m) for p in (1, 2, 3, 4) for m in range(1, 10)]
    shapes += [("1f1b", p, 1, m) for p in (1, 2, 3, 4) for m in range(1, 10)]
    shapes += [("interleaved", p, v, m) for p in (2, 3, 4) for v in (1, 2, 3) for m in range(1, 13)
               if m % max(1, m // p) == 0]
    for schedule, p, v, m in shapes:
        lists, why = kit_lists(args.probe, schedule, p, v, m)
        if lists is None:
            failures.append(f"{schedule} pp {p} v {v} m {m}: the kit refuses it: {why}")
            continue
        for rank in range(p):
            if schedule == "interleaved":
                want = interleaved(p, v, m, rank)
            else:
                want = executed(S.ScheduleGPipe if schedule == "gpipe" else S.Schedule1F1B, p, m, rank)
            cases += 1
            if lists[rank] != want:
                failures.append(f"{schedule} pp {p} v {v} m {m} rank {rank}: kit {' '.join(lists[rank])}"
                                f" | torch {' '.join(want)}")
    # The one shape PyTorch refuses in its constructor and the kit too: rounds that do not divide.
    lists, why = kit_lists(args.probe, "interleaved", 4, 2, 9)
    if lists is not None or "not a multiple of its 2 rounds" not in why:
        failures.append(f"interleaved pp 4 v 2 m 9 should be refused (m % rounds), got: {why or lists}")
    for f in failures[:20]:
        print("MISMATCH", f)
    print(f"{cases} rank orders compared, {len(failures)} mismatches")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
