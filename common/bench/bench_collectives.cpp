// bench_collectives — how long the collectives take, in the style of NVIDIA's nccl-tests.
//
// For every message size from --min-bytes to --max-bytes (times --factor each step) and every
// collective of --collectives, each rank runs --warmup untimed calls, then --iters timed ones,
// and rank 0 prints one row: the time of one call (the slowest rank's mean), the algorithm
// bandwidth algbw = size / time, and the bus bandwidth busbw = algbw x the collective's bus
// factor, which makes the collectives comparable with each other and with the link speed:
//
//   all_reduce       2 (n - 1) / n   a ring sends and receives every byte twice (reduce-scatter,
//                                    then all-gather), less the rank's own share
//   all_gather       (n - 1) / n     every rank receives the n - 1 shares it does not have
//   reduce_scatter   (n - 1) / n     every rank sends the n - 1 shares it does not keep
//   broadcast        1               every byte crosses every link once
//
// The size is that of the largest buffer of the call, as nccl-tests counts it: the buffer of an
// all_reduce or broadcast, the output of an all_gather, the input of a reduce_scatter (n shares).
// The first call of each size is checked against its closed form: a wrong result stops the run.
//
//   build/bin/ddprun --nproc-per-node 2 -- build/bin/bench_collectives --max-bytes 64M --csv c.csv
//   slides/tools/plot_collectives.py c.csv --out DIR      busbw against size, with the alpha-beta fit
//
// Gloo on CPU; NCCL on GPUs (kit::setup() picks it when CUDA is there). Bad input (a size that is
// not a size, out of range, an unknown collective) stops with one line and exit code 2.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "kit/train/args.h"
#include "kit/runtime/distributed.h"

namespace {

const std::vector<std::string> kCollectives = {"all_reduce", "all_gather", "reduce_scatter",
                                               "broadcast"};
constexpr int64_t kMaxBytes = int64_t{1} << 34;  // 16 GiB: more than any one GPU's share

struct Options {
  int64_t min_bytes = 8, max_bytes = int64_t{256} << 20, factor = 2, iters = 20, warmup = 5;
  std::vector<std::string> collectives = kCollectives;
  std::string csv;
};

// "8", "64K", "256M", "1G" (binary units, as nccl-tests reads them) -> bytes in [1, 16 GiB].
int64_t parse_size(const std::string& flag, const std::string& v) {
  std::string digits = v;
  int64_t unit = 1;
  if (!v.empty()) {
    const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(v.back())));
    const std::string units = "KMG";
    if (auto at = units.find(last); at != std::string::npos) {
      unit = int64_t{1} << (10 * (at + 1));
      digits = v.substr(0, v.size() - 1);
    }
  }
  const bool number = !digits.empty() && digits.size() <= 11 &&
                      std::all_of(digits.begin(), digits.end(), ::isdigit);
  if (!number)
    kit::flag_error(flag + " needs a size such as 8, 64K, 256M or 1G, got '" + v + "'");
  const int64_t bytes = std::stoll(digits) * unit;
  if (bytes < 1 || bytes > kMaxBytes)
    kit::flag_error(flag + " must be between 1 byte and 16G, got '" + v + "'");
  return bytes;
}

std::vector<std::string> parse_collectives(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream list(v);
  for (std::string name; std::getline(list, name, ',');) {
    if (std::find(kCollectives.begin(), kCollectives.end(), name) == kCollectives.end())
      kit::flag_error("unknown collective '" + name +
                      "' (known: all_reduce, all_gather, reduce_scatter, broadcast)");
    out.push_back(name);
  }
  if (out.empty()) kit::flag_error("--collectives needs at least one name");
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  kit::parse_flags(argc, argv, {
      {"--min-bytes", "smallest message (8, 64K, 256M, 1G; default 8)",
       [&](auto v) { o.min_bytes = parse_size("--min-bytes", v); }},
      {"--max-bytes", "largest message (default 256M)",
       [&](auto v) { o.max_bytes = parse_size("--max-bytes", v); }},
      {"--factor", "each size is this many times the previous one (default 2)",
       [&](auto v) { o.factor = kit::flag_int("--factor", v, 2, 1024); }},
      {"--iters", "timed calls per size (default 20)",
       [&](auto v) { o.iters = kit::flag_int("--iters", v, 1, 1000000); }},
      {"--warmup", "untimed calls per size first (default 5)",
       [&](auto v) { o.warmup = kit::flag_int("--warmup", v, 0, 1000000); }},
      {"--collectives", "comma-separated, default all_reduce,all_gather,reduce_scatter,broadcast",
       [&](auto v) { o.collectives = parse_collectives(v); }},
      {"--csv", "write the rows to this CSV file too (rank 0)", [&](auto v) { o.csv = v; }},
  });
  if (o.min_bytes > o.max_bytes)
    kit::flag_error("--min-bytes (" + std::to_string(o.min_bytes) + ") is larger than --max-bytes (" +
                    std::to_string(o.max_bytes) + ")");
  return o;
}

double bus_factor(const std::string& name, int n) {
  if (name == "all_reduce") return 2.0 * (n - 1) / n;
  if (name == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;  // all_gather, reduce_scatter
}

// The buffers of one collective at one size, and the call itself.
struct Call {
  std::string name;
  torch::Tensor in, out;  // in place (all_reduce, broadcast): out only
  int64_t bytes = 0, elements = 0;

  Call(const std::string& n, int64_t size, int ranks, const torch::TensorOptions& opt) : name(n) {
    elements = std::max<int64_t>(size / 4, 1);  // float32
    const bool shares = name == "all_gather" || name == "reduce_scatter";
    if (shares) elements = std::max<int64_t>(elements / ranks, 1) * ranks;  // n equal shares
    bytes = elements * 4;
    const int64_t share = shares ? elements / ranks : elements;
    if (name == "all_gather") {
      in = torch::empty({share}, opt);
      out = torch::empty({elements}, opt);
    } else if (name == "reduce_scatter") {
      in = torch::empty({elements}, opt);
      out = torch::empty({share}, opt);
    } else {
      out = torch::empty({elements}, opt);
    }
  }

  void run() {
    if (name == "all_reduce") kit::all_reduce(out, kit::ReduceOp::SUM);
    else if (name == "broadcast") kit::broadcast(out, 0);
    else if (name == "all_gather") kit::all_gather(out, in);
    else kit::reduce_scatter(out, in, kit::ReduceOp::SUM);
  }

  // One call on known values: rank r holds r + 1 everywhere. Returns what is wrong, or "".
  std::string check(int rank, int ranks) {
    (in.defined() ? in : out).fill_(rank + 1);
    if (in.defined()) out.fill_(-1);
    run();
    const double tri = ranks * (ranks + 1) / 2.0;
    torch::Tensor want;
    if (name == "all_reduce") want = torch::full_like(out, tri);
    else if (name == "broadcast") want = torch::ones_like(out);
    else if (name == "reduce_scatter") want = torch::full_like(out, tri);
    else want = torch::arange(1, ranks + 1, out.options()).repeat_interleave(out.numel() / ranks);
    if (torch::equal(out, want)) return "";
    return name + " of " + std::to_string(bytes) + " bytes gave a wrong result on rank " +
           std::to_string(rank);
  }
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const kit::Setup me = kit::setup();
  const int rank = me.rank, ranks = me.world_size;
  const torch::Device device = me.device;
  const std::string backend = kit::default_group().backend();
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(device);
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };

  std::ofstream csv;
  if (rank == 0 && !o.csv.empty()) {
    csv.open(o.csv);
    if (!csv) kit::flag_error("--csv " + o.csv + " cannot be written");
    csv << "collective,bytes,elements,ranks,backend,device,iterations,time_us,algbw_gbps,busbw_gbps\n";
  }
  kit::print0("# bench_collectives: %d ranks, %s on %s, float32, %ld timed calls after %ld "
              "warm-up calls per size\n", ranks, backend.c_str(), device.is_cuda() ? "GPU" : "CPU",
              static_cast<long>(o.iters), static_cast<long>(o.warmup));
  kit::print0("# %-15s %12s %12s %12s %14s %14s\n", "collective", "bytes", "elements",
              "time (us)", "algbw (GB/s)", "busbw (GB/s)");
  for (const std::string& name : o.collectives) {
    for (int64_t size = o.min_bytes; size <= o.max_bytes; size *= o.factor) {
      Call call(name, size, ranks, options);
      if (std::string wrong = call.check(rank, ranks); !wrong.empty()) {
        std::fprintf(stderr, "rank %d: error: %s\n", rank, wrong.c_str());
        return 1;
      }
      call.out.zero_();  // keeps repeated sums finite
      if (call.in.defined()) call.in.zero_();
      for (int64_t i = 0; i < o.warmup; ++i) call.run();
      sync();
      kit::barrier();  // every rank starts the timed calls together
      const double start = now_s();
      for (int64_t i = 0; i < o.iters; ++i) call.run();
      sync();
      // The slowest rank's time is the collective's time.
      auto seconds = torch::full({1}, (now_s() - start) / o.iters,
                                 torch::TensorOptions().dtype(torch::kDouble).device(device));
      kit::all_reduce(seconds, kit::ReduceOp::MAX);
      const double t = seconds.item<double>();
      const double algbw = call.bytes / t / 1e9, busbw = algbw * bus_factor(name, ranks);
      kit::print0("  %-15s %12ld %12ld %12.1f %14.3f %14.3f\n", name.c_str(),
                  static_cast<long>(call.bytes), static_cast<long>(call.elements), t * 1e6, algbw,
                  busbw);
      if (csv.is_open())
        csv << name << ',' << call.bytes << ',' << call.elements << ',' << ranks << ',' << backend
            << ',' << device.str() << ',' << o.iters << ',' << t * 1e6 << ',' << algbw << ','
            << busbw << '\n' << std::flush;
      if (size > o.max_bytes / o.factor) break;  // the next size would overflow or pass the end
    }
  }
  kit::destroy_process_group();
  return 0;
}
