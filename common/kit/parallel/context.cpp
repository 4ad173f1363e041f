// kit/parallel/context.cpp — the parts of a sequence each cp rank holds (see context.h).
#include "kit/parallel/context.h"

#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "kit/parallel/mesh.h"

namespace kit {

torch::Tensor cp_positions(int64_t seq, int size, int rank, CpSplit split, CallSite site) {
  const int64_t chunks = split == CpSplit::zigzag ? 2 * size : size;
  if (seq % chunks != 0)
    throw std::invalid_argument("kit::cp_positions (" + site.str() + "): a sequence of " +
                                std::to_string(seq) + " does not split into " +
                                std::to_string(chunks) + " equal chunks (cp " +
                                std::to_string(size) +
                                (split == CpSplit::zigzag ? ", zigzag: 2 cp chunks)" : ")"));
  const int64_t chunk = seq / chunks;
  auto range = [&](int64_t c) { return torch::arange(c * chunk, (c + 1) * chunk, torch::kLong); };
  if (split == CpSplit::contiguous) return range(rank);
  return torch::cat({range(rank), range(2 * size - 1 - rank)});
}

torch::Tensor cp_shard(const torch::Tensor& x, int64_t dim, const Mesh& mesh, CpSplit split,
                       CallSite site) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  if (d < 0 || d >= x.dim())
    throw std::invalid_argument("kit::cp_shard (" + site.str() + "): dimension " +
                                std::to_string(dim) + " of a tensor of " + std::to_string(x.dim()) +
                                " dimensions");
  if (mesh.cp_size() == 1) return x;
  auto pos = cp_positions(x.size(d), mesh.cp_size(), mesh.cp_rank(), split, site);
  return x.index_select(d, pos.to(x.device()));
}

}  // namespace kit
