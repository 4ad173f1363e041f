// kit/train/args.cpp — command-line flags (see args.h).
#include "kit/train/args.h"

#include <cerrno>
#include <cmath>  // HUGE_VAL
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "kit/models/transformer_lm.h"  // TransformerLMOptions: what lm_options() fills in
#include "kit/runtime/process.h"        // prepare_process()
#include "kit/train/default_dirs.h"     // the build's corpus, when no folder is given

namespace kit {

void flag_error(const std::string& msg) {
  std::fprintf(stderr, "error: %s (see --help)\n", msg.c_str());
  std::exit(2);
}

int64_t flag_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || x < lo || x > hi) {
    std::string range = hi == std::numeric_limits<int64_t>::max()
                            ? ">= " + std::to_string(lo)
                            : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    flag_error(flag + " needs a whole number " + range + ", got '" + v + "'");
  }
  return x;
}

double flag_real(const std::string& flag, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x >= lo && x <= hi)) flag_error(flag + " needs a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

namespace {
// The flags take_flag() took out of argv, for parse_flags()' --help: {name, help}.
std::vector<std::pair<std::string, std::string>>& taken_flags() {
  static std::vector<std::pair<std::string, std::string>> flags;
  return flags;
}
}  // namespace

std::string take_flag(int& argc, char** argv, const std::string& name, const std::string& absent,
                      const std::string& help) {
  taken_flags().emplace_back(name, help);
  const std::string with_value = name + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg != name && arg.rfind(with_value, 0) != 0) continue;
    const bool joined = arg != name;  // --name=value: one word; --name value: two
    const int words = joined ? 1 : 2;
    if (!joined && i + 1 >= argc) flag_error(name + " needs a value");
    std::string value = joined ? arg.substr(with_value.size()) : argv[i + 1];
    for (int j = i; j + words < argc; ++j) argv[j] = argv[j + words];
    argc -= words;
    return value;
  }
  return absent;
}

void parse_flags(int argc, char** argv, const std::vector<Flag>& flags) {
  // A kit program's first kit call: from here on an uncaught exception is one line, also before
  // setup() (missing data in the single-GPU trainer), and malloc keeps freed memory
  // (kit/runtime/process.h; setup() does it again for programs without flags).
  prepare_process();
  auto find = [&](const std::string& name) -> const Flag* {
    for (const Flag& f : flags)
      if (f.name == name) return &f;
    return nullptr;
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("usage: %s [flags]\n", argv[0]);
      for (const Flag& f : flags) std::printf("  %-18s %s\n", f.name.c_str(), f.help.c_str());
      for (const auto& [name, help] : taken_flags()) std::printf("  %-18s %s\n", name.c_str(), help.c_str());
      std::printf("  %-18s %s\n", "--allow-cpu", "a CPU run in a Slurm job with GPUs, which a CPU-only build refuses (KIT_ALLOW_CPU=1)");
      std::exit(0);
    }
    std::string value;
    auto eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    if (arg == "--allow-cpu") {  // every program's: read by setup() (kit/runtime/env.h)
      if (eq != std::string::npos) flag_error(arg + " takes no value");
      setenv("KIT_ALLOW_CPU", "1", 1);
      continue;
    }
    const Flag* f = find(arg);
    if (f == nullptr) flag_error("unknown flag '" + arg + "'");
    if (f->is_switch) {
      if (eq != std::string::npos) flag_error(arg + " takes no value");
    } else if (eq == std::string::npos) {
      if (i + 1 >= argc) flag_error(arg + " needs a value");
      value = argv[++i];
    }
    f->set(value);
  }
}

std::vector<std::string> with_preset(int argc, char** argv, const std::vector<Preset>& presets) {
  std::vector<std::string> rest, front;
  std::string name;
  bool given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--preset" || arg.rfind("--preset=", 0) == 0) {
      if (arg == "--preset" && i + 1 >= argc) flag_error("--preset needs a value");
      name = arg == "--preset" ? argv[++i] : arg.substr(9);
      given = true;
      continue;
    }
    rest.push_back(arg);
  }
  if (given) {
    const Preset* found = nullptr;
    std::string known;
    for (const Preset& p : presets) {
      if (p.name == name) found = &p;
      known += (known.empty() ? "" : ", ") + p.name;
    }
    if (found == nullptr) flag_error("--preset " + name + " is not a preset (known: " + known + ")");
    front = found->flags;
  }
  std::vector<std::string> out{argc > 0 ? argv[0] : "program"};
  out.insert(out.end(), front.begin(), front.end());
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

// The preset "gpu" of exercises 01 and 03: a Transformer of 6 layers, width 512 (8 heads, feed-
// forward 2048), 64 sequences of 256 words per rank and step. Sized by what a step computes
// against what its all-reduce moves, for the WikiText-2 vocabulary of 33,278 words:
//   * parameters: 53.0 M (embedding and head 17.0 M each, 3.15 M per layer; counted from the
//     model by unit.Presets.LmGpuSizes), so the all-reduce moves 212 MB of fp32 gradients, and a
//     ring all-reduce sends 2(N-1)/N of that from each GPU: 371 MB on 8 GPUs;
//   * FLOPs: 6 per weight of a matrix product and per token, forward and backward (Kaplan et al.
//     2020, "Scaling Laws for Neural Language Models", section 2.1: C = 6N per token), plus the
//     attention's scores and weighted sums (3 x 4 x seq x width per layer and token): 35.9 M
//     weights in matrix products (the embedding is a lookup) x 6 + 9.4 M = 225 MFLOP per token,
//     3.7 TFLOP per rank and step (16,384 tokens);
//   * so a step takes at least 189 ms on an A100 (19.5 TFLOP/s in FP32, which LibTorch's matrix
//     products use: TF32 is off for them by default) and 55 ms on an H100 SXM (67 TFLOP/s), while
//     its all-reduce over two nodes takes 15 ms at 25 GB/s per GPU (an InfiniBand HDR200 link
//     per GPU, as on JUWELS Booster): the step's arithmetic is 13x (A100) or 4x (H100) its
//     communication, both at peak rates, and DDP hides part of the communication behind the
//     backward. At the defaults (1,024 tokens per step, 2 layers of width 128) a step is 28
//     GFLOP with WikiText-2's vocabulary, 1.4 ms at an A100's peak, while its all-reduce moves
//     35 MB (8.8 M parameters, most of them the embedding and the head): 2.5 ms at 25 GB/s.
const std::vector<Preset>& lm_presets() {
  static const std::vector<Preset> presets = {
      {"gpu",
       "a step long enough on an A100 or H100 to show scaling: --d-model 512 --heads 8 "
       "--layers 6 --feedforward 2048 --seq-len 256 --batch-size 64 --eval-batch-size 64 "
       "(53 M parameters with WikiText-2)",
       {"--d-model", "512", "--heads", "8", "--layers", "6", "--feedforward", "2048", "--seq-len",
        "256", "--batch-size", "64", "--eval-batch-size", "64"}},
  };
  return presets;
}

TrainArgs parse_args(int argc, char** argv) {
  std::vector<std::string> words = with_preset(argc, argv, lm_presets());
  std::vector<char*> args;
  for (std::string& w : words) args.push_back(w.data());
  argc = static_cast<int>(args.size());
  argv = args.data();
  TrainArgs a;
  if (const char* d = std::getenv("KIT_DATA_DIR"); d && *d) a.data_dir = d;
  else if (const char* b = default_data_dir()) a.data_dir = b;
  auto to_int = [](const std::string& flag, const std::string& v, int64_t lo) {
    return flag_int(flag, v, lo);
  };
  // Off unless given: a norm of 0 or less would be no gradient at all, or a sign flip.
  auto clip_norm = [](const std::string& v) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(x > 0) || x == HUGE_VAL)
      flag_error("--clip-grad needs a norm > 0, got '" + v + "' (leave the flag out for no clipping)");
    return x;
  };
  parse_flags(argc, argv, {
      {"--data-dir", "folder with wiki.{train,valid,test}.tokens", [&](auto v) { a.data_dir = v; }},
      {"--out-dir", "where checkpoints and metrics.csv are written", [&](auto v) { a.out_dir = v; }},
      {"--epochs", "passes over the training set", [&](auto v) { a.epochs = to_int("--epochs", v, 1); }},
      {"--batch-size", "sequences per step and rank", [&](auto v) { a.batch_size = to_int("--batch-size", v, 1); }},
      {"--eval-batch-size", "sequences per evaluation batch", [&](auto v) { a.eval_batch_size = to_int("--eval-batch-size", v, 1); }},
      {"--seq-len", "words per training sequence", [&](auto v) { a.seq_len = to_int("--seq-len", v, 2); }},
      {"--lr", "learning rate", [&](auto v) { a.lr = flag_real("--lr", v, 0, 10); }},
      {"--d-model", "model width", [&](auto v) { a.d_model = to_int("--d-model", v, 2); }},
      {"--heads", "attention heads", [&](auto v) { a.heads = to_int("--heads", v, 1); }},
      {"--layers", "Transformer layers", [&](auto v) { a.layers = to_int("--layers", v, 1); }},
      {"--feedforward", "feed-forward width", [&](auto v) { a.feedforward = to_int("--feedforward", v, 1); }},
      {"--dropout", "dropout probability", [&](auto v) { a.dropout = flag_real("--dropout", v, 0, 0.99); }},
      {"--seed", "random seed", [&](auto v) { a.seed = static_cast<uint64_t>(to_int("--seed", v, 0)); }},
      {"--max-steps", "stop each epoch after this many steps (0: no limit)", [&](auto v) { a.max_steps = to_int("--max-steps", v, 0); }},
      {"--clip-grad", "clip the averaged gradient to this global L2 norm before each step (default: no clipping)", [&](auto v) { a.clip_grad = clip_norm(v); }},
      {"--keep-checkpoints", "how many checkpoints to keep in <out-dir>/checkpoints", [&](auto v) { a.keep_checkpoints = to_int("--keep-checkpoints", v, 1); }},
      {"--resume", "continue from the newest checkpoint, which must exist (default: continue if there is one)", [&](auto) { a.resume = true; }, true},
      {"--preset", "gpu: " + lm_presets()[0].help + "; flags given with it win", [](auto) {}},
  });
  if (a.d_model % a.heads != 0) flag_error("--d-model must be a multiple of --heads");
  if (a.data_dir.empty()) flag_error("no data folder: pass --data-dir or set KIT_DATA_DIR");
  // Everything a run writes goes here (metrics, checkpoints, models): a new folder is made.
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec) flag_error("--out-dir " + a.out_dir + " cannot be created: " + ec.message());
  return a;
}

std::string config_fingerprint(const TrainArgs& a, int64_t vocab_size) {
  std::ostringstream f;
  f << "vocab=" << vocab_size << " seq_len=" << a.seq_len << " d_model=" << a.d_model
    << " heads=" << a.heads << " layers=" << a.layers << " feedforward=" << a.feedforward
    << " dropout=" << a.dropout << " batch=" << a.batch_size << " lr=" << a.lr
    << " seed=" << a.seed << " max_steps=" << a.max_steps;
  if (a.clip_grad > 0) f << " clip_grad=" << a.clip_grad;  // only when on: older checkpoints still match
  return f.str();
}

TransformerLMOptions lm_options(const TrainArgs& args, int64_t vocab_size) {
  TransformerLMOptions o;
  o.vocab_size = vocab_size;
  o.d_model = args.d_model;
  o.heads = args.heads;
  o.layers = args.layers;
  o.feedforward = args.feedforward;
  o.dropout = args.dropout;
  o.max_len = args.seq_len;
  return o;
}

}  // namespace kit
