// kit/parallel/parallel_lm.cpp — the tensor- and context-parallel language model (see
// parallel_lm.h).
#include "kit/parallel/parallel_lm.h"

#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "kit/check/observe.h"  // model_to(), training_forward(): for the checker, as TransformerLM
#include "kit/parallel/mesh.h"

namespace kit {
namespace {

void refuse_unless(bool ok, const std::string& what, const CallSite& site) {
  if (!ok) throw std::invalid_argument(what + " (" + site.str() + ")");
}

// Encoder layer i of a TransformerLM (its encoder's layers, as TransformerLM registers them).
torch::nn::TransformerEncoderLayer layer_of(TransformerLM& full, size_t i) {
  auto encoder = std::dynamic_pointer_cast<torch::nn::TransformerEncoderImpl>(
      full->named_children()["encoder"]);
  return torch::nn::TransformerEncoderLayer(
      encoder->layers->ptr<torch::nn::TransformerEncoderLayerImpl>(i));
}

void copy(torch::Tensor& to, const torch::Tensor& from) {
  torch::NoGradGuard no_grad;
  to.copy_(from);
}

}  // namespace

// --- ParallelBlock -------------------------------------------------------------------------------

ParallelBlockImpl::ParallelBlockImpl(const torch::nn::TransformerEncoderLayer& full, const Mesh& mesh,
                                     RandomStreams& streams, CallSite site,
                                     const ParallelLMOptions& parallel)
    : streams_(streams), dropout_(full->options.dropout()) {
  TORCH_CHECK(std::holds_alternative<torch::enumtype::kReLU>(full->options.activation()),
              "ParallelBlock: the encoder layers use ReLU");
  const double p = full->options.dropout();
  attention = register_module(
      "attention", parallel.attention
                       ? ParallelAttention(parallel.attention(full->self_attn),
                                           full->self_attn->options.num_heads(), p, mesh, streams)
                       : ParallelAttention(full->self_attn, mesh, streams, site));
  mlp = register_module("mlp", parallel.mlp
                                   ? ParallelMLP(parallel.mlp(full->linear1, full->linear2), streams, p)
                                   : ParallelMLP(full->linear1, full->linear2, mesh.tp(), streams, p, site));
  norm1 = register_module("norm1", torch::nn::LayerNorm(full->norm1->options));
  norm2 = register_module("norm2", torch::nn::LayerNorm(full->norm2->options));
  load_full(full);
}

void ParallelBlockImpl::load_full(const torch::nn::TransformerEncoderLayer& full) {
  attention->load_full(full->self_attn);
  mlp->linear1->load_full(full->linear1->weight, full->linear1->bias);
  mlp->linear2->load_full(full->linear2->weight, full->linear2->bias);
  copy(norm1->weight, full->norm1->weight);
  copy(norm1->bias, full->norm1->bias);
  copy(norm2->weight, full->norm2->weight);
  copy(norm2->bias, full->norm2->bias);
}

torch::Tensor ParallelBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  // The residual stream is replicated: its dropout draws alike on every tp rank (random.h).
  auto h = norm1(x + dropout(attention(x, mask), dropout_, is_training(), streams_.replicated()));
  return norm2(h + dropout(mlp(h), dropout_, is_training(), streams_.replicated()));
}

// --- ParallelTransformerLM -----------------------------------------------------------------------

ParallelTransformerLMImpl::ParallelTransformerLMImpl(const TransformerLMOptions& o, const Mesh& mesh,
                                                     ParallelLMOptions parallel, CallSite site)
    : options_(o), parallel_(parallel), mesh_(mesh), site_(site) {
  const int tp = mesh.tp_size();
  auto divides = [&](int64_t n, const char* what) {
    refuse_unless(n % tp == 0,
                  "ParallelTransformerLM: " + std::string(what) + " " + std::to_string(n) +
                      " does not divide by tp = " + std::to_string(tp),
                  site);
  };
  refuse_unless(o.vocab_size > 0, "ParallelTransformerLM: vocab_size must be set", site);
  divides(o.heads, "heads");
  divides(o.d_model, "d_model");
  divides(o.feedforward, "feedforward");
  streams_ = std::make_unique<RandomStreams>(parallel.seed, mesh);

  // TransformerLM's random numbers, in its order, from torch::manual_seed(seed)'s generator.
  auto gen = at::globalContext().defaultGenerator(torch::kCPU);
  torch::Tensor before;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    before = gen.get_state();
    gen.set_current_seed(parallel.seed);
  }
  embed = register_module("embed", torch::nn::Embedding(o.vocab_size, o.d_model));
  auto layer = torch::nn::TransformerEncoderLayer(
      torch::nn::TransformerEncoderLayerOptions(o.d_model, o.heads)
          .dim_feedforward(o.feedforward)
          .dropout(o.dropout));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.layers; ++i) {
    // torch's TransformerEncoder clones the layer for each of its layers: a clone draws fresh
    // weights (reset()) and then takes the layer's values, so every layer starts alike.
    (void)layer->clone();
    blocks->push_back(ParallelBlock(layer, mesh, *streams_, site, parallel));
  }
  layer = nullptr;  // the one whole layer goes
  head = register_module("head", torch::nn::Linear(o.d_model, o.vocab_size));
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(before);
  }

  // Sinusoidal position codes, TransformerLM's (a buffer: nothing to learn or to average).
  positions_ = register_buffer("positions", sinusoidal_positions(o.max_len, o.d_model));
}

void ParallelTransformerLMImpl::to(torch::Device device, bool non_blocking) {
  observe::model_to(device);
  torch::nn::Module::to(device, non_blocking);
  *streams_ = RandomStreams(parallel_.seed, mesh_, device);  // the blocks hold a reference to it
}

torch::Tensor ParallelTransformerLMImpl::forward(const torch::Tensor& tokens) {
  // The checker's record of this rank's weights (its shards) at each training forward.
  if (is_training()) observe::training_forward(*this, ++training_forwards_);
  const int cp = mesh_.cp_size();
  const int64_t local = tokens.size(1), seq = local * cp;
  refuse_unless(seq <= options_.max_len,
                "ParallelTransformerLM: a sequence of " + std::to_string(seq) + " (" +
                    std::to_string(local) + " on each of cp = " + std::to_string(cp) +
                    " ranks) is longer than max_len " + std::to_string(options_.max_len) +
                    (cp > 1 ? ": give the model this rank's part of each sequence (kit::cp_shard)" : ""),
                site_);
  const auto device = positions_.device();
  // Where this rank's tokens sit in their sequences, and every key's position in the order the
  // cp ranks' parts are gathered (context.h).
  auto mine = cp_positions(seq, cp, mesh_.cp_rank(), parallel_.cp_split, site_).to(device);
  std::vector<torch::Tensor> every;
  for (int r = 0; r < cp; ++r) every.push_back(cp_positions(seq, cp, r, parallel_.cp_split, site_));
  auto keys = torch::cat(every).to(device);
  // The causal mask by position: a key after the query is not seen.
  auto mask = torch::zeros({local, seq}, positions_.options())
                  .masked_fill_(keys.unsqueeze(0) > mine.unsqueeze(1),
                                -std::numeric_limits<float>::infinity());

  auto x = embed(tokens) * std::sqrt(static_cast<double>(options_.d_model)) +
           positions_.index_select(0, mine).unsqueeze(0);
  x = dropout(x, options_.dropout, is_training(), streams_->replicated());
  for (auto& block : *blocks) x = block->as<ParallelBlock>()->forward(x, mask);
  return head(x);
}

void ParallelTransformerLMImpl::gather_into(TransformerLM& full) {
  auto params = full->named_parameters();
  copy(params["embed.weight"], embed->weight);
  copy(params["head.weight"], head->weight);
  copy(params["head.bias"], head->bias);
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto& b = *blocks->ptr<ParallelBlockImpl>(i);
    auto layer = layer_of(full, i);
    auto& attn = *layer->self_attn;
    copy(attn.in_proj_weight, b.attention->qkv->full_weight());
    copy(attn.in_proj_bias, b.attention->qkv->full_bias());
    copy(attn.out_proj->weight, b.attention->out->full_weight());
    copy(attn.out_proj->bias, b.attention->out->full_bias());
    copy(layer->linear1->weight, b.mlp->linear1->full_weight());
    copy(layer->linear1->bias, b.mlp->linear1->full_bias());
    copy(layer->linear2->weight, b.mlp->linear2->full_weight());
    copy(layer->linear2->bias, b.mlp->linear2->full_bias());
    copy(layer->norm1->weight, b.norm1->weight);
    copy(layer->norm1->bias, b.norm1->bias);
    copy(layer->norm2->weight, b.norm2->weight);
    copy(layer->norm2->bias, b.norm2->bias);
  }
}

void ParallelTransformerLMImpl::load_from(TransformerLM& full) {
  auto params = full->named_parameters();
  copy(embed->weight, params["embed.weight"]);
  copy(head->weight, params["head.weight"]);
  copy(head->bias, params["head.bias"]);
  for (size_t i = 0; i < blocks->size(); ++i) blocks->ptr<ParallelBlockImpl>(i)->load_full(layer_of(full, i));
}

ParallelTransformerLMImpl::Origin ParallelTransformerLMImpl::origin(const std::string& name) const {
  if (name == "embed.weight" || name == "head.weight" || name == "head.bias") return {name, 0, {}};
  // "blocks.<i>.<rest>": the layer's parameter, whole or this rank's rows or columns.
  const std::string prefix = "blocks.";
  const size_t dot = name.find('.', prefix.size());
  if (name.rfind(prefix, 0) != 0 || dot == std::string::npos)
    throw std::invalid_argument("ParallelTransformerLM: no parameter '" + name + "'");
  const size_t i = std::stoul(name.substr(prefix.size(), dot - prefix.size()));
  const std::string rest = name.substr(dot + 1), layer = "encoder.layers." + std::to_string(i) + ".";
  const auto& b = *blocks->ptr<ParallelBlockImpl>(i);
  auto columns = [](const RowParallelLinearImpl& row) {
    const int64_t part = row.weight.size(1), rank = row.tp_rank();
    return torch::arange(rank * part, (rank + 1) * part);
  };
  if (rest == "attention.qkv.weight") return {layer + "self_attn.in_proj_weight", 0, b.attention->qkv->rows()};
  if (rest == "attention.qkv.bias") return {layer + "self_attn.in_proj_bias", 0, b.attention->qkv->rows()};
  if (rest == "attention.out.weight") return {layer + "self_attn.out_proj.weight", 1, columns(*b.attention->out)};
  if (rest == "attention.out.bias") return {layer + "self_attn.out_proj.bias", 0, {}};
  if (rest == "mlp.linear1.weight") return {layer + "linear1.weight", 0, b.mlp->linear1->rows()};
  if (rest == "mlp.linear1.bias") return {layer + "linear1.bias", 0, b.mlp->linear1->rows()};
  if (rest == "mlp.linear2.weight") return {layer + "linear2.weight", 1, columns(*b.mlp->linear2)};
  if (rest == "mlp.linear2.bias") return {layer + "linear2.bias", 0, {}};
  if (rest.rfind("norm", 0) == 0) return {layer + rest, 0, {}};
  throw std::invalid_argument("ParallelTransformerLM: no parameter '" + name + "'");
}

std::string ParallelTransformerLMImpl::full_name(const std::string& name) const {
  return origin(name).full_name;
}

torch::Tensor ParallelTransformerLMImpl::slice_of(const std::string& name, const torch::Tensor& full) const {
  const Origin o = origin(name);
  return o.index.defined() ? full.index_select(o.dim, o.index.to(full.device())) : full;
}

int64_t ParallelTransformerLMImpl::params_per_rank(const TransformerLMOptions& o, int tp) {
  const int64_t d = o.d_model, ff = o.feedforward, v = o.vocab_size;
  const int64_t whole = v * d + (d * v + v)                  // embedding, head
                        + o.layers * (4 * d + d + d);        // norms, the row layers' biases
  const int64_t split = o.layers * ((3 * d * d + 3 * d)      // q, k, v and their biases
                                    + d * d                  // attention's output projection
                                    + (ff * d + ff) + d * ff);  // linear1 and its bias, linear2
  return whole + split / tp;
}

}  // namespace kit
