// kit/sharding/zero.h — ZeroOptimizer: AdamW with its state sharded over the ranks (ZeRO-1, -2).
//
//   kit::ZeroOptimizer optimizer(model, {.stage = 2, .adamw = AdamWOptions(1e-3)});  // no DDP
//   ... loss.backward(); optimizer.step(); optimizer.zero_grad();
//
// Under DDP every rank keeps AdamW's two moments for every parameter: 8 bytes a parameter, twice
// the model itself, stored N times over. Here rank r keeps them only for its shard of the flat
// parameter vector, and one step is:
//   1. the gradients are reduce-scattered: rank r receives only the average over the ranks of
//      its shard of them, all it needs to update its shard.
//        stage 1: in step(). Every parameter's .grad stays as backward made it (this rank's
//                 gradient, not the average) until zero_grad(): 4 P bytes of gradients, as under
//                 DDP;
//        stage 2: during backward, overlapped with it as DDP's all-reduces are: a bucket's
//                 reduce-scatter starts, in the background, as soon as backward has made its
//                 last gradient (and the buckets before it have gone: the same order on every
//                 rank), straight from the buffer those gradients accumulated in, and
//                 the bucket's .grads are freed once it is done (it reads them until then). At
//                 most two buckets travel at once: when a bucket is full, the older of two is
//                 waited for, so that a slow network cannot pile the gradients up; the end of
//                 backward waits for the rest. After backward no .grad is left, only the
//                 averaged shard, made bucket by bucket as the averages arrive: 4 P / N bytes of
//                 gradients, and at no moment more full gradients than those of the buckets not
//                 yet sent and of the two travelling. Two backward passes before a step add up.
//   2. AdamW updates this rank's shard of the weights, with this rank's shard of the state;
//   3. the updated shards are all-gathered: every rank has the whole new model again.
// The layout (kit/sharding/sharding.h, BucketLayout) is cut for this: buckets of whole parameters,
// in the order backward is expected to make their gradients (the last parameter first, as DDP's
// first buckets and DeepSpeed's), each split evenly over the ranks, rank r's shard being its slice
// of every bucket. So a bucket is complete as soon as its own parameters' gradients are.
// No full-size copy on the way, so that the peak, not only what is held between steps, is lower
// than DDP's (kit/train/memory.h measures it): the parameters are views of one flat vector, which
// AdamW updates in place and the all-gathers fill bucket by bucket; the gradients are views of flat
// buffers too (stage 1: one for all; stage 2: one per bucket, or autograd's own gradient for a
// bucket of one large parameter), which the reduce-scatters read as they are; the buckets hold at
// most 4 MiB (zero.cpp says why). On one rank nothing is averaged or gathered: the gradients are
// the "shard" (no copy), and neither stage peaks above DDP (measured: README's model, ZeRO-1 equal
// to DDP, ZeRO-2 6% below; tests/ddp/zero_test.cpp, ZeroPeak).
// Communication per step, stage 1 or 2: a reduce-scatter plus an all-gather, the same bytes as
// DDP's all-reduce (a ring all-reduce IS a reduce-scatter followed by an all-gather).
//
// Reduce-scatter on Gloo: c10d itself emulates it with an all-reduce (kit/compat.h, note 3), so
// on CPU ZeRO-2 receives the right shard but the wire carries a whole all-reduce; NCCL has a
// real one. The byte counts of kit::ring_bytes() are the ring algorithm's, not Gloo's. ZeRO-2's
// buckets are dropped after their collective, so it lets the all-reduce work in the bucket itself
// (ProcessGroup::reduce_scatter_scratch_async) and saves c10d's copy of it.
//
// Simplification, said plainly: the buckets follow the reverse of the parameters' order, and
// unlike DDP's (kit/ddp/ddp.h) they are not rebuilt from the order the gradients really arrive in
// (that would move the weights and AdamW's state to a new layout). Where the two differ, a bucket
// waits for its latest gradient, and the buckets after it wait with it: in TransformerLM's
// post-norm encoder layer, norm1 is registered after the feed-forward, so its bucket goes first,
// but its gradient comes after the feed-forward's. held() counts what a rank keeps between steps;
// the peak is kit/train/memory.h's.
//
// Wraps the model instead of DDP, never together with it (one error line: kit/ddp/param_claim.h).
// At construction rank 0's parameters are broadcast, as DDP does, so all ranks start alike: the
// trainable ones, and, given the model, its frozen ones (requires_grad false) and its buffers too.
// AdamW's options are checked first: amsgrad, which ShardedAdamW does not implement, and values
// torch::optim::AdamW refuses are one error line ending with the line that wrote the options
// (kit/sharding/sharding.h, unsupported_adamw), and nothing is changed.
// set_lr() changes the rate between steps, as torch's param_groups()[0].options().set_lr() does
// (Python: param_groups[0]["lr"] = lr), for a schedule such as warm-up (kit/train/lr_rule.h); a
// sharded checkpoint keeps it, as torch's optimizer state does.
// At stage 2, a parameter that gets a second gradient in one backward (a reentrant activation
// checkpoint, a nested backward through it) is an error naming it, as under DDP: its bucket may
// already be reduce-scattered, and the second gradient would be lost.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/adamw.h>

#include "kit/ddp/param_claim.h"        // ParameterClaim: not together with DDP
#include "kit/runtime/process_group.h"  // ProcessGroup: reduce_scatter, all_gather, broadcast
#include "kit/sharding/sharding.h"      // BucketLayout, ShardedAdamW, HeldBytes

namespace kit {

struct ZeroOptions {
  int stage = 1;  // 1 or 2 here; 3 is kit/sharding/zero3.h
  torch::optim::AdamWOptions adamw{1e-3};  // amsgrad is refused (see above)
  // The ranks that share the state: default the world (kit::setup()'s group), or a group from
  // kit::new_group() that this rank is a member of (rank 0's weights: the group's first rank's).
  ProcessGroup* group = nullptr;
  // > 0: the averaged gradient is clipped to this global L2 norm before AdamW, as
  // torch.nn.utils.clip_grad_norm_ does (kit/sharding/clip.h: the shards' sums of squares
  // all-reduced). 0: no clipping.
  double max_grad_norm = 0;
  // Where these options were written (the trainer's line, filled in by the aggregate
  // initialisation `kit::ZeroOptions{...}` itself): an error of the stage ends with it, so that
  // kit check blames that line, not zero.cpp. Never set by hand.
  CallSite site = {};
};

class ZeroOptimizer {
 public:
  // The model's trainable parameters are sharded; its frozen parameters and buffers are set to
  // rank 0's, as DDP does; a parameter is named by its name in the model in an error.
  template <typename M>
  ZeroOptimizer(const torch::nn::ModuleHolder<M>& model, ZeroOptions options)
      : ZeroOptimizer(*model, options) {}
  ZeroOptimizer(const torch::nn::Module& model, ZeroOptions options);
  // Parameters only: no buffers to broadcast; a parameter is named by its place in the list.
  ZeroOptimizer(std::vector<torch::Tensor> params, ZeroOptions options);
  ~ZeroOptimizer();  // takes its hooks off the parameters
  ZeroOptimizer(const ZeroOptimizer&) = delete;  // the hooks point at this object
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  void zero_grad();  // drops the gradients (as zero_grad(set_to_none))
  void step();       // the three steps above; every rank must call it

  HeldBytes held() const;
  const BucketLayout& layout() const { return layout_; }
  int stage() const { return stage_; }
  // The learning rate of the next step()s (see the top of this file).
  void set_lr(double lr) { adamw_.set_lr(lr); }
  double lr() const { return adamw_.options().lr(); }
  // The averaged gradient's global norm before clipping, at the last step (undefined without
  // max_grad_norm): a 0-d tensor on the gradients' device, as clip_grad_norm_ returns it.
  const torch::Tensor& grad_norm() const { return grad_norm_; }
  ProcessGroup& group() const { return *group_; }
  // This rank's part of the training state, for sharded checkpoints
  // (kit/train/zero_checkpoint.h): its shard of the weights (a copy), AdamW's two moments for
  // it, and the steps done.
  ShardedAdamW& adamw() { return adamw_; }
  torch::Tensor own_params() const;
  // Puts a shard back (checkpoint resume) and all-gathers the weights from every rank's shard:
  // every rank must call it.
  void load_own_params(const torch::Tensor& shard);

 private:
  // Both public constructors: every parameter by name, and the buffers (rank 0's everywhere).
  ZeroOptimizer(const torch::OrderedDict<std::string, torch::Tensor>& named,
                const std::vector<torch::Tensor>& buffers, ZeroOptions options);
  void gather_params();  // all-gather every rank's slices into the weights, bucket by bucket
  void reduce_scatter_grads(const torch::Tensor& my_grad);  // bucket by bucket, from flat_grads_
  torch::Tensor& flat_grads();  // the flat gradient buffer, made (zeros) and handed out as .grad
  struct Overlap;               // stage 2: reduce-scatter during backward (zero.cpp)
  void start_overlap();
  void before_grad(size_t i);   // parameter i's .grad: its place in its bucket's buffer
  torch::Tensor& buffer(size_t b);  // bucket b's gradients, made on first use
  void mark_ready(size_t i);
  void launch_ready();          // the complete buckets' reduce-scatters, in order, async
  void complete_oldest();       // waits for one, frees its .grads and buffer
  void finish_backward();       // autograd's callback: the rest, and wait for all
  void drop_grads();            // every .grad and the buffer under them

  // Where this rank's gradient is between the calls: the one place the two stages' different
  // rules are told apart (zero.cpp reads and sets it, nothing else does).
  //   kNone      no gradient: constructed, or after zero_grad()
  //   kLocal     stage 1: every .grad is this rank's own gradient, a view of flat_grads_, which
  //              step() reduce-scatters (kept as backward left it until zero_grad())
  //   kReducing  stage 2, inside a backward: buckets filling and travelling (Overlap)
  //   kAveraged  stage 2, after it: grad_pieces_ hold the averaged shard; a second backward adds
  //              to them, step() uses them
  //   kStepped   stage 2, after step(): grad_pieces_ hold the shard step() used (counted by
  //              held()); the next backward makes them anew
  enum class Grads { kNone, kLocal, kReducing, kAveraged, kStepped };
  Grads grads_ = Grads::kNone;

  std::shared_ptr<ProcessGroup> keep_group_;
  ProcessGroup* group_;
  int stage_;
  std::vector<std::string> names_;  // per trainable parameter, for errors
  std::vector<torch::Tensor> params_;
  ParameterClaim claim_;
  BucketLayout layout_;
  ShardedAdamW adamw_;
  torch::Tensor flat_params_;  // N S elements; every parameter is a view of its part
  torch::Tensor flat_grads_;   // N S elements while gradients exist; every .grad is a view
  std::vector<unsigned> hooks_;  // per parameter: the hook before its gradient is added
  std::unique_ptr<Overlap> overlap_;  // stage 2
  // Stage 2: the only gradient kept, this rank's averaged shard (S elements), one piece a bucket.
  std::vector<torch::Tensor> grad_pieces_;
  double max_grad_norm_;      // 0: no clipping
  torch::Tensor grad_norm_;
};

}  // namespace kit
