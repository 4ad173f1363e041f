// kit/zero.cpp — ZeRO stages 1 and 2 (see zero.h).
#include "kit/zero.h"

#include <algorithm>
#include <functional>
#include <stdexcept>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "kit/clip.h"         // clip_shard_grads_: --clip-grad on a sharded gradient
#include "kit/compat.h"       // NodePtr
#include "kit/distributed.h"  // default_group_ptr

namespace kit {
namespace {

std::vector<torch::Tensor> trainable(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params)
    if (p.requires_grad()) out.push_back(p);
  if (out.empty()) throw std::invalid_argument("ZeroOptimizer: the model has no trainable parameters");
  return out;
}

// The collectives go bucket by bucket: c10d's Gloo makes a scratch copy as big as what it is
// handed, for a reduce-scatter (an all-reduce inside: kit/compat.h, note 3) as for an all-gather
// (a flat output of its own), and handed the whole flat vector, that copy alone would be 4 P bytes
// at the peak, more than sharding saves on two ranks. A bucket takes from every rank's shard
// `piece` elements: at most kBucket elements (4 MiB) over all the ranks, and at most an eighth of
// a shard, so that small models are cut too; the bytes on the wire are the same.
constexpr int64_t kBucket = int64_t{1} << 20;
int64_t piece(int64_t shard, int64_t world) {
  return std::max<int64_t>(1, std::min(kBucket / world, (shard + 7) / 8));
}

int stage_1_or_2(int stage) {
  check_zero_stage(stage);
  if (stage != 1 && stage != 2)
    throw std::invalid_argument("ZeroOptimizer does stages 1 and 2, not " + std::to_string(stage) +
                                " (stage 0 is DistributedDataParallel, 3 is FullyShardedModel)");
  return stage;
}

}  // namespace

// Stage 2: the buckets of reduce_scatter_grads(), reduce-scattered during backward as soon as every
// parameter with a part in them has its gradient, from the last bucket down (the same order on
// every rank, whatever order backward takes); a parameter's .grad is freed once every bucket it
// has a part in is done. With a shard of S elements a bucket holds elements [at, at + len) of each
// rank's shard, so that in a backward that runs from the last parameter to the first, the last
// bucket is complete when backward is halfway through (N = 2), and from then on the gradients
// alive are about a shard's worth, 4 P / N bytes, instead of all of them.
struct ZeroOptimizer::Overlap {
  int64_t S = 0, N = 0, C = 0, B = 0;          // shard, ranks, piece, buckets
  std::vector<std::vector<int64_t>> buckets_of;  // parameter -> the buckets it has a part in
  std::vector<std::vector<int64_t>> params_of;   // bucket -> the parameters with a part in it
  std::vector<int64_t> bucket_waits, param_waits;  // this backward: parameters, buckets to come
  std::vector<bool> ready;
  int64_t next = -1;         // the next bucket to reduce-scatter; -1: not in a backward
  bool accumulate = false;   // a second backward before step(): add to grad_shard_
  bool unused = false;       // grad_shard_ holds averages step() has not used yet
  std::vector<compat::NodePtr> accumulators;
  std::vector<uintptr_t> keys;
};

namespace {
struct GradReady : torch::autograd::FunctionPostHook {
  std::function<void()> ready;
  explicit GradReady(std::function<void()> f) : ready(std::move(f)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ready();
    return outputs;
  }
};
}  // namespace

void ZeroOptimizer::start_overlap() {
  auto o = std::make_unique<Overlap>();
  o->S = layout_.shard();
  o->N = group_->size();
  o->C = piece(o->S, o->N);
  o->B = (o->S + o->C - 1) / o->C;
  o->buckets_of.resize(params_.size());
  o->params_of.resize(o->B);
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t begin = layout_.offset(i), end = begin + params_[i].numel();
    for (int64_t r = 0; r < o->N; ++r) {  // its part in each rank's shard, in shard coordinates
      const int64_t lo = std::max(begin, r * o->S) - r * o->S;
      const int64_t hi = std::min(end, (r + 1) * o->S) - r * o->S;
      if (lo >= hi) continue;  // nothing of it in shard r
      for (int64_t b = lo / o->C; b <= (hi - 1) / o->C; ++b) o->buckets_of[i].push_back(b);
    }
    std::sort(o->buckets_of[i].begin(), o->buckets_of[i].end());
    o->buckets_of[i].erase(std::unique(o->buckets_of[i].begin(), o->buckets_of[i].end()), o->buckets_of[i].end());
    for (int64_t b : o->buckets_of[i]) o->params_of[b].push_back(static_cast<int64_t>(i));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    o->keys.push_back(acc->add_post_hook(std::make_unique<GradReady>([this, i] { on_grad_ready(i); })));
    o->accumulators.push_back(std::move(acc));
  }
  overlap_ = std::move(o);
}

void ZeroOptimizer::on_grad_ready(size_t i) {
  Overlap& o = *overlap_;
  torch::NoGradGuard no_grad;
  if (o.next < 0) {  // the first gradient of this backward
    o.next = o.B - 1;
    o.bucket_waits.assign(o.B, 0);
    for (int64_t b = 0; b < o.B; ++b) o.bucket_waits[b] = static_cast<int64_t>(o.params_of[b].size());
    o.param_waits.clear();
    for (auto& bs : o.buckets_of) o.param_waits.push_back(static_cast<int64_t>(bs.size()));
    o.ready.assign(params_.size(), false);
    o.accumulate = o.unused;  // else what grad_shard_ holds is the last step's: written over
    o.unused = true;
    if (!o.accumulate) grad_shard_ = torch::empty({o.S}, flat_params_.options());
    // Every rank must contribute every bucket, even where a parameter got no gradient (zeros).
    torch::autograd::Engine::get_default_engine().queue_callback([this] {
      for (size_t k = 0; k < params_.size(); ++k) mark_ready(k);
      overlap_->next = -1;
    });
  }
  mark_ready(i);
}

void ZeroOptimizer::mark_ready(size_t i) {
  Overlap& o = *overlap_;
  if (o.ready[i]) return;
  o.ready[i] = true;
  for (int64_t b : o.buckets_of[i]) --o.bucket_waits[b];
  while (o.next >= 0 && o.bucket_waits[o.next] == 0) reduce_bucket(o.next--);
}

void ZeroOptimizer::reduce_bucket(int64_t b) {
  Overlap& o = *overlap_;
  const int64_t at = b * o.C, len = std::min(o.C, o.S - at);
  auto in = torch::zeros({o.N * len}, flat_params_.options());  // zeros: padding, no gradient
  for (int64_t r = 0; r < o.N; ++r) {
    const int64_t piece_begin = r * o.S + at;
    for (int64_t i : o.params_of[b]) {
      const auto& g = params_[i].grad();
      const int64_t begin = layout_.offset(i);
      const int64_t lo = std::max(begin, piece_begin);
      const int64_t hi = std::min(begin + params_[i].numel(), piece_begin + len);
      if (g.defined() && lo < hi)
        in.narrow(0, r * len + lo - piece_begin, hi - lo).copy_(g.reshape(-1).narrow(0, lo - begin, hi - lo));
    }
  }
  auto mine = grad_shard_.narrow(0, at, len);
  if (o.accumulate) {
    auto sum = torch::empty({len}, mine.options());
    group_->reduce_scatter(sum, in, ReduceOp::AVG);
    mine.add_(sum);
  } else {
    group_->reduce_scatter(mine, in, ReduceOp::AVG);
  }
  for (int64_t i : o.params_of[b])
    if (--o.param_waits[i] == 0) params_[i].mutable_grad() = torch::Tensor();  // all of it sent
}

ZeroOptimizer::ZeroOptimizer(std::vector<torch::Tensor> params, ZeroOptions options)
    : keep_group_(options.group ? nullptr : default_group_ptr()),
      group_(options.group ? options.group : keep_group_.get()),
      stage_(stage_1_or_2(options.stage)),
      params_(trainable(params)),
      claim_(params_, "ZeRO-" + std::to_string(stage_)),
      layout_(params_, group_->size(), group_->rank()),
      adamw_(options.adamw, torch::zeros({layout_.shard()}, params_[0].options().requires_grad(false))),
      max_grad_norm_(check_max_grad_norm(options.max_grad_norm, "ZeroOptimizer")) {
  // Rank 0's weights everywhere, as DDP does: in one flat broadcast. That flat vector then IS the
  // weights: each parameter becomes a view of its part (set_data keeps the parameter, which the
  // model holds, and frees its old storage), so that AdamW updates this rank's shard in place
  // and the all-gather writes straight into the weights, with no flat copy of them in between.
  torch::NoGradGuard no_grad;
  flat_params_ = layout_.flatten(params_);
  group_->broadcast(flat_params_, 0);
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_data(layout_.part(flat_params_, i));
  // Stage 2 reduce-scatters during backward (Overlap, above). At stage 1 the gradients are views
  // of one flat buffer too: before backward accumulates the first of them, every .grad becomes a
  // zeroed view of it (AccumulateGrad then adds into it in place: 0 + g is g, bit for bit), and
  // the reduce-scatter in step() reads that buffer as it is.
  if (stage_ == 2) {
    start_overlap();
    return;
  }
  for (auto& p : params_)
    hooks_.push_back(p.register_hook([this](const torch::Tensor&) { flat_grads(); }));
}

ZeroOptimizer::~ZeroOptimizer() {
  for (size_t i = 0; i < hooks_.size(); ++i) params_[i].remove_hook(hooks_[i]);
  if (overlap_)
    for (size_t i = 0; i < overlap_->keys.size(); ++i) overlap_->accumulators[i]->del_post_hook(overlap_->keys[i]);
}

torch::Tensor& ZeroOptimizer::flat_grads() {
  if (!flat_grads_.defined()) {
    torch::NoGradGuard no_grad;
    flat_grads_ = torch::zeros({layout_.padded()}, flat_params_.options());
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i].mutable_grad() = layout_.part(flat_grads_, i);
  }
  return flat_grads_;
}

void ZeroOptimizer::drop_grads() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  flat_grads_ = torch::Tensor();
}

void ZeroOptimizer::zero_grad() {
  drop_grads();
  grad_shard_ = torch::Tensor();
  if (overlap_) overlap_->unused = false;
}

void ZeroOptimizer::step() {
  torch::NoGradGuard no_grad;
  // 1. Average the gradients, but only our shard of them comes back: a reduce-scatter, straight
  //    from the flat gradient buffer (zeros if backward made none).
  torch::Tensor my_grad;
  if (stage_ == 2 && overlap_->unused) {
    my_grad = grad_shard_;  // reduce-scattered during backward
    overlap_->unused = false;
  } else {
    my_grad = torch::empty({layout_.shard()}, flat_params_.options());
    reduce_scatter_grads(my_grad);
  }
  // --clip-grad: the global norm of the averaged gradient, from every rank's shard of it.
  if (max_grad_norm_ > 0) grad_norm_ = clip_shard_grads_({my_grad}, max_grad_norm_, *group_);
  if (stage_ == 2) {
    grad_shard_ = my_grad;  // the only gradient kept; the full ones go before AdamW's temporaries
    drop_grads();
  }
  // Stage 1 keeps every parameter's .grad as backward left it (this rank's own gradient, not
  // the average): gradient memory is not sharded at stage 1.
  // 2. AdamW on our shard only, with our shard of the state: in place, in the weights.
  adamw_.update(layout_.own(flat_params_), my_grad);
  my_grad = torch::Tensor();  // stage 1: the averaged shard is done with, before the all-gather
  // 3. Everybody's updated shard, to everybody.
  gather_params(layout_.own(flat_params_));
}

// Bucket b holds, for every rank r, elements [at, at + len) of r's shard: the reduce-scatter of the
// bucket gives this rank those elements of its own shard, averaged.
void ZeroOptimizer::reduce_scatter_grads(torch::Tensor& my_grad) {
  const int64_t S = layout_.shard(), N = group_->size();
  const int64_t C = piece(S, N);
  torch::Tensor& grads = flat_grads();
  auto bucket = torch::empty({N * C}, grads.options());
  for (int64_t at = 0; at < S; at += C) {
    const int64_t len = std::min(C, S - at);
    auto in = bucket.narrow(0, 0, N * len);
    for (int64_t r = 0; r < N; ++r) in.narrow(0, r * len, len).copy_(grads.narrow(0, r * S + at, len));
    group_->reduce_scatter(my_grad.narrow(0, at, len), in, ReduceOp::AVG);
  }
}

// The other way round: every rank's elements [at, at + len) of its shard, into the weights.
void ZeroOptimizer::gather_params(const torch::Tensor& own) {
  torch::NoGradGuard no_grad;
  const int64_t S = layout_.shard(), N = group_->size();
  const int64_t C = piece(S, N);
  auto bucket = torch::empty({N * C}, flat_params_.options());
  for (int64_t at = 0; at < S; at += C) {
    const int64_t len = std::min(C, S - at);
    auto out = bucket.narrow(0, 0, N * len);
    group_->all_gather(out, own.narrow(0, at, len));
    for (int64_t r = 0; r < N; ++r)
      flat_params_.narrow(0, r * S + at, len).copy_(out.narrow(0, r * len, len));
  }
}

torch::Tensor ZeroOptimizer::own_params() const { return layout_.own(flat_params_).clone(); }

void ZeroOptimizer::load_own_params(const torch::Tensor& shard) {
  if (shard.numel() != layout_.shard())
    throw std::invalid_argument("ZeroOptimizer: a shard of " + std::to_string(shard.numel()) +
                                " elements for shards of " + std::to_string(layout_.shard()));
  gather_params(shard.to(params_[0].options().requires_grad(false)));
}

HeldBytes ZeroOptimizer::held() const {
  HeldBytes b;
  b.params = bytes_of(params_);
  std::vector<torch::Tensor> grads;
  for (const auto& p : params_) grads.push_back(p.grad());
  grads.push_back(grad_shard_);
  b.grads = bytes_of(grads);
  b.optimizer = adamw_.bytes();
  return b;
}

}  // namespace kit
