// kit/zero3.cpp — ZeRO-3: per-unit gather, recompute and reduce-scatter (see zero3.h).
#include "kit/zero3.h"

#include <algorithm>
#include <stdexcept>

#include <torch/torch.h>

#include "kit/clip.h"         // clip_shard_grads_: the global norm over every unit's shard
#include "kit/distributed.h"  // default_group_ptr

namespace kit {

struct FullyShardedModel::Unit {
  TransformerLMImpl::Unit unit;
  std::vector<torch::Tensor> params;  // the module's own tensors: empty except while gathered
  ShardLayout layout;
  torch::Tensor shard;                // this rank's S weights: a leaf that requires grad
  ShardedAdamW adamw;
  torch::Tensor full;                 // while gathered: the unit's N S weights
};

namespace {

// Which model and unit a recorded forward belongs to, kept in autograd's context for backward.
// The context stores IValues; a custom class in a capsule keeps the two typed pointers (no
// integers standing for addresses). Both outlive the graph: a step's backward comes before the
// model is destroyed.
struct UnitRef : torch::CustomClassHolder {
  UnitRef(FullyShardedModel* m, FullyShardedModel::Unit* u) : model(m), unit(u) {}
  FullyShardedModel* model;
  FullyShardedModel::Unit* unit;
};

// The unit's input and its weight shard in, the unit's output out; see zero3.h.
struct GatheredUnit : torch::autograd::Function<GatheredUnit> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input,
                               torch::Tensor shard, FullyShardedModel* model,
                               FullyShardedModel::Unit* unit) {
    (void)shard;  // an input only so that its gradient comes back through backward()
    ctx->saved_data["unit"] = c10::IValue::make_capsule(c10::make_intrusive<UnitRef>(model, unit));
    // Where the random numbers stand (dropout), for the recomputation in backward.
    auto gen = at::globalContext().defaultGenerator(input.device());
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    model->gather(*unit);
    torch::Tensor out = unit->unit.run(input);
    model->release(*unit);
    ctx->save_for_backward({input});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto ref = c10::static_intrusive_pointer_cast<UnitRef>(ctx->saved_data["unit"].toCapsule());
    FullyShardedModel* model = ref->model;
    FullyShardedModel::Unit* unit = ref->unit;
    const torch::Tensor saved = ctx->get_saved_variables()[0];
    torch::Tensor input = saved.detach();
    const bool input_grad = input.is_floating_point();  // the tokens have none
    if (input_grad) input.requires_grad_(true);

    model->gather(*unit);
    torch::Tensor out;
    {
      // The forward again, this time recording the graph, with forward's random numbers.
      auto gen = at::globalContext().defaultGenerator(input.device());
      torch::Tensor now;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        now = gen.get_state();
        gen.set_state(ctx->saved_data["rng"].toTensor());
      }
      torch::AutoGradMode grad_on(true);
      out = unit->unit.run(input);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(now);
    }
    std::vector<torch::Tensor> wrt = unit->params;
    if (input_grad) wrt.push_back(input);
    auto grads = torch::autograd::grad({out}, wrt, {grad_out[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);
    torch::Tensor input_grad_out = input_grad ? grads.back() : torch::Tensor();
    grads.resize(unit->params.size());
    // Each rank gets the average over the ranks of its own shard of the unit's gradient.
    torch::Tensor shard_grad = torch::empty({unit->layout.shard()}, unit->shard.options());
    {
      torch::NoGradGuard no_grad;
      auto flat = unit->layout.flatten(grads);
      model->group_ptr()->reduce_scatter(shard_grad, flat, ReduceOp::AVG);
    }
    model->release(*unit);
    return {input_grad_out, shard_grad, torch::Tensor(), torch::Tensor()};
  }
};

int stage_3(int stage) {
  check_zero_stage(stage);
  if (stage != 3)
    throw std::invalid_argument("FullyShardedModel is ZeRO stage 3, not " + std::to_string(stage) +
                                " (stages 1 and 2: ZeroOptimizer)");
  return stage;
}

// The model's units. A parameter outside every unit would be neither gathered nor trained: such
// a model is refused.
std::vector<TransformerLMImpl::Unit> units_of(TransformerLM& model) {
  auto units = model->units();
  int64_t all = 0, in_units = 0;
  for (auto& p : model->parameters()) all += p.numel();
  for (auto& u : units)
    for (auto& p : u.module->parameters()) in_units += p.numel();
  if (all != in_units)
    throw std::invalid_argument("FullyShardedModel: the units hold " + std::to_string(in_units) +
                                " of the model's " + std::to_string(all) + " parameters");
  return units;
}

}  // namespace

FullyShardedModel::FullyShardedModel(TransformerLM& model, ZeroOptions options)
    : FullyShardedModel(units_of(model), options) {}

FullyShardedModel::FullyShardedModel(std::vector<TransformerLMImpl::Unit> units,
                                     ZeroOptions options)
    : keep_group_(options.group ? nullptr : default_group_ptr()),
      group_(options.group ? options.group : keep_group_.get()) {
  stage_3(options.stage);
  max_grad_norm_ = check_max_grad_norm(options.max_grad_norm, "FullyShardedModel");
  std::vector<torch::Tensor> every;
  for (auto& u : units)
    for (auto& p : u.module->parameters())
      if (p.requires_grad()) every.push_back(p);
  claim_ = std::make_unique<ParameterClaim>(every, "ZeRO-3");
  torch::NoGradGuard no_grad;
  for (auto& u : units) {
    std::vector<torch::Tensor> params;
    for (auto& p : u.module->parameters())
      if (p.requires_grad()) params.push_back(p);
    if (params.empty()) continue;
    ShardLayout layout(params, group_->size(), group_->rank());
    // Rank 0's weights, as DDP starts; then keep only our shard of them.
    auto flat = layout.flatten(params);
    group_->broadcast(flat, 0);
    auto shard = layout.own(flat).clone().requires_grad_(true);
    ShardedAdamW adamw(options.adamw, shard.detach());
    units_.push_back(std::make_unique<Unit>(
        Unit{u, params, layout, shard, std::move(adamw), torch::Tensor()}));
    release(*units_.back());
  }
  gathered_peak_ = 0;
}

FullyShardedModel::~FullyShardedModel() = default;

void FullyShardedModel::gather(Unit& u) {
  torch::NoGradGuard no_grad;
  u.full = torch::empty({u.layout.padded()}, u.shard.options().requires_grad(false));
  group_->all_gather(u.full, u.shard.detach());
  for (size_t i = 0; i < u.params.size(); ++i) u.params[i].set_data(u.layout.part(u.full, i));
  gathered_now_ += bytes_of({u.full});
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
}

void FullyShardedModel::release(Unit& u) {
  torch::NoGradGuard no_grad;
  for (auto& p : u.params) p.set_data(torch::empty({0}, p.options().requires_grad(false)));
  if (u.full.defined()) gathered_now_ -= bytes_of({u.full});
  u.full = torch::Tensor();
}

torch::Tensor FullyShardedModel::forward(const torch::Tensor& input) {
  torch::Tensor x = input;
  for (auto& u : units_) x = GatheredUnit::apply(x, u->shard, this, u.get());
  return x;
}

void FullyShardedModel::zero_grad() {
  for (auto& u : units_) u->shard.mutable_grad() = torch::Tensor();
}

void FullyShardedModel::step() {
  // Backward left each unit's averaged shard in shard.grad(): the global norm is over all of them.
  if (max_grad_norm_ > 0) {
    std::vector<torch::Tensor> grads;
    for (auto& u : units_) grads.push_back(u->shard.grad());
    grad_norm_ = clip_shard_grads_(grads, max_grad_norm_, *group_);
  }
  for (auto& u : units_)
    if (u->shard.grad().defined()) u->adamw.update(u->shard.detach(), u->shard.grad());
}

HeldBytes FullyShardedModel::held() const {
  HeldBytes b;
  for (auto& u : units_) {
    b.params += bytes_of({u->shard});
    b.grads += bytes_of({u->shard.grad()});
    b.optimizer += u->adamw.bytes();
  }
  b.gathered_peak = gathered_peak_;
  return b;
}

int64_t FullyShardedModel::numel() const {
  int64_t n = 0;
  for (auto& u : units_) n += u->layout.numel();
  return n;
}

int64_t FullyShardedModel::padded() const {
  int64_t n = 0;
  for (auto& u : units_) n += u->layout.padded();
  return n;
}

std::vector<torch::Tensor> FullyShardedModel::shards() const {
  std::vector<torch::Tensor> out;
  for (auto& u : units_) out.push_back(u->shard);
  return out;
}

std::vector<ShardedAdamW*> FullyShardedModel::adamw() {
  std::vector<ShardedAdamW*> out;
  for (auto& u : units_) out.push_back(&u->adamw);
  return out;
}

}  // namespace kit
