// kit/check/model_trace.cpp — a model's trace events (see model_trace.h).
#include "kit/check/model_trace.h"

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <string>

#include <torch/serialize.h>  // torch::pickle_save

#include "kit/check/trace.h"        // enabled(), record(), file()

namespace kit::trace {

void record_model_to(torch::Device device) { record("model_to", "device=" + device.str()); }

namespace {

void save_initial_weights(const torch::nn::Module& model) {
  const char* wanted = std::getenv("KIT_TRACE_WEIGHTS");
  const std::string path = file("initial-weights", "pt");
  if (wanted == nullptr || std::string(wanted) != "1" || path.empty()) return;
  c10::Dict<std::string, torch::Tensor> state;
  for (const auto& p : model.named_parameters()) state.insert(p.key(), p.value().detach().cpu());
  for (const auto& b : model.named_buffers()) state.insert(b.key(), b.value().detach().cpu());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(state));
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// The sum of every floating-point buffer (batch norm's running statistics; 0 without any).
double buffer_sum(const torch::nn::Module& model) {
  double sum = 0;
  for (const auto& b : model.buffers())
    if (b.is_floating_point()) sum += b.to(torch::kDouble).sum().item<double>();
  return sum;
}

}  // namespace

void record_training_forward(const torch::nn::Module& model, int64_t step) {
  if (!enabled()) return;
  torch::NoGradGuard no_grad;
  double sum = 0;
  std::string device;  // where the weights are: the device setup() gave this rank?
  for (const auto& p : model.parameters()) {
    sum += p.to(torch::kDouble).sum().item<double>();
    if (device.empty()) device = p.device().str();
  }
  std::ostringstream fields;
  fields << "step=" << step << " params=" << std::setprecision(17) << sum
         << " buffers=" << buffer_sum(model) << " device=" << device;
  record("forward", fields.str());
  if (step == 1) save_initial_weights(model);
}

void record_gradients(int64_t step, const std::vector<std::string>& names,
                      const std::vector<torch::Tensor>& params) {
  const char* wanted = std::getenv("KIT_TRACE_WEIGHTS");
  const std::string path = file("first-backward", "pt");
  if (step != 1 || wanted == nullptr || std::string(wanted) != "1" || path.empty()) return;
  torch::serialize::OutputArchive archive;
  std::string list;
  for (size_t i = 0; i < params.size() && i < names.size(); ++i) {
    const torch::Tensor& g = params[i].grad();
    archive.write("w" + std::to_string(i), params[i].detach().cpu());
    archive.write("g" + std::to_string(i), g.defined() ? g.detach().cpu() : torch::zeros({0}));
    list += names[i] + "\n";
  }
  archive.save_to(path);
  std::ofstream out(file("first-backward", "names"));
  out << list;
  if (!out) throw std::runtime_error("cannot write the parameters' names beside " + path);
}

void record_evaluation(const torch::nn::Module& model) {
  if (!enabled()) return;
  torch::NoGradGuard no_grad;
  std::ostringstream fields;
  fields << "buffers=" << std::setprecision(17) << buffer_sum(model);
  record("evaluate", fields.str());
}

}  // namespace kit::trace
