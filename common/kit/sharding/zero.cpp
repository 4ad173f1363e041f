// kit/sharding/zero.cpp — ZeRO stages 1 and 2 (see zero.h).
#include "kit/sharding/zero.h"

#include <algorithm>
#include <functional>
#include <stdexcept>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "kit/sharding/clip.h"        // clip_shard_grads_: --clip-grad on a sharded gradient
#include "kit/compat.h"               // NodePtr
#include "kit/runtime/distributed.h"  // group_or_world

namespace kit {
namespace {

using Named = torch::OrderedDict<std::string, torch::Tensor>;

// The trainable parameters, or their names (in the same order).
std::vector<torch::Tensor> trainable(const Named& named, const CallSite& site) {
  std::vector<torch::Tensor> out;
  for (const auto& item : named)
    if (item.value().requires_grad()) out.push_back(item.value());
  if (out.empty())
    throw std::invalid_argument("ZeroOptimizer: the model has no trainable parameters (" +
                                site.str() + ")");
  return out;
}
std::vector<std::string> trainable_names(const Named& named) {
  std::vector<std::string> out;
  for (const auto& item : named)
    if (item.value().requires_grad()) out.push_back(item.key());
  return out;
}

// A list of parameters, named by their place in it.
Named numbered(const std::vector<torch::Tensor>& params) {
  Named out;
  for (size_t i = 0; i < params.size(); ++i) out.insert("parameter " + std::to_string(i), params[i]);
  return out;
}

// What is not sharded but must start alike on every rank: the frozen parameters and the buffers.
std::vector<torch::Tensor> unsharded_state(const Named& named, const std::vector<torch::Tensor>& buffers) {
  std::vector<torch::Tensor> out;
  for (const auto& item : named)
    if (!item.value().requires_grad()) out.push_back(item.value());
  out.insert(out.end(), buffers.begin(), buffers.end());
  return out;
}

// The collectives go bucket by bucket: c10d's Gloo makes a scratch copy as big as what it is
// handed, for a reduce-scatter (an all-reduce inside: kit/compat.h, note 3) as for an all-gather
// (a flat output of its own), and handed the whole flat vector, that copy alone would be 4 P bytes
// at the peak, more than sharding saves on two ranks. A bucket holds at most kBucket elements
// (4 MiB of fp32; one parameter larger than that is a bucket of its own) and at most an eighth of
// the parameters, so that small models are cut too; the bytes on the wire are the same.
constexpr int64_t kBucket = int64_t{1} << 20;
int64_t bucket_cap(const std::vector<torch::Tensor>& params) {
  int64_t P = 0;
  for (const auto& p : params) P += p.numel();
  return std::max<int64_t>(1, std::min(kBucket, (P + 7) / 8));
}

// Stage 2: at most this many buckets' reduce-scatters on the wire at once, so that a slow network
// bounds the gradients alive instead of letting them pile up. Two: one travels while the next is
// sent. The peak is the same as with one (zero_report, README's model: 231.2 MB against 232.1 on
// 2 ranks, 168.0-171.2 against 166.9-170.6 on 4, varying from run to run).
constexpr size_t kInFlight = 2;

// The stage, and AdamW's options; an error ends with the line that wrote the options
// (ZeroOptions::site): the trainer's, not this file's.
int stage_1_or_2(const ZeroOptions& options) {
  const int stage = options.stage;
  if (stage != 1 && stage != 2)
    throw std::invalid_argument("ZeroOptimizer does stages 1 and 2, not " + std::to_string(stage) +
                                " (stage 0 is DistributedDataParallel, 3 is FullyShardedModel) (" +
                                options.site.str() + ")");
  check_adamw_options(options.adamw, "ZeroOptimizer", options.site);
  return stage;
}

}  // namespace

// Stage 2's state during a backward. A bucket's gradients accumulate straight into its own flat
// buffer (each .grad a view of its part, made just before autograd adds the parameter's first
// gradient: 0 + g is g, bit for bit; a bucket of one large parameter uses autograd's gradient
// itself); once the last of them is in, the buffer IS the reduce-scatter's input, launched in the
// background (no copy, no wait), its output this rank's piece of the averaged shard
// (grad_pieces_), made then. The bucket's .grads and its buffer are dropped once its collective is
// done, not before: it reads them. On one rank there is nothing to average: each buffer is the
// bucket's piece itself, and no collective runs.
struct ZeroOptimizer::Overlap {
  struct InFlight {
    size_t bucket;
    Work work;
    torch::Tensor sum;  // accumulating: the average arrives here, then is added to its piece
  };
  std::vector<torch::Tensor> buffers;  // per bucket, while it fills and travels: its N slices
  // Per bucket: one parameter that needs no padding. Its .grad, as autograd makes it, is the
  // buffer already: no window, and no second copy of a large gradient beside autograd's own.
  std::vector<bool> solo;
  std::vector<int64_t> pending;        // per bucket: gradients still to come in this backward
  std::vector<bool> ready;             // per parameter, in this backward
  std::vector<InFlight> in_flight;     // oldest first
  size_t next = 0;           // the next bucket to launch: in order, the same on every rank
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

// Two hooks per parameter: one on its gradient, before autograd adds it into .grad (before_grad),
// one on the node that adds it, after (mark_ready).
void ZeroOptimizer::start_overlap() {
  auto o = std::make_unique<Overlap>();
  const size_t B = layout_.buckets().size();
  o->buffers.resize(B);
  o->pending.assign(B, 0);
  o->ready.assign(params_.size(), false);
  for (const auto& bucket : layout_.buckets())
    o->solo.push_back(group_->size() > 1 && bucket.params.size() == 1 &&
                      params_[bucket.params[0]].numel() == bucket.slice * group_->size());
  for (size_t i = 0; i < params_.size(); ++i) {
    hooks_.push_back(params_[i].register_hook([this, i](const torch::Tensor&) { before_grad(i); }));
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    o->keys.push_back(acc->add_post_hook(std::make_unique<GradReady>([this, i] { mark_ready(i); })));
    o->accumulators.push_back(std::move(acc));
  }
  overlap_ = std::move(o);
}

void ZeroOptimizer::before_grad(size_t i) {
  Overlap& o = *overlap_;
  torch::NoGradGuard no_grad;
  // A parameter used twice in one graph gets one gradient (autograd sums its uses first); a second
  // one is a second backward through it while this one runs (DDP's check, kit/ddp/ddp.cpp), and
  // its bucket may already be on the wire or freed: that gradient would be lost.
  if (grads_ == Grads::kReducing && o.ready[i])
    throw std::runtime_error("ZeroOptimizer (ZeRO-2): parameter '" + names_[i] + "' got its "
                             "gradient twice in one backward (reentrant activation checkpointing "
                             "or a second backward through it before this one ended); its bucket "
                             "may already be reduce-scattered: give each parameter one gradient "
                             "per backward");
  if (grads_ != Grads::kReducing) {  // the first gradient of this backward
    // A second backward before step() adds to the averages of the first (kAveraged: the pieces
    // stay, and launch_ready() adds into them); otherwise what grad_pieces_ hold is the last
    // step's (kStepped) or nothing: made anew, piece by piece, as each bucket's average arrives
    // (buffer(), launch_ready()), not all at the start of backward, when the activations peak.
    if (grads_ != Grads::kAveraged) grad_pieces_.assign(layout_.buckets().size(), torch::Tensor());
    grads_ = Grads::kReducing;
    o.next = 0;
    for (size_t b = 0; b < o.pending.size(); ++b)
      o.pending[b] = static_cast<int64_t>(layout_.buckets()[b].params.size());
    std::fill(o.ready.begin(), o.ready.end(), false);
    // Every rank must contribute every bucket, even where a parameter got no gradient (zeros).
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }
  if (o.solo[layout_.bucket_of(i)]) return;  // autograd's gradient is the buffer (buffer())
  auto& grad = params_[i].mutable_grad();
  auto place = layout_.part_of_bucket(buffer(layout_.bucket_of(i)), i);
  if (grad.defined() && !grad.is_same(place)) place.copy_(grad);  // a .grad set by hand
  grad = place;
}

torch::Tensor& ZeroOptimizer::buffer(size_t b) {
  auto& buf = overlap_->buffers[b];
  if (!buf.defined()) {
    const auto& bucket = layout_.buckets()[b];
    const auto& solo_grad = params_[bucket.params[0]].grad();
    if (overlap_->solo[b] && solo_grad.defined())  // complete (launch_ready), as autograd left it
      buf = solo_grad.contiguous().view(-1);
    else if (group_->size() == 1)  // the whole bucket is this rank's piece: zeros, then the sum
      buf = grad_pieces_[b].defined()
                ? grad_pieces_[b]
                : (grad_pieces_[b] = torch::zeros({bucket.slice}, flat_params_.options()));
    else
      buf = torch::zeros({bucket.slice * group_->size()}, flat_params_.options());
  }
  return buf;
}

void ZeroOptimizer::mark_ready(size_t i) {
  Overlap& o = *overlap_;
  if (grads_ != Grads::kReducing || o.ready[i]) return;
  o.ready[i] = true;
  if (--o.pending[layout_.bucket_of(i)] > 0) return;
  // A bucket is full: the older of two travelling is waited for now, even where this one cannot
  // go yet (a bucket before it still waits for a gradient), else it would stay alive while more
  // fill up. A bucket is freed only when it is waited for: c10d cannot be asked whether Gloo's
  // reduce-scatter is done (its isCompleted() stays false, even after wait(); measured).
  while (o.in_flight.size() >= kInFlight) complete_oldest();
  launch_ready();
}

void ZeroOptimizer::launch_ready() {
  Overlap& o = *overlap_;
  torch::NoGradGuard no_grad;
  const auto& buckets = layout_.buckets();
  while (o.next < buckets.size() && o.pending[o.next] == 0) {
    const size_t b = o.next++;
    if (group_->size() == 1) continue;  // one rank's average is its own gradient, already in place
    auto in = buffer(b);
    while (o.in_flight.size() >= kInFlight) complete_oldest();
    auto& mine = grad_pieces_[b];
    torch::Tensor sum;  // a second backward before step(): this average is added to the piece
    if (mine.defined()) sum = torch::empty_like(mine);
    else mine = torch::empty({buckets[b].slice}, flat_params_.options());
    // The buffer is dropped once this is done: the collective may use it as its scratch.
    Work work = group_->reduce_scatter_scratch_async(sum.defined() ? sum : mine, in, ReduceOp::AVG);
    o.in_flight.push_back({b, std::move(work), std::move(sum)});
  }
}

void ZeroOptimizer::complete_oldest() {
  Overlap& o = *overlap_;
  Overlap::InFlight f = std::move(o.in_flight.front());
  o.in_flight.erase(o.in_flight.begin());
  f.work.wait();
  const auto& bucket = layout_.buckets()[f.bucket];
  if (f.sum.defined()) grad_pieces_[f.bucket].add_(f.sum);
  for (size_t i : bucket.params) params_[i].mutable_grad() = torch::Tensor();
  o.buffers[f.bucket] = torch::Tensor();
}

// The end of backward (autograd's callback): a parameter without a gradient adds zeros (its part
// of a buffer, made zero) and keeps no .grad; the last buckets go, and all are waited for, so that
// after backward only grad_pieces_ are left.
void ZeroOptimizer::finish_backward() {
  Overlap& o = *overlap_;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!o.ready[i]) {
      buffer(layout_.bucket_of(i));
      o.ready[i] = true;
      --o.pending[layout_.bucket_of(i)];
    }
  launch_ready();
  while (!o.in_flight.empty()) complete_oldest();
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();  // one rank: views of the pieces
  for (auto& buf : o.buffers) buf = torch::Tensor();
  grads_ = Grads::kAveraged;
}

ZeroOptimizer::ZeroOptimizer(const torch::nn::Module& model, ZeroOptions options)
    : ZeroOptimizer(model.named_parameters(), model.buffers(), options) {}

ZeroOptimizer::ZeroOptimizer(std::vector<torch::Tensor> params, ZeroOptions options)
    : ZeroOptimizer(numbered(params), {}, options) {}

// Everything that can be refused is checked in the initialisers (the stage, AdamW's options, the
// parameters, DDP's claim), before the body changes the model.
ZeroOptimizer::ZeroOptimizer(const Named& named, const std::vector<torch::Tensor>& buffers,
                             ZeroOptions options)
    : keep_group_(group_or_world(options.group, "ZeroOptimizer", &options.site)),
      group_(keep_group_.get()),
      stage_(stage_1_or_2(options)),
      names_(trainable_names(named)),
      params_(trainable(named, options.site)),
      claim_(params_, "ZeRO-" + std::to_string(stage_)),
      layout_(params_, group_->size(), group_->rank(), bucket_cap(params_)),
      adamw_(options.adamw, torch::zeros({layout_.shard()}, params_[0].options().requires_grad(false))),
      max_grad_norm_(check_max_grad_norm(options.max_grad_norm, "ZeroOptimizer")) {
  // Rank 0's weights everywhere, as DDP does: in one flat broadcast. That flat vector then IS the
  // weights: each parameter becomes a view of its part (set_data keeps the parameter, which the
  // model holds, and frees its old storage), so that AdamW updates this rank's slices in place
  // and the all-gathers write straight into the weights, with no flat copy of them in between.
  torch::NoGradGuard no_grad;
  flat_params_ = layout_.flatten(params_);
  group_->broadcast(flat_params_, 0);
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_data(layout_.part(flat_params_, i));
  // What is not sharded: each rank keeps it whole, rank 0's (DDP does the same).
  broadcast_from_rank0(*group_, unsharded_state(named, buffers));
  // Stage 2 reduce-scatters during backward (Overlap, above). At stage 1 the gradients are views
  // of one flat buffer too: before backward accumulates the first of them, every .grad becomes a
  // zeroed view of it (AccumulateGrad then adds into it in place: 0 + g is g, bit for bit), and
  // the reduce-scatters in step() read that buffer as it is.
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
  if (stage_ == 1) grads_ = Grads::kLocal;  // the first gradient of a backward, or step()
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
  grad_pieces_.clear();
  grads_ = Grads::kNone;
}

void ZeroOptimizer::step() {
  torch::NoGradGuard no_grad;
  // 1. Average the gradients, but only our shard of them comes back: reduce-scatters, straight
  //    from the flat gradient buffer (zeros if backward made none). On one rank the average is the
  //    gradient itself: the buffer is the shard, with no copy (so that ZeRO-1 holds no more than
  //    DDP there).
  std::vector<torch::Tensor> my_grad;  // per bucket: this rank's slice of it, averaged
  if (grads_ == Grads::kAveraged) {
    my_grad = grad_pieces_;  // stage 2: reduce-scattered during backward
  } else {  // stage 1, or a step with no backward since the last one (zeros)
    torch::Tensor shard;
    if (group_->size() == 1) {
      shard = flat_grads();
    } else {
      shard = torch::empty({layout_.shard()}, flat_params_.options());
      reduce_scatter_grads(shard);
    }
    for (const auto& bucket : layout_.buckets())
      my_grad.push_back(shard.narrow(0, bucket.shard_begin, bucket.slice));
  }
  // --clip-grad: the global norm of the averaged gradient, from every rank's shard of it.
  if (max_grad_norm_ > 0) grad_norm_ = clip_shard_grads_(my_grad, max_grad_norm_, *group_);
  if (stage_ == 2) {
    grad_pieces_ = my_grad;  // the only gradient kept; the full ones go before AdamW's temporaries
    drop_grads();
    grads_ = Grads::kStepped;
  }
  // Stage 1 keeps every parameter's .grad as backward left it (this rank's own gradient, not
  // the average; on one rank, where they are the same, clipped as clip_grad_norm_ leaves it):
  // gradient memory is not sharded at stage 1.
  // 2. AdamW on our shard only, with our shard of the state: in place, in the weights.
  adamw_.update(layout_.own_pieces(flat_params_), my_grad);
  my_grad.clear();  // stage 1: the averaged shard is done with, before the all-gathers
  // 3. Everybody's updated slices, to everybody.
  gather_params();
}

// Bucket b's reduce-scatter gives this rank its slice of the bucket, averaged: elements
// [shard_begin, shard_begin + slice) of its shard.
void ZeroOptimizer::reduce_scatter_grads(const torch::Tensor& my_grad) {
  torch::Tensor& grads = flat_grads();
  const auto& buckets = layout_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b)
    group_->reduce_scatter(my_grad.narrow(0, buckets[b].shard_begin, buckets[b].slice),
                           layout_.bucket(grads, b), ReduceOp::AVG);
}

// The other way round: every rank's slice of bucket b, straight into the weights. The input is a
// copy of this rank's slice (one slice, at most a bucket / N), as the output holds it too.
void ZeroOptimizer::gather_params() {
  if (group_->size() == 1) return;  // the one shard is all of the weights, updated in place
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < layout_.buckets().size(); ++b)
    group_->all_gather(layout_.bucket(flat_params_, b), layout_.own(flat_params_, b).clone());
}

torch::Tensor ZeroOptimizer::own_params() const {
  return torch::cat(layout_.own_pieces(flat_params_));
}

void ZeroOptimizer::load_own_params(const torch::Tensor& shard) {
  if (shard.numel() != layout_.shard())
    throw std::invalid_argument("ZeroOptimizer: a shard of " + std::to_string(shard.numel()) +
                                " elements for shards of " + std::to_string(layout_.shard()));
  torch::NoGradGuard no_grad;
  auto values = shard.reshape(-1).to(flat_params_.options());
  int64_t at = 0;
  for (auto& piece : layout_.own_pieces(flat_params_)) {
    piece.copy_(values.narrow(0, at, piece.numel()));
    at += piece.numel();
  }
  gather_params();
}

HeldBytes ZeroOptimizer::held() const {
  HeldBytes b;
  b.params = bytes_of(params_);
  std::vector<torch::Tensor> grads;
  for (const auto& p : params_) grads.push_back(p.grad());
  grads.insert(grads.end(), grad_pieces_.begin(), grad_pieces_.end());
  b.grads = bytes_of(grads);
  b.optimizer = adamw_.bytes();
  return b;
}

}  // namespace kit
