// kit/sharding/zero3.h — FullyShardedModel: ZeRO stage 3, FSDP-style. Even the parameters are
// sharded.
//
//   kit::FullyShardedModel sharded(model, {.stage = 3, .adamw = AdamWOptions(1e-3)});
//   auto loss = kit::lm_loss(sharded.forward(input), target);  // not model->forward
//   loss.backward(); sharded.step(); sharded.zero_grad();
//   kit::save0(sharded, "model-final.pt");  // the whole model, gathered to rank 0: save0's file
//
// Any model that is a chain of units can be sharded: give the model and a list of ShardedUnit (a
// name, the unit's forward, Tensor -> Tensor, and the parameters it reads; or a module holder and a
// forward) in the order forward runs them, or a model that lists its own units (a units() method
// whose elements have a `module` and a `run`, as TransformerLM::units(): the embedding, each
// Transformer block, the output layer). Every trainable parameter of the model must be in exactly
// one unit (tied weights: a unit that says it reuses an earlier unit's parameters, ShardedUnit::
// reuse, is that unit run again), and a unit may read only the model's parameters: anything else
// is one error line ending with the line that wrote the options (ZeroOptions::site), before
// anything is changed.
// (That is why every constructor takes the model: a list alone cannot show a parameter it left
// out.) This folder knows no model by name: sharding/ sits above models/ and includes nothing of
// it (common/kit/README.md, the folders' order).
// At construction every rank takes rank 0's weights, as DDP does: the trainable ones, before it
// keeps its shard of them, and the model's frozen parameters (requires_grad false) and buffers,
// which stay whole on every rank. AdamW's options are checked as ZeroOptimizer checks them
// (kit/sharding/zero.h: amsgrad is refused); set_lr() changes the rate between steps.
// Each unit's trainable parameters get a flat layout of their own (kit/sharding/sharding.h), and
// rank r keeps only its shard of each: of the weights, of the gradients, of AdamW's moments, 16 P /
// N bytes in all. The model's own parameter tensors are left empty (0 elements) between uses.
//
// Each unit has one flat buffer of its N S weights, and while the unit is gathered its parameters
// are views into it. A unit's forward: all-gather into the buffer, run the unit with autograd
// recording, free the buffer's storage. Its backward: all-gather into the same storage again,
// back-propagate through the graph forward recorded, reduce-scatter the unit's flat weight
// gradient (each rank receives the average of its shard), free. So the full weights of one unit
// at a time exist, never the whole model; no forward is run twice.
//
// Why the same storage: what autograd saves for the unit's backward (the input of a matmul, the
// transposed weight, a LayerNorm's weight) are the parameters or views of them, so of the flat
// buffer's storage. Freeing that storage's bytes while keeping its StorageImpl (c10's
// StorageImpl::set_data_ptr_noswap with an empty pointer, and size 0; the same API in LibTorch
// 2.2 to 2.15) releases the weights without autograd's knowledge; allocating new bytes into the
// same StorageImpl and gathering into them before the unit's backward makes every saved view
// see the weights again. The gather writes into the buffer, whose version counter is not the
// parameters', so autograd's in-place check does not fire. This is FSDP1's mechanism (torch's
// distributed/utils.py, _free_storage and _alloc_storage, resize the storage of its
// _full_param_padded to 0 bytes and back; fsdp/_flat_param.py).
//
// How, with no module pre-hooks in LibTorch's C++ API: each unit runs inside a custom autograd
// Function (GatheredUnit, in zero3.cpp) whose inputs are the unit's input and the unit's weight
// shard (a leaf tensor that requires grad: the parameter AdamW updates). Its forward runs the
// unit with autograd on, on a detached copy of the input's handle, and keeps that inner graph
// (inner output, inner input) in autograd's context; its backward is the second gather, a
// backward through the inner graph that accumulates the weights' gradients into one flat buffer
// (no per-parameter copy), the release of the weights and then the reduce-scatter, and returns
// the shard's gradient, which autograd adds into shard.grad(), and the input's gradient.
//
// Recomputation, an option (FullyShardedOptions::recompute): forward runs under no-grad and keeps
// only each unit's input; backward gathers, runs the unit's forward once more with autograd on,
// and back-propagates through that. Its cost: one extra forward of every unit per step. What it
// saves: every unit's activations (what autograd saves inside the unit) between forward and
// backward; only the units' inputs stay, plus one unit's activations while it is recomputed.
// It lowers the peak only where activations weigh more than the gradients that backward adds
// meanwhile: for exercise 03's model (zero_report, README "The peak") the peak comes at the end
// of backward either way, and was 354.3 MB without and 354.4 MB with recomputation on 1 rank,
// 195-200 MB and 198 MB on 2 (Gloo frees some buffers late: the figure varies by run).
// Dropout draws the same masks in the recomputation: the random generator's state is saved at
// the forward and restored for it (on the input's device).
//
// Communication, either way: all-gather in forward, all-gather and reduce-scatter in backward,
// 3 (N-1)/N x 4P bytes sent per rank in a ring, against DDP's 2 (N-1)/N x 4P: 1.5x. On one rank
// no collective is made: the shard is the whole unit, the gathers are copies and the flat
// gradient is the shard's (Gloo's collectives would each stage one more unit-sized buffer).
//
// The whole model on disk (kit::save0(sharded, path), below): FSDP's full state dict with
// rank0_only and offload_to_cpu. Every rank takes part; each unit is gathered in turn, rank 0
// copies its weights to the CPU, and the unit is freed again: on its device no rank holds more
// than one unit's full weights, as in forward; rank 0 holds the whole model in host memory until
// it has written the file save0 writes for the unsharded model (Module::save's layout, the same
// names), which torch::load reads into a fresh model.
//
// Differences from PyTorch's FSDP2 (fully_shard): no prefetch of the next unit's gather (one
// unit's weights alive at a time, and the collectives are not overlapped with compute); the
// model runs through FullyShardedModel::forward, not through the module's own forward; tied
// weights are a unit gathered at each of its uses, where FSDP puts them in the root module,
// whose weights it keeps gathered from the first forward to the end of backward (one gather,
// more memory).
#pragma once

#include <concepts>
#include <functional>
#include <memory>
#include <ranges>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "kit/ddp/param_claim.h"        // ParameterClaim: not together with DDP
#include "kit/runtime/process_group.h"  // ProcessGroup: all_gather, reduce_scatter, broadcast
#include "kit/sharding/sharding.h"      // ShardLayout, ShardedAdamW, HeldBytes
#include "kit/sharding/zero.h"          // ZeroOptions

namespace kit {

// One unit of a chain: its name (for messages), its forward (the previous unit's output, or the
// model's input for the first, to this unit's output) and the parameters that forward reads.
// The trainable ones (requires_grad) are sharded; a unit with none runs as it is, unsharded.
// `reuse`: the unit's parameters are exactly an earlier unit's (tied weights: the summariser's one
// embedding matrix reads the documents, the summaries and makes the logits), which runs here
// again with this forward. They stay one unit: one shard, one AdamW state; each use gathers and
// frees the weights and reduce-scatters its own gradient, and autograd adds the uses' shard
// gradients (a reduce-scatter is linear: the sum of the uses' is the one of their sum).
struct ShardedUnit {
  using Forward = std::function<torch::Tensor(const torch::Tensor&)>;
  std::string name;
  Forward forward;
  std::vector<torch::Tensor> params;
  bool reuse = false;

  ShardedUnit(std::string name, Forward forward, std::vector<torch::Tensor> params,
              bool reuse = false)
      : name(std::move(name)), forward(std::move(forward)), params(std::move(params)),
        reuse(reuse) {}
  // A module's parameters, and `forward` (default: the module's own forward(x)). The holder is
  // kept in the forward, so the module lives as long as the unit does.
  template <typename M>
  ShardedUnit(std::string name, const torch::nn::ModuleHolder<M>& module, Forward forward = nullptr,
              bool reuse = false)
      : ShardedUnit(std::move(name),
                    forward ? std::move(forward)
                            : Forward([m = module.ptr()](const torch::Tensor& x) {
                                return m->forward(x);
                              }),
                    module->parameters(), reuse) {}
};

// A unit as a model lists it (TransformerLM::units()): the module that holds its parameters, and
// what it computes.
template <typename U>
concept ModelUnit = requires(const U& u) {
  { u.module } -> std::convertible_to<std::shared_ptr<torch::nn::Module>>;
  { u.run } -> std::convertible_to<ShardedUnit::Forward>;
};
// A model that lists its units in the order its forward runs them.
template <typename M>
concept ChainModel = requires(M& m) {
  { m.units() } -> std::ranges::range;
  requires ModelUnit<std::ranges::range_value_t<decltype(m.units())>>;
};

// A model's units as ShardedUnits, named after their modules ("unit 1 (TransformerEncoderLayer)");
// a unit type with a `reuse` member passes it on (Seq2SeqUnit: its tied embedding).
template <ModelUnit U>
std::vector<ShardedUnit> sharded_units(const std::vector<U>& units) {
  std::vector<ShardedUnit> out;
  for (size_t k = 0; k < units.size(); ++k) {
    bool reuse = false;
    if constexpr (requires(const U& u) { u.reuse; }) reuse = units[k].reuse;
    out.emplace_back("unit " + std::to_string(k) + " (" + units[k].module->name() + ")",
                     units[k].run, units[k].module->parameters(), reuse);
  }
  return out;
}

struct FullyShardedOptions {
  // false (default): keep what autograd saves in each unit's forward; true: keep only each
  // unit's input and run its forward again in backward (see the top of this file).
  bool recompute = false;
};

class FullyShardedModel {
 public:
  struct Unit;  // one unit's layout, shard, gradient and AdamW state (zero3.cpp)

  // `model` cut into any chain of units, run in this order by forward(). An empty list, a unit
  // without a forward, a parameter in two units or in none, a unit's parameter that is not the
  // model's: each refused (std::invalid_argument, one line) before anything is changed.
  template <typename M>
  FullyShardedModel(const torch::nn::ModuleHolder<M>& model, std::vector<ShardedUnit> units,
                    ZeroOptions options, FullyShardedOptions sharding = {})
      : FullyShardedModel(std::static_pointer_cast<torch::nn::Module>(model.ptr()),
                          std::move(units), options, sharding) {}
  FullyShardedModel(std::shared_ptr<torch::nn::Module> model, std::vector<ShardedUnit> units,
                    ZeroOptions options, FullyShardedOptions sharding = {});
  // A chain model (TransformerLM) as its own units().
  template <ChainModel M>
  FullyShardedModel(const torch::nn::ModuleHolder<M>& model, ZeroOptions options,
                    FullyShardedOptions sharding = {})
      : FullyShardedModel(model, sharded_units(model.ptr()->units()), options, sharding) {}
  // The model and a list of units as a model lists them (TransformerLM::units(), or another cut).
  template <typename M, ModelUnit U>
  FullyShardedModel(const torch::nn::ModuleHolder<M>& model, const std::vector<U>& units,
                    ZeroOptions options, FullyShardedOptions sharding = {})
      : FullyShardedModel(model, sharded_units(units), options, sharding) {}
  ~FullyShardedModel();
  FullyShardedModel(const FullyShardedModel&) = delete;
  FullyShardedModel& operator=(const FullyShardedModel&) = delete;

  // The chain of units, each gathered in turn. Under no-grad (evaluation) each unit is gathered,
  // run and freed, and nothing is kept for a backward.
  torch::Tensor forward(const torch::Tensor& input);

  // Every unit's full weights in the model's own parameters while the guard lives: the model's
  // own methods then run as on one rank (Seq2Seq::beam_decode, which the chain cannot express).
  // FSDP's summon_full_params with writeback=False: what is written into the parameters is lost
  // at the end. It holds the whole model on every rank, as DDP does; forward() is refused
  // inside it (a unit gathered twice). Every rank must make it (the all-gathers), in the same
  // order as its other collectives.
  class FullParams {
   public:
    explicit FullParams(FullyShardedModel& model);
    ~FullParams();
    FullParams(const FullParams&) = delete;
    FullParams& operator=(const FullParams&) = delete;

   private:
    FullyShardedModel& model_;
  };
  FullParams full_params() { return FullParams(*this); }
  void zero_grad();
  // AdamW on each unit's shard: no communication (backward did it), except, with
  // ZeroOptions::max_grad_norm, one all-reduce of a number for the global norm (kit/sharding/clip.h).
  void step();
  const torch::Tensor& grad_norm() const { return grad_norm_; }  // as ZeroOptimizer::grad_norm()
  // The learning rate of the next step()s, for every unit (as ZeroOptimizer::set_lr).
  void set_lr(double lr);
  double lr() const { return lr_; }

  // FSDP's full state dict (rank0_only, offload_to_cpu): every rank must call it. On rank 0, every
  // parameter and buffer of the model under its name in named_parameters() / named_buffers(), as
  // a CPU tensor of its own; the sharded ones gathered one unit at a time. Elsewhere: empty.
  torch::OrderedDict<std::string, torch::Tensor> full_state_dict();
  torch::nn::Module& module() const { return *model_; }

  HeldBytes held() const;
  int64_t numel() const;   // P: all units' parameters
  int64_t padded() const;  // all units' padded layouts together
  bool recompute() const { return recompute_; }
  ProcessGroup& group() const { return *group_; }
  // This rank's shards (one per unit with trainable parameters, in chain order) and their AdamW
  // states, for sharded checkpoints.
  std::vector<torch::Tensor> shards() const;
  std::vector<ShardedAdamW*> adamw();
  // Per unit of shards(): its trainable parameters' elements (its layout's numel(), no padding).
  std::vector<int64_t> unit_numels() const;

  // For GatheredUnit (zero3.cpp): the unit's full weights into its parameters, and back to
  // nothing (the flat buffer's storage freed, the parameters empty).
  void gather(Unit& unit);
  void release(Unit& unit);
  ProcessGroup* group_ptr() const { return group_; }

 private:
  struct Link {  // one unit of the chain: sharded (unit set; a reused unit in several) or run as
    ShardedUnit::Forward forward;  // it is
    Unit* unit;
  };
  std::shared_ptr<ProcessGroup> keep_group_;
  ProcessGroup* group_;
  std::shared_ptr<torch::nn::Module> model_;
  double lr_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<Link> chain_;
  std::unique_ptr<ParameterClaim> claim_;
  bool recompute_ = false;
  int64_t gathered_now_ = 0, gathered_peak_ = 0;  // bytes of full weights alive
  double max_grad_norm_ = 0;  // 0: no clipping
  torch::Tensor grad_norm_;
};

// save0 for a sharded model (see the top of this file): every rank calls it; rank 0 writes the
// model's full_state_dict() in the layout save0 writes for the model itself (atomically), and the
// others wait until the file is complete. `site`: the caller's line, for the barrier's errors.
void save0(FullyShardedModel& model, const std::string& path, CallSite site = {});

}  // namespace kit
