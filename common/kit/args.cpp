// kit/args.cpp — command-line flags (see args.h).
#include "kit/args.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace kit {
namespace {

[[noreturn]] void bad(const std::string& msg) {
  std::fprintf(stderr, "error: %s (see --help)\n", msg.c_str());
  std::exit(2);
}

int64_t to_int(const std::string& flag, const std::string& v, int64_t lo) {
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo) bad(flag + " needs a whole number >= " + std::to_string(lo) + ", got '" + v + "'");
  return x;
}

double to_real(const std::string& flag, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x >= lo && x <= hi)) bad(flag + " needs a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

}  // namespace

TrainArgs parse_args(int argc, char** argv) {
  TrainArgs a;
  if (const char* d = std::getenv("KIT_DATA_DIR"); d && *d) a.data_dir = d;
#ifdef KIT_DEFAULT_DATA_DIR
  else a.data_dir = KIT_DEFAULT_DATA_DIR;
#endif
  using Set = std::function<void(const std::string&)>;
  const std::map<std::string, std::pair<Set, const char*>> flags = {
      {"--data-dir", {[&](auto v) { a.data_dir = v; }, "folder with wiki.{train,valid,test}.tokens"}},
      {"--out-dir", {[&](auto v) { a.out_dir = v; }, "where checkpoints and metrics.csv are written"}},
      {"--epochs", {[&](auto v) { a.epochs = to_int("--epochs", v, 1); }, "passes over the training set"}},
      {"--batch-size", {[&](auto v) { a.batch_size = to_int("--batch-size", v, 1); }, "sequences per step and rank"}},
      {"--eval-batch-size", {[&](auto v) { a.eval_batch_size = to_int("--eval-batch-size", v, 1); }, "sequences per evaluation batch"}},
      {"--seq-len", {[&](auto v) { a.seq_len = to_int("--seq-len", v, 2); }, "words per training sequence"}},
      {"--lr", {[&](auto v) { a.lr = to_real("--lr", v, 0, 10); }, "learning rate"}},
      {"--d-model", {[&](auto v) { a.d_model = to_int("--d-model", v, 2); }, "model width"}},
      {"--heads", {[&](auto v) { a.heads = to_int("--heads", v, 1); }, "attention heads"}},
      {"--layers", {[&](auto v) { a.layers = to_int("--layers", v, 1); }, "Transformer layers"}},
      {"--feedforward", {[&](auto v) { a.feedforward = to_int("--feedforward", v, 1); }, "feed-forward width"}},
      {"--dropout", {[&](auto v) { a.dropout = to_real("--dropout", v, 0, 0.99); }, "dropout probability"}},
      {"--seed", {[&](auto v) { a.seed = static_cast<uint64_t>(to_int("--seed", v, 0)); }, "random seed"}},
      {"--max-steps", {[&](auto v) { a.max_steps = to_int("--max-steps", v, 0); }, "stop each epoch after this many steps (0: no limit)"}},
      {"--keep-checkpoints", {[&](auto v) { a.keep_checkpoints = to_int("--keep-checkpoints", v, 1); }, "how many checkpoints to keep in <out-dir>/checkpoints"}},
      {"--resume", {[&](auto) { a.resume = true; }, "continue from the newest checkpoint, which must exist (default: continue if there is one)"}},
  };
  const std::set<std::string> switches = {"--resume"};  // flags without a value
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("usage: %s [flags]\n", argv[0]);
      for (auto& [name, f] : flags) std::printf("  %-18s %s\n", name.c_str(), f.second);
      std::exit(0);
    }
    std::string value;
    auto eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto it = flags.find(arg);
    if (it == flags.end()) bad("unknown flag '" + arg + "'");
    if (switches.count(arg)) {
      if (eq != std::string::npos) bad(arg + " takes no value");
    } else if (eq == std::string::npos) {
      if (i + 1 >= argc) bad(arg + " needs a value");
      value = argv[++i];
    }
    it->second.first(value);
  }
  if (a.d_model % a.heads != 0) bad("--d-model must be a multiple of --heads");
  if (a.data_dir.empty()) bad("no data folder: pass --data-dir or set KIT_DATA_DIR");
  // Everything a run writes goes here (metrics, checkpoints, models): a new folder is made.
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec) bad("--out-dir " + a.out_dir + " cannot be created: " + ec.message());
  return a;
}

std::string config_fingerprint(const TrainArgs& a, int64_t vocab_size) {
  std::ostringstream f;
  f << "vocab=" << vocab_size << " seq_len=" << a.seq_len << " d_model=" << a.d_model
    << " heads=" << a.heads << " layers=" << a.layers << " feedforward=" << a.feedforward
    << " dropout=" << a.dropout << " batch=" << a.batch_size << " lr=" << a.lr
    << " seed=" << a.seed << " max_steps=" << a.max_steps;
  return f.str();
}

}  // namespace kit
