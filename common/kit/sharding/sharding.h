// kit/sharding/sharding.h — what every ZeRO stage shares: the flat layout of the parameters and
// which slice of it a rank owns (ShardLayout; ZeRO-1/2's, in buckets: BucketLayout), AdamW applied
// to one such slice (ShardedAdamW), the bytes a rank holds by category (HeldBytes) and the check of
// the stage number.
//
// ShardLayout: the parameters, in a fixed order (the model's), are laid end to end in one flat
// vector of P elements, padded with zeros to a multiple of the world size N, so that it cuts into
// N equal shards of S = ceil(P / N) elements; rank r owns elements [r S, (r + 1) S). Equal
// shards are what all-gather and reduce-scatter need; the padding (fewer than N elements) is
// never read by the model, and stays zero through AdamW (zero gradient, zero weight: zero
// update). BucketLayout (below) pads and splits each bucket the same way.
//
// AdamW works element by element, so AdamW on a slice of the flat vector is exactly AdamW on the
// parameters that slice covers: the same operations in the same order as torch::optim::AdamW.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/optim/adamw.h>
#include <torch/types.h>

#include "kit/runtime/process_group.h"  // ProcessGroup, CallSite

namespace kit {

// 0 is plain DDP; 1 shards the optimizer state, 2 also the gradients, 3 also the parameters.
// Returns `stage`, or throws std::invalid_argument (one line) outside 0..3.
int check_zero_stage(int stage);

class ShardLayout {
 public:
  // The layout of `params` (their shapes; nothing is copied) over `world` ranks, seen by `rank`.
  ShardLayout(const std::vector<torch::Tensor>& params, int world, int rank);

  int64_t numel() const { return numel_; }      // P: the parameters' elements
  int64_t padded() const { return shard_ * world_; }  // N S >= P
  int64_t shard() const { return shard_; }      // S: the elements each rank owns
  int64_t begin() const { return shard_ * rank_; }  // where this rank's shard starts

  // `tensors` (one per parameter, in layout order; undefined = zeros) end to end in one new,
  // padded flat tensor of N S elements.
  torch::Tensor flatten(const std::vector<torch::Tensor>& tensors) const;
  // Parameter i's part of a padded flat tensor, shaped like parameter i (a view, no copy).
  torch::Tensor part(const torch::Tensor& flat, size_t i) const;
  // This rank's shard of a padded flat tensor (a view).
  torch::Tensor own(const torch::Tensor& flat) const { return flat.narrow(0, begin(), shard_); }
  size_t count() const { return shapes_.size(); }
  int64_t offset(size_t i) const { return offsets_[i]; }  // where parameter i starts

 private:
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0, shard_ = 0;
  int world_, rank_;
};

// The layout of ZeRO-1 and 2 (kit/sharding/zero.h): the parameters cut into buckets in the order
// their gradients are expected in backward (the reverse of the parameters' order, as DDP's first
// buckets and DeepSpeed's), each bucket of whole parameters, at most `cap` elements; a parameter
// of half the cap or more has a bucket of its own (ZeRO-2 then reduce-scatters its gradient as
// autograd made it, with no copy into a shared buffer). The flat vector is the buckets end to
// end, each padded with zeros to a multiple of N (fewer than N elements), and each bucket cuts
// into N equal slices: rank r owns slice r of every bucket, and its shard of S elements is those
// slices end to end. So a bucket is complete (and its reduce-scatter can start) as soon as
// backward has made its parameters' gradients, its reduce-scatter's input is its part of the flat
// vector as it is, and its all-gather's output is that part again. Each parameter is one
// contiguous part of the flat vector.
class BucketLayout {
 public:
  struct Bucket {
    std::vector<size_t> params;  // parameter indices, in the order backward makes them
    int64_t begin = 0;           // where the bucket starts in the flat vector
    int64_t slice = 0;           // each rank's elements of it (the bucket is N slices)
    int64_t shard_begin = 0;     // where this bucket's slice starts in a rank's shard
    int64_t numel = 0;           // its parameters' elements (the padding left out)
  };
  // `params` (their shapes), `world` ranks seen by `rank`, buckets of at most `cap` elements.
  BucketLayout(const std::vector<torch::Tensor>& params, int world, int rank, int64_t cap);

  int64_t numel() const { return numel_; }      // P: the parameters' elements
  int64_t padded() const { return shard_ * world_; }  // N S >= P: the flat vector
  int64_t shard() const { return shard_; }      // S: the elements each rank owns
  int world() const { return world_; }
  int rank() const { return rank_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  size_t bucket_of(size_t i) const { return bucket_of_[i]; }
  size_t count() const { return shapes_.size(); }
  int64_t offset(size_t i) const { return offsets_[i]; }  // where parameter i starts

  // `tensors` (one per parameter; undefined = zeros) in a new flat tensor of N S elements.
  torch::Tensor flatten(const std::vector<torch::Tensor>& tensors) const;
  // Parameter i's part of a flat tensor, shaped like parameter i (a view, no copy).
  torch::Tensor part(const torch::Tensor& flat, size_t i) const;
  // Bucket b's part of a flat tensor (N slices), and this rank's slice of it (views).
  torch::Tensor bucket(const torch::Tensor& flat, size_t b) const;
  torch::Tensor own(const torch::Tensor& flat, size_t b) const;
  // Parameter i's part of a tensor that holds only its bucket (N slices), shaped like it (a view).
  torch::Tensor part_of_bucket(const torch::Tensor& bucket, size_t i) const;
  // This rank's slices of every bucket of a flat tensor (views), in shard order.
  std::vector<torch::Tensor> own_pieces(const torch::Tensor& flat) const;

 private:
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> offsets_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  int64_t numel_ = 0, shard_ = 0;
  int world_, rank_;
};

// Why `options` cannot train a ShardedAdamW, in words, or "". Of torch::optim::AdamWOptions'
// fields (lr, betas, eps, weight_decay, amsgrad: all of them in LibTorch 2.13's header) ShardedAdamW
// implements all but amsgrad, which is refused rather than ignored; values torch::optim::AdamW's
// constructor refuses (a negative lr, eps or weight_decay, a beta outside [0, 1)) are refused too.
std::string unsupported_adamw(const torch::optim::AdamWOptions& options);
// The same as one error: std::invalid_argument "<who>: <why> (<site>)" (site: the trainer's line
// that wrote the options, ZeroOptions::site), thrown before anything is changed.
void check_adamw_options(const torch::optim::AdamWOptions& options, const std::string& who,
                         const CallSite& site);

// Rank 0's values of `state` into every rank's tensors, in place: one broadcast per dtype, the
// same order on every rank (DDP's start, kit/ddp/ddp.cpp, for the frozen parameters and buffers
// that ZeRO does not shard). Every rank must call it, with tensors of the same shapes and dtypes.
void broadcast_from_rank0(ProcessGroup& group, const std::vector<torch::Tensor>& state);

// AdamW's state for one flat shard, and its update.
class ShardedAdamW {
 public:
  // std::invalid_argument for options it cannot train with (unsupported_adamw()).
  ShardedAdamW(const torch::optim::AdamWOptions& options, const torch::Tensor& like_shard);
  // param -= AdamW's step for `grad`, in place (both: this rank's shard).
  void update(torch::Tensor param, const torch::Tensor& grad);
  // The same step when this rank's shard of the weights and its gradient are in pieces
  // (BucketLayout::own_pieces): params[k] and grads[k] alike, end to end the shard that the state
  // covers.
  void update(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads);
  int64_t steps() const { return step_; }
  torch::Tensor& exp_avg() { return exp_avg_; }
  torch::Tensor& exp_avg_sq() { return exp_avg_sq_; }
  void set_steps(int64_t s) { step_ = s; }
  // The rate of the next update()s: torch's optimizer.param_groups()[0].options().set_lr(lr), for
  // a schedule. Not checked, as torch does not check it there.
  void set_lr(double lr) { options_.lr(lr); }
  int64_t bytes() const;  // the state held: both moments
  const torch::optim::AdamWOptions& options() const { return options_; }

 private:
  torch::optim::AdamWOptions options_;
  torch::Tensor exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

// Bytes of training state one rank holds, by category, measured on the tensors it really keeps.
struct HeldBytes {
  int64_t params = 0;     // ZeRO-3: the persistent shards (the peak gathered unit is apart)
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t gathered_peak = 0;  // ZeRO-3 only: the largest unit's full parameters, while in use
  int64_t total() const { return params + grads + optimizer + gathered_peak; }
};

// The same figures from the formula (fp32, AdamW: 4 bytes a parameter, 4 a gradient, 8 of
// state), for P parameters on N ranks at `stage`, the sharded categories counted as N S / N with
// the padding of `layout_padded` (N S); for stage 3 gathered_peak is left to the caller.
HeldBytes formula_bytes(int stage, int64_t P, int64_t padded, int world);

// Bytes one rank sends per collective in a ring algorithm, from what it handed to each kind
// (CommStats counts the tensors' sizes): an all-reduce of b bytes sends 2 (N-1)/N b, a
// reduce-scatter of an input of b bytes (N-1)/N b, an all-gather of an input (its shard) of b
// bytes (N-1) b; a broadcast is left out (only at construction).
double ring_bytes(const std::string& kind, double bytes, int world);

// Sum of nbytes() of the defined tensors among `ts`.
int64_t bytes_of(const std::vector<torch::Tensor>& ts);

}  // namespace kit
