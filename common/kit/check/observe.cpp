// kit/check/observe.cpp — each library event as a line of the run trace (see observe.h). The
// fields and their order are what common/tools/checklib/ parses: a change here is a change of
// the trace's format, and the checker's rules and tests read it.
#include "kit/check/observe.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/Context.h>
#include <c10/core/ScalarType.h>

#include "kit/check/model_trace.h"  // the model's records: fingerprints, starting weights
#include "kit/check/trace.h"        // the file: enabled(), record()
#include "kit/runtime/process_group.h"  // CallSite::str(), ReduceOp

namespace kit::observe::detail {
namespace {

bool (*g_group_alive)() = nullptr;

// At exit, whether the process group was still alive: a trainer that never called
// destroy_process_group() leaves "exit group_alive=1".
void record_exit() {
  trace::record("exit", std::string("group_alive=") + (g_group_alive && g_group_alive() ? "1" : "0"));
}

std::string shape_of(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + "]";
}

// A moment as microseconds of the monotonic clock: one clock for every process of a machine, so
// that the timeline can put the ranks of one node side by side.
int64_t micros(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

// Every value of a tensor, as "1.000000,2.000000" (std::to_string of each, as a double).
std::string values(const torch::Tensor& t) {
  std::string out;
  auto flat = t.detach().to(torch::kCPU, torch::kDouble).flatten();
  for (int64_t i = 0; i < flat.numel(); ++i)
    out += (i ? "," : "") + std::to_string(flat[i].item<double>());
  return out;
}

}  // namespace

bool tracing() { return trace::enabled(); }

void setup(int rank, int local_rank, int world_size, const torch::Device& device,
           const std::string& backend, std::chrono::milliseconds timeout, int threads,
           uint64_t seed, bool (*group_alive)()) {
  trace::record("setup", "rank=" + std::to_string(rank) + " local_rank=" +
                             std::to_string(local_rank) + " world_size=" +
                             std::to_string(world_size) + " device=" + device.str() +
                             " backend=" + backend + " timeout_s=" +
                             std::to_string(timeout.count() / 1000) + " threads=" +
                             std::to_string(threads) + " seed=" + std::to_string(seed));
  g_group_alive = group_alive;
  std::atexit(record_exit);
}

void collective(int64_t seq, const char* kind, const char* op, const torch::Tensor& t,
                const CallSite& site, const std::string& group) {
  trace::record("coll", "seq=" + std::to_string(seq) + " kind=" + kind + " op=" + op +
                            " shape=" + (t.defined() ? shape_of(t) : "-") + " dtype=" +
                            (t.defined() ? std::string(c10::toString(t.scalar_type())) : "-") +
                            " site=" + site.str() + " group=" + group);
}

void p2p(int64_t seq, const char* kind, int peer, int tag, const torch::Tensor& t,
         const CallSite& site, const std::string& group) {
  trace::record("p2p", "seq=" + std::to_string(seq) + " kind=" + kind + " peer=" +
                           std::to_string(peer) + " tag=" + std::to_string(tag) + " shape=" +
                           shape_of(t) + " dtype=" + std::string(c10::toString(t.scalar_type())) +
                           " site=" + site.str() + " group=" + group);
}

void p2p_wait(int64_t seq, const char* kind, int peer, const std::string& group,
              std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end) {
  trace::record("p2p_wait", "seq=" + std::to_string(seq) + " kind=" + kind + " peer=" +
                                std::to_string(peer) + " group=" + group + " t0=" +
                                std::to_string(micros(start)) + " t1=" + std::to_string(micros(end)));
}

namespace {
std::atomic<int64_t (*)()> g_live_bytes{nullptr};  // kit::memory::live_bytes, once installed
}  // namespace

int64_t live_bytes() {
  auto* source = g_live_bytes.load();
  return source ? source() : -1;
}

void count_live_bytes(int64_t (*source)()) { g_live_bytes.store(source); }

void pipeline(const char* kind, int stage, int micro, std::chrono::steady_clock::time_point start,
              std::chrono::steady_clock::time_point end, int64_t live_before) {
  std::string live;
  if (live_before >= 0)
    live = " live0=" + std::to_string(live_before) + " live=" + std::to_string(live_bytes());
  trace::record("pp", std::string("kind=") + kind + " stage=" + std::to_string(stage) + " mb=" +
                          std::to_string(micro) + " t0=" + std::to_string(micros(start)) +
                          " t1=" + std::to_string(micros(end)) + live);
}

std::string small_values(const torch::Tensor& t) {
  return t.numel() >= 1 && t.numel() <= 4 ? values(t) : "";
}

void all_reduce(const std::string& before, ReduceOp op, const torch::Tensor& after) {
  trace::record("all_reduce", "op=" + std::to_string(static_cast<int>(op)) + " in=" + before +
                                  " out=" + values(after));
}

void after_destroy(const char* what, const CallSite* site) {
  trace::record("after_destroy", std::string(what) + (site ? " site=" + site->str() : ""));
}

void print0(const char* text) {
  std::string line = text;
  while (!line.empty() && line.back() == '\n') line.pop_back();
  trace::record("print0", line);
}

void save0(const std::string& path) { trace::record("save0", path); }

void destroy() { trace::record("destroy", ""); }

void sampler(size_t dataset_size, int replicas, int rank, bool shuffle, uint64_t seed) {
  trace::record("sampler", "size=" + std::to_string(dataset_size) + " replicas=" +
                               std::to_string(replicas) + " rank=" + std::to_string(rank) +
                               " shuffle=" + std::to_string(static_cast<int>(shuffle)) +
                               " seed=" + std::to_string(seed));
}

void set_epoch(int64_t epoch, size_t dataset_size) {
  trace::record("set_epoch", std::to_string(epoch) + " size=" + std::to_string(dataset_size));
}

void batch(const std::string& dataset, const std::vector<size_t>& order, size_t at,
           size_t batch_size) {
  std::string used;
  for (size_t k = at; k < std::min(order.size(), at + batch_size); ++k)
    used += (used.empty() ? "" : ",") + std::to_string(order[k]);
  trace::record("batch", dataset + " " + used);
}

void sample(const std::string& dataset, size_t index, int worker, int64_t start_ns,
            int64_t end_ns) {
  trace::record("sample", dataset + " index=" + std::to_string(index) + " worker=" +
                              std::to_string(worker) + " start_ns=" + std::to_string(start_ns) +
                              " end_ns=" + std::to_string(end_ns));
}

void ddp(size_t params, size_t buckets, bool overlap, const torch::Device& device) {
  trace::record("ddp", "params=" + std::to_string(params) + " buckets=" +
                           std::to_string(buckets) + " overlap=" +
                           std::to_string(static_cast<int>(overlap)) + " device=" + device.str());
}

void ddp_step(int64_t step, double waited_s) {
  trace::record("ddp_step", "step=" + std::to_string(step) + " wait_us=" +
                                std::to_string(static_cast<int64_t>(waited_s * 1e6)));
}

void ddp_buffers(size_t count) { trace::record("ddp_buffers", "count=" + std::to_string(count)); }

void mesh(int rank, const std::string& coords, const std::string& groups) {
  trace::record("mesh", "rank=" + std::to_string(rank) + " " + coords + " " + groups);
}

void ddp_rebuild(size_t buckets) {
  trace::record("ddp_rebuild", "buckets=" + std::to_string(buckets));
}

void ddp_no_sync() { trace::record("ddp_no_sync", ""); }

void ddp_gradients(int64_t step, const std::vector<std::string>& names,
                   const std::vector<torch::Tensor>& params) {
  trace::record_gradients(step, names, params);
}

void step(int64_t epoch, int64_t step, const torch::Tensor& loss) {
  // %.9g: a float32 loss exactly, for the step-by-step comparison with the solution's run.
  char fields[96];
  std::snprintf(fields, sizeof fields, "epoch=%ld step=%ld loss=%.9g", static_cast<long>(epoch + 1),
                static_cast<long>(step), loss.item<double>());
  trace::record("step", fields);
}

void epoch_report(int64_t epoch, int64_t steps, double samples_per_s, const std::string& device,
                  const char* host) {
  trace::record("epoch_report", "epoch=" + std::to_string(epoch + 1) +
                                    " steps=" + std::to_string(steps) +
                                    " samples_per_s=" + std::to_string(samples_per_s) +
                                    " device=" + device + " host=" + host);
}

void checkpoint(const std::string& name) { trace::record("checkpoint", name); }

void resume(const std::string& name) { trace::record("resume", name); }

void model_to(const torch::Device& device) { trace::record_model_to(device); }

void training_forward(const torch::nn::Module& model, int64_t step) {
  trace::record_training_forward(model, step);
}

void evaluation(const torch::nn::Module& model) { trace::record_evaluation(model); }

void forward_precision(int64_t step, c10::ScalarType output) {
  const auto p = at::globalContext().float32MatmulPrecision();
  const char* matmul = p == at::Float32MatmulPrecision::HIGHEST ? "highest"
                       : p == at::Float32MatmulPrecision::HIGH  ? "high"
                                                                : "medium";
  trace::record("precision", "step=" + std::to_string(step) + " output=" + c10::toString(output) +
                                 " matmul=" + matmul);
}

void optimizer_step(const char* kind, size_t tensors) {
  trace::record("optimizer_step", std::string("kind=") + kind + " tensors=" + std::to_string(tensors));
}

}  // namespace kit::observe::detail
