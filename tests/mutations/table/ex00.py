"""Exercise 00's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds). Few and quick: each costs a check of a program that runs in a second."""
EXERCISE = "00-collectives"

WHOAMI = 'std::printf("rank %d of %d: local rank %d, device %s\\n", rank, world_size, me.local_rank,'
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    ("include-path", "compile", "1", "#include \"distributed.h\": the header without its folder",
     [('#include "kit/runtime/distributed.h"', '#include "distributed.h"')], []),
    ("destroy-early", "stops", "2", "destroy_process_group() before the barrier (right code, wrong "
     "place)",
     [("  kit::destroy_process_group();\n", ""),
      ("  kit::barrier();\n", "  kit::destroy_process_group();\n  kit::barrier();\n")], ["8"]),
    ("whoami-print0", "run", "3", "who-am-I printed with print0: only rank 0 says who it is",
     [(WHOAMI, WHOAMI.replace("std::printf", "kit::print0"))], []),
    ("whoami-rank-as-local-rank", "run", "3", "the rank printed where the local rank belongs "
     "(equal on one node, not with one rank per node)",
     [("rank, world_size, me.local_rank,", "rank, world_size, rank,")], []),
    ("broadcast-rank0-only", "stops", "4", "the broadcast inside `if (rank == 0)`: the other ranks "
     "never join it, and the run hangs until the collective timeout",
     [("  kit::broadcast(shared, /*root=*/0);", "  if (rank == 0) kit::broadcast(shared, /*root=*/0);")],
     ["5", "6", "7", "8"]),
    ("average-by-sum", "run", "5", "ReduceOp::SUM where the average was asked for",
     [("kit::all_reduce(average, kit::ReduceOp::AVG);", "kit::all_reduce(average, kit::ReduceOp::SUM);")],
     []),
    ("gather-into-n", "stops", "6", "the all_gather output sized like one rank's tensor: the kit "
     "refuses it, and the run stops",
     [("torch::Tensor gathered = torch::empty({world_size * n}, options);",
       "torch::Tensor gathered = torch::empty({n}, options);")], ["7", "8"]),
    ("reduce-scatter-avg", "run", "7", "reduce_scatter with ReduceOp::AVG instead of SUM",
     [("kit::reduce_scatter(scattered, chunks, kit::ReduceOp::SUM);",
       "kit::reduce_scatter(scattered, chunks, kit::ReduceOp::AVG);")], []),
    ("barrier-rank0-only", "run", "8", "the barrier inside `if (rank == 0)`: rank 1 goes on and "
     "leaves while rank 0 waits for it",
     [("  kit::barrier();\n", "  if (rank == 0) kit::barrier();\n")], []),
]

# Passes every TODO, yet the run is not the solution's: the closing row must say where it first
# leaves it (kind "diverges", tests/mutations/mutants.py).
MUTANTS += [
    ("second-barrier", "diverges", "-", "a second kit::barrier() just before leaving: every "
     "result is right, but the collectives are not the solution's",
     [("  kit::destroy_process_group();\n",
       "  kit::barrier();\n  kit::destroy_process_group();\n")], ["extra collective #7 on rank 0: barrier #7"]),
]

# Written from the TODO text (issue: a table of mistakes per class): a raw backend error, the
# kit's refusal of a wrong input, a barrier in the wrong place, and a correct rewrite.
MUTANTS += [
    ("broadcast-root-2", "stops", "4", "the broadcast from root 2, a rank that does not exist "
     "on 2 ranks: the backend refuses it on every rank (a raw c10d error)",
     [("kit::broadcast(shared, /*root=*/0);", "kit::broadcast(shared, /*root=*/2);")],
     ["5", "6", "7", "8"]),
    ("reduce-scatter-input-mine", "stops", "7", "reduce_scatter given `mine` (n numbers) as its "
     "input, not the world-size chunks: the kit refuses it and the run stops",
     [("kit::reduce_scatter(scattered, chunks, kit::ReduceOp::SUM);",
       "kit::reduce_scatter(scattered, mine, kit::ReduceOp::SUM);")], ["8"]),
    ("barrier-before-wait", "run", "8", "the barrier before the slow rank's wait and the marks "
     "(right call, wrong place): the fast rank counts the marks before the slow one left its own",
     [("  kit::barrier();\n", ""),
      ("  if (rank == 0) std::this_thread::sleep_for",
       "  kit::barrier();\n  if (rank == 0) std::this_thread::sleep_for")], []),
    ("average-sum-then-divide", "equivalent", "5", "the average as ReduceOp::SUM, then divided "
     "by the world size (correct: must pass)",
     [("kit::all_reduce(average, kit::ReduceOp::AVG);",
       "kit::all_reduce(average, kit::ReduceOp::SUM);\n  average /= world_size;")], []),
]

# Tensors: the device (KIT_DEVICE_CHECK=nccl: a host tensor works on Gloo, NCCL refuses it) and
# the dtype of each collective's tensor, against the solution's run.
MUTANTS += [
    ("sum-on-host", "run", "5", "the sum's tensor moved to the host (.cpu()) before its "
     "all_reduce: Gloo takes it, NCCL on a GPU refuses it",
     [("kit::all_reduce(sum, kit::ReduceOp::SUM);",
       "sum = sum.cpu();\n  kit::all_reduce(sum, kit::ReduceOp::SUM);")], []),
    ("average-as-double", "run", "5", "the average all-reduced as a Double copy: the same "
     "numbers, twice the bytes of the solution's Float",
     [("kit::all_reduce(average, kit::ReduceOp::AVG);",
       "average = average.to(torch::kDouble);\n  kit::all_reduce(average, kit::ReduceOp::AVG);")],
     []),
]
