// tp_report — the tensor- and context-parallel memory and communication report, as NERSC shows it:
// for each mesh asked (default tp 1, 2, 4 and cp 2; ranks are threads of this process on a local
// Gloo world), trains kit::ParallelTransformerLM for a few steps (DDP on the dp x cp group, AdamW)
// and prints, per rank (the highest rank where they differ),
//   * the bytes of parameters, gradients and AdamW state it holds, measured on its tensors, against
//     the formula: 4 P_r, 4 P_r and 8 P_r, P_r = ParallelTransformerLM::params_per_rank (the
//     embedding, head, norms and the row layers' biases whole; the rest of each block / tp);
//   * the activations: the bytes that became live during the first forward (what autograd keeps
//     for backward, the logits and the loss), against the count of what the model keeps (below);
//   * the bytes it sent in one step, from what each group's collectives were handed, with the ring
//     model (kit::ring_bytes), against the theory: on tp, 4 all-reduces of [batch, seq/cp, d] per
//     block, 2 (tp-1)/tp of each; on cp, per block an all-gather of this rank's keys and values and
//     a reduce-scatter of their gradient, (cp-1) 8 N d/tp bytes each; on dp x cp, DDP's all-reduce
//     of the gradients, 2 (n-1)/n 4 P_r (its broadcast of the position codes is left out);
//   * the peak of live tensor bytes in a step (kit/train/memory.h) and the step's time on the CPU.
//
// The activation count (float32, N = batch/dp x seq/cp tokens per rank, S = seq, s = seq/cp,
// heads and widths per rank: h = heads/tp, d_r = d/tp, f_r = feedforward/tp), per block: the block's
// input, the two residual sums and the first norm's output (4 N d), q and the attention's output
// (2 N d_r), the keys and values of the whole sequence (2 b S d_r), the softmax (b h s S), the
// ReLU's output (N f_r) and the norms' means and inverse deviations (4 N); then the head's input
// (N d), the logits and their log-softmax (2 N vocab), and the loss's two scalars (8 bytes: its
// value and nll_loss's total weight). Measured on LibTorch 2.13 (CPU), the count is exact. With tp the per-block part falls as 1/tp except the
// 4 N d of the residual stream, which every tp rank keeps whole (sequence parallelism would split
// it); with cp everything falls as 1/cp but the keys and values, gathered whole.
//
//   tp_report [--d-model 128] [--heads 4] [--layers 4] [--feedforward 4 d] [--vocab 2000]
//             [--seq 32] [--batch 8] [--steps 2] [--runs tp1,tp2,tp4,cp2] [--cap BYTES]
//             [--csv FILE] [--check]
// --runs: meshes as tpN, cpN, dpN joined (tp2cp2, dp2tp2; a size left out is 1), each one run.
// --cap: kit::memory's cap per rank (512M, 1G; as KIT_MEMORY_CAP): a run that exceeds it stops
//        with the out-of-memory line, shown in its row; the others run.
// --check: exit 1 if a measured figure differs from its formula. Bad flags: one line, exit 2.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kit/runtime/process.h"    // prepare_process
#include "kit/sharding/sharding.h"  // ring_bytes
#include "kit/train/memory.h"       // install, set_cap, parse_bytes
#include "tp_runs.h"                // kit_bench::train_tp

namespace {

const char* kFlags = "--d-model N --heads N --layers N --feedforward N --vocab N --seq N --batch N "
                     "--steps N --runs tp1,tp2,tp4,cp2 --cap BYTES --csv FILE --check";

int usage(const std::string& why) {
  std::fprintf(stderr, "tp_report: %s (flags: %s)\n", why.c_str(), kFlags);
  return 2;
}

struct Mesh {
  std::string name;
  int tp = 1, cp = 1, dp = 1;
};

// The activations one rank keeps after the forward, by the count at the top of this file.
int64_t activation_formula(const kit::TransformerLMOptions& o, const Mesh& m, int64_t batch) {
  const int64_t b = batch / m.dp, S = o.max_len, s = S / m.cp, N = b * s;
  const int64_t d = o.d_model, dr = d / m.tp, fr = o.feedforward / m.tp, h = o.heads / m.tp;
  const int64_t block = 4 * N * d + 2 * N * dr + 2 * b * S * dr + b * h * s * S + N * fr + 4 * N;
  return 4 * (o.layers * block + N * d + 2 * N * o.vocab_size) + 8;
}

}  // namespace

int main(int argc, char** argv) {
  kit::prepare_process();
  kit_bench::TpSetup s;
  s.model.vocab_size = 2000;
  s.model.d_model = 128;
  s.model.heads = 4;
  s.model.layers = 4;
  s.model.dropout = 0.0;
  s.model.max_len = 32;
  s.global_batch = 8;
  s.steps = 2;
  s.record = false;  // no copies of weights or gradients beside the run's own
  int64_t feedforward = 0, cap = 0;
  std::string csv, runs_flag = "tp1,tp2,tp4,cp2", cap_flag;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check") { check = true; continue; }
    if (i + 1 >= argc) return usage("flag " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--csv") { csv = v; continue; }
    if (a == "--runs") { runs_flag = v; continue; }
    if (a == "--cap") {
      try {
        cap = kit::memory::parse_bytes(v);
        cap_flag = "--cap " + v;
      } catch (const std::invalid_argument& e) {
        return usage(std::string("--cap: ") + e.what());
      }
      continue;
    }
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (*end != '\0' || v.empty() || x <= 0) return usage(a + " wants a positive whole number, not '" + v + "'");
    if (a == "--d-model") s.model.d_model = x;
    else if (a == "--heads") s.model.heads = x;
    else if (a == "--layers") s.model.layers = x;
    else if (a == "--feedforward") feedforward = x;
    else if (a == "--vocab") s.model.vocab_size = x;
    else if (a == "--seq") s.model.max_len = x;
    else if (a == "--batch") s.global_batch = x;
    else if (a == "--steps") s.steps = x;
    else return usage("unknown flag " + a);
  }
  s.model.feedforward = feedforward > 0 ? feedforward : 4 * s.model.d_model;
  std::vector<Mesh> meshes;
  const std::regex whole("((tp|cp|dp)[0-9]{1,2})+"), part("(tp|cp|dp)([0-9]+)");
  for (size_t at = 0; at <= runs_flag.size();) {
    const size_t comma = std::min(runs_flag.find(',', at), runs_flag.size());
    const std::string name = runs_flag.substr(at, comma - at);
    if (!std::regex_match(name, whole))
      return usage("--runs wants meshes like tp2,cp2,dp2tp2, not '" + runs_flag + "'");
    Mesh mesh{name};
    for (std::sregex_iterator m(name.begin(), name.end(), part), end; m != end; ++m)
      ((*m)[1] == "tp" ? mesh.tp : (*m)[1] == "cp" ? mesh.cp : mesh.dp) = std::stoi((*m)[2]);
    if (mesh.tp < 1 || mesh.cp < 1 || mesh.dp < 1 || mesh.tp * mesh.cp * mesh.dp > 64)
      return usage("--runs: '" + name + "' wants sizes from 1 and at most 64 ranks in all");
    if (s.global_batch % mesh.dp != 0)
      return usage("--batch " + std::to_string(s.global_batch) + " does not divide by dp " + std::to_string(mesh.dp));
    meshes.push_back(mesh);
    at = comma + 1;
  }
  torch::set_num_threads(1);  // the ranks are threads already
  kit::memory::install();     // before any tensor is made, so that every one is counted
  if (cap > 0) kit::memory::set_cap(cap, cap_flag);

  std::FILE* out = nullptr;
  if (!csv.empty() && !(out = std::fopen(csv.c_str(), "w"))) return usage("cannot write " + csv);
  if (out)
    std::fprintf(out, "run,tp,cp,dp,params_per_rank,param_bytes,grad_bytes,optimizer_bytes,"
                      "formula_state,activations,formula_activations,sent_tp,sent_cp,sent_dp,"
                      "theory_sent,peak,step_seconds,out_of_memory\n");
  std::printf("%-8s | %10s %10s %10s %10s | %10s %10s | %10s %10s %10s %10s | %10s %8s\n", "run",
              "params", "grads", "optimizer", "f.state", "activ.", "f.activ.", "sent tp", "sent cp",
              "sent dp", "theory", "peak", "step s");
  bool all_match = true;
  for (const Mesh& mesh : meshes) {
    s.world = mesh.tp * mesh.cp * mesh.dp;
    s.tp = mesh.tp;
    s.cp = mesh.cp;
    std::vector<std::string> errors;
    auto runs = kit_bench::train_tp(s, &errors);
    std::string oom;
    for (int r = 0; r < s.world && oom.empty(); ++r)
      if (!errors[r].empty()) {
        if (errors[r].find("out of memory") == std::string::npos) {
          std::fprintf(stderr, "tp_report: %s, rank %d: %s\n", mesh.name.c_str(), r, errors[r].c_str());
          return 1;
        }
        oom = "rank " + std::to_string(r) + ": " + errors[r].substr(0, errors[r].find('\n'));
      }
    if (!oom.empty()) {
      std::printf("%-8s | %s\n", mesh.name.c_str(), oom.c_str());
      if (out) std::fprintf(out, "%s,%d,%d,%d,,,,,,,,,,,,,,\"%s\"\n", mesh.name.c_str(), mesh.tp, mesh.cp, mesh.dp, oom.c_str());
      continue;
    }
    // The rank with the most of each: under tp and cp every rank holds alike.
    const kit_bench::TpRankRun* top = &runs[0];
    int64_t peak = 0;
    double seconds = 0;
    for (auto& r : runs) {
      peak = std::max(peak, r.peak);
      seconds = std::max(seconds, r.step_seconds);
      if (r.activation_bytes > top->activation_bytes) top = &r;
    }
    const int64_t P = kit::ParallelTransformerLMImpl::params_per_rank(s.model, mesh.tp);
    auto sent = [&](const char* group, int n) {
      double total = 0;
      for (auto& [kind, b] : top->traffic.at(group).bytes) total += kit::ring_bytes(kind, static_cast<double>(b), n);
      return total;
    };
    const double sent_tp = sent("tp", mesh.tp), sent_cp = sent("cp", mesh.cp),
                 sent_dp = sent("dp-cp", mesh.dp * mesh.cp);
    const int64_t N = s.global_batch / mesh.dp * (s.model.max_len / mesh.cp);
    const double theory = 4.0 * s.model.layers * 2 * (mesh.tp - 1) / mesh.tp * 4 * N * s.model.d_model +
                          2.0 * s.model.layers * (mesh.cp - 1) * 8 * N * s.model.d_model / mesh.tp +
                          2.0 * (mesh.dp * mesh.cp - 1) / (mesh.dp * mesh.cp) * 4 * P;
    const int64_t f_act = activation_formula(s.model, mesh, s.global_batch);
    const bool match = top->params == P && top->param_bytes == 4 * P && top->grad_bytes == 4 * P &&
                       top->optimizer_bytes == 8 * P && std::abs(sent_tp + sent_cp + sent_dp - theory) < 0.5 &&
                       top->activation_bytes == f_act;
    all_match = all_match && match;
    std::printf("%-8s | %10lld %10lld %10lld %10lld | %10lld %10lld | %10.0f %10.0f %10.0f %10.0f | %10lld %8.3f%s\n",
                mesh.name.c_str(), (long long)top->param_bytes, (long long)top->grad_bytes,
                (long long)top->optimizer_bytes, (long long)(16 * P), (long long)top->activation_bytes,
                (long long)f_act, sent_tp, sent_cp, sent_dp, theory, (long long)peak, seconds,
                match ? "" : "  <- differs");
    if (out)
      std::fprintf(out, "%s,%d,%d,%d,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%.0f,%.0f,%.0f,%.0f,%lld,%.4f,\n",
                   mesh.name.c_str(), mesh.tp, mesh.cp, mesh.dp, (long long)P, (long long)top->param_bytes,
                   (long long)top->grad_bytes, (long long)top->optimizer_bytes, (long long)(16 * P),
                   (long long)top->activation_bytes, (long long)f_act, sent_tp, sent_cp, sent_dp, theory,
                   (long long)peak, seconds);
  }
  if (out) std::fclose(out);
  std::printf("bytes per rank (fp32): params, grads, AdamW state measured on the tensors held, f.state = "
              "16 P_r by the formula; activ.: live bytes the first forward added, f.activ.: the count "
              "(tp_report.cpp); sent: one step, ring model, per group; peak: the most live tensor bytes "
              "of a rank in a step; step s: the slowest rank's last step, on this CPU%s\n",
              cap > 0 ? "; out-of-memory rows: above --cap" : "");
  if (check && !all_match) {
    std::fprintf(stderr, "tp_report: a measured figure differs from its formula (marked above)\n");
    return 1;
  }
  return 0;
}
