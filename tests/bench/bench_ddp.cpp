// bench_ddp — step time of kit::DistributedDataParallel on the exercise-01 model (issue 2).
//
//   bench_ddp [flags]                                  one process, no DDP (the baseline)
//   ddprun --nproc-per-node 2 -- bench_ddp [flags]     N ranks, kit::DistributedDataParallel
//   ddprun --nproc-per-node 1 -- bench_ddp --device cuda --ddp on
//                                                      kit DDP on one GPU rank (NCCL)
//
// --device: auto (default) is what kit::setup() chose: cuda:LOCAL_RANK with NCCL where a GPU is
// visible, else the CPU with Gloo. cuda insists on a GPU (exit 2 without one); cpu hides the GPUs
// (CUDA_VISIBLE_DEVICES=""), so that the CPU run can be made on a GPU node too. On a GPU the
// clock is read after torch::cuda::synchronize(), so that every phase is the GPU's time, not the
// time it took to queue the work.
//
// Builds kit::TransformerLM with the trainer's default sizes (kit::TrainArgs: d_model 128,
// 4 heads, 2 layers, feed-forward 256, seq_len 64, batch 16 per rank (--batch B: B instead; a
// small batch makes DDP's overhead dominate), dropout 0.1, AdamW lr 1e-3)
// and trains it on synthetic token batches (uniform random ids, drawn before timing starts; the
// vocabulary size is the bundled corpus's when --data is given, so the embedding and the head
// have their real sizes). It runs --warmup untimed steps, then --steps timed steps of
// zero_grad + forward + loss + backward + AdamW step, and prints on rank 0 one line
//
//   BENCH impl=cpp name=... ranks=2 threads=1 overlap=1 ... step_ms_median=... wait_ms_median=...
//
// Every per-step figure is first reduced over the ranks (step time: the slowest rank; wait and
// tail: the mean of the ranks), then the median over the timed steps is taken.
//   step_ms   zero_grad .. optimizer.step() inclusive
//   fwd_ms    forward + loss;  bwd_ms  loss.backward() (with DDP: including the final wait);
//   opt_ms    optimizer.step()
//   wait_ms   DDPStats::last_wait_seconds: after backward, waiting for the all-reduces in flight.
//             On a GPU this is tail_ms instead: NCCL's wait() only makes the compute stream wait
//             for the all-reduce, so the CPU never waits there; the tail is the same definition
//             as bench_ddp.py's, so the column compares like with like.
//   cpu_ms    CPU time the process used during the step (all its threads), mean of the ranks:
//             unlike the wall-clock figures, barely affected by other load on the machine
//   tail_ms   from the last parameter gradient produced by autograd to the return of backward():
//             the same definition as bench_ddp.py uses for torch's DDP, which exposes no wait
//             time (it includes the last copies into/out of the buckets besides the wait)
//   copy_ms   DDPStats::last_copy_seconds: copying gradients into the buckets (the kit copies
//             nothing out: .grad is a window on the bucket)
//   reduce_ms DDPStats::last_reduce_seconds: from the first bucket's all-reduce started to the
//             last one seen finished (by the wait after backward), i.e. the all-reduces' wall time
//             including any backward computation they overlapped; reduce_bytes: bytes per step
//   loopback_ms / loopback_mb_per_s: after the timed steps, one all-reduce (SUM) of reduce_bytes
//             alone, without backward around it (median of 10): what Gloo moves over loopback on
//             this machine at this moment, the yardstick for reduce_bytes / reduce_ms
// The tensor hooks that time tail_ms run on the backward thread and only read a clock.
//
// This is a benchmark, not a test: nothing here asserts a time.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "kit/train/args.h"
#include "kit/ddp/ddp.h"
#include "kit/runtime/distributed.h"
#include "kit/runtime/process.h"
#include "kit/models/transformer_lm.h"
#include "kit/data/wikitext.h"

namespace {

using Clock = std::chrono::steady_clock;

// CPU time of the whole process (all its threads: compute, Gloo, autograd), in ms.
double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct BenchArgs {
  std::string name = "cpp";
  std::string data_dir;     // bundled corpus: only its vocabulary size is used
  int64_t vocab = 0;        // 0: the corpus's (or 10000 without --data)
  int64_t steps = 30;
  int64_t warmup = 5;
  int64_t batch = 0;        // per rank; 0: the trainer's default
  int overlap = 1;
  int threads = 0;          // 0: what kit::setup() chose (OMP_NUM_THREADS or cores / local ranks)
  std::string ddp = "auto"; // auto: DDP when world_size > 1; on; off
  std::string device = "auto";  // auto: kit::setup()'s choice; cpu; cuda
  double first_bucket_mb = -1, bucket_cap_mb = -1;  // < 0: kit defaults (1 MiB, 25 MiB)
  bool print_vocab = false;
};

[[noreturn]] void usage(const char* prog, int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: %s [--steps N] [--warmup N] [--batch B] [--overlap 0|1] [--threads T] [--vocab V]\n"
               "          [--data DIR] [--ddp auto|on|off] [--device auto|cpu|cuda] [--name NAME]\n"
               "          [--first-bucket-mb X] [--bucket-cap-mb X] [--print-vocab]\n",
               prog);
  std::exit(code);
}

BenchArgs parse(int argc, char** argv) {
  BenchArgs a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") usage(argv[0], 0);
    if (flag == "--print-vocab") { a.print_vocab = true; continue; }
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      std::fprintf(stderr, "error: %s needs a value\n", flag.c_str());
      usage(argv[0], 2);
    }
    auto num = [&](double lo) {
      char* end = nullptr;
      double x = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || x < lo) {
        std::fprintf(stderr, "error: %s: bad value '%s'\n", flag.c_str(), value.c_str());
        std::exit(2);
      }
      return x;
    };
    if (flag == "--name") a.name = value;
    else if (flag == "--data") a.data_dir = value;
    else if (flag == "--vocab") a.vocab = static_cast<int64_t>(num(0));
    else if (flag == "--steps") a.steps = static_cast<int64_t>(num(1));
    else if (flag == "--warmup") a.warmup = static_cast<int64_t>(num(0));
    else if (flag == "--batch") a.batch = static_cast<int64_t>(num(1));
    else if (flag == "--overlap") a.overlap = num(0) != 0;
    else if (flag == "--threads") a.threads = static_cast<int>(num(0));
    else if (flag == "--first-bucket-mb") a.first_bucket_mb = num(0);
    else if (flag == "--bucket-cap-mb") a.bucket_cap_mb = num(0);
    else if (flag == "--ddp") {
      if (value != "auto" && value != "on" && value != "off") usage(argv[0], 2);
      a.ddp = value;
    } else if (flag == "--device") {
      if (value != "auto" && value != "cpu" && value != "cuda") usage(argv[0], 2);
      a.device = value;
    } else {
      std::fprintf(stderr, "error: unknown flag %s\n", flag.c_str());
      usage(argv[0], 2);
    }
  }
  return a;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Per-step values of every rank -> one value per step (MAX or AVG over the ranks). They travel on
// the rank's device: NCCL reduces CUDA tensors only.
std::vector<double> over_ranks(const std::vector<double>& mine, kit::ReduceOp op, bool distributed,
                               torch::Device device) {
  if (!distributed) return mine;
  auto t = torch::tensor(mine, torch::kDouble).to(device);
  kit::all_reduce(t, op);
  t = t.cpu();
  return {t.data_ptr<double>(), t.data_ptr<double>() + t.numel()};
}

}  // namespace

int main(int argc, char** argv) {
  kit::prepare_process();  // as a trainer's flag parser does: one-line errors, malloc as in training
  BenchArgs args = parse(argc, argv);
  const kit::TrainArgs train;  // the trainer's defaults: the sizes we benchmark
  const int64_t batch = args.batch > 0 ? args.batch : train.batch_size;

  int64_t vocab = args.vocab;
  if (vocab == 0) vocab = args.data_dir.empty() ? 10000 : kit::load_wikitext2(args.data_dir).vocab.size();
  if (args.print_vocab) {
    std::printf("%ld\n", static_cast<long>(vocab));
    return 0;
  }

  if (args.device == "cuda" && !torch::cuda::is_available()) {
    std::fprintf(stderr, "error: --device cuda: %s\n", kit::ProcessGroup::nccl_unavailable().c_str());
    return 2;
  }
  // The CPU where GPUs are visible: hide them before CUDA starts, so that setup() chooses the CPU
  // and Gloo as on a machine without any (and does not refuse more ranks than GPUs).
  if (args.device == "cpu") ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  const kit::Setup me = kit::setup(train.seed);  // by name: kit::Setup cannot be unpacked
  const int rank = me.rank, world_size = me.world_size;
  const torch::Device device = me.device;
  if (args.threads > 0) torch::set_num_threads(args.threads);
  // GPU work is queued: wait for it before reading the clock.
  auto sync = [on = device] {
    if (on.is_cuda()) torch::cuda::synchronize(on.index());
  };
  const bool distributed = world_size > 1;
  const bool use_ddp = args.ddp == "on" || (args.ddp == "auto" && distributed);

  kit::TransformerLM model(kit::lm_options(train, vocab));
  model->to(device);
  model->train();

  std::unique_ptr<kit::DistributedDataParallel> ddp;
  if (use_ddp) {
    kit::DistributedDataParallel::Options o;
    o.overlap = args.overlap != 0;
    if (args.first_bucket_mb >= 0) o.first_bucket_bytes = static_cast<size_t>(args.first_bucket_mb * (1 << 20));
    if (args.bucket_cap_mb >= 0) o.bucket_cap_bytes = static_cast<size_t>(args.bucket_cap_mb * (1 << 20));
    ddp = std::make_unique<kit::DistributedDataParallel>(model, o);
  }
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(train.lr));

  int64_t n_params = 0;
  for (auto& p : model->parameters()) n_params += p.numel();
  std::string bucket_sizes;  // MB per bucket, in launch order
  if (ddp) {
    auto params = model->parameters();
    for (auto& b : ddp->buckets()) {
      int64_t bytes = 0;
      for (size_t i : b) bytes += params[i].numel() * params[i].element_size();
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.3f", bucket_sizes.empty() ? "" : ",", bytes / 1048576.0);
      bucket_sizes += buf;
    }
  }

  // tail_ms: time of the last parameter gradient autograd produced in this backward.
  Clock::time_point last_grad;
  for (auto& p : model->parameters())
    p.register_hook([&last_grad](const torch::Tensor&) { last_grad = Clock::now(); });

  // Synthetic batches, drawn before timing: [batch, seq_len + 1] ids -> input, shifted target.
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(1234 + rank);
  std::vector<torch::Tensor> pool;
  for (int i = 0; i < 8; ++i)
    pool.push_back(torch::randint(vocab, {batch, train.seq_len + 1}, gen,
                                  torch::TensorOptions().dtype(torch::kLong)).to(device));

  std::vector<double> step_ms, fwd_ms, bwd_ms, opt_ms, wait_ms, tail_ms, cpu_ms, copy_ms, reduce_ms;
  double loss_sum = 0;
  if (distributed) kit::barrier();  // start the clock together
  for (int64_t s = 0; s < args.warmup + args.steps; ++s) {
    auto& batch = pool[static_cast<size_t>(s) % pool.size()];
    auto input = batch.narrow(1, 0, train.seq_len), target = batch.narrow(1, 1, train.seq_len);
    sync();
    double c0 = process_cpu_ms();
    auto t0 = Clock::now();
    optimizer.zero_grad();
    auto loss = kit::lm_loss(ddp ? ddp->forward(input) : model->forward(input), target);
    sync();
    double f = ms_since(t0);
    auto t1 = Clock::now();
    loss.backward();
    sync();
    auto t2 = Clock::now();
    optimizer.step();
    sync();
    double total = ms_since(t0);
    double cpu = process_cpu_ms() - c0;
    if (s < args.warmup) continue;
    step_ms.push_back(total);
    fwd_ms.push_back(f);
    bwd_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    opt_ms.push_back(total - f - bwd_ms.back());
    tail_ms.push_back(std::chrono::duration<double, std::milli>(t2 - last_grad).count());
    const double waited = ddp ? ddp->stats().last_wait_seconds * 1e3 : 0.0;
    wait_ms.push_back(ddp && device.is_cuda() ? tail_ms.back() : waited);
    cpu_ms.push_back(cpu);
    copy_ms.push_back(ddp ? ddp->stats().last_copy_seconds * 1e3 : 0.0);
    reduce_ms.push_back(ddp ? ddp->stats().last_reduce_seconds * 1e3 : 0.0);
    loss_sum += loss.item<double>();
  }

  auto step = over_ranks(step_ms, kit::ReduceOp::MAX, distributed, device);
  auto fwd = over_ranks(fwd_ms, kit::ReduceOp::AVG, distributed, device);
  auto bwd = over_ranks(bwd_ms, kit::ReduceOp::AVG, distributed, device);
  auto opt = over_ranks(opt_ms, kit::ReduceOp::AVG, distributed, device);
  auto wait = over_ranks(wait_ms, kit::ReduceOp::AVG, distributed, device);
  auto tail = over_ranks(tail_ms, kit::ReduceOp::AVG, distributed, device);
  auto cpu = over_ranks(cpu_ms, kit::ReduceOp::AVG, distributed, device);
  auto copy = over_ranks(copy_ms, kit::ReduceOp::AVG, distributed, device);
  auto reduce = over_ranks(reduce_ms, kit::ReduceOp::AVG, distributed, device);
  const int64_t reduce_bytes = ddp ? ddp->stats().last_reduce_bytes : 0;

  // Gloo's (NCCL's) own speed here and now: the same bytes in one all-reduce, nothing around it.
  std::vector<double> loopback_ms;
  if (ddp && distributed) {
    auto flat = torch::zeros({reduce_bytes / 4}, torch::TensorOptions().device(device));
    for (int k = 0; k < 12; ++k) {
      sync();
      auto t = Clock::now();
      kit::all_reduce(flat, kit::ReduceOp::SUM);
      sync();
      if (k >= 2) loopback_ms.push_back(ms_since(t));  // 2 to warm up
    }
    loopback_ms = over_ranks(loopback_ms, kit::ReduceOp::MAX, distributed, device);
  }
  const double loopback = median(loopback_ms);
  double step_med = median(step);
  double samples_per_s = step_med > 0 ? 1e3 * batch * world_size / step_med : 0;

  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(3);
  line << "BENCH impl=cpp name=" << args.name << " device=" << (device.is_cuda() ? "cuda" : "cpu")
       << " ranks=" << world_size
       << " threads=" << torch::get_num_threads() << " ddp=" << (ddp ? 1 : 0)
       << " overlap=" << (ddp ? args.overlap : 0) << " steps=" << args.steps
       << " warmup=" << args.warmup << " batch=" << batch
       << " seq_len=" << train.seq_len << " vocab=" << vocab << " params=" << n_params
       << " buckets=" << (ddp ? bucket_sizes : std::string("-"))
       << " step_ms_median=" << step_med << " step_ms_min=" << *std::min_element(step.begin(), step.end())
       << " fwd_ms_median=" << median(fwd) << " bwd_ms_median=" << median(bwd)
       << " opt_ms_median=" << median(opt) << " wait_ms_median=" << median(wait)
       << " tail_ms_median=" << median(tail) << " cpu_ms_median=" << median(cpu)
       << " samples_per_s=" << samples_per_s
       << " loss_mean=" << loss_sum / static_cast<double>(args.steps)
       << " copy_ms_median=" << median(copy) << " reduce_ms_median=" << median(reduce)
       << " reduce_bytes=" << reduce_bytes << " loopback_ms_median=" << loopback
       << " loopback_mb_per_s=" << (loopback > 0 ? reduce_bytes / 1048576.0 / (loopback / 1e3) : 0.0)
       << "\n";
  kit::print0("%s", line.str().c_str());
  kit::destroy_process_group();
  return 0;
}
