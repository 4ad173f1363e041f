// kit/train/tp_checkpoint.h — checkpoints of a tensor- and context-parallel run: every rank saves
// what it holds and reads it back.
//
//   kit::Checkpoints::ShardIO save = [&](const std::string& dir) {
//     kit::save_tp_checkpoint(dir, model, optimizer);
//   };
//   checkpoints.save_sharded(save, state);              // every rank; ... resume_sharded(load, ...)
//
// Under tensor parallelism no rank holds the whole training state: rank r has its slices of the
// split weights, the AdamW moments of those slices, and its own dropout streams. Rank 0 writing
// what it holds (Checkpoints::save) would save its slices only, and a resume would give rank 0's
// slices to every rank: the shapes agree, the weights do not, and nothing says so. Instead each
// rank writes <dir>/shard-<r>-of-<N>.pt (Checkpoints::shard_file, N the world size): its module's
// parameters and buffers, its optimizer's state and its two RandomStreams; rank 0 also writes
// <dir>/MANIFEST with the mesh (world size, tp, cp, order). Each file is written atomically
// (kit/runtime/files.h), and the save ends on a barrier of the mesh's world (Checkpoints then
// finds every rank's file). Inside a kit::Checkpoints folder (save_sharded: <checkpoint>/zero)
// every shard is in the checkpoint's MANIFEST with its checksum; resume_sharded verifies it first.
//
// Resumed on the same mesh, every tensor comes back exactly: the run continues bit for bit. On
// another mesh (another tp, cp, order or number of ranks) the slices are other slices: the load is
// refused with one line (TpCheckpointError) naming both meshes, and nothing is loaded. To move a
// run to another tp, save the whole model instead (ParallelTransformerLM::gather_into, kit::save0)
// and load it with load_from(): the weights reshard to any tp; AdamW's state and the streams do
// not come along (not built here).
#pragma once

#include <stdexcept>
#include <string>

#include <torch/optim/optimizer.h>

#include "kit/parallel/parallel_lm.h"  // ParallelTransformerLM, and its Mesh

namespace kit {

struct TpCheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Every rank of the model's mesh calls each, with its own model and optimizer.
void save_tp_checkpoint(const std::string& dir, ParallelTransformerLM& model,
                        torch::optim::Optimizer& optimizer);
void load_tp_checkpoint(const std::string& dir, ParallelTransformerLM& model,
                        torch::optim::Optimizer& optimizer);

}  // namespace kit
