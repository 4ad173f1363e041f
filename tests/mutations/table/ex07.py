"""The capstone's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds). Written from the TODO text: what a participant who did exercises 01 and 03
gets wrong when the hints are few."""
EXERCISE = "07-xsum-summariser"

SHARD_TRAIN = "  for (size_t k = 0; k < steps; ++k) mine.push_back(batches[k * world_size + rank]);\n"
SHARD_EVAL = ("    if (static_cast<int>(k % world_size) != rank) continue;  "
              "// batch k is rank k % world_size's\n")
DDP = ("    ddp.emplace(model);  // rank 0's weights everywhere, then averaged gradients\n"
       "    forward = [&](const torch::Tensor& src, const torch::Tensor& tgt) {\n"
       "      return ddp->forward_with([&] { return model->forward(src, tgt); });\n"
       "    };\n")
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    # kit/parallel/mesh.h (TODO 6's) includes kit/runtime/distributed.h: both left out.
    ("no-distributed-include", "compile", "1", "kit/runtime/distributed.h not included (nor "
     "kit/parallel/mesh.h, which includes it)",
     [('#include "kit/runtime/distributed.h"      // setup(), all_reduce(), print0(), save0(), '
       'destroy_process_group()\n', ""),
      ('#include "kit/parallel/mesh.h"            // Mesh: the tp and dp groups (TODO 6)\n', "")],
     []),
    ("cuda-rank", "run", "1", "the device numbered by the global rank (cuda:rank; on this "
     "CPU-only machine cpu:rank) instead of setup()'s",
     [("const torch::Device device = me.device;",
       "const torch::Device device(me.device.type(), rank);")], []),
    ("no-destroy", "run", "1", "the process group left open at the end",
     [("  kit::destroy_process_group();\n", "")], []),
    ("every-rank-every-batch", "run", "2", "every rank trains on every batch (the list not "
     "shared out)",
     [(SHARD_TRAIN, "  mine = batches;\n")], []),
    # The run hangs: rank 0's extra step waits in DDP's collective while rank 1 has gone on to
    # TODO 4's all-reduce, so the ranks part there (TODO 4's row says where); the cause, and the
    # TODO to fix first, is the step count of TODO 2.
    ("uneven-steps", "run", "2", "batch k to rank k % world_size, the remainder kept: one rank "
     "takes a step more and waits for the others in DDP's all-reduce",
     [(SHARD_TRAIN, "  for (size_t k = rank; k < batches.size(); k += world_size) "
       "mine.push_back(batches[k]);\n")], ["4"]),
    ("contiguous-overlap", "run", "2", "each rank takes `steps` batches from its own start, "
     "rank x steps, off by one: neighbours share a batch",
     [(SHARD_TRAIN, "  for (size_t k = 0; k < steps; ++k) mine.push_back(batches[rank * "
       "(steps - 1) + k]);\n")], []),
    ("every-rank-evaluates-all", "run", "2", "every rank evaluates every batch",
     [(SHARD_EVAL, "")], []),
    ("no-ddp", "run", "3", "no DistributedDataParallel: the copies drift apart",
     [(DDP, "")], []),
    ("ddp-bypassed", "stops", "3", "the wrapper made, but the training forward still calls "
     "model->forward: no backward is averaged; the kit stops the first",
     [(DDP, "    ddp.emplace(model);  // rank 0's weights everywhere, then averaged gradients\n")],
     ["1", "2", "4", "5", "6"]),
    ("train-mean-own", "run", "4", "the training mean reported without averaging over the ranks",
     [("  kit::all_reduce(mean, kit::ReduceOp::AVG);  // every rank took the same number of steps\n",
       "")], []),
    ("rouge-own", "run", "4", "the ROUGE sums not added up over the ranks: rank 0's own scores",
     [("  kit::all_reduce(rouge, kit::ReduceOp::SUM);  // [ROUGE-1, -2, -L sums, examples] of all "
       "ranks\n", "")], []),
    ("final-printf", "run", "4", "the final line with std::printf on every rank",
     [('  kit::print0("final test loss', '  std::printf("final test loss')], []),
    ("final-torch-save", "run", "4", "model-final.pt written by every rank with torch::save",
     [('  kit::save0(model, args.out_dir + "/model-final.pt");',
       '  torch::save(model, args.out_dir + "/model-final.pt");')], []),
    ("zero2-beside-ddp", "stops", "5", "--strategy zero2 with the model still wrapped in DDP "
     "(both average the gradients)",
     [('  if (args.strategy == "ddp") {\n    ddp.emplace', '  if (true) {\n    ddp.emplace')], []),
    ("zero2-stage-0", "stops", "5", "ZeroOptions without stage 2 (stage 0: no such ZeRO stage)",
     [(".stage = 2,", ".stage = 0,")], []),
    ("zero3-evaluates-shards", "stops", "5", "--strategy zero3 without whole_model(): the "
     "evaluation runs the model's own methods on its emptied parameters",
     [("    whole_model = [&] { return std::make_shared<kit::FullyShardedModel::FullParams>"
       "(*sharded); };\n", "")], []),
    ("tp-data-by-world-rank", "run", "6", "--strategy tp with the batches still shared out by "
     "world rank: the two ranks of one split model compute on different documents",
     [("    data_rank = mesh->dp_rank();  // one copy of the model, one share of the batches\n"
       "    data_ranks = mesh->dp_size();\n", "")], []),
    ("tp-evaluates-initial-weights", "run", "6", "--strategy tp without gathering the trained "
     "slices: evaluation and saving use the whole model's initial weights",
     [("      split->write_full(model);\n", "")], []),
]
