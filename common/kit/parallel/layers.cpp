// kit/parallel/layers.cpp — the tensor-parallel layers (see layers.h).
#include "kit/parallel/layers.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "kit/parallel/mappings.h"
#include "kit/parallel/mesh.h"
#include "kit/parallel/random.h"

namespace kit {
namespace {

namespace F = torch::nn::functional;

void refuse_unless(bool ok, const std::string& what, const CallSite& site) {
  if (!ok) throw std::invalid_argument(what + " (" + site.str() + ")");
}

// The whole tensor back from the tp ranks' parts, each `part` = [rows, cols]: rank r's part is
// block r along `dim` (0: rows, 1: columns) of each of `stacked` equal blocks of rows.
torch::Tensor gather_parts(const torch::Tensor& part, int64_t dim, int64_t stacked, ProcessGroup& tp,
                           const CallSite& site) {
  torch::NoGradGuard no_grad;
  const torch::Tensor mine = part.detach().contiguous();
  const int n = tp.size();
  torch::Tensor all = mine.unsqueeze(0).clone();
  if (n > 1) {
    all = torch::empty({n * mine.numel()}, mine.options());
    tp.all_gather(all, mine, site);
  }
  if (mine.dim() == 1) {  // a bias: [n, stacked, part] -> [stacked, n, part]
    return all.view({n, stacked, mine.size(0) / stacked}).transpose(0, 1).reshape({-1});
  }
  const int64_t rows = mine.size(0), cols = mine.size(1);
  if (dim == 1) return all.view({n, rows, cols}).permute({1, 0, 2}).reshape({rows, n * cols});
  // [n, stacked, rows/stacked, cols] -> [stacked, n, rows/stacked, cols]
  return all.view({n, stacked, rows / stacked, cols}).transpose(0, 1).reshape({n * rows, cols});
}

}  // namespace

// --- ColumnParallelLinear ------------------------------------------------------------------------

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::Tensor& full_weight,
                                                   const torch::Tensor& full_bias, ProcessGroup& tp,
                                                   ColumnParallelOptions options, CallSite site)
    : tp_(tp), options_(options), site_(site) {
  tp.require_member("ColumnParallelLinear", &site);
  const int64_t out = full_weight.size(0), in = full_weight.size(1);
  refuse_unless(options.stacked >= 1 && out % (options.stacked * tp.size()) == 0,
                "ColumnParallelLinear: " + std::to_string(out) + " output features do not split into " +
                    std::to_string(options.stacked) + " x tp = " + std::to_string(tp.size()) +
                    " equal parts",
                site);
  refuse_unless(!(options.gather_output && options.stacked > 1),
                "ColumnParallelLinear: gather_output with stacked blocks would mix them up", site);
  weight = register_parameter("weight", torch::empty({out / tp.size(), in}, full_weight.options()));
  bias = register_parameter("bias", torch::empty({out / tp.size()}, full_weight.options()));
  load_full(full_weight, full_bias);
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in, int64_t out, ProcessGroup& tp,
                                                   ColumnParallelOptions options, CallSite site)
    : ColumnParallelLinearImpl(torch::nn::Linear(in, out), tp, options, site) {}

torch::Tensor ColumnParallelLinearImpl::rows() const {
  const int64_t out = weight.size(0) * tp_.size(), block = out / options_.stacked;
  const int64_t part = block / tp_.size();
  std::vector<torch::Tensor> mine;
  for (int64_t j = 0; j < options_.stacked; ++j)
    mine.push_back(torch::arange(j * block + tp_.rank() * part, j * block + (tp_.rank() + 1) * part));
  return torch::cat(mine);
}

void ColumnParallelLinearImpl::load_full(const torch::Tensor& full_weight, const torch::Tensor& full_bias) {
  torch::NoGradGuard no_grad;
  const auto mine = rows().to(full_weight.device());
  weight.copy_(full_weight.index_select(0, mine));
  bias.copy_(full_bias.index_select(0, mine.to(full_bias.device())));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  return forward_with_bias(x, bias);
}

torch::Tensor ColumnParallelLinearImpl::forward_with_bias(const torch::Tensor& x, const torch::Tensor& b) {
  // f: the input is the same on every rank; its gradient is the sum of the ranks' (backward).
  auto y = F::linear(copy_to(x, tp_, site_), weight, b);
  return options_.gather_output ? gather_from(y, tp_, site_) : y;
}

torch::Tensor ColumnParallelLinearImpl::full_weight() {
  return gather_parts(weight, 0, options_.stacked, tp_, site_);
}
torch::Tensor ColumnParallelLinearImpl::full_bias() {
  return gather_parts(bias, 0, options_.stacked, tp_, site_);
}

// --- RowParallelLinear ---------------------------------------------------------------------------

RowParallelLinearImpl::RowParallelLinearImpl(const torch::Tensor& full_weight,
                                             const torch::Tensor& full_bias, ProcessGroup& tp,
                                             RowParallelOptions options, CallSite site)
    : tp_(tp), options_(options), site_(site) {
  tp.require_member("RowParallelLinear", &site);
  const int64_t out = full_weight.size(0), in = full_weight.size(1);
  refuse_unless(in % tp.size() == 0,
                "RowParallelLinear: " + std::to_string(in) + " input features do not split into tp = " +
                    std::to_string(tp.size()) + " equal parts",
                site);
  weight = register_parameter("weight", torch::empty({out, in / tp.size()}, full_weight.options()));
  bias = register_parameter("bias", torch::empty({out}, full_weight.options()));
  load_full(full_weight, full_bias);
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in, int64_t out, ProcessGroup& tp,
                                             RowParallelOptions options, CallSite site)
    : RowParallelLinearImpl(torch::nn::Linear(in, out), tp, options, site) {}

void RowParallelLinearImpl::load_full(const torch::Tensor& full_weight, const torch::Tensor& full_bias) {
  torch::NoGradGuard no_grad;
  const int64_t part = weight.size(1);
  weight.copy_(full_weight.narrow(1, tp_.rank() * part, part));
  bias.copy_(full_bias);
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  auto mine = options_.input_is_parallel ? x : scatter_to(x, tp_, site_);
  // g: each rank's product is a partial sum of the output; the bias is added once, to the sum.
  return reduce_from(F::linear(mine, weight), tp_, site_) + bias;
}

torch::Tensor RowParallelLinearImpl::full_weight() { return gather_parts(weight, 1, 1, tp_, site_); }

// --- ParallelAttention ---------------------------------------------------------------------------

ParallelAttentionImpl::ParallelAttentionImpl(const torch::nn::MultiheadAttention& full,
                                             const Mesh& mesh, RandomStreams& streams, CallSite site)
    : ParallelAttentionImpl(
          ColumnRow{ColumnParallelLinear(full->in_proj_weight, full->in_proj_bias, mesh.tp(),
                                         ColumnParallelOptions{.stacked = 3}, site),
                    RowParallelLinear(full->out_proj, mesh.tp(), RowParallelOptions{}, site)},
          full->options.num_heads(), full->options.dropout(), mesh, streams) {}

ParallelAttentionImpl::ParallelAttentionImpl(ColumnRow layers, int64_t heads, double dropout,
                                             const Mesh& mesh, RandomStreams& streams)
    : mesh_(mesh), streams_(streams), dropout_(dropout), site_(layers.column->site()) {
  const int tp = layers.column->group().size();
  const CallSite at = layers.column->site();  // a refusal names the trainer's line that split it
  refuse_unless(layers.column->options().stacked == 3 || tp == 1,  // whole, the blocks are whole too
                "ParallelAttention: q, k and v's layer must be ColumnParallelOptions{.stacked = 3}, "
                "so that each rank keeps its heads' rows of each of q, k and v (stacked = " +
                    std::to_string(layers.column->options().stacked) +
                    " keeps a block of in_proj_weight's rows: all of q and part of k on the first rank)",
                at);
  refuse_unless(!layers.column->options().gather_output,
                "ParallelAttention: q, k and v's layer gathers its output; each rank computes its "
                "own heads from its own slice",
                at);
  refuse_unless(layers.row->group().size() == tp,
                "ParallelAttention: q, k and v are split over " + std::to_string(tp) +
                    " rank(s) but the output projection over " +
                    std::to_string(layers.row->group().size()) +
                    ": the row layer's columns must be the heads this rank computes",
                at);
  refuse_unless(heads % tp == 0,
                "ParallelAttention: " + std::to_string(heads) + " heads do not split over tp = " +
                    std::to_string(tp) + " ranks",
                at);
  heads_ = heads / tp;
  qkv = register_module("qkv", std::move(layers.column));
  out = register_module("out", std::move(layers.row));
}

void ParallelAttentionImpl::load_full(const torch::nn::MultiheadAttention& full) {
  qkv->load_full(full->in_proj_weight, full->in_proj_bias);
  out->load_full(full->out_proj->weight, full->out_proj->bias);
}

torch::Tensor ParallelAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  const int64_t batch = x.size(0), seq = x.size(1);
  const int64_t local = qkv->weight.size(0) / 3, head_dim = local / heads_;
  // The key third of the bias held at zero (kit/models/transformer_lm.h): zeros in its place.
  const auto& b = qkv->bias;
  auto bias = torch::cat({b.narrow(0, 0, local), torch::zeros({local}, b.options()),
                          b.narrow(0, 2 * local, local)});
  auto qkv_out = qkv->forward_with_bias(x, bias).chunk(3, /*dim=*/-1);  // this rank's heads' q, k, v
  // [batch, seq, heads x head_dim] -> [batch, heads, seq, head_dim], one copy each: what the
  // products below keep for backward is then these three, whatever the number of heads (matmul
  // would copy some layouts itself and keep views of others; tp_report counts them).
  auto per_head = [&](const torch::Tensor& t) {
    return t.reshape({batch, seq, heads_, head_dim}).transpose(1, 2).contiguous();
  };
  auto q = per_head(qkv_out[0] * (1 / std::sqrt(static_cast<double>(head_dim))));
  auto k = per_head(qkv_out[1]);
  auto v = per_head(qkv_out[2]);
  if (mesh_.cp_size() > 1) {
    // Every position's keys and values, in the cp ranks' order: one all-gather for both.
    auto kv = all_gather_along(torch::cat({k, v}, /*dim=*/-1), /*dim=*/2, mesh_.cp(), site_);
    k = kv.narrow(-1, 0, head_dim).contiguous();
    v = kv.narrow(-1, head_dim, head_dim).contiguous();
  }
  auto scores = torch::matmul(q, k.transpose(-2, -1)) + mask;
  // Dropout on this rank's heads: a parallel region, its own random numbers (random.h); heads
  // that every rank computes whole (a group of one) are replicated, alike on the tp ranks.
  auto& stream = qkv->group().size() > 1 ? streams_.parallel() : streams_.replicated();
  auto weights = dropout(F::softmax(scores, /*dim=*/-1), dropout_, is_training(), stream);
  auto mixed = torch::matmul(weights, v).transpose(1, 2).reshape({batch, seq, local});
  return out->forward(mixed);
}

// --- ParallelMLP ---------------------------------------------------------------------------------

ParallelMLPImpl::ParallelMLPImpl(const torch::nn::Linear& l1, const torch::nn::Linear& l2,
                                 ProcessGroup& tp, RandomStreams& streams, double dropout,
                                 CallSite site)
    : ParallelMLPImpl(ColumnRow{ColumnParallelLinear(l1, tp, ColumnParallelOptions{}, site),
                                RowParallelLinear(l2, tp, RowParallelOptions{}, site)},
                      streams, dropout) {}

ParallelMLPImpl::ParallelMLPImpl(ColumnRow layers, RandomStreams& streams, double dropout)
    : streams_(streams), dropout_(dropout) {
  const int tp = layers.column->group().size();
  const CallSite at = layers.column->site();  // a refusal names the trainer's line that split it
  refuse_unless(!layers.column->options().gather_output,
                "ParallelMLP: linear1 gathers its output; the row layer takes each rank's slice of "
                "the hidden layer as it is (column -> row sends nothing between them)",
                at);
  refuse_unless(layers.row->options().input_is_parallel,
                "ParallelMLP: linear2 scatters its input, but linear1's output is already this "
                "rank's slice (RowParallelOptions{.input_is_parallel = true})",
                at);
  refuse_unless(layers.row->group().size() == tp,
                "ParallelMLP: linear1 is split over " + std::to_string(tp) + " rank(s) but linear2 "
                    "over " + std::to_string(layers.row->group().size()) +
                    ": the column layer's slice of the hidden layer is the row layer's input",
                at);
  linear1 = register_module("linear1", std::move(layers.column));
  linear2 = register_module("linear2", std::move(layers.row));
}

torch::Tensor ParallelMLPImpl::forward(const torch::Tensor& x) {
  // This rank's slice of the hidden layer: a parallel region (random.h); whole on a group of one.
  auto& stream = linear1->group().size() > 1 ? streams_.parallel() : streams_.replicated();
  auto hidden = dropout(F::relu(linear1->forward(x)), dropout_, is_training(), stream);
  return linear2->forward(hidden);
}

}  // namespace kit
