// kit/train/args.h — TrainArgs and parse_args(): the trainers' command-line flags.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace kit {

struct TrainArgs {
  std::string data_dir;        // folder with wiki.{train,valid,test}.tokens
  std::string out_dir = ".";   // where model-best.pt, model-final.pt and metrics.csv go
  int64_t epochs = 3;
  int64_t batch_size = 16;     // per rank: the global batch is batch_size x world size
  int64_t eval_batch_size = 32;
  int64_t seq_len = 64;
  double lr = 1e-3;
  int64_t d_model = 128, heads = 4, layers = 2, feedforward = 256;
  double dropout = 0.1;
  uint64_t seed = 42;
  int64_t max_steps = 0;       // > 0: stop each epoch after this many steps (quick checks)
  bool resume = false;         // require a checkpoint to continue from (default: use one if any)
  int64_t keep_checkpoints = 3;
  double clip_grad = 0;        // > 0: clip the averaged gradient to this global L2 norm (0: off)
};

// The model's sizes that the flags ask for (--d-model, --heads, --layers, --feedforward,
// --dropout; positions up to --seq-len), for a vocabulary of vocab_size words.
struct TransformerLMOptions;  // kit/models/transformer_lm.h
TransformerLMOptions lm_options(const TrainArgs& args, int64_t vocab_size);

// What a checkpoint must agree on to be resumed: everything that changes the numbers (model,
// batch, sequence length, learning rate, seed, data) and nothing that does not (epochs, paths).
std::string config_fingerprint(const TrainArgs& args, int64_t vocab_size);

// Flags are --name value or --name=value; --help prints them all. A bad flag ends the program
// with one line on stderr and exit code 2. The data folder defaults to $KIT_DATA_DIR, then to the
// corpus the build generated.
TrainArgs parse_args(int argc, char** argv);

// The flag parser of parse_args(), for the kit's other programs (exercise 00, the collectives
// benchmark): one Flag per option, with its help line and what to do with its value. It takes
// --name value and --name=value, prints the flags on --help (exit 0), and stops a bad command
// line with one line on stderr and exit code 2 (flag_error). It first calls kit::prepare_process()
// (kit/runtime/process.h), so that every error from there on, before setup() too, is one line.
struct Flag {
  std::string name, help;
  std::function<void(const std::string&)> set;  // the value ("" for a switch)
  bool is_switch = false;                       // takes no value (--resume)
};
void parse_flags(int argc, char** argv, const std::vector<Flag>& flags);
[[noreturn]] void flag_error(const std::string& msg);  // "error: <msg> (see --help)", exit 2
// A whole number in [lo, hi], else flag_error naming the flag and the value.
int64_t flag_int(const std::string& flag, const std::string& value, int64_t lo,
                 int64_t hi = std::numeric_limits<int64_t>::max());
// A number in [lo, hi], else flag_error naming the flag and the value.
double flag_real(const std::string& flag, const std::string& value, double lo, double hi);

// Every kit program's parse_flags() also takes --allow-cpu: the same as KIT_ALLOW_CPU=1, a CPU
// run in a Slurm job with GPUs that a CPU-only build would otherwise refuse
// (kit/runtime/env.h, cpu_build_in_gpu_job).

// A named set of flags, --preset NAME (or --preset=NAME): the preset's flags are read first and
// the command line's after them, so that a flag given on the command line wins over the preset's.
struct Preset {
  std::string name, help;          // help: what it is for, on --help
  std::vector<std::string> flags;  // e.g. {"--d-model", "512", ...}
};
// argv without --preset NAME, the preset's flags placed right after the program's name; an
// unknown NAME is flag_error listing the known ones. Without --preset: argv as it is.
std::vector<std::string> with_preset(int argc, char** argv, const std::vector<Preset>& presets);
// The presets of parse_args() (exercises 01 and 03, one model): "gpu", a step long enough on an
// A100 or H100 for the scaling lesson. How it was sized (args.cpp): the FLOPs of a step against
// the bytes its all-reduce moves.
const std::vector<Preset>& lm_presets();

// For a program that adds one flag of its own to parse_args()'s (exercise 03's --zero-stage):
// removes --name value or --name=value from argv and returns the value, `absent` when the flag
// is not there. Call it before parse_args(), which refuses flags it does not know, and which
// lists the flag with its `help` line on --help, after its own.
std::string take_flag(int& argc, char** argv, const std::string& name, const std::string& absent,
                      const std::string& help);

}  // namespace kit
