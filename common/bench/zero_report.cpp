// zero_report — the ZeRO memory and communication report: for DDP and ZeRO stages 1, 2 and 3 on
// 1, 2 and 4 ranks (threads of this process on a local Gloo world), trains a Transformer for two
// steps and prints, per rank,
//   * the bytes of parameters, gradients and AdamW state it holds, measured on its tensors,
//     against the formula (fp32: 4P, 4P, 8P under DDP; ZeRO-1 divides the optimizer state by N,
//     ZeRO-2 also the gradients, ZeRO-3 also the parameters; padded to N equal shards);
//   * the bytes it sent in one step, from what it handed to each collective, converted with the
//     ring model (kit::ring_bytes), against the theory: DDP, ZeRO-1 and ZeRO-2 2(N-1)/N 4P (a
//     reduce-scatter and an all-gather make one all-reduce), ZeRO-3 3(N-1)/N 4P (1.5x DDP);
//   * the peak: the most bytes of live tensors the rank had at any moment of a step (forward,
//     backward, optimizer step, collectives' buffers; kit/train/memory.h), the highest over the
// ranks,
//     beside the formula's total: what the formula leaves out (activations, transient copies)
//     is the difference.
//
//   zero_report [--d-model 128] [--heads 4] [--layers 4] [--feedforward 4 d] [--vocab 2000]
//               [--seq 32] [--batch 8] [--steps 2] [--ranks 1,2,4] [--stage S] [--csv FILE]
//               [--recompute] [--check]
// --batch: the global batch (sequences per step over all ranks).
// --stage: only that stage (0 = DDP, 1, 2, 3; anything else is refused with one line).
// --recompute: ZeRO-3 recomputes each unit's forward in backward (kit::FullyShardedOptions;
// the row is named ZeRO-3r) instead of keeping its activations, the default.
// --check: exit 1 if any measured figure differs from its formula. Bad flags: one line, exit 2.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "kit/runtime/process.h"    // prepare_process: one-line errors, malloc as in a trainer
#include "kit/train/memory.h"       // install: the counting allocator, for the peaks
#include "kit/sharding/sharding.h"  // formula_bytes, ring_bytes
#include "zero_runs.h"              // kit_bench::train

namespace {

int usage(const std::string& why) {
  std::fprintf(stderr, "zero_report: %s (flags: --d-model N --heads N --layers N --feedforward N "
                       "--vocab N --seq N --batch N --steps N --ranks 1,2,4 --stage S --csv FILE "
                       "--recompute --check)\n",
               why.c_str());
  return 2;
}

// The theory of the bytes one rank sends per step in a ring (see the top of this file).
double theory_sent(int stage, int64_t P, int64_t padded, int n) {
  const double f = (n - 1.0) / n;
  if (stage == 0) return 2 * f * 4 * P;
  return (stage == 3 ? 3 : 2) * f * 4 * padded;
}

}  // namespace

int main(int argc, char** argv) {
  kit::prepare_process();  // as a trainer's flag parser does (no kit flags here)
  kit_bench::Setup s;
  s.model.vocab_size = 2000;
  s.model.d_model = 128;
  s.model.heads = 4;
  s.model.layers = 4;
  s.model.feedforward = 512;
  s.model.dropout = 0.0;
  s.model.max_len = 32;
  s.global_batch = 8;
  s.steps = 2;
  std::string csv;
  bool check = false;
  int only = -1;  // --stage: one stage, else all four
  int64_t feedforward = 0;  // 0: 4 d_model
  std::vector<int> world_sizes{1, 2, 4};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check") { check = true; continue; }
    if (a == "--recompute") { s.recompute = true; continue; }
    if (i + 1 >= argc) return usage("flag " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--csv") { csv = v; continue; }
    if (a == "--ranks") {
      world_sizes.clear();
      for (size_t at = 0; at <= v.size();) {
        const size_t comma = std::min(v.find(',', at), v.size());
        const std::string one = v.substr(at, comma - at);
        char* end = nullptr;
        const long x = std::strtol(one.c_str(), &end, 10);
        if (one.empty() || *end != '\0' || x <= 0 || x > 64)
          return usage("--ranks wants world sizes like 1,2,4, not '" + v + "'");
        world_sizes.push_back(static_cast<int>(x));
        at = comma + 1;
      }
      continue;
    }
    if (a == "--stage") {
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      try {
        if (*end != '\0' || v.empty()) throw std::invalid_argument("--stage wants 0, 1, 2 or 3, not '" + v + "'");
        only = kit::check_zero_stage(static_cast<int>(x));
      } catch (const std::invalid_argument& e) {
        return usage(e.what());
      }
      continue;
    }
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (*end != '\0' || x <= 0) return usage(a + " wants a positive whole number, not '" + v + "'");
    if (a == "--d-model") s.model.d_model = x;
    else if (a == "--heads") s.model.heads = x;
    else if (a == "--feedforward") feedforward = x;
    else if (a == "--batch") s.global_batch = x;
    else if (a == "--steps") s.steps = x;
    else if (a == "--layers") s.model.layers = x;
    else if (a == "--vocab") s.model.vocab_size = x;
    else if (a == "--seq") s.model.max_len = x;
    else return usage("unknown flag " + a);
  }
  if (s.model.d_model % s.model.heads != 0) return usage("--d-model must be a multiple of --heads");
  for (int n : world_sizes)
    if (s.global_batch % n != 0)
      return usage("--batch " + std::to_string(s.global_batch) + " does not divide by " + std::to_string(n) + " ranks");
  s.model.feedforward = feedforward > 0 ? feedforward : 4 * s.model.d_model;
  torch::set_num_threads(1);  // the ranks are threads already
  kit::memory::install();     // before any tensor is made, so that every one is counted

  std::FILE* out = nullptr;
  if (!csv.empty() && !(out = std::fopen(csv.c_str(), "w"))) return usage("cannot write " + csv);
  if (out) std::fprintf(out, "ranks,stage,P,padded,params,grads,optimizer,gathered_peak,"
                             "formula_params,formula_grads,formula_optimizer,sent,theory_sent,"
                             "sent_all_reduce,sent_reduce_scatter,sent_all_gather,peak,formula_total\n");
  const char* names[] = {"DDP", "ZeRO-1", "ZeRO-2", s.recompute ? "ZeRO-3r" : "ZeRO-3"};
  bool all_match = true;
  int64_t P = 0;
  const int width = s.recompute ? 7 : 6;  // the stage column: "ZeRO-3r" is one wider
  std::printf("%-6s %-*s | %12s %12s %12s %12s | %12s %12s %12s | %12s %12s | %12s %12s\n", "ranks",
              width, "stage", "params", "grads", "optimizer", "gathered", "f.params", "f.grads", "f.optim",
              "sent/step", "theory", "peak", "f.total");
  for (int n : world_sizes) {
    for (int stage = 0; stage <= 3; ++stage) {
      if (only >= 0 && stage != only) continue;
      std::vector<std::string> errors;
      auto runs = kit_bench::train(s, stage, n, &errors);
      for (int r = 0; r < n; ++r)
        if (!errors[r].empty()) {
          std::fprintf(stderr, "zero_report: %s on %d ranks, rank %d: %s\n", names[stage], n, r,
                       errors[r].c_str());
          return 1;
        }
      const auto& run = runs[0];
      int64_t peak = 0;  // the rank that peaked highest: the one that needs the memory
      for (const auto& r : runs) peak = std::max(peak, r.peak);
      P = run.P;
      const auto f = kit::formula_bytes(stage, run.P, run.padded, n);
      // Bytes sent in the step, by kind of collective (the ring model), and their sum.
      std::map<std::string, double> by_kind;
      double sent = 0;
      for (auto& [kind, b] : run.step_bytes) {
        by_kind[kind] = kit::ring_bytes(kind, static_cast<double>(b), n);
        sent += by_kind[kind];
      }
      const double theory = theory_sent(stage, run.P, run.padded, n);
      const bool match = run.held.params == f.params && run.held.grads == f.grads &&
                         run.held.optimizer == f.optimizer && std::abs(sent - theory) < 0.5;
      all_match = all_match && match;
      std::printf("%-6d %-*s | %12lld %12lld %12lld %12lld | %12lld %12lld %12lld | %12.0f %12.0f | %12lld %12lld%s\n",
                  n, width, names[stage], (long long)run.held.params, (long long)run.held.grads,
                  (long long)run.held.optimizer, (long long)run.held.gathered_peak,
                  (long long)f.params, (long long)f.grads, (long long)f.optimizer, sent, theory,
                  (long long)peak, (long long)f.total(), match ? "" : "  <- differs");
      if (out)
        std::fprintf(out, "%d,%d,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%.0f,%.0f,%.0f,%.0f,%.0f,%lld,%lld\n",
                     n, stage,
                     (long long)run.P, (long long)run.padded, (long long)run.held.params,
                     (long long)run.held.grads, (long long)run.held.optimizer,
                     (long long)run.held.gathered_peak, (long long)f.params, (long long)f.grads,
                     (long long)f.optimizer, sent, theory, by_kind["all_reduce"],
                     by_kind["reduce_scatter"], by_kind["all_gather"], (long long)peak,
                     (long long)f.total());
    }
  }
  if (out) std::fclose(out);
  std::printf("P = %lld parameters (fp32); bytes per rank, measured on the tensors held after a step; "
              "sent: ring model of what each collective was handed; peak: the most live tensor bytes "
              "of a rank during a step (the highest rank), f.total: the formula's params + grads + optimizer\n",
              (long long)P);
  if (check && !all_match) {
    std::fprintf(stderr, "zero_report: a measured figure differs from its formula (marked above)\n");
    return 1;
  }
  return 0;
}
