// kit/sharding/zero3.cpp — ZeRO-3: per-unit gather, forward, free; gather, backward,
// reduce-scatter, free (see zero3.h).
#include "kit/sharding/zero3.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include <torch/torch.h>

#include "kit/check/observe.h"        // observe::save0: save0's event for the checker
#include "kit/runtime/distributed.h"  // group_or_world
#include "kit/runtime/files.h"        // write_atomically: save0's file
#include "kit/sharding/clip.h"        // clip_shard_grads_: the global norm over every unit's shard

namespace kit {

struct FullyShardedModel::Unit {
  std::string name;
  std::vector<torch::Tensor> params;  // the module's own tensors: empty except while gathered
  ShardLayout layout;
  torch::Tensor shard;                // this rank's S weights: a leaf that requires grad
  ShardedAdamW adamw;
  // The unit's N S weights. Its StorageImpl lives as long as the unit (autograd's saved views
  // point into it); its bytes exist only while the unit is gathered.
  torch::Tensor full;
  bool gathered = false;
};

namespace {

// The bytes of a tensor's storage, released or allocated again, with the StorageImpl kept: every
// tensor viewing it (the parameters, what autograd saved) sees the new bytes. c10::StorageImpl's
// set_data_ptr_noswap, set_nbytes(size_t) and allocator() read the same in the headers of
// LibTorch 2.2.2 and 2.15.0 (no compat.h note needed). set_nbytes has a SymInt overload too:
// the argument is a size_t, so that the call is not ambiguous.
void free_storage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, s->device()));
  s->set_nbytes(size_t{0});
}

void allocate_storage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

// Which model and unit a recorded forward belongs to, kept in autograd's context for backward.
// The context stores IValues; a custom class in a capsule keeps the two typed pointers (no
// integers standing for addresses). Both outlive the graph: a step's backward comes before the
// model is destroyed.
struct UnitRef : torch::CustomClassHolder {
  UnitRef(FullyShardedModel* m, FullyShardedModel::Unit* u, const ShardedUnit::Forward* f)
      : model(m), unit(u), forward(f) {}
  FullyShardedModel* model;
  FullyShardedModel::Unit* unit;
  const ShardedUnit::Forward* forward;  // this use's (a reused unit has one per use)
};

// The unit's input as the leaf of the unit's own graph: the same tensor, cut from the graph
// before it; it requires grad when it can have one (the tokens cannot).
torch::Tensor inner_input(const torch::Tensor& input) {
  torch::Tensor x = input.detach();
  if (x.is_floating_point()) x.requires_grad_(true);
  return x;
}

// The unit gathered, its graph (out from in) recorded: back-propagates `grad` through it. The
// weights' gradients accumulate into the parameters' .grad, set to views of one zeroed flat
// buffer, so they land in the layout the reduce-scatter wants without a copy. Then the weights
// are freed (before the reduce-scatter: they are not needed for it) and the flat gradient
// reduce-scattered. Returns this rank's shard of the averaged gradient; in.grad() holds the
// input's.
torch::Tensor backward_unit(FullyShardedModel& model, FullyShardedModel::Unit& u,
                            const torch::Tensor& out, torch::Tensor grad, const torch::Tensor& in) {
  torch::Tensor flat = torch::zeros({u.layout.padded()}, u.shard.options().requires_grad(false));
  for (size_t i = 0; i < u.params.size(); ++i) u.params[i].mutable_grad() = u.layout.part(flat, i);
  std::vector<torch::Tensor> wrt = u.params;
  if (in.requires_grad()) wrt.push_back(in);
  if (!grad.defined()) grad = torch::zeros_like(out);  // the unit's output was not used
  torch::autograd::backward({out}, {grad}, /*retain_graph=*/false, /*create_graph=*/false, wrt);
  for (auto& p : u.params) p.mutable_grad() = torch::Tensor();
  model.release(u);
  if (model.group_ptr()->size() == 1) return flat;  // one rank: its shard, and the average, is all
  auto shard_grad = torch::empty({u.layout.shard()}, u.shard.options().requires_grad(false));
  torch::NoGradGuard no_grad;
  // Each rank gets the average over the ranks of its own shard of the unit's gradient.
  model.group_ptr()->reduce_scatter(shard_grad, flat, ReduceOp::AVG);
  return shard_grad;
}

// The unit's input and its weight shard in, the unit's output out; see zero3.h.
struct GatheredUnit : torch::autograd::Function<GatheredUnit> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input,
                               torch::Tensor shard, FullyShardedModel* model,
                               FullyShardedModel::Unit* unit, const ShardedUnit::Forward* run) {
    (void)shard;  // an input only so that its gradient comes back through backward()
    ctx->saved_data["unit"] =
        c10::IValue::make_capsule(c10::make_intrusive<UnitRef>(model, unit, run));
    model->gather(*unit);
    torch::Tensor out;
    if (model->recompute()) {
      // Where the random numbers stand (dropout), for the recomputation in backward.
      auto gen = at::globalContext().defaultGenerator(input.device());
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        ctx->saved_data["rng"] = gen.get_state();
      }
      out = (*run)(input);  // no-grad (apply's): nothing saved inside the unit
      ctx->save_for_backward({input});
    } else {
      // The unit's own graph, recorded from a leaf that stands for the input; autograd's saved
      // tensors in it view the flat buffer, whose bytes release() frees now.
      torch::Tensor in = inner_input(input);
      torch::AutoGradMode grad_on(true);
      out = (*run)(in);
      ctx->saved_data["in"] = in;
      ctx->saved_data["out"] = out;
      out = out.detach();  // apply() gives the output its place in the outer graph
    }
    model->release(*unit);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto ref =
        c10::static_intrusive_pointer_cast<UnitRef>(ctx->saved_data["unit"].toCapsule());
    FullyShardedModel& model = *ref->model;
    FullyShardedModel::Unit& unit = *ref->unit;
    model.gather(unit);
    torch::Tensor in, out;
    if (model.recompute()) {
      in = inner_input(ctx->get_saved_variables()[0]);
      // The forward again, this time recording the graph, with forward's random numbers.
      auto gen = at::globalContext().defaultGenerator(in.device());
      torch::Tensor now;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        now = gen.get_state();
        gen.set_state(ctx->saved_data["rng"].toTensor());
      }
      {
        torch::AutoGradMode grad_on(true);
        out = (*ref->forward)(in);
      }
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(now);
    } else {
      if (!ctx->saved_data.count("out"))
        throw std::runtime_error("FullyShardedModel: unit '" + unit.name + "' was back-propagated "
                                 "through twice; its graph is freed after the first backward");
      in = ctx->saved_data["in"].toTensor();
      out = ctx->saved_data["out"].toTensor();
      ctx->saved_data.erase("in");  // the inner graph goes with the last reference below
      ctx->saved_data.erase("out");
    }
    torch::Tensor shard_grad = backward_unit(model, unit, out, grad_out[0], in);
    return {in.requires_grad() ? in.grad() : torch::Tensor(), shard_grad, torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

// A unit's parameters that are sharded and trained.
std::vector<torch::Tensor> trainable(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (auto& p : params)
    if (p.requires_grad()) out.push_back(p);
  return out;
}

// The stage and AdamW's options; an error ends with the line that wrote the options
// (ZeroOptions::site): the trainer's, not this file's.
int stage_3(const ZeroOptions& options) {
  if (options.stage != 3)
    throw std::invalid_argument("FullyShardedModel is ZeRO stage 3, not " +
                                std::to_string(options.stage) + " (stages 1 and 2: ZeroOptimizer) (" +
                                options.site.str() + ")");
  check_adamw_options(options.adamw, "FullyShardedModel", options.site);
  return options.stage;
}

// The list of units against the model: each unit has a forward, each trainable parameter of the
// model is in exactly one unit, and the units read only the model's parameters. Checked before
// anything is claimed, broadcast or freed, so that a refused list leaves the model as it was.
void check_units(const torch::nn::Module& model, const std::vector<ShardedUnit>& units,
                 const CallSite& site) {
  auto refuse = [&](const std::string& why) {
    throw std::invalid_argument("FullyShardedModel: " + why + " (" + site.str() + ")");
  };
  if (units.empty()) refuse("no units given");
  std::unordered_map<const void*, const ShardedUnit*> owner;  // a trainable parameter's unit
  std::unordered_map<const void*, std::string> of_model;       // the model's parameters' names
  for (auto& item : model.named_parameters()) of_model.emplace(item.value().unsafeGetTensorImpl(), item.key());
  for (auto& u : units) {
    if (!u.forward) refuse("unit '" + u.name + "' has no forward");
    for (auto& p : u.params)
      if (!of_model.count(p.unsafeGetTensorImpl()))
        refuse("unit '" + u.name + "' reads a parameter that is not the model's");
    const std::vector<torch::Tensor> mine = trainable(u.params);
    if (u.reuse) {
      // Tied weights: exactly the trainable parameters of one earlier unit, in its order.
      const ShardedUnit* first = nullptr;
      if (!mine.empty())
        if (auto it = owner.find(mine[0].unsafeGetTensorImpl()); it != owner.end())
          first = it->second;
      std::vector<torch::Tensor> theirs;
      if (first) theirs = trainable(first->params);
      const bool same = first && theirs.size() == mine.size() &&
                        std::equal(mine.begin(), mine.end(), theirs.begin(),
                                   [](const torch::Tensor& a, const torch::Tensor& b) {
                                     return a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl();
                                   });
      if (!same)
        refuse("unit '" + u.name + "' reuses parameters that are not exactly those of one "
               "earlier unit");
      continue;
    }
    for (auto& p : mine) {
      // A parameter in two units would be gathered into two buffers and trained twice.
      auto [at, fresh] = owner.emplace(p.unsafeGetTensorImpl(), &u);
      if (!fresh)
        refuse("a parameter of unit '" + u.name + "' is also in unit '" + at->second->name +
               "' (a unit that runs an earlier unit's parameters again, as tied weights do, says "
               "so: ShardedUnit::reuse)");
    }
  }
  // One outside every unit would be neither gathered nor trained.
  for (auto& item : model.named_parameters())
    if (item.value().requires_grad() && !owner.count(item.value().unsafeGetTensorImpl()))
      refuse("the model's parameter '" + item.key() + "' is in no unit: every trainable parameter "
             "must be in exactly one");
}

}  // namespace

FullyShardedModel::FullyShardedModel(std::shared_ptr<torch::nn::Module> model,
                                     std::vector<ShardedUnit> units, ZeroOptions options,
                                     FullyShardedOptions sharding)
    : keep_group_(group_or_world(options.group, "FullyShardedModel", &options.site)),
      group_(keep_group_.get()),
      model_(std::move(model)),
      lr_(options.adamw.lr()),
      recompute_(sharding.recompute) {
  stage_3(options);
  max_grad_norm_ = check_max_grad_norm(options.max_grad_norm, "FullyShardedModel");
  check_units(*model_, units, options.site);
  std::vector<torch::Tensor> every;
  for (auto& u : units)
    if (!u.reuse)
      for (auto& p : trainable(u.params)) every.push_back(p);
  claim_ = std::make_unique<ParameterClaim>(every, "ZeRO-3");
  torch::NoGradGuard no_grad;
  // What is not sharded, whole on every rank: rank 0's frozen parameters and buffers.
  std::vector<torch::Tensor> unsharded;
  for (auto& p : model_->parameters())
    if (!p.requires_grad()) unsharded.push_back(p);
  for (auto& b : model_->buffers()) unsharded.push_back(b);
  broadcast_from_rank0(*group_, unsharded);
  std::unordered_map<const void*, Unit*> unit_of;  // a unit's first trainable parameter -> it
  for (auto& u : units) {
    std::vector<torch::Tensor> params = trainable(u.params);
    if (params.empty()) {  // nothing to shard: the unit runs as it is
      chain_.push_back({std::move(u.forward), nullptr});
      continue;
    }
    if (u.reuse) {  // tied weights: the earlier unit, run here with this forward
      chain_.push_back({std::move(u.forward), unit_of.at(params[0].unsafeGetTensorImpl())});
      continue;
    }
    ShardLayout layout(params, group_->size(), group_->rank());
    // Rank 0's weights, as DDP starts; then keep only our shard of them.
    auto flat = layout.flatten(params);
    if (group_->size() > 1) group_->broadcast(flat, 0);
    auto shard = layout.own(flat).clone().requires_grad_(true);
    flat = torch::Tensor();
    ShardedAdamW adamw(options.adamw, shard.detach());
    auto full = torch::empty({layout.padded()}, shard.options().requires_grad(false));
    units_.push_back(std::make_unique<Unit>(Unit{u.name, params, layout, shard,
                                                 std::move(adamw), full, true}));
    unit_of.emplace(params[0].unsafeGetTensorImpl(), units_.back().get());
    chain_.push_back({std::move(u.forward), units_.back().get()});
    gathered_now_ += bytes_of({full});
    release(*units_.back());
  }
  gathered_peak_ = 0;
}

FullyShardedModel::~FullyShardedModel() = default;

void FullyShardedModel::gather(Unit& u) {
  TORCH_CHECK(!u.gathered, "FullyShardedModel: unit '", u.name, "' gathered twice");
  torch::NoGradGuard no_grad;
  allocate_storage(u.full);
  // One rank: its shard is the whole unit. A copy, not a collective: Gloo's all-gather would
  // stage the result in a flat buffer of its own, one more copy of the unit's weights.
  if (group_->size() == 1) u.full.copy_(u.shard.detach());
  else group_->all_gather(u.full, u.shard.detach());
  for (size_t i = 0; i < u.params.size(); ++i) u.params[i].set_data(u.layout.part(u.full, i));
  u.gathered = true;
  gathered_now_ += bytes_of({u.full});
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
}

void FullyShardedModel::release(Unit& u) {
  if (!u.gathered) return;
  torch::NoGradGuard no_grad;
  for (auto& p : u.params) p.set_data(torch::empty({0}, p.options().requires_grad(false)));
  free_storage(u.full);
  u.gathered = false;
  gathered_now_ -= bytes_of({u.full});
}

torch::Tensor FullyShardedModel::forward(const torch::Tensor& input) {
  torch::Tensor x = input;
  const bool record = torch::GradMode::is_enabled();
  for (auto& link : chain_) {
    if (!link.unit) {
      x = link.forward(x);
    } else if (record) {
      x = GatheredUnit::apply(x, link.unit->shard, this, link.unit, &link.forward);
    } else {  // evaluation: nothing to keep for a backward
      gather(*link.unit);
      x = link.forward(x);
      release(*link.unit);
    }
  }
  return x;
}

FullyShardedModel::FullParams::FullParams(FullyShardedModel& model) : model_(model) {
  for (auto& u : model_.units_) model_.gather(*u);
}

FullyShardedModel::FullParams::~FullParams() {
  for (auto& u : model_.units_) model_.release(*u);
}

void FullyShardedModel::set_lr(double lr) {
  lr_ = lr;
  for (auto& u : units_) u->adamw.set_lr(lr);
}

// Unit by unit, as forward gathers: the same collectives in the same order on every rank.
torch::OrderedDict<std::string, torch::Tensor> FullyShardedModel::full_state_dict() {
  torch::NoGradGuard no_grad;
  const bool keep = group_->rank() == 0;
  // A CPU tensor of its own (not a view of the unit's buffer, which save would write whole), with
  // the parameter's requires_grad, as Module::save writes the parameter itself.
  auto on_cpu = [](const torch::Tensor& t) {
    return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).requires_grad_(t.requires_grad());
  };
  std::unordered_map<const void*, torch::Tensor> gathered;  // rank 0: each sharded parameter's
  for (auto& u : units_) {
    gather(*u);
    if (keep)
      for (auto& p : u->params) gathered.emplace(p.unsafeGetTensorImpl(), on_cpu(p));
    release(*u);
  }
  torch::OrderedDict<std::string, torch::Tensor> out;
  if (!keep) return out;
  for (auto& item : model_->named_parameters()) {
    auto it = gathered.find(item.value().unsafeGetTensorImpl());
    out.insert(item.key(), it != gathered.end() ? it->second : on_cpu(item.value()));
  }
  for (auto& item : model_->named_buffers()) out.insert(item.key(), on_cpu(item.value()));
  return out;
}

namespace {
// Module::save's layout (torch/csrc/api/src/nn/module.cpp), with the values of `state` (by dotted
// name) in place of the module's own: a module's parameters, then its buffers, then each child
// that is serializable as an archive of its own, under its name.
void write_as_module(const torch::nn::Module& module,
                     const torch::OrderedDict<std::string, torch::Tensor>& state,
                     const std::string& prefix, torch::serialize::OutputArchive& archive) {
  for (auto& item : module.named_parameters(/*recurse=*/false))
    archive.write(item.key(), state[prefix + item.key()]);
  for (auto& item : module.named_buffers(/*recurse=*/false))
    archive.write(item.key(), state[prefix + item.key()], /*is_buffer=*/true);
  for (auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive sub(archive.compilation_unit());
    write_as_module(*child.value(), state, prefix + child.key() + ".", sub);
    archive.write(child.key(), sub);
  }
}
}  // namespace

void save0(FullyShardedModel& model, const std::string& path, CallSite site) {
  auto state = model.full_state_dict();  // every rank: the gathers
  if (model.group().rank() == 0) {
    torch::serialize::OutputArchive archive;
    write_as_module(model.module(), state, "", archive);
    write_atomically(path, archive, "save0");  // temp file, fsync, rename (kit/runtime/files.h)
  }
  observe::save0(path);
  // Nobody reads the file before it is complete (e.g. to evaluate the best model).
  if (model.group().size() > 1) model.group().barrier(site);
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

std::vector<int64_t> FullyShardedModel::unit_numels() const {
  std::vector<int64_t> out;
  for (auto& u : units_) out.push_back(u->layout.numel());
  return out;
}

std::vector<ShardedAdamW*> FullyShardedModel::adamw() {
  std::vector<ShardedAdamW*> out;
  for (auto& u : units_) out.push_back(&u->adamw);
  return out;
}

}  // namespace kit
