// kit/train/pp_checkpoint.h — checkpoints of a pipelined run: every rank saves the chunks it holds
// and reads them back.
//
//   kit::Checkpoints::ShardIO save = [&](const std::string& dir) {
//     kit::save_pp_checkpoint(dir, mesh, chunks, optimizer);
//   };
//   checkpoints.save_sharded(save, state);              // every rank; ... resume_sharded(load, ...)
//
// Under pipeline parallelism rank 0 holds the first stage only: rank 0 writing what it holds
// (Checkpoints::save) would lose every other stage. Each rank writes <dir>/shard-<r>-of-<N>.pt
// (Checkpoints::shard_file): its chunks' parameters, named by chunk ("chunk3.1.linear1.weight":
// chunk 3's second unit), and its optimizer's state; rank 0 also writes <dir>/MANIFEST with the
// split (world size, pp, chunks per rank, the mesh's order). Each file is written
// atomically (kit/runtime/files.h) and the save ends on a barrier of the mesh's world.
//
// Resumed with the same split, every tensor comes back exactly. With another pp, chunks per rank,
// order or number of ranks, each file holds other blocks: the load is refused with one line
// (PpCheckpointError) naming both splits, and nothing is loaded. (Dropout's random numbers are
// not saved: a resumed run with dropout continues with other masks.)
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

#include "kit/parallel/mesh.h"
#include "kit/pipeline/stage.h"

namespace kit {

struct PpCheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Every rank of the mesh calls each, with its own chunks (kit::pp::take_chunks) and optimizer.
void save_pp_checkpoint(const std::string& dir, const Mesh& mesh, std::vector<pp::Chunk>& chunks,
                        torch::optim::Optimizer& optimizer);
void load_pp_checkpoint(const std::string& dir, const Mesh& mesh, std::vector<pp::Chunk>& chunks,
                        torch::optim::Optimizer& optimizer);

}  // namespace kit
