// kit/seq2seq/model.cpp — the summariser's encoder-decoder Transformer (see model.h).
#include "kit/seq2seq/model.h"

#include <cmath>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "kit/check/observe.h"  // model_to(), training_forward(): for the capstone's checker
#include "kit/models/transformer_lm.h"  // sinusoidal_positions(): exercise 01's position codes

namespace kit {
namespace {

[[noreturn]] void fail(const char* call, const std::string& what) {
  throw std::invalid_argument(std::string(call) + ": " + what);
}

// torch::manual_seed(seed)'s effect on the CPU generator (where the weights are drawn) while the
// weights are drawn, then the caller's generator state back: making a model moves neither the
// caller's CPU stream (its dropout, its data order) nor, unlike torch::manual_seed, a CUDA one.
class SeededInit {
 public:
  explicit SeededInit(uint64_t seed) : gen_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    saved_ = gen_.get_state();
    gen_.set_current_seed(seed);
  }
  ~SeededInit() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(saved_);
  }

 private:
  at::Generator gen_;
  at::Tensor saved_;
};

}  // namespace

Seq2SeqImpl::Seq2SeqImpl(const Seq2SeqOptions& o) : options_(o) {
  const char* call = "Seq2Seq";
  auto positive = [&](int64_t v, const char* name) {
    if (v < 1) fail(call, std::string(name) + " must be at least 1, not " + std::to_string(v));
  };
  positive(o.vocab_size, "vocab_size");
  positive(o.d_model, "d_model");
  positive(o.heads, "heads");
  positive(o.encoder_layers, "encoder_layers");
  positive(o.decoder_layers, "decoder_layers");
  positive(o.feedforward, "feedforward");
  positive(o.max_len, "max_len");
  if (o.d_model % o.heads != 0)
    fail(call, "heads (" + std::to_string(o.heads) + ") must divide d_model (" +
                   std::to_string(o.d_model) + ")");
  if (o.d_model % 2 != 0)
    fail(call, "d_model (" + std::to_string(o.d_model) + ") must be even (sinusoidal positions)");
  if (!(o.dropout >= 0 && o.dropout < 1))
    fail(call, "dropout must be in [0, 1), not " + std::to_string(o.dropout));
  for (auto [id, name] : {std::pair{o.pad_id, "pad_id"}, {o.bos_id, "bos_id"}, {o.eos_id, "eos_id"}})
    if (id < 0 || id >= o.vocab_size)
      fail(call, std::string(name) + " " + std::to_string(id) + " is outside the vocabulary [0, " +
                     std::to_string(o.vocab_size) + ")");
  if (o.pad_id == o.bos_id || o.pad_id == o.eos_id)
    fail(call, "pad_id must differ from bos_id and eos_id (a padded position is masked)");

  SeededInit seeded(o.seed);
  embed_ = register_module("embed", torch::nn::Embedding(o.vocab_size, o.d_model));
  {
    torch::NoGradGuard no_grad;
    embed_->weight.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(o.d_model)));
  }
  dropout_ = register_module("dropout", torch::nn::Dropout(o.dropout));
  // torch's defaults otherwise: post-norm (norm_first is false in Python, and the C++ layers have
  // no other), ReLU, xavier_uniform_ on every matrix (TransformerImpl::reset_parameters, as
  // Python's _reset_parameters).
  transformer_ = register_module(
      "transformer", torch::nn::Transformer(torch::nn::TransformerOptions(o.d_model, o.heads)
                                                .num_encoder_layers(o.encoder_layers)
                                                .num_decoder_layers(o.decoder_layers)
                                                .dim_feedforward(o.feedforward)
                                                .dropout(o.dropout)));

  positions_ = register_buffer("positions", sinusoidal_positions(o.max_len, o.d_model));
}

namespace {

void check_seq2seq_ids(const torch::Tensor& ids, int64_t max_len, const char* what,
                       const char* call) {
  if (!ids.defined() || ids.dim() != 2 || ids.scalar_type() != torch::kLong)
    fail(call, std::string(what) + " must be int64 [batch, length]");
  if (ids.size(1) < 1 || ids.size(1) > max_len)
    fail(call, std::string(what) + " has length " + std::to_string(ids.size(1)) +
                   ", outside [1, max_len = " + std::to_string(max_len) + "]");
}

}  // namespace

void check_seq2seq_pair(const torch::Tensor& src, const torch::Tensor& tgt_in, int64_t max_len,
                        const char* call) {
  check_seq2seq_ids(src, max_len, "src", call);
  check_seq2seq_ids(tgt_in, max_len, "tgt_in", call);
  if (src.size(0) != tgt_in.size(0))
    fail(call, "src has " + std::to_string(src.size(0)) + " rows and tgt_in " +
                   std::to_string(tgt_in.size(0)));
}

torch::Tensor seq2seq_causal_mask(int64_t len, torch::Device device) {
  return torch::nn::TransformerImpl::generate_square_subsequent_mask(len).to(device);
}

void Seq2SeqImpl::check_ids(const torch::Tensor& ids, const char* what, const char* call) const {
  check_seq2seq_ids(ids, options_.max_len, what, call);
}

void Seq2SeqImpl::check_weights(const char* call) const {
  if (embed_->weight.numel() == 0)
    fail(call, "the model's weights are not here (0 elements): FullyShardedModel (ZeRO-3) keeps "
               "only shards between uses; run the model through forward_chain(), or inside "
               "FullyShardedModel::full_params()");
}

torch::Tensor Seq2SeqImpl::embed(const torch::Tensor& ids) {
  const int64_t len = ids.size(1);
  auto x = embed_(ids) * std::sqrt(static_cast<double>(options_.d_model));
  return dropout_(x + positions_.narrow(0, 0, len).unsqueeze(0)).transpose(0, 1);
}

// The output projection is the embedding (model.h): [T, b, d] -> [b, T, vocab].
torch::Tensor Seq2SeqImpl::project(const torch::Tensor& h) {
  return torch::nn::functional::linear(h.transpose(0, 1), embed_->weight);
}

torch::Tensor Seq2SeqImpl::encode(const torch::Tensor& src) {
  check_weights("Seq2Seq::encode");
  check_ids(src, "src", "Seq2Seq::encode");
  auto& encoder = *transformer_->encoder.ptr<torch::nn::TransformerEncoderImpl>();
  return encoder.forward(embed(src), /*src_mask=*/{}, /*src_key_padding_mask=*/src.eq(options_.pad_id));
}

torch::Tensor Seq2SeqImpl::decode(const torch::Tensor& memory, const torch::Tensor& src,
                                  const torch::Tensor& tgt_in) {
  const char* call = "Seq2Seq::decode";
  check_weights(call);
  check_seq2seq_pair(src, tgt_in, options_.max_len, call);
  auto& decoder = *transformer_->decoder.ptr<torch::nn::TransformerDecoderImpl>();
  auto causal = seq2seq_causal_mask(tgt_in.size(1), memory.device());
  auto h = decoder.forward(embed(tgt_in), memory, causal, /*memory_mask=*/{},
                           /*tgt_key_padding_mask=*/tgt_in.eq(options_.pad_id),
                           /*memory_key_padding_mask=*/src.eq(options_.pad_id));
  return project(h);
}

torch::Tensor Seq2SeqImpl::forward(const torch::Tensor& src, const torch::Tensor& tgt_in) {
  const char* call = "Seq2Seq::forward";
  check_weights(call);
  check_seq2seq_pair(src, tgt_in, options_.max_len, call);
  // Each training forward's weights, for the checker (are the copies of all ranks the same?).
  if (is_training() && torch::GradMode::is_enabled())
    observe::training_forward(*this, ++training_forwards_);
  return decode(encode(src), src, tgt_in);
}

std::vector<Seq2SeqUnit> Seq2SeqImpl::units() {
  auto& encoder = *transformer_->encoder.ptr<torch::nn::TransformerEncoderImpl>();
  auto& decoder = *transformer_->decoder.ptr<torch::nn::TransformerDecoderImpl>();
  // torch::nn::Transformer always gives both stacks a final LayerNorm (model.h).
  auto encoder_norm = encoder.norm.ptr<torch::nn::LayerNormImpl>();
  auto decoder_norm = decoder.norm.ptr<torch::nn::LayerNormImpl>();
  const auto batch = chain_;
  std::vector<Seq2SeqUnit> out;
  // The documents' embedding: [batch, S] ids -> [S, batch, d].
  out.push_back({embed_.ptr(), [this](const torch::Tensor& src) { return embed(src); }});
  // What TransformerEncoderImpl::forward runs: each layer, then the norm.
  for (size_t i = 0; i < encoder.layers->size(); ++i) {
    auto layer = encoder.layers->ptr<torch::nn::TransformerEncoderLayerImpl>(i);
    out.push_back({layer, [layer, batch](const torch::Tensor& x) {
                     return layer->forward(x, /*src_mask=*/{}, batch->src_pad);
                   }});
  }
  out.push_back({encoder_norm,
                 [encoder_norm](const torch::Tensor& x) { return encoder_norm->forward(x); }});
  // The summary inputs' embedding after the memory: [S + T, batch, d].
  out.push_back({embed_.ptr(),
                 [this, batch](const torch::Tensor& memory) {
                   return torch::cat({memory, embed(batch->tgt_in)}, 0);
                 },
                 /*reuse=*/true});
  // TransformerDecoderImpl::forward's layers, each reading the memory and passing it on.
  for (size_t i = 0; i < decoder.layers->size(); ++i) {
    auto layer = decoder.layers->ptr<torch::nn::TransformerDecoderLayerImpl>(i);
    out.push_back({layer, [layer, batch](const torch::Tensor& x) {
                     const int64_t s = batch->src_len;
                     auto memory = x.narrow(0, 0, s);
                     auto h = layer->forward(x.narrow(0, s, x.size(0) - s), memory, batch->causal,
                                             /*memory_mask=*/{}, batch->tgt_pad, batch->src_pad);
                     return torch::cat({memory, h}, 0);
                   }});
  }
  out.push_back({decoder_norm, [decoder_norm, batch](const torch::Tensor& x) {
                   const int64_t s = batch->src_len;
                   return decoder_norm->forward(x.narrow(0, s, x.size(0) - s));  // [T, batch, d]
                 }});
  // The output projection, with the embedding's weights again.
  out.push_back({embed_.ptr(), [this](const torch::Tensor& h) { return project(h); },
                 /*reuse=*/true});
  return out;
}

torch::Tensor Seq2SeqImpl::forward_chain(const Chain& chain, const torch::Tensor& src,
                                         const torch::Tensor& tgt_in) {
  const char* call = "Seq2Seq::forward_chain";
  check_seq2seq_pair(src, tgt_in, options_.max_len, call);
  if (is_training() && torch::GradMode::is_enabled())
    observe::training_forward(*this, ++training_forwards_);
  // The masks decode() makes, once for every unit.
  *chain_ = ChainBatch{
      .tgt_in = tgt_in,
      .src_pad = src.eq(options_.pad_id),
      .tgt_pad = tgt_in.eq(options_.pad_id),
      .causal = seq2seq_causal_mask(tgt_in.size(1), src.device()),
      .src_len = src.size(1)};
  return chain(src);
}

void Seq2SeqImpl::to(torch::Device device, bool non_blocking) {
  observe::model_to(device);  // where each rank puts its model, for the checker
  torch::nn::Module::to(device, non_blocking);
}

torch::Tensor Seq2SeqImpl::greedy_decode(const torch::Tensor& src, int64_t max_len) {
  const char* call = "Seq2Seq::greedy_decode";
  check_weights(call);
  check_ids(src, "src", call);
  if (max_len < 1 || max_len > options_.max_len)
    fail(call, "max_len " + std::to_string(max_len) + " is outside [1, options' max_len = " +
                   std::to_string(options_.max_len) + "]");
  torch::NoGradGuard no_grad;
  const int64_t batch = src.size(0);
  auto memory = encode(src);  // once: the decoder's steps all read it
  auto ys = torch::full({batch, 1}, options_.bos_id, src.options());
  auto done = torch::zeros({batch}, src.options().dtype(torch::kBool));
  for (int64_t t = 0; t < max_len; ++t) {
    // The whole prefix again at each step (no cached keys and values): simple, and exactly the
    // forward that training runs.
    auto next = decode(memory, src, ys).select(1, t).argmax(-1);
    next = torch::where(done, torch::full_like(next, options_.pad_id), next);
    ys = torch::cat({ys, next.unsqueeze(1)}, 1);
    done = done | next.eq(options_.eos_id);
    if (done.all().item<bool>()) break;  // one host sync a step
  }
  return ys.narrow(1, 1, ys.size(1) - 1);
}

torch::Tensor Seq2SeqImpl::beam_decode(const torch::Tensor& src, int64_t max_len, int64_t beam,
                                       double length_penalty) {
  const char* call = "Seq2Seq::beam_decode";
  check_weights(call);
  check_ids(src, "src", call);
  if (max_len < 1 || max_len > options_.max_len)
    fail(call, "max_len " + std::to_string(max_len) + " is outside [1, options' max_len = " +
                   std::to_string(options_.max_len) + "]");
  if (beam < 1) fail(call, "beam must be at least 1, not " + std::to_string(beam));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> best;  // each row's tokens, bos_id left out
  int64_t longest = 1;
  for (int64_t b = 0; b < src.size(0); ++b) {
    const auto row = src.narrow(0, b, 1);
    const auto memory = encode(row);  // [S, 1, d]: once, repeated for the live hypotheses
    auto seqs = torch::full({1, 1}, options_.bos_id, src.options());  // the live hypotheses
    auto scores = torch::zeros({1}, memory.options());                // their summed log-probs
    std::vector<std::pair<double, torch::Tensor>> finished;           // (score, tokens)
    auto score = [&](double sum, int64_t length) {
      return sum / std::pow(static_cast<double>(length), length_penalty);
    };
    bool stopped = false;  // `beam` hypotheses finished before max_len
    for (int64_t t = 0; t < max_len && !stopped; ++t) {
      const int64_t n = seqs.size(0);
      auto logp = torch::log_softmax(
          decode(memory.repeat({1, n, 1}), row.expand({n, -1}), seqs).select(1, t), -1);
      const int64_t vocab = logp.size(1);
      // The 2 beam best extensions: enough for `beam` live ones even if `beam` of them finish.
      auto [values, index] =
          (scores.unsqueeze(1) + logp).flatten().topk(std::min(2 * beam, n * vocab));
      values = values.to(torch::kCPU, torch::kDouble);
      index = index.cpu();
      std::vector<int64_t> from, token;
      std::vector<double> kept;
      for (int64_t j = 0; j < values.size(0) && static_cast<int64_t>(from.size()) < beam; ++j) {
        const int64_t i = index[j].item<int64_t>() / vocab, tok = index[j].item<int64_t>() % vocab;
        const double sum = values[j].item<double>();
        if (tok == options_.eos_id) {
          if (static_cast<int64_t>(finished.size()) < beam) {
            auto eos = torch::full({1}, tok, src.options());
            finished.emplace_back(score(sum, t + 1), torch::cat({seqs[i].narrow(0, 1, t), eos}));
          }
        } else {
          from.push_back(i);
          token.push_back(tok);
          kept.push_back(sum);
        }
      }
      stopped = static_cast<int64_t>(finished.size()) >= beam || from.empty();
      if (from.empty()) break;
      auto pick = torch::tensor(from, src.options());
      auto next = torch::tensor(token, src.options()).unsqueeze(1);
      seqs = torch::cat({seqs.index_select(0, pick), next}, 1);
      scores = torch::tensor(kept, torch::kDouble).to(memory.options());
    }
    if (!stopped)  // max_len reached: the live hypotheses, unfinished, compete too
      for (int64_t i = 0; i < seqs.size(0); ++i)
        finished.emplace_back(score(scores[i].item<double>(), seqs.size(1) - 1),
                              seqs[i].narrow(0, 1, seqs.size(1) - 1));
    size_t top = 0;
    for (size_t i = 1; i < finished.size(); ++i)
      if (finished[i].first > finished[top].first) top = i;
    best.push_back(finished[top].second);
    longest = std::max(longest, finished[top].second.size(0));
  }
  auto out = torch::full({src.size(0), longest}, options_.pad_id, src.options());
  for (int64_t b = 0; b < src.size(0); ++b) out[b].narrow(0, 0, best[b].size(0)).copy_(best[b]);
  return out;
}

torch::Tensor seq2seq_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                           int64_t pad_id) {
  if (logits.dim() != 3 || targets.dim() != 2 || logits.size(0) != targets.size(0) ||
      logits.size(1) != targets.size(1)) {
    std::ostringstream s;
    s << "seq2seq_loss: logits " << logits.sizes() << " and targets " << targets.sizes()
      << " must be [batch, T, vocab] and [batch, T]";
    throw std::invalid_argument(s.str());
  }
  namespace F = torch::nn::functional;
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape(-1),
                          F::CrossEntropyFuncOptions().ignore_index(pad_id));
}

}  // namespace kit
