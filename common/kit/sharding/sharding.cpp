// kit/sharding/sharding.cpp — the flat layout, AdamW on a shard, the byte counts (see sharding.h).
#include "kit/sharding/sharding.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include <torch/torch.h>

namespace kit {

// What ShardLayout and BucketLayout share. Both keep each parameter as one contiguous run of the
// flat vector, at its offset, and differ only in where those offsets are and how much padding
// there is; so a parameter's part and the flattening need nothing else of a layout.
namespace {

// The `shape`d part of `flat` that starts at `offset` (a view, no copy).
torch::Tensor part_at(const torch::Tensor& flat, int64_t offset, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return flat.narrow(0, offset, n).view(shape);
}

// `tensors` (one per parameter, in the layout's order; undefined = zeros) at their parts of a new
// flat tensor of layout.padded() zeros, in the options of the first defined one. `who` names the
// caller in the error of a wrong count.
template <typename Layout>
torch::Tensor flatten_into_layout(const Layout& layout, const char* who,
                                  const std::vector<torch::Tensor>& tensors) {
  if (tensors.size() != layout.count())
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(tensors.size()) +
                                " tensors for a layout of " + std::to_string(layout.count()));
  torch::Tensor like;
  for (const auto& t : tensors)
    if (t.defined()) { like = t; break; }
  auto flat = torch::zeros({layout.padded()}, like.defined() ? like.options() : torch::TensorOptions());
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].defined()) layout.part(flat, i).copy_(tensors[i]);
  return flat;
}

}  // namespace

int check_zero_stage(int stage) {
  if (stage < 0 || stage > 3)
    throw std::invalid_argument("ZeRO stage " + std::to_string(stage) +
                                " does not exist: use 0 (DDP), 1, 2 or 3");
  return stage;
}

ShardLayout::ShardLayout(const std::vector<torch::Tensor>& params, int world, int rank)
    : world_(world), rank_(rank) {
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("ShardLayout: rank " + std::to_string(rank) + " of " +
                                std::to_string(world) + " ranks");
  for (const auto& p : params) {
    shapes_.push_back(p.sizes().vec());
    offsets_.push_back(numel_);
    numel_ += p.numel();
  }
  shard_ = (numel_ + world - 1) / world;  // rounded up: the last shard ends in padding
}

torch::Tensor ShardLayout::flatten(const std::vector<torch::Tensor>& tensors) const {
  return flatten_into_layout(*this, "ShardLayout::flatten", tensors);
}

torch::Tensor ShardLayout::part(const torch::Tensor& flat, size_t i) const {
  return part_at(flat, offsets_[i], shapes_[i]);
}

BucketLayout::BucketLayout(const std::vector<torch::Tensor>& params, int world, int rank, int64_t cap)
    : world_(world), rank_(rank) {
  if (world < 1 || rank < 0 || rank >= world)
    throw std::invalid_argument("BucketLayout: rank " + std::to_string(rank) + " of " +
                                std::to_string(world) + " ranks");
  const size_t n = params.size();
  shapes_.resize(n);
  offsets_.resize(n);
  bucket_of_.resize(n);
  int64_t at = 0, filled = 0;  // the flat vector so far; the open bucket's elements
  bool alone = false;          // the open bucket holds a parameter of half the cap or more
  auto close = [&] {           // pad the open bucket to N slices
    Bucket& b = buckets_.back();
    b.numel = filled;
    b.slice = (filled + world - 1) / world;
    b.shard_begin = shard_;
    shard_ += b.slice;
    at = b.begin + b.slice * world;
    filled = 0;
  };
  for (size_t k = n; k-- > 0;) {  // backward's order: the last parameter first
    const int64_t size = params[k].numel();
    const bool large = 2 * size >= cap;
    if (buckets_.empty() || (filled > 0 && (filled + size > cap || large || alone))) {
      if (!buckets_.empty()) close();
      buckets_.push_back({});
      buckets_.back().begin = at;
    }
    shapes_[k] = params[k].sizes().vec();
    offsets_[k] = at + filled;
    bucket_of_[k] = buckets_.size() - 1;
    buckets_.back().params.push_back(k);
    filled += size;
    numel_ += size;
    alone = large;
  }
  if (!buckets_.empty()) close();
}

torch::Tensor BucketLayout::flatten(const std::vector<torch::Tensor>& tensors) const {
  return flatten_into_layout(*this, "BucketLayout::flatten", tensors);
}

torch::Tensor BucketLayout::part(const torch::Tensor& flat, size_t i) const {
  return part_at(flat, offsets_[i], shapes_[i]);
}

torch::Tensor BucketLayout::bucket(const torch::Tensor& flat, size_t b) const {
  return flat.narrow(0, buckets_[b].begin, buckets_[b].slice * world_);
}

torch::Tensor BucketLayout::own(const torch::Tensor& flat, size_t b) const {
  return flat.narrow(0, buckets_[b].begin + buckets_[b].slice * rank_, buckets_[b].slice);
}

torch::Tensor BucketLayout::part_of_bucket(const torch::Tensor& bucket, size_t i) const {
  return part_at(bucket, offsets_[i] - buckets_[bucket_of_[i]].begin, shapes_[i]);
}

std::vector<torch::Tensor> BucketLayout::own_pieces(const torch::Tensor& flat) const {
  std::vector<torch::Tensor> out;
  for (size_t b = 0; b < buckets_.size(); ++b) out.push_back(own(flat, b));
  return out;
}

std::string unsupported_adamw(const torch::optim::AdamWOptions& o) {
  const auto [beta1, beta2] = o.betas();
  std::ostringstream why;
  // amsgrad keeps a third state (the running maximum of exp_avg_sq) and divides by it: not built,
  // and ignoring it would train another optimizer than the one asked for.
  if (o.amsgrad())
    why << "AdamW's amsgrad is not implemented by ZeRO's sharded AdamW; use amsgrad(false) (the "
           "default) or DistributedDataParallel with torch::optim::AdamW";
  // torch::optim::AdamW's own checks (its constructor), in its order; `!(x >= 0)` also catches NaN.
  else if (!(o.lr() >= 0)) why << "invalid learning rate " << o.lr() << " (AdamW wants lr >= 0)";
  else if (!(o.eps() >= 0)) why << "invalid eps " << o.eps() << " (AdamW wants eps >= 0)";
  else if (!(beta1 >= 0 && beta1 < 1)) why << "invalid beta1 " << beta1 << " (AdamW wants 0 <= beta1 < 1)";
  else if (!(beta2 >= 0 && beta2 < 1)) why << "invalid beta2 " << beta2 << " (AdamW wants 0 <= beta2 < 1)";
  else if (!(o.weight_decay() >= 0))
    why << "invalid weight_decay " << o.weight_decay() << " (AdamW wants weight_decay >= 0)";
  return why.str();
}

void check_adamw_options(const torch::optim::AdamWOptions& options, const std::string& who,
                         const CallSite& site) {
  const std::string why = unsupported_adamw(options);
  if (!why.empty()) throw std::invalid_argument(who + ": " + why + " (" + site.str() + ")");
}

// Not all through float32: that would round float64 values and large int64 buffers. Only bool and
// bfloat16 travel as uint8 / float32 (exact), in case the backend cannot broadcast them.
void broadcast_from_rank0(ProcessGroup& group, const std::vector<torch::Tensor>& state) {
  if (group.size() == 1) return;
  torch::NoGradGuard no_grad;
  auto wire = [](c10::ScalarType t) {
    return t == torch::kBool ? torch::kByte : t == torch::kBFloat16 ? torch::kFloat : t;
  };
  std::map<c10::ScalarType, std::vector<torch::Tensor>> by_type;  // same order on every rank
  for (auto& t : state) by_type[wire(t.scalar_type())].push_back(t);
  for (auto& [type, tensors] : by_type) {
    std::vector<torch::Tensor> parts;
    for (auto& t : tensors) parts.push_back(t.detach().reshape(-1).to(type));
    auto flat = torch::cat(parts);
    group.broadcast(flat, 0);
    int64_t at = 0;
    for (auto t : tensors) {
      t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }
}

ShardedAdamW::ShardedAdamW(const torch::optim::AdamWOptions& options, const torch::Tensor& like)
    : options_(options) {
  const std::string why = unsupported_adamw(options);
  if (!why.empty()) throw std::invalid_argument("ShardedAdamW: " + why);
  exp_avg_ = torch::zeros_like(like);
  exp_avg_sq_ = torch::zeros_like(like);
}

// torch::optim::AdamW::step for one tensor (without amsgrad), operation for operation, so that the
// sharded run matches the unsharded one to the last bit where the gradients agree. Every operation
// is element by element, so it runs over the shard in chunks: the same values, but the temporary
// (`denom`) is one chunk (at most 1 MiB of fp32 and an eighth of the shard), not a second and
// third copy of the whole shard, which would undo at the peak much of what sharding saved.
void ShardedAdamW::update(torch::Tensor param, const torch::Tensor& grad) {
  update(std::vector<torch::Tensor>{param}, std::vector<torch::Tensor>{grad});
}

// Pieces: element by element, one step over the pieces is the step over the shard they make up.
void ShardedAdamW::update(const std::vector<torch::Tensor>& params,
                          const std::vector<torch::Tensor>& grads) {
  torch::NoGradGuard no_grad;
  const int64_t shard = exp_avg_.numel();
  int64_t total = 0;
  bool alike = params.size() == grads.size();
  for (size_t k = 0; k < params.size(); ++k) {
    total += params[k].numel();
    alike = alike && grads[k].numel() == params[k].numel();
  }
  if (total != shard || !alike)
    throw std::invalid_argument("ShardedAdamW::update: " + std::to_string(params.size()) +
                                " pieces of weights (" + std::to_string(total) + " elements) and " +
                                std::to_string(grads.size()) + " of gradients, unlike, or not the " +
                                std::to_string(shard) + " elements of the state");
  const int64_t kChunk = std::max<int64_t>(1, std::min<int64_t>(int64_t{1} << 18, (shard + 7) / 8));
  const double lr = options_.lr();
  const auto [beta1, beta2] = options_.betas();
  ++step_;
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step_));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step_));
  int64_t base = 0;  // where the piece starts in the shard
  for (size_t k = 0; k < params.size(); ++k) {
    const int64_t n = params[k].numel();
    for (int64_t at = 0; at < n; at += kChunk) {
      const int64_t len = std::min(kChunk, n - at);
      auto p = params[k].narrow(0, at, len), g = grads[k].reshape(-1).narrow(0, at, len);
      auto m = exp_avg_.narrow(0, base + at, len), v = exp_avg_sq_.narrow(0, base + at, len);
      p.mul_(1 - lr * options_.weight_decay());
      m.mul_(beta1).add_(g, 1 - beta1);
      v.mul_(beta2).addcmul_(g, g, 1 - beta2);
      auto denom = v.sqrt().div_(std::sqrt(bias_correction2)).add_(options_.eps());
      p.addcdiv_(m, denom, -lr / bias_correction1);
    }
    base += n;
  }
}

int64_t ShardedAdamW::bytes() const { return bytes_of({exp_avg_, exp_avg_sq_}); }

double ring_bytes(const std::string& kind, double bytes, int world) {
  const double n = world;
  if (kind == "all_reduce") return 2 * (n - 1) / n * bytes;
  if (kind == "reduce_scatter") return (n - 1) / n * bytes;
  if (kind == "all_gather") return (n - 1) * bytes;
  return 0;
}

int64_t bytes_of(const std::vector<torch::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts)
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  return n;
}

HeldBytes formula_bytes(int stage, int64_t P, int64_t padded, int world) {
  check_zero_stage(stage);
  const int64_t shard = padded / world;  // S elements
  HeldBytes b;
  b.params = 4 * (stage >= 3 ? shard : P);
  b.grads = 4 * (stage >= 2 ? shard : P);
  b.optimizer = 8 * (stage >= 1 ? shard : P);
  return b;
}

}  // namespace kit
