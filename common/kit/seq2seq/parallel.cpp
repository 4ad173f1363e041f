// kit/seq2seq/parallel.cpp — the summariser's model split over tp (see parallel.h).
#include "kit/seq2seq/parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "kit/check/observe.h"     // model_to(), training_forward(): for the capstone's checker
#include "kit/parallel/mappings.h" // reduce_from
#include "kit/parallel/mesh.h"     // Mesh
#include "kit/parallel/random.h"   // RandomStreams, dropout

namespace kit {

namespace F = torch::nn::functional;

namespace {

void refuse_split(bool ok, const std::string& what, const CallSite& site) {
  if (!ok) throw std::invalid_argument("ParallelSeq2Seq: " + what + " (" + site.str() + ")");
}

// A LayerNorm of its own with `full`'s weights (a copy: the full model may go).
torch::nn::LayerNorm own_norm(const torch::nn::LayerNorm& full) {
  return torch::nn::LayerNorm(std::dynamic_pointer_cast<torch::nn::LayerNormImpl>(full->clone()));
}

void copy_weight(torch::Tensor& to, const torch::Tensor& from) {
  torch::NoGradGuard no_grad;
  to.copy_(from);
}

}  // namespace

// --- Seq2SeqAttention ----------------------------------------------------------------------------

Seq2SeqAttentionImpl::Seq2SeqAttentionImpl(const torch::nn::MultiheadAttention& full, bool cross,
                                           ProcessGroup& tp, RandomStreams& streams, CallSite site)
    : streams_(streams), dropout_(full->options.dropout()), cross_(cross) {
  const int64_t d = full->options.embed_dim(), heads = full->options.num_heads();
  refuse_split(heads % tp.size() == 0,
                std::to_string(heads) + " heads do not split over tp = " +
                    std::to_string(tp.size()),
                site);
  heads_ = heads / tp.size();
  const auto& w = full->in_proj_weight;
  const auto& b = full->in_proj_bias;
  if (cross) {
    q = register_module("q", ColumnParallelLinear(w.narrow(0, 0, d), b.narrow(0, 0, d), tp,
                                                  ColumnParallelOptions{}, site));
    kv = register_module("kv", ColumnParallelLinear(w.narrow(0, d, 2 * d), b.narrow(0, d, 2 * d),
                                                    tp, ColumnParallelOptions{.stacked = 2}, site));
  } else {
    qkv = register_module("qkv", ColumnParallelLinear(w, b, tp, ColumnParallelOptions{.stacked = 3},
                                                      site));
  }
  out = register_module("out", RowParallelLinear(full->out_proj, tp, RowParallelOptions{}, site));
}

torch::Tensor Seq2SeqAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& memory,
                                            const torch::Tensor& mask,
                                            const torch::Tensor& key_pad) {
  torch::Tensor qs, ks, vs;  // [b, len, this rank's heads x head_dim]
  if (cross_) {
    qs = q->forward(x);
    auto both = kv->forward(memory).chunk(2, /*dim=*/-1);
    ks = both[0];
    vs = both[1];
  } else {
    auto all = qkv->forward(x).chunk(3, /*dim=*/-1);
    qs = all[0];
    ks = all[1];
    vs = all[2];
  }
  const int64_t batch = x.size(0), len = x.size(1), keys = memory.size(1);
  const int64_t local = qs.size(-1), head_dim = local / heads_;
  auto per_head = [&](const torch::Tensor& t, int64_t n) {
    return t.reshape({batch, n, heads_, head_dim}).transpose(1, 2);  // [b, heads, n, head_dim]
  };
  // torch scales q (its bias included) before the product, as here.
  auto scores = torch::matmul(per_head(qs * (1 / std::sqrt(static_cast<double>(head_dim))), len),
                              per_head(ks, keys).transpose(-2, -1));  // [b, heads, L, S]
  if (mask.defined()) scores = scores + mask;
  if (key_pad.defined())
    scores = scores.masked_fill(key_pad.view({batch, 1, 1, keys}),
                                -std::numeric_limits<float>::infinity());
  // This rank's heads: a parallel region (random.h); whole heads on a group of one: replicated.
  auto& stream = out->group().size() > 1 ? streams_.parallel() : streams_.replicated();
  auto weights = dropout(F::softmax(scores, /*dim=*/-1), dropout_, is_training(), stream);
  auto mixed =
      torch::matmul(weights, per_head(vs, keys)).transpose(1, 2).reshape({batch, len, local});
  return out->forward(mixed);
}

std::vector<torch::Tensor> Seq2SeqAttentionImpl::full_weights() {
  torch::Tensor w, b;
  if (cross_) {
    w = torch::cat({q->full_weight(), kv->full_weight()});
    b = torch::cat({q->full_bias(), kv->full_bias()});
  } else {
    w = qkv->full_weight();
    b = qkv->full_bias();
  }
  return {w, b, out->full_weight(), out->full_bias()};
}

// --- the layers ----------------------------------------------------------------------------------

// One post-norm layer, as torch's TransformerEncoderLayer (self-attention, MLP) or
// TransformerDecoderLayer (self-attention, cross-attention, MLP): each part's output dropped
// (the replicated stream), added to the stream and normalised.
struct ParallelSeq2SeqImpl::Layer : torch::nn::Module {
  Layer(torch::nn::MultiheadAttention self_full, torch::nn::MultiheadAttention cross_full,
        const torch::nn::Linear& linear1, const torch::nn::Linear& linear2,
        std::vector<torch::nn::LayerNorm> full_norms, double p, ProcessGroup& tp,
        RandomStreams& streams, CallSite site)
      : streams(streams), p(p) {
    refuse_split(linear1->weight.size(0) % tp.size() == 0,
                  "feedforward " + std::to_string(linear1->weight.size(0)) +
                      " does not split over tp = " + std::to_string(tp.size()),
                  site);
    self_attn = register_module("self_attn", Seq2SeqAttention(self_full, false, tp, streams, site));
    if (cross_full)
      cross_attn =
          register_module("cross_attn", Seq2SeqAttention(cross_full, true, tp, streams, site));
    ColumnRow split{ColumnParallelLinear(linear1, tp, ColumnParallelOptions{}, site),
                    RowParallelLinear(linear2, tp, RowParallelOptions{}, site)};
    mlp = register_module("mlp", ParallelMLP(std::move(split), streams, p));
    for (size_t i = 0; i < full_norms.size(); ++i)
      norms.push_back(register_module("norm" + std::to_string(i + 1), own_norm(full_norms[i])));
  }
  // x [b, L, d]; memory [b, S, d] for a decoder layer (else undefined).
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& memory, const torch::Tensor& causal,
                        const torch::Tensor& self_pad, const torch::Tensor& memory_pad) {
    auto add_norm = [&](const torch::Tensor& h, size_t i) {
      return norms[i]->forward(x + dropout(h, p, is_training(), streams.replicated()));
    };
    x = add_norm(self_attn->forward(x, x, causal, self_pad), 0);
    size_t next = 1;
    if (cross_attn) x = add_norm(cross_attn->forward(x, memory, {}, memory_pad), next++);
    return add_norm(mlp->forward(x), next);
  }

  RandomStreams& streams;
  double p;
  Seq2SeqAttention self_attn{nullptr}, cross_attn{nullptr};
  ParallelMLP mlp{nullptr};
  std::vector<torch::nn::LayerNorm> norms;
};

// --- ParallelSeq2Seq -----------------------------------------------------------------------------

ParallelSeq2SeqImpl::ParallelSeq2SeqImpl(Seq2Seq& full, const Mesh& mesh, RandomStreams& streams,
                                         CallSite site)
    : options_(full->options()), tp_(mesh.tp()), streams_(streams), site_(site) {
  refuse_split(mesh.cp_size() == 1 && mesh.pp_size() == 1,
                "splits the model over tp only, not over cp (" + std::to_string(mesh.cp_size()) +
                    ") or pp (" + std::to_string(mesh.pp_size()) + ")",
                site);
  refuse_split(full->embedding()->weight.numel() > 0,
                "the full model's weights are not here (emptied by ZeRO-3?)", site);
  embed_ = register_module(
      "embed", torch::nn::Embedding(std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(
                   full->embedding()->clone())));
  positions_ = register_buffer("positions", full->named_buffers()["positions"].clone());
  auto& t = *full->transformer();
  auto& encoder = *t.encoder.ptr<torch::nn::TransformerEncoderImpl>();
  auto& decoder = *t.decoder.ptr<torch::nn::TransformerDecoderImpl>();
  for (size_t i = 0; i < encoder.layers->size(); ++i) {
    auto l = encoder.layers->ptr<torch::nn::TransformerEncoderLayerImpl>(i);
    encoder_.push_back(register_module(
        "encoder" + std::to_string(i),
        std::make_shared<Layer>(l->self_attn, nullptr, l->linear1, l->linear2,
                                std::vector{l->norm1, l->norm2}, options_.dropout, tp_, streams,
                                site)));
  }
  for (size_t i = 0; i < decoder.layers->size(); ++i) {
    auto l = decoder.layers->ptr<torch::nn::TransformerDecoderLayerImpl>(i);
    decoder_.push_back(register_module(
        "decoder" + std::to_string(i),
        std::make_shared<Layer>(l->self_attn, l->multihead_attn, l->linear1, l->linear2,
                                std::vector{l->norm1, l->norm2, l->norm3}, options_.dropout, tp_,
                                streams, site)));
  }
  encoder_norm_ =
      register_module("encoder_norm", own_norm(encoder.norm.get<torch::nn::LayerNorm>()));
  decoder_norm_ =
      register_module("decoder_norm", own_norm(decoder.norm.get<torch::nn::LayerNorm>()));
  for (auto* stack : {&encoder_, &decoder_})
    for (auto& layer : *stack) {
      for (auto* attn : {&layer->self_attn, &layer->cross_attn}) {
        if (attn->is_empty()) continue;
        for (auto* column : {&(*attn)->qkv, &(*attn)->q, &(*attn)->kv})
          if (!column->is_empty())
            split_.insert(split_.end(), {(*column)->weight, (*column)->bias});
        split_.push_back((*attn)->out->weight);
      }
      split_.insert(split_.end(), {layer->mlp->linear1->weight, layer->mlp->linear1->bias,
                                   layer->mlp->linear2->weight});
    }
  // The rest, whole on every tp rank (once, here: the set of parameters does not change).
  for (auto& p : parameters())
    if (std::none_of(split_.begin(), split_.end(), [&](const auto& s) { return s.is_same(p); }))
      whole_.push_back(p);
}

torch::Tensor ParallelSeq2SeqImpl::clip_grad_norm_(double max_norm) {
  torch::NoGradGuard no_grad;
  auto squares = [](const std::vector<torch::Tensor>& params) {
    torch::Tensor sum;
    for (const auto& p : params)
      if (p.grad().defined()) {
        auto s = p.grad().pow(2).sum();
        sum = sum.defined() ? sum + s : s;
      }
    return sum;
  };
  auto split_sum = squares(split_);
  auto whole_sum = squares(whole_);
  if (!split_sum.defined() && !whole_sum.defined()) return torch::zeros({});
  if (!split_sum.defined()) split_sum = torch::zeros_like(whole_sum);
  if (!whole_sum.defined()) whole_sum = torch::zeros_like(split_sum);
  // Every tp rank's squares of its slices, added up: the split weights' part of the norm.
  split_sum = reduce_from(split_sum, tp_, site_);
  auto norm = (split_sum + whole_sum).sqrt();
  auto factor = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  for (const auto* params : {&split_, &whole_})
    for (const auto& p : *params)
      if (p.grad().defined()) p.grad().mul_(factor);
  return norm;
}

torch::Tensor ParallelSeq2SeqImpl::embed(const torch::Tensor& ids) {
  auto x = embed_(ids) * std::sqrt(static_cast<double>(options_.d_model));
  x = x + positions_.narrow(0, 0, ids.size(1)).unsqueeze(0);
  return dropout(x, options_.dropout, is_training(), streams_.replicated());
}

torch::Tensor ParallelSeq2SeqImpl::forward(const torch::Tensor& src, const torch::Tensor& tgt_in) {
  check_seq2seq_pair(src, tgt_in, options_.max_len, "ParallelSeq2Seq::forward");
  if (is_training() && torch::GradMode::is_enabled())
    observe::training_forward(*this, ++training_forwards_);
  const auto src_pad = src.eq(options_.pad_id), tgt_pad = tgt_in.eq(options_.pad_id);
  auto memory = embed(src);
  for (auto& layer : encoder_) memory = layer->forward(memory, {}, {}, src_pad, {});
  memory = encoder_norm_->forward(memory);
  const auto causal = seq2seq_causal_mask(tgt_in.size(1), src.device());
  auto h = embed(tgt_in);
  for (auto& layer : decoder_) h = layer->forward(h, memory, causal, tgt_pad, src_pad);
  // The output projection is the embedding (model.h), whole on every rank.
  return F::linear(decoder_norm_->forward(h), embed_->weight);
}

void ParallelSeq2SeqImpl::write_full(Seq2Seq& full) {
  refuse_split(full->options().d_model == options_.d_model &&
                    full->options().vocab_size == options_.vocab_size &&
                    full->options().encoder_layers == options_.encoder_layers &&
                    full->options().decoder_layers == options_.decoder_layers &&
                    full->options().feedforward == options_.feedforward,
                "write_full wants a Seq2Seq of the same options", site_);
  auto& t = *full->transformer();
  auto& encoder = *t.encoder.ptr<torch::nn::TransformerEncoderImpl>();
  auto& decoder = *t.decoder.ptr<torch::nn::TransformerDecoderImpl>();
  auto attention = [](torch::nn::MultiheadAttention& to, Seq2SeqAttention& from) {
    auto w = from->full_weights();
    copy_weight(to->in_proj_weight, w[0]);
    copy_weight(to->in_proj_bias, w[1]);
    copy_weight(to->out_proj->weight, w[2]);
    copy_weight(to->out_proj->bias, w[3]);
  };
  auto rest = [](Layer& from, torch::nn::Linear& l1, torch::nn::Linear& l2,
                 std::vector<torch::nn::LayerNorm> norms) {
    copy_weight(l1->weight, from.mlp->linear1->full_weight());
    copy_weight(l1->bias, from.mlp->linear1->full_bias());
    copy_weight(l2->weight, from.mlp->linear2->full_weight());
    copy_weight(l2->bias, from.mlp->linear2->full_bias());
    for (size_t i = 0; i < norms.size(); ++i) {
      copy_weight(norms[i]->weight, from.norms[i]->weight);
      copy_weight(norms[i]->bias, from.norms[i]->bias);
    }
  };
  copy_weight(full->embedding()->weight, embed_->weight);
  for (size_t i = 0; i < encoder_.size(); ++i) {
    auto l = encoder.layers->ptr<torch::nn::TransformerEncoderLayerImpl>(i);
    attention(l->self_attn, encoder_[i]->self_attn);
    rest(*encoder_[i], l->linear1, l->linear2, {l->norm1, l->norm2});
  }
  for (size_t i = 0; i < decoder_.size(); ++i) {
    auto l = decoder.layers->ptr<torch::nn::TransformerDecoderLayerImpl>(i);
    attention(l->self_attn, decoder_[i]->self_attn);
    attention(l->multihead_attn, decoder_[i]->cross_attn);
    rest(*decoder_[i], l->linear1, l->linear2, {l->norm1, l->norm2, l->norm3});
  }
  for (auto [to, from] : {std::pair{encoder.norm.get<torch::nn::LayerNorm>(), encoder_norm_},
                          {decoder.norm.get<torch::nn::LayerNorm>(), decoder_norm_}}) {
    copy_weight(to->weight, from->weight);
    copy_weight(to->bias, from->bias);
  }
}

void ParallelSeq2SeqImpl::to(torch::Device device, bool non_blocking) {
  observe::model_to(device);
  torch::nn::Module::to(device, non_blocking);
}

}  // namespace kit
