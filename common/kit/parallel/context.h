// kit/parallel/context.h — which positions of a sequence each rank of the cp group holds, and its
// part of a batch: context parallelism splits every sequence over the cp ranks (the weights stay
// whole on each of them).
//
//   auto x = kit::cp_shard(tokens, 1, mesh);   // [batch, seq] -> [batch, seq / cp]: this rank's
//   auto y = kit::cp_shard(targets, 1, mesh);  // the same positions of the targets
//
// Two ways to split (CpSplit):
//   contiguous  rank r holds positions [r S/cp, (r + 1) S/cp). Simple, but under the causal mask
//               the last rank's queries see every key and the first rank's only their own: of the
//               query-key pairs the mask keeps, the last rank has 2 cp - 1 times the first's.
//   zigzag      the sequence cut into 2 cp chunks; rank r holds chunks r and 2 cp - 1 - r, an
//               early and a late one, so every rank has the same share of kept pairs (Megatron's
//               load balancing of context parallelism). Needs S divisible by 2 cp.
// The kit's attention computes every score and masks it (a dense mask), so here both splits cost
// the same; the balance pays with an attention kernel that skips masked blocks (flash attention,
// ring attention), where a rank's work is its kept pairs.
// Attention builds its causal mask from these positions (a key is seen when its position is not
// after the query's), so both splits compute exactly what the whole sequence would.
#pragma once

#include <cstdint>

#include <torch/types.h>

#include "kit/runtime/process_group.h"  // CallSite

namespace kit {

class Mesh;

enum class CpSplit { contiguous, zigzag };

// The positions (0..seq-1, in the order the rank holds them) that cp rank `rank` of `size` holds
// of a sequence of `seq`: int64, [seq / size]. Refused (std::invalid_argument, one line naming
// `site`): seq not divisible by size (by 2 size for zigzag).
torch::Tensor cp_positions(int64_t seq, int size, int rank, CpSplit split, CallSite site = {});
// This rank's part of x along `dim` (the sequence's), by mesh.cp_size() and mesh.cp_rank().
torch::Tensor cp_shard(const torch::Tensor& x, int64_t dim, const Mesh& mesh,
                       CpSplit split = CpSplit::contiguous, CallSite site = {});

}  // namespace kit
