// kit/train/zero_checkpoint.h — sharded checkpoints for ZeRO: each rank saves only what it
// holds.
//
//   kit::save_zero_checkpoint(dir, optimizer);   // every rank; ZeroOptimizer or FullyShardedModel
//   kit::load_zero_checkpoint(dir, optimizer);   // every rank, on any number of ranks
//
// Under ZeRO no rank has the whole training state (ZeRO-1/2: nobody has all of AdamW's moments;
// ZeRO-3: nobody has the weights), so nobody could write the usual single file without first
// gathering everything onto one rank. Instead rank r writes <dir>/shard-<r>-of-<N>.pt: its shard
// of the weights, its AdamW moments and step count; rank 0 also writes <dir>/MANIFEST (the
// layout's version, the ZeRO stage, the number of ranks, the number of parameters, the learning
// rate, which a load sets as torch's optimizer state does; a ZeRO-1/2 checkpoint of the layout
// before gradient-ordered buckets is refused with one line). Each file
// is written atomically (kit/runtime/files.h). Loading puts every tensor back exactly: the run
// continues bit for bit. Inside a checkpoint of kit::Checkpoints (save_sharded, <checkpoint>/zero),
// every shard is in the checkpoint's MANIFEST with its size and checksum, and resume_sharded has
// each rank verify its own shard, and the ranks agree, before load_zero_checkpoint's first
// collective.
//
// A shard is a slice of a layout that depends on the number of ranks: the state end to end (the
// parameters', in buckets under ZeRO-1/2, per unit under ZeRO-3), each piece padded to N equal
// slices. On as many ranks as wrote it, each rank reads its own file, bit for bit. On another
// number of ranks the load reshards, as PyTorch's distributed checkpoint does: each rank reads
// every old rank's file in turn (one file's tensors in memory at a time) and copies what falls in
// its new shard, of the weights and of both AdamW moments; the step counts and the learning rate
// are every rank's. Checkpoints (kit/train/checkpoint.h) still resumes only on as many ranks: a
// run's data order, its per-rank random states and loss sums belong to its number of ranks.
#pragma once

#include <stdexcept>
#include <string>

#include "kit/sharding/flat.h"   // FlatParameters, ShardedAdamW
#include "kit/sharding/zero.h"   // ZeroOptimizer
#include "kit/sharding/zero3.h"  // FullyShardedModel

namespace kit {

// What a checkpoint that cannot be loaded throws: one line.
struct ZeroCheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void save_zero_checkpoint(const std::string& dir, ZeroOptimizer& optimizer);
void load_zero_checkpoint(const std::string& dir, ZeroOptimizer& optimizer);
void save_zero_checkpoint(const std::string& dir, FullyShardedModel& model);
void load_zero_checkpoint(const std::string& dir, FullyShardedModel& model);
// ZeRO-1/2 written by hand (exercise 03): this rank's shard of flat.params() and `adamw`'s state
// for it; `stage` (1 or 2) goes into the MANIFEST and must match at load. The shard is one
// contiguous run of the flat vector (ShardLayout, MANIFEST version 1), not ZeroOptimizer's
// buckets: neither loads the other's. The load all-gathers the weights, as ZeroOptimizer's does.
void save_zero_checkpoint(const std::string& dir, FlatParameters& flat, ShardedAdamW& adamw,
                          int stage);
void load_zero_checkpoint(const std::string& dir, FlatParameters& flat, ShardedAdamW& adamw,
                          int stage);

}  // namespace kit
