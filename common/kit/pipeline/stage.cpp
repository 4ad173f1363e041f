// kit/pipeline/stage.cpp — the model cut into chunks (see stage.h).
#include "kit/pipeline/stage.h"

#include <mutex>
#include <stdexcept>

#include <ATen/Context.h>

#include "kit/check/observe.h"  // the forwards and backwards in the run trace

namespace kit::pp {

TransformerLM whole_model(const TransformerLMOptions& options, uint64_t seed) {
  auto gen = at::globalContext().defaultGenerator(torch::kCPU);
  torch::Tensor before;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    before = gen.get_state();
    gen.set_current_seed(seed);
  }
  TransformerLM model(options);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(before);
  return model;
}

std::vector<int> split_layers(int layers, int chunks) {
  if (chunks < 1 || chunks > layers)
    throw std::invalid_argument("the pipeline has " + std::to_string(chunks) + " chunks for " +
                                std::to_string(layers) + " blocks: each chunk needs at least one "
                                "block (fewer stages or chunks per rank, or more --layers)");
  std::vector<int> out(chunks, layers / chunks);
  for (int c = 0; c < layers % chunks; ++c) ++out[c];
  return out;
}

namespace {
std::string blocks(int from, int count) {
  return count == 1 ? "block " + std::to_string(from)
                    : "blocks " + std::to_string(from) + "-" + std::to_string(from + count - 1);
}
std::string what(int c, int chunks, int from, int count) {
  return std::string(c == 0 ? "embedding, " : "") + blocks(from, count) +
         (c == chunks - 1 ? ", output layer" : "");
}
}  // namespace

std::string describe_split(int layers, int chunks) {
  const auto counts = split_layers(layers, chunks);
  std::string out;
  for (int c = 0, from = 0; c < chunks; from += counts[c], ++c)
    out += (out.empty() ? "" : " | ") + std::string("chunk ") + std::to_string(c) + ": " +
           what(c, chunks, from, counts[c]);
  return out;
}

torch::Tensor Chunk::forward(const torch::Tensor& x, int micro) const {
  const auto start = std::chrono::steady_clock::now();
  const int64_t live = observe::live_bytes();
  torch::Tensor y = x;
  for (const auto& u : units) y = u.run(y);
  observe::pipeline("F", index, micro, start, std::chrono::steady_clock::now(), live);
  return y;
}

void Chunk::backward(const torch::Tensor& y, const torch::Tensor& grad, int micro) const {
  const auto start = std::chrono::steady_clock::now();
  const int64_t live = observe::live_bytes();
  if (grad.defined())
    y.backward(grad);
  else
    y.backward();
  observe::pipeline("B", index, micro, start, std::chrono::steady_clock::now(), live);
}

std::vector<torch::Tensor> Chunk::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& u : units)
    for (auto& p : u.module->parameters()) out.push_back(p);
  return out;
}

std::vector<Chunk> take_chunks(TransformerLM& model, int pp, int v, int stage, CallSite site) {
  const std::string call = "kit::pp::take_chunks (" + site.str() + "): ";
  if (pp < 1 || v < 1 || stage < 0 || stage >= pp)
    throw std::invalid_argument(call + "stage " + std::to_string(stage) + " of pp " +
                                std::to_string(pp) + " with " + std::to_string(v) +
                                " chunks per rank: pp and v must be at least 1, stage in 0..pp-1");
  auto units = model->units();  // embedding, blocks..., output layer
  const int layers = static_cast<int>(units.size()) - 2, chunks = pp * v;
  std::vector<int> counts;
  try {
    counts = split_layers(layers, chunks);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(call + e.what());
  }
  std::vector<Chunk> mine;
  std::vector<bool> kept(units.size(), false);
  for (int c = 0, from = 0; c < chunks; from += counts[c], ++c) {
    if (c % pp != stage) continue;
    Chunk chunk{.index = c, .first = c == 0, .last = c == chunks - 1};
    // Unit i + 1 is block i; unit 0 the embedding, the last unit the output layer.
    const size_t begin = c == 0 ? 0 : from + 1, end = from + counts[c] + 1 + (chunk.last ? 1 : 0);
    for (size_t u = begin; u < end; ++u) {
      chunk.units.push_back(units[u]);
      kept[u] = true;
    }
    chunk.what = what(c, chunks, from, counts[c]);
    mine.push_back(std::move(chunk));
  }
  // The other ranks' weights: emptied, so that this rank holds only its share.
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < units.size(); ++u)
    if (!kept[u])
      for (auto& p : units[u].module->parameters()) p.set_data(torch::empty({0}, p.options()));
  return mine;
}

}  // namespace kit::pp
