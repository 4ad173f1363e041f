// GPU tests (CTest label gpu): the NCCL half of the kit, which the CPU-only CI cannot run.
//
//   * NcclCollectives  kit::ProcessGroup on NCCL: all_reduce (SUM, AVG, MAX, MIN, several tensors
//                      in one call), broadcast from every root, all_gather, reduce_scatter, on
//                      CUDA tensors, each result against its closed form for every rank;
//   * NcclDDP          kit::DistributedDataParallel over NCCL trains exactly like one process
//                      that sees the whole global batch (1e-5 relative, as tests/ddp on Gloo);
//   * Ex01OnGpus       exercise 01's solution under ddprun, one process per GPU: every rank
//                      drives cuda:LOCAL_RANK with NCCL and the run finishes;
//   * NcclGroups       where NCCL cannot run, asking for it is refused with the reason (this
//                      one runs on every machine);
//   * NcclCollectives.ControlTrafficGoesThroughTheGpu  kit::control over NCCL, a host tensor
//                      refused in one line, shutdown();
//   * NcclDDP          also: DDP's wait/reduce times are CUDA-event device times;
//   * Ex01OnGpus.StopAndResumeIsBitExactWithDropoutOnTheGpu  stop, resume (CUDA generators in
//                      the checkpoint): the uninterrupted run's losses and model, bit for bit;
//   * Ex01OnGpus.ResumeWithAnotherGpuVisibility  the same, resumed with another
//                      CUDA_VISIBLE_DEVICES (each rank's checkpoint holds its own GPU's generator).
//
// The in-process ranks are threads, one per GPU (NCCL cannot put two ranks of one group on the
// same GPU), so the world size is the number of visible GPUs; a world of one on a single GPU
// still goes through NCCL. Where there is no GPU, or LibTorch is a CPU build, each test is
// skipped with kit::ProcessGroup::nccl_unavailable()'s reason, which CTest reports as skipped.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "child_process.h"  // Process, Result, TempDir, clean_env (tests/support)
#include "kit/ddp/ddp.h"
#include "kit/runtime/process_group.h"
#include "kit/models/transformer_lm.h"
#include "tiny_lm.h"  // kit_test::tiny_lm (tests/support)

namespace fs = std::filesystem;

namespace {

// Skips the calling test unless `ranks` NCCL ranks can run in this process.
#define SKIP_UNLESS_NCCL(ranks)                                                       \
  do {                                                                                \
    if (const std::string why = kit::ProcessGroup::nccl_unavailable(ranks); !why.empty()) \
      GTEST_SKIP() << why;                                                            \
  } while (0)

// One rank per visible GPU.
int gpus() { return static_cast<int>(torch::cuda::device_count()); }

torch::Device gpu(int r) { return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(r)); }

// Runs fn(group, device) on n NCCL ranks at once, one thread each, rank r on cuda:r (also as the
// thread's current device, as in a process of its own). An exception on a rank fails the test
// with the rank's number.
void on_gpu_ranks(int n, const std::function<void(kit::ProcessGroup&, torch::Device)>& fn) {
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(60), "nccl");
  ASSERT_EQ(groups.size(), static_cast<size_t>(n));
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        c10::DeviceGuard on_gpu(gpu(r));
        fn(*groups[r], gpu(r));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << " threw";
}

// A result must come back where it was sent (NCCL works in place on the rank's GPU); the values
// are compared in host memory.
void expect_on(const torch::Tensor& t, torch::Device device, const torch::Tensor& want, int rank,
               const char* what) {
  EXPECT_EQ(t.device(), device) << "rank " << rank << ", " << what;
  auto got = t.cpu();
  EXPECT_TRUE(got.sizes() == want.sizes() && torch::allclose(got, want, 0, 1e-6))
      << "rank " << rank << ", " << what << ": got\n" << got << "\nwant\n" << want;
}

// ---------------------------------------------------------------------------------------------
// Where NCCL cannot run: refused, with the reason
// ---------------------------------------------------------------------------------------------

TEST(NcclGroups, MoreRanksThanGpusAreRefusedWithTheReason) {
  const int visible = kit::ProcessGroup::nccl_built() && torch::cuda::is_available() ? gpus() : 0;
  const int too_many = visible + 1;
  const std::string why = kit::ProcessGroup::nccl_unavailable(too_many);
  ASSERT_FALSE(why.empty()) << too_many << " NCCL ranks on " << visible << " GPUs declared possible";
  if (!kit::ProcessGroup::nccl_built())
    EXPECT_NE(why.find("CPU build"), std::string::npos) << why;
  else if (visible == 0)
    EXPECT_NE(why.find("no GPU visible"), std::string::npos) << why;
  else
    EXPECT_NE(why.find(std::to_string(visible) + " visible"), std::string::npos) << why;
  try {
    kit::ProcessGroup::local_groups(too_many, std::chrono::seconds(5), "nccl");
    ADD_FAILURE() << "local_groups(" << too_many << ", nccl) did not refuse";
  } catch (const kit::CommError& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  EXPECT_THROW(kit::ProcessGroup::local_groups(1, std::chrono::seconds(5), "mpi"), kit::CommError);
}

// ---------------------------------------------------------------------------------------------
// Collectives on NCCL, one rank per GPU
// ---------------------------------------------------------------------------------------------

// kit::control, the one path of host values (stop flags, reports, descriptors): staged through
// the rank's GPU and back. A host tensor handed to a collective directly is one line naming the
// call (what KIT_DEVICE_CHECK=nccl imitates on CPU CI), and after shutdown() (NCCL's own
// shutdown() included) a collective is a CommError, not a crash.
TEST(NcclCollectives, ControlTrafficGoesThroughTheGpu) {
  SKIP_UNLESS_NCCL(1);
  const int n = gpus();
  on_gpu_ranks(n, [n](kit::ProcessGroup& g, torch::Device device) {
    const int r = g.rank();
    EXPECT_EQ(g.device(), device) << "rank " << r;
    auto sum = kit::control::all_reduce(g, torch::tensor({1.0f, float(r)}), kit::ReduceOp::SUM);
    EXPECT_TRUE(sum.device().is_cpu());
    expect_on(sum, torch::Device(torch::kCPU), torch::tensor({float(n), n * (n - 1) / 2.0f}), r,
              "control::all_reduce");
    auto all = kit::control::all_gather(g, torch::tensor({int64_t(r)}));
    expect_on(all.to(torch::kFloat), torch::Device(torch::kCPU),
              torch::arange(n, torch::kFloat), r, "control::all_gather");
    auto root = kit::control::broadcast(g, torch::tensor({int64_t(10 + r)}), 0);
    EXPECT_EQ(root.item<int64_t>(), 10) << "rank " << r;
    auto host = torch::ones({2});
    try {
      g.all_reduce(host, kit::ReduceOp::SUM);
      ADD_FAILURE() << "rank " << r << ": a host tensor went into an NCCL all_reduce";
    } catch (const kit::CommError& e) {
      EXPECT_NE(std::string(e.what()).find("was given a tensor on cpu"), std::string::npos) << e.what();
    }
    g.barrier();
    g.shutdown();
    auto t = torch::ones({1}, device);
    EXPECT_THROW(g.all_reduce(t, kit::ReduceOp::SUM), kit::CommError);
  });
}

TEST(NcclCollectives, AllReduceSumAvgMaxMin) {
  SKIP_UNLESS_NCCL(1);
  const int n = gpus();
  on_gpu_ranks(n, [n](kit::ProcessGroup& g, torch::Device dev) {
    EXPECT_EQ(g.backend(), "nccl");
    EXPECT_EQ(g.size(), n);
    const int r = g.rank();
    const float sum1 = n * (n + 1) / 2.0f;       // sum of r + 1 over the ranks
    const float sum_r = n * (n - 1) / 2.0f;      // sum of r

    auto t = torch::tensor({float(r + 1), float(10 * r), float(-r)}).to(dev);
    g.all_reduce(t, kit::ReduceOp::SUM);
    expect_on(t, dev, torch::tensor({sum1, 10 * sum_r, -sum_r}), r, "SUM float");

    auto i = torch::full({2, 3}, int64_t{r}, torch::kLong).to(dev);
    g.all_reduce(i, kit::ReduceOp::SUM);
    EXPECT_TRUE(torch::equal(i.cpu(), torch::full({2, 3}, int64_t{n * (n - 1) / 2}, torch::kLong)))
        << "rank " << r << ", SUM int64: " << i;

    // Every element divided by the world size; one element that only rank 0 contributes.
    auto a = torch::full({3, 2}, float(2 * (r + 1))).to(dev);
    a[1][1] = float(r == 0 ? 4 * n : 0);
    g.all_reduce(a, kit::ReduceOp::AVG);
    auto want = torch::full({3, 2}, float(n + 1));
    want[1][1] = 4.0f;
    expect_on(a, dev, want, r, "AVG");

    auto hi = torch::tensor({float(r), float(-r)}).to(dev), lo = hi.clone();
    g.all_reduce(hi, kit::ReduceOp::MAX);
    g.all_reduce(lo, kit::ReduceOp::MIN);
    expect_on(hi, dev, torch::tensor({float(n - 1), 0.0f}), r, "MAX");
    expect_on(lo, dev, torch::tensor({0.0f, float(1 - n)}), r, "MIN");
  });
}

// Several tensors in one call travel packed in one buffer and come back unpacked, each reduced on
// its own (what DDP's buckets and the trainer's loss/count pairs rely on).
TEST(NcclCollectives, AllReduceAsyncReducesEveryTensorOfTheCall) {
  SKIP_UNLESS_NCCL(1);
  const int n = gpus();
  on_gpu_ranks(n, [n](kit::ProcessGroup& g, torch::Device dev) {
    const int r = g.rank();
    std::vector<torch::Tensor> ts = {torch::full({4}, float(r)).to(dev),
                                     torch::full({2, 2}, float(2 * r + 1)).to(dev)};
    kit::Work w = g.all_reduce_async(ts, kit::ReduceOp::SUM);
    w.wait();
    const float sum_r = n * (n - 1) / 2.0f;
    expect_on(ts[0], dev, torch::full({4}, sum_r), r, "first tensor");
    expect_on(ts[1], dev, torch::full({2, 2}, 2 * sum_r + n), r, "second tensor");
  });
}

TEST(NcclCollectives, BroadcastCopiesTheRootsTensorFromEveryRoot) {
  SKIP_UNLESS_NCCL(1);
  const int n = gpus();
  on_gpu_ranks(n, [n](kit::ProcessGroup& g, torch::Device dev) {
    const int r = g.rank();
    for (int root = 0; root < n; ++root) {
      // Rank r holds 100 r + 0..5, so whose values arrived is visible in every element.
      auto t = (torch::arange(6, torch::kFloat) + 100.0f * r).view({2, 3}).to(dev);
      g.broadcast(t, root);
      expect_on(t, dev, (torch::arange(6, torch::kFloat) + 100.0f * root).view({2, 3}), r,
                ("broadcast from root " + std::to_string(root)).c_str());
    }
  });
}

TEST(NcclCollectives, AllGatherPutsTheInputsInRankOrder) {
  SKIP_UNLESS_NCCL(1);
  const int n = gpus();
  on_gpu_ranks(n, [n](kit::ProcessGroup& g, torch::Device dev) {
    const int r = g.rank();
    auto input = (torch::arange(3, torch::kFloat) + 10.0f * r).to(dev);
    // Expected: 0 1 2 | 10 11 12 | 20 21 22 | ...
    auto want = (torch::arange(3, torch::kFloat).repeat({n}) +
                 10.0f * torch::arange(n, torch::kFloat).repeat_interleave(3));
    auto flat = torch::empty({3 * n}, input.options());
    g.all_gather(flat, input);
    expect_on(flat, dev, want, r, "all_gather into a flat tensor");
    // A non-contiguous output [n, 3] (the transpose of [3, n]) takes the other path.
    auto shaped = torch::empty({3, n}, input.options()).t();
    ASSERT_FALSE(shaped.is_contiguous());
    g.all_gather(shaped, input);
    expect_on(shaped, dev, want.view({n, 3}), r, "all_gather into a non-contiguous tensor");
  });
}

TEST(NcclCollectives, ReduceScatterGivesEachRankItsChunkSummed) {
  SKIP_UNLESS_NCCL(1);
  const int n = gpus();
  on_gpu_ranks(n, [n](kit::ProcessGroup& g, torch::Device dev) {
    const int r = g.rank();
    // Chunk c of rank r's input is (r + 1) (c + 1) [1, 2]: rank c ends with
    // (c + 1) n (n + 1) / 2 [1, 2].
    auto input = torch::empty({n, 2});
    for (int c = 0; c < n; ++c) input[c] = torch::tensor({1.0f, 2.0f}) * float((r + 1) * (c + 1));
    input = input.to(dev);
    auto output = torch::empty({2}, input.options());
    g.reduce_scatter(output, input, kit::ReduceOp::SUM);
    expect_on(output, dev, torch::tensor({1.0f, 2.0f}) * float((r + 1) * n * (n + 1) / 2), r,
              "reduce_scatter SUM");
  });
}

// Point to point on NCCL (two GPUs: a rank cannot send to itself, and NCCL puts each rank on a
// GPU of its own): a blocking send and receive, isend/irecv, and a batch in which both ranks send
// to and receive from each other at once (one NCCL group: without it each rank's send would wait
// on its stream for the other's receive, which comes after that rank's own send); a host tensor
// is one line naming the call.
TEST(NcclCollectives, PointToPointBetweenTwoGpus) {
  SKIP_UNLESS_NCCL(2);
  on_gpu_ranks(2, [](kit::ProcessGroup& g, torch::Device dev) {
    const int r = g.rank(), peer = 1 - r;
    auto of = [](int k) { return (torch::arange(6, torch::kFloat) + 100.0f * k).view({2, 3}); };
    if (r == 0) g.send(of(0).to(dev), 1);
    else {
      auto got = torch::zeros({2, 3}, torch::TensorOptions().device(dev));
      g.recv(got, 0);
      expect_on(got, dev, of(0), r, "send/recv");
    }
    auto got = torch::zeros({2, 3}, torch::TensorOptions().device(dev));
    auto mine = of(r).to(dev);
    // Posted in matching orders (rank 0 sends first, rank 1 receives first): each NCCL call
    // outside a batch runs in turn on the pair's stream, so a receive posted first on both ranks
    // would wait for a send queued behind the other's receive.
    kit::Work first = r == 0 ? g.isend(mine, peer) : g.irecv(got, peer);
    kit::Work second = r == 0 ? g.irecv(got, peer) : g.isend(mine, peer);
    first.wait();
    second.wait();
    expect_on(got, dev, of(peer), r, "isend/irecv");
    auto both = torch::zeros({2, 3}, torch::TensorOptions().device(dev));
    g.batch_isend_irecv({{kit::ProcessGroup::P2POp::kSend, of(r).to(dev) * 2, peer},
                         {kit::ProcessGroup::P2POp::kRecv, both, peer}})
        .wait();
    expect_on(both, dev, of(peer) * 2, r, "batch_isend_irecv both ways");
    std::string what;
    try {
      g.send(torch::ones({2}), peer);
    } catch (const kit::CommError& e) {
      what = e.what();
    }
    EXPECT_NE(what.find("was given a tensor on cpu, but NCCL moves only tensors on the rank's device"),
              std::string::npos) << what;
  });
}

// ---------------------------------------------------------------------------------------------
// DDP over NCCL against one process on the whole global batch
// ---------------------------------------------------------------------------------------------

constexpr int64_t kVocab = 64, kSeqLen = 8, kPerRank = 4, kSteps = 5;

kit::TransformerLMOptions small_lm() { return kit_test::tiny_lm(kVocab, kSeqLen); }

// Step k's global batch: n * kPerRank sequences of random tokens; rank r trains on rows
// [r * kPerRank, (r + 1) * kPerRank). The same for every n, drawn on the CPU.
std::vector<torch::Tensor> global_batches(int n) {
  torch::manual_seed(123);
  std::vector<torch::Tensor> out;
  for (int64_t k = 0; k < kSteps; ++k)
    out.push_back(torch::randint(0, kVocab, {n * kPerRank, kSeqLen + 1}, torch::kLong));
  return out;
}

struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<torch::Tensor>> params;  // host copies after each step
  int64_t reduced_steps = 0;                       // DDPStats::steps
};

// Trains `model` (already on its device) on `batches` with SGD; ddp may be null.
void train(kit::TransformerLM& model, const std::vector<torch::Tensor>& batches,
           kit::DistributedDataParallel* ddp, Trained& out) {
  const torch::Device dev = model->parameters().front().device();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  model->train();
  for (const auto& batch : batches) {
    auto b = batch.to(dev);
    optimizer.zero_grad();
    const auto input = b.narrow(1, 0, kSeqLen);  // under DDP through the wrapper, as a trainer
    auto loss = kit::lm_loss(ddp ? ddp->forward(input) : model->forward(input), b.narrow(1, 1, kSeqLen));
    loss.backward();
    optimizer.step();
    out.losses.push_back(loss.item<double>());
    std::vector<torch::Tensor> ps;
    for (auto& p : model->parameters()) ps.push_back(p.detach().cpu().clone());
    out.params.push_back(std::move(ps));
  }
  if (ddp) out.reduced_steps = ddp->stats().steps;
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-12);
}

class NcclDDP : public ::testing::TestWithParam<bool> {};  // overlap on/off

TEST_P(NcclDDP, MatchesOneProcessOnTheWholeBatch) {
  SKIP_UNLESS_NCCL(1);
  const int n = gpus();
  const bool overlap = GetParam();
  const auto batches = global_batches(n);

  // The reference: one process, the whole global batch, on cuda:0.
  Trained ref;
  {
    torch::manual_seed(1);
    kit::TransformerLM model(small_lm());
    model->to(gpu(0));
    train(model, batches, nullptr, ref);
  }
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps));
  // The comparison means something only if training moves the loss and the weights.
  EXPECT_GT(std::abs(ref.losses.front() - ref.losses.back()), 1e-3);
  EXPECT_GT(relative(ref.params.back()[0], ref.params.front()[0]), 1e-4);

  // n ranks, each its own slice; ranks other than 0 start from other weights, which DDP's
  // broadcast from rank 0 must replace.
  std::vector<kit::TransformerLM> models;
  for (int r = 0; r < n; ++r) {
    torch::manual_seed(r == 0 ? 1 : 100 + r);
    models.emplace_back(small_lm());
    models.back()->to(gpu(r));
  }
  std::vector<Trained> runs(n);
  on_gpu_ranks(n, [&](kit::ProcessGroup& g, torch::Device) {
    const int r = g.rank();
    kit::DistributedDataParallel::Options o;
    o.group = &g;
    o.overlap = overlap;
    o.first_bucket_bytes = 2048;  // several buckets, started during backward when overlapping
    o.bucket_cap_bytes = 8192;
    kit::DistributedDataParallel ddp(models[r], o);
    EXPECT_GE(ddp.buckets().size(), 3u);
    std::vector<torch::Tensor> mine;
    for (auto& b : batches) mine.push_back(b.narrow(0, r * kPerRank, kPerRank));
    train(models[r], mine, &ddp, runs[r]);
    // DDP's times on a GPU are device time from CUDA events (a host clock around NCCL's enqueue
    // measures nothing): the reduce (first launch to done) contains the wait (after backward to
    // done), and both are real, finite times.
    const kit::DDPStats& s = ddp.stats();
    EXPECT_GT(s.last_reduce_seconds, 0) << "rank " << r;
    EXPECT_GE(s.last_wait_seconds, 0) << "rank " << r;
    EXPECT_GE(s.last_reduce_seconds, s.last_wait_seconds) << "rank " << r;
    EXPECT_LT(s.last_reduce_seconds, 10) << "rank " << r;
    EXPECT_GE(s.wait_seconds, s.last_wait_seconds) << "rank " << r;
  });

  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(runs[r].losses.size(), static_cast<size_t>(kSteps)) << "rank " << r;
    EXPECT_EQ(runs[r].reduced_steps, kSteps) << "rank " << r << ": DDP did not reduce every backward";
  }
  double worst_loss = 0, worst_param = 0;
  for (int64_t k = 0; k < kSteps; ++k) {
    // Equal slices: the mean of the ranks' mean losses is the mean over the global batch.
    double mean = 0;
    for (auto& run : runs) mean += run.losses[k] / n;
    const double rel = std::abs(mean - ref.losses[k]) / std::abs(ref.losses[k]);
    worst_loss = std::max(worst_loss, rel);
    EXPECT_LE(rel, 1e-5) << "step " << k + 1 << ": ranks' mean loss " << mean << " vs " << ref.losses[k];
    const auto& p0 = runs[0].params[k];
    ASSERT_EQ(p0.size(), ref.params[k].size());
    for (size_t i = 0; i < p0.size(); ++i) {
      const double d = relative(p0[i], ref.params[k][i]);
      worst_param = std::max(worst_param, d);
      EXPECT_LE(d, 1e-5) << "step " << k + 1 << ", parameter " << i;
      for (int r = 1; r < n; ++r)
        EXPECT_TRUE(torch::equal(runs[r].params[k][i], p0[i]))
            << "step " << k + 1 << ": rank " << r << "'s parameter " << i << " differs from rank 0's";
    }
  }
  std::printf("[ worst    ] %d GPU rank(s): loss %.2e, parameters %.2e (relative, %ld steps)\n", n,
              worst_loss, worst_param, static_cast<long>(kSteps));
}

INSTANTIATE_TEST_SUITE_P(Nccl, NcclDDP, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "overlap" : "no_overlap"; });

// ---------------------------------------------------------------------------------------------
// Exercise 01's solution, one process per GPU, started by ddprun
// ---------------------------------------------------------------------------------------------

// The quick run of `kit check` (common/tools/rules/ex01.py: RUN_FLAGS and CORPUS_FLAGS).
const std::vector<std::string> kRunFlags = {
    "--epochs", "2", "--batch-size", "8", "--eval-batch-size", "16", "--seq-len", "16",
    "--d-model", "32", "--heads", "2", "--layers", "1", "--feedforward", "64",
    "--dropout", "0", "--seed", "7"};
const std::vector<std::string> kCorpusFlags = {"--train-tokens", "4000", "--valid-tokens", "1200",
                                               "--test-tokens", "1200", "--seed", "3"};

TEST(Ex01OnGpus, EveryRankDrivesItsOwnGpuWithNccl) {
  SKIP_UNLESS_NCCL(1);
  const int n = gpus();
  kit_test::TempDir dir("kit-gpu", "KIT_GPU_KEEP");  // KIT_GPU_KEEP=1: keep it for a post-mortem
  const std::string tag = "kit-gpu-" + std::to_string(::getpid());
  auto env = [&](const std::map<std::string, std::string>& extra) {
    return kit_test::clean_env("KIT_GPU_TEST_TAG", tag, extra);
  };

  std::vector<std::string> corpus = {MAKE_CORPUS_EXE, "--out", (dir.path / "data").string()};
  corpus.insert(corpus.end(), kCorpusFlags.begin(), kCorpusFlags.end());
  kit_test::Result made = kit_test::Process(corpus, env({}), dir.path, "make_corpus").wait(60);
  ASSERT_EQ(made.exit_code, 0) << made;

  std::vector<std::string> job = {DDPRUN_EXE, "--nproc-per-node", std::to_string(n), "--",
                                  TRAINER_EXE, "--data-dir", (dir.path / "data").string(),
                                  "--out-dir", (dir.path / "run").string()};
  job.insert(job.end(), kRunFlags.begin(), kRunFlags.end());
  const fs::path trace = dir.path / "trace";
  fs::create_directories(trace);
  kit_test::Result run =
      kit_test::Process(job, env({{"KIT_TRACE_DIR", trace.string()}, {"KIT_TIMEOUT", "120"}}),
                        dir.path, "ex01")
          .wait(540);
  ASSERT_FALSE(run.timed_out) << run;
  ASSERT_EQ(run.exit_code, 0) << run;

  for (int r = 0; r < n; ++r) {
    const std::string line = "rank " + std::to_string(r) + " of " + std::to_string(n) +
                             ": local rank " + std::to_string(r) + ", device cuda:" +
                             std::to_string(r);
    EXPECT_NE(run.out.find(line), std::string::npos) << "missing \"" << line << "\"\n" << run;
    // The run trace says which backend setup() chose.
    const std::string setup = kit_test::read_file(trace / ("rank" + std::to_string(r) + ".trace"));
    EXPECT_NE(setup.find("device=cuda:" + std::to_string(r) + " backend=nccl"), std::string::npos)
        << "rank " << r << "'s trace:\n" << setup;
  }
  // Every GPU did the work: rank 0 lists each rank's epoch report on its own GPU, and
  // metrics.csv has a row per rank with that device and the GPU memory it used.
  const std::string csv = kit_test::read_file(dir.path / "run" / "metrics.csv");
  for (int r = 0; r < n; ++r) {
    const std::string report = "  epoch 1, rank " + std::to_string(r) + " (";
    const size_t at = run.out.find(report);
    ASSERT_NE(at, std::string::npos) << "no epoch report of rank " << r << "\n" << run;
    const std::string line = run.out.substr(at, run.out.find('\n', at) - at);
    EXPECT_NE(line.find(", cuda:" + std::to_string(r) + "): "), std::string::npos) << line;
    EXPECT_EQ(line.find("): 0 samples/s"), std::string::npos) << line;
    EXPECT_EQ(line.find("(host)"), std::string::npos) << "GPU memory expected: " << line;
    const std::string row = "," + std::to_string(r) + ",cuda:" + std::to_string(r) + ",";
    EXPECT_NE(csv.find(row), std::string::npos) << "no metrics.csv row of rank " << r << ":\n" << csv;
  }
  EXPECT_NE(run.out.find("final test loss"), std::string::npos) << run;
  EXPECT_EQ(run.err.find("no GPU"), std::string::npos) << run;
  EXPECT_EQ(run.out.find("share cuda:"), std::string::npos) << "two ranks on one GPU\n" << run;
  EXPECT_TRUE(fs::exists(dir.path / "run" / "model-final.pt")) << run;
}

// One rank more than the node's GPUs: with one GPU, every rank sees it and takes cuda:0, which
// only the ranks together can see (setup()'s shared_gpu check); with more, device_for() refuses a
// rank that sees fewer GPUs than the node has ranks. Either way every rank stops, with one line.
TEST(Ex01OnGpus, MoreRanksThanGpusStopWithOneLine) {
  SKIP_UNLESS_NCCL(1);
  const int n = gpus() + 1;
  kit_test::TempDir dir("kit-gpu", "KIT_GPU_KEEP");
  const std::string tag = "kit-gpu-" + std::to_string(::getpid());
  auto env = [&](const std::map<std::string, std::string>& extra) {
    return kit_test::clean_env("KIT_GPU_TEST_TAG", tag, extra);
  };
  std::vector<std::string> corpus = {MAKE_CORPUS_EXE, "--out", (dir.path / "data").string()};
  corpus.insert(corpus.end(), kCorpusFlags.begin(), kCorpusFlags.end());
  ASSERT_EQ(kit_test::Process(corpus, env({}), dir.path, "make_corpus").wait(60).exit_code, 0);
  std::vector<std::string> job = {DDPRUN_EXE, "--nproc-per-node", std::to_string(n), "--",
                                  TRAINER_EXE, "--data-dir", (dir.path / "data").string(),
                                  "--out-dir", (dir.path / "run").string()};
  job.insert(job.end(), kRunFlags.begin(), kRunFlags.end());
  kit_test::Result run = kit_test::Process(job, env({{"KIT_TIMEOUT", "60"}}), dir.path, "ex01").wait(180);
  ASSERT_FALSE(run.timed_out) << run;
  EXPECT_NE(run.exit_code, 0) << run;
  const bool named = run.err.find("both drive GPU") != std::string::npos ||
                     run.err.find("ranks on this node sees") != std::string::npos;
  EXPECT_TRUE(named) << n << " ranks on " << n - 1 << " GPU(s) not refused with the reason\n" << run;
  EXPECT_EQ(run.out.find("final test loss"), std::string::npos) << run;
}

// Stop after step 3 (KIT_TEST_STOP_AFTER_STEP of the preloaded libkit_test_hooks.so;
// KIT_DEBUG_COLLECTIVES=1: the stop flag and the debug descriptors go over NCCL), resume,
// finish: with dropout, which on a GPU draws from the CUDA generator, the losses and
// model-final.pt are the uninterrupted run's, bit for bit. Before the checkpoints held the CUDA
// generators, the resumed run drew other dropout masks; before kit::control, the stop flag (a
// CPU tensor) ended the run at step 1.
TEST(Ex01OnGpus, StopAndResumeIsBitExactWithDropoutOnTheGpu) {
  SKIP_UNLESS_NCCL(1);
  const int n = gpus();
  kit_test::TempDir dir("kit-gpu", "KIT_GPU_KEEP");
  const std::string tag = "kit-gpu-" + std::to_string(::getpid());
  auto env = [&](std::map<std::string, std::string> extra) {
    extra["KIT_TIMEOUT"] = "120";
    return kit_test::clean_env("KIT_GPU_TEST_TAG", tag, extra);
  };
  std::vector<std::string> corpus = {MAKE_CORPUS_EXE, "--out", (dir.path / "data").string()};
  corpus.insert(corpus.end(), kCorpusFlags.begin(), kCorpusFlags.end());
  ASSERT_EQ(kit_test::Process(corpus, env({}), dir.path, "make_corpus").wait(60).exit_code, 0);
  auto job = [&](const std::string& out) {
    std::vector<std::string> argv = {DDPRUN_EXE, "--nproc-per-node", std::to_string(n), "--",
                                     TRAINER_EXE, "--data-dir", (dir.path / "data").string(),
                                     "--out-dir", (dir.path / out).string()};
    argv.insert(argv.end(), kRunFlags.begin(), kRunFlags.end());
    argv.insert(argv.end(), {"--dropout", "0.2", "--max-steps", "6"});  // the last flag wins
    return argv;
  };
  auto run = [&](const std::string& out, const std::map<std::string, std::string>& extra) {
    return kit_test::Process(job(out), env(extra), dir.path, out).wait(540);
  };
  kit_test::Result whole = run("whole", {});
  ASSERT_EQ(whole.exit_code, 0) << whole;
  kit_test::Result stop = run("parts", {{"KIT_TEST_STOP_AFTER_STEP", "3"}, {"LD_PRELOAD", TEST_HOOKS_LIB},
                                        {"KIT_DEBUG_COLLECTIVES", "1"}});
  ASSERT_EQ(stop.exit_code, 0) << stop;
  ASSERT_NE(stop.out.find("stopping after step 3"), std::string::npos) << stop;
  const fs::path cuda_rng = dir.path / "parts" / "checkpoints" / "step-000000003" / "cuda-rng-rank0.bin";
  EXPECT_TRUE(fs::exists(cuda_rng)) << "the checkpoint holds no CUDA generator state";
  // The rank's own GPU's generator only, not one per visible GPU (kit/train/checkpoint_format.h).
  EXPECT_EQ(kit_test::read_file(cuda_rng).rfind("kit-cuda-rng 2\n", 0), 0u)
      << "not the one-GPU format: " << kit_test::read_file(cuda_rng).substr(0, 20);
  kit_test::Result rest = run("parts", {{"KIT_DEBUG_COLLECTIVES", "1"}});
  ASSERT_EQ(rest.exit_code, 0) << rest;
  ASSERT_NE(rest.out.find("resuming from"), std::string::npos) << rest;
  // metrics.csv: step,epoch,loss,...; the rows of steps (not the per-rank epoch rows) as text.
  auto losses = [&](const std::string& out) {
    std::vector<std::string> rows;
    for (auto& line : kit_test::nonempty_lines(kit_test::read_file(dir.path / out / "metrics.csv")))
      if (line.find("cuda:") == std::string::npos) {  // not a per-rank epoch row
        const size_t c2 = line.find(',', line.find(',') + 1);
        rows.push_back(line.substr(0, line.find(',', c2 + 1)));  // step,epoch,loss
      }
    return rows;
  };
  EXPECT_EQ(losses("whole"), losses("parts"));
  EXPECT_TRUE(kit_test::read_file(dir.path / "whole" / "model-final.pt") ==
              kit_test::read_file(dir.path / "parts" / "model-final.pt"))
      << "model-final.pt differs from the uninterrupted run's";
}

// A resume that sees the GPUs otherwise: one rank stopped after step 3 with every GPU visible
// (it drives cuda:0, the first), resumed with CUDA_VISIBLE_DEVICES naming only the last GPU (its
// cuda:0 now), as a job requeued onto another GPU of the node. The checkpoint holds the generator
// of the rank's own GPU, restored into its GPU of the resume: the uninterrupted run's losses and
// model, bit for bit. When the checkpoint held every visible GPU's generator, this resume was
// refused ("holds the CUDA random state of 2 GPU(s), and this rank sees 1"). Needs 2 GPUs.
TEST(Ex01OnGpus, ResumeWithAnotherGpuVisibility) {
  SKIP_UNLESS_NCCL(1);
  if (gpus() < 2) GTEST_SKIP() << "needs 2 GPUs to see them otherwise, this machine has " << gpus();
  kit_test::TempDir dir("kit-gpu", "KIT_GPU_KEEP");
  const std::string tag = "kit-gpu-" + std::to_string(::getpid());
  auto env = [&](std::map<std::string, std::string> extra) {
    extra["KIT_TIMEOUT"] = "120";
    return kit_test::clean_env("KIT_GPU_TEST_TAG", tag, extra);
  };
  std::vector<std::string> corpus = {MAKE_CORPUS_EXE, "--out", (dir.path / "data").string()};
  corpus.insert(corpus.end(), kCorpusFlags.begin(), kCorpusFlags.end());
  ASSERT_EQ(kit_test::Process(corpus, env({}), dir.path, "make_corpus").wait(60).exit_code, 0);
  auto run = [&](const std::string& out, const std::map<std::string, std::string>& extra) {
    std::vector<std::string> argv = {DDPRUN_EXE, "--nproc-per-node", "1", "--", TRAINER_EXE,
                                     "--data-dir", (dir.path / "data").string(),
                                     "--out-dir", (dir.path / out).string()};
    argv.insert(argv.end(), kRunFlags.begin(), kRunFlags.end());
    argv.insert(argv.end(), {"--dropout", "0.2", "--max-steps", "6"});  // the last flag wins
    return kit_test::Process(argv, env(extra), dir.path, out).wait(540);
  };
  kit_test::Result whole = run("whole", {});
  ASSERT_EQ(whole.exit_code, 0) << whole;
  kit_test::Result stop = run("parts", {{"KIT_TEST_STOP_AFTER_STEP", "3"}, {"LD_PRELOAD", TEST_HOOKS_LIB}});
  ASSERT_EQ(stop.exit_code, 0) << stop;
  ASSERT_NE(stop.out.find("stopping after step 3"), std::string::npos) << stop;
  kit_test::Result rest = run("parts", {{"CUDA_VISIBLE_DEVICES", std::to_string(gpus() - 1)}});
  ASSERT_EQ(rest.exit_code, 0) << "the resume with one GPU visible was refused?\n" << rest;
  ASSERT_NE(rest.out.find("resuming from"), std::string::npos) << rest;
  EXPECT_TRUE(kit_test::read_file(dir.path / "whole" / "model-final.pt") ==
              kit_test::read_file(dir.path / "parts" / "model-final.pt"))
      << "model-final.pt differs from the uninterrupted run's: another generator state?";
}

}  // namespace

int main(int argc, char** argv) {
  // The in-process ranks share the cores; the GPU does the arithmetic.
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
