"""Exercise 00's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds). Few and quick: each costs a check of a program that runs in a second."""
EXERCISE = "00-collectives"

WHOAMI = 'std::printf("rank %d of %d: local rank %d, device %s\\n", rank, world_size, local_rank,'
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    ("include-path", "compile", "1", "#include \"distributed.h\": the header without its kit/ folder",
     [('#include "kit/distributed.h"', '#include "distributed.h"')], []),
    ("destroy-early", "stops", "2", "destroy_process_group() before the barrier (right code, wrong "
     "place)",
     [("  kit::destroy_process_group();\n", ""),
      ("  kit::barrier();\n", "  kit::destroy_process_group();\n  kit::barrier();\n")], ["8"]),
    ("whoami-print0", "run", "3", "who-am-I printed with print0: only rank 0 says who it is",
     [(WHOAMI, WHOAMI.replace("std::printf", "kit::print0"))], []),
    ("whoami-rank-as-local-rank", "run", "3", "the rank printed where the local rank belongs "
     "(equal on one node, not with one rank per node)",
     [("rank, world_size, local_rank,", "rank, world_size, rank,")], []),
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
