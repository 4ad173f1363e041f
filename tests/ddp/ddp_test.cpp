// DistributedDataParallel equivalence tests: N ranks (threads of this process, each with its own
// model copy and its own kit::ProcessGroup from local_groups()) must train exactly like one
// process that sees the whole global batch.
//
//   * same initial weights (rank 0's, broadcast by DDP), same global batch (B sequences split
//     B/N per rank by DistributedSampler), same data order (the sampler's seed);
//   * the mean of the ranks' losses equals the single-process loss, and rank 0's parameters equal
//     the single-process parameters after every step, both to 1e-5 relative (float32);
//   * all ranks hold bit-identical parameters after every step;
//   * every rank does forward and backward on its own, disjoint shard of the data.
//
// Nothing here uses kit::setup()'s process-global default group: every group is passed
// explicitly (DDP Options::group, DistributedSampler(num_replicas, rank)).
//
// Backends: by default every rank is a CPU thread on Gloo (CTest label ddp). With --backend=nccl
// the Equivalence and Broadcast cases run on NCCL instead (CTest label gpu, tests gpu.ddp.*):
// rank r's model and data on cuda:r, the single-process reference on cuda:0. A case with more
// ranks than visible GPUs is skipped with the reason, as is every case without a GPU or with a
// CPU build of LibTorch.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/data/data_loader.h"
#include "kit/ddp/ddp.h"
#include "kit/runtime/process.h"        // prepare_process: the death test's terminate handler
#include "kit/runtime/process_group.h"
#include "kit/models/resnet.h"         // ResNet: a model with batch norm
#include "kit/models/transformer_lm.h"
#include "tiny_lm.h"  // kit_test::tiny_lm (tests/support)
#include "kit/data/wikitext.h"

namespace {

constexpr int64_t kVocab = 64, kSeqLen = 8, kGlobalBatch = 8, kSteps = 5;
constexpr uint64_t kModelSeed = 1, kSamplerSeed = 17;

// The backend of this run: "gloo" or "nccl" (main()'s --backend).
std::string g_backend = "gloo";

// Where rank r computes: its own GPU on NCCL, the CPU on Gloo. The reference runs where rank 0 does.
torch::Device device_of(int rank) {
  return g_backend == "nccl" ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank))
                             : torch::Device(torch::kCPU);
}

// Why this run cannot have n ranks here ("" when it can; Gloo always can).
std::string cannot_run(int n) {
  return g_backend == "nccl" ? kit::ProcessGroup::nccl_unavailable(n) : std::string();
}

kit::TransformerLMOptions small_lm() { return kit_test::tiny_lm(kVocab, kSeqLen); }

// kSteps global batches of random tokens: exactly one epoch.
const kit::LanguageModelDataset& dataset() {
  static const kit::LanguageModelDataset data = [] {
    torch::manual_seed(123);
    auto ids = torch::randint(0, kVocab, {kSteps * kGlobalBatch * (kSeqLen + 1)}, torch::kLong);
    return kit::LanguageModelDataset(ids, kSeqLen, "synthetic");
  }();
  return data;
}

// The dataset, remembering which samples this reader asked for (one per rank: no sharing).
struct RecordingDataset {
  const kit::LanguageModelDataset* base;
  mutable std::vector<size_t> seen;
  size_t size() const { return base->size(); }
  std::pair<torch::Tensor, torch::Tensor> get(size_t i) const {
    seen.push_back(i);
    return base->get(i);
  }
  const std::string& name() const { return base->name(); }
};

using Params = std::vector<torch::Tensor>;

// Copies in host memory, wherever the model lives, so that the ranks' tensors (each on its own
// GPU under NCCL) and the reference's can be compared with each other.
torch::Tensor host_copy(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}
Params snapshot(const torch::nn::Module& m) {
  Params out;
  for (auto& p : m.parameters()) out.push_back(host_copy(p));
  return out;
}
Params state(const torch::nn::Module& m) {  // parameters and buffers
  Params out = snapshot(m);
  for (auto& b : m.buffers()) out.push_back(host_copy(b));
  return out;
}

enum class Opt { SGD, AdamW };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt which, const std::vector<torch::Tensor>& params) {
  if (which == Opt::SGD)
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  // AdamW with PyTorch's default eps (1e-8). Its division by sqrt(v) + eps would amplify a
  // gradient that is only rounding noise, summed in another order on N ranks than in one
  // process, into a full +-lr step; the model's one such gradient (the attention's key bias)
  // is held at zero by TransformerLM itself (kit/models/transformer_lm.h), so no larger eps is
  // needed. Measured with it (2026-11-26, CPU, Gloo): worst relative difference from one process
  // over 5 steps, loss 8.4e-8 and parameters 6.8e-7 (N4_no_overlap; N2_overlap 5.6e-8 / 6.8e-7 for
  // loss / parameters): the 1e-5 of MatchesSingleProcessStepByStep leaves a factor 14.
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
}

// What one rank (or the reference) did, step by step.
struct History {
  std::vector<double> losses;
  std::vector<Params> params;               // after each step
  std::vector<std::vector<size_t>> batches;  // sample indices of each step
  int64_t forwards = 0, backwards = 0;
  kit::DDPStats stats;
  size_t first_buckets = 0;  // before the first backward (overlap rebuilds them after it)
  size_t buckets = 0;
  int64_t collectives = 0;  // what the rank's group actually ran (broadcasts and all-reduces)
};

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// Trains `model` for one epoch with batch `batch`, reading the shard of `sampler`; the training
// forward is `forward` (the model's own, or through its DDP wrapper).
void train(kit::TransformerLM& model, const Forward& forward, torch::optim::Optimizer& optimizer,
           const kit::DistributedSampler& sampler, int64_t batch, History& run) {
  RecordingDataset data{&dataset(), {}};
  kit::DataLoader<RecordingDataset> loader(data, static_cast<size_t>(batch), sampler);
  const torch::Device device = model->parameters().front().device();
  model->train();
  for (kit::Batch b : loader) {
    run.batches.emplace_back(data.seen.end() - b.input.size(0), data.seen.end());
    optimizer.zero_grad();
    auto loss = kit::lm_loss(forward(b.input.to(device)), b.target.to(device));
    ++run.forwards;
    loss.backward();
    ++run.backwards;
    optimizer.step();
    run.losses.push_back(loss.item<double>());
    run.params.push_back(snapshot(*model));
  }
}

History single_process(Opt opt) {
  torch::manual_seed(kModelSeed);
  kit::TransformerLM model(small_lm());
  model->to(device_of(0));
  auto optimizer = make_optimizer(opt, model->parameters());
  kit::DistributedSampler sampler(dataset().size(), /*shuffle=*/true, kSamplerSeed, 1, 0);
  History run;
  train(model, [&](const torch::Tensor& x) { return model->forward(x); }, *optimizer, sampler,
        kGlobalBatch, run);
  return run;
}

// Runs body(rank) for ranks 0..n-1, one thread each (the ranks of an in-process world must run
// at once: their collectives wait for each other). Returns each rank's exception text, "" if none.
std::vector<std::string> on_every_rank(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        // An NCCL rank's thread works on its own GPU, as a process per GPU would.
        std::optional<c10::DeviceGuard> on_gpu;
        if (device_of(r).is_cuda()) on_gpu.emplace(device_of(r));
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// N ranks, one thread each. Rank 0 starts from the reference's weights; the other ranks start
// from different random weights, which DDP's broadcast must overwrite.
std::vector<History> distributed(int n, bool overlap, Opt opt, size_t first_bucket, size_t cap) {
  std::vector<kit::TransformerLM> models;
  for (int r = 0; r < n; ++r) {
    torch::manual_seed(r == 0 ? kModelSeed : kModelSeed + 100 + r);
    models.emplace_back(small_lm());
    models.back()->to(device_of(r));
  }
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(30), g_backend);
  std::vector<History> runs(n);
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.overlap = overlap;
    o.group = groups[r].get();
    o.first_bucket_bytes = first_bucket;
    o.bucket_cap_bytes = cap;
    kit::DistributedDataParallel ddp(models[r], o);
    runs[r].first_buckets = ddp.buckets().size();
    auto optimizer = make_optimizer(opt, models[r]->parameters());
    kit::DistributedSampler sampler(dataset().size(), true, kSamplerSeed, n, r);
    sampler.set_epoch(0);
    train(models[r], [&](const torch::Tensor& x) { return ddp.forward(x); }, *optimizer, sampler,
          kGlobalBatch / n, runs[r]);
    runs[r].stats = ddp.stats();
    runs[r].buckets = ddp.buckets().size();
    runs[r].collectives = groups[r]->collectives();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return runs;
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  double scale = std::max(b.norm().item<double>(), 1e-12);
  return (a - b).norm().item<double>() / scale;
}

// ---------------------------------------------------------------------------------------------

struct Case {
  int n;
  bool overlap;
  Opt opt;
};

std::string name(const Case& c) {
  return "N" + std::to_string(c.n) + (c.overlap ? "_overlap_" : "_no_overlap_") +
         (c.opt == Opt::SGD ? "SGD" : "AdamW");
}
void PrintTo(const Case& c, std::ostream* os) { *os << name(c); }  // for gtest's messages

class Equivalence : public ::testing::TestWithParam<Case> {};

TEST_P(Equivalence, MatchesSingleProcessStepByStep) {
  const Case c = GetParam();
  if (const std::string why = cannot_run(c.n); !why.empty()) GTEST_SKIP() << why;
  const History ref = single_process(c.opt);
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps));
  // The test means something only if training moves: the loss changes and so do the weights.
  EXPECT_GT(std::abs(ref.losses.front() - ref.losses.back()), 1e-3);
  EXPECT_GT(relative(ref.params.back()[0], ref.params.front()[0]), 1e-4);

  // Small buckets: several all-reduces per step, started in order during backward.
  const std::vector<History> runs = distributed(c.n, c.overlap, c.opt, 2048, 8192);
  ASSERT_EQ(runs.size(), static_cast<size_t>(c.n));
  for (int r = 0; r < c.n; ++r) {
    ASSERT_EQ(runs[r].losses.size(), static_cast<size_t>(kSteps)) << "rank " << r;
    EXPECT_GE(runs[r].buckets, 3u) << "rank " << r;
  }

  double worst_loss = 0, worst_param = 0;
  for (int64_t k = 0; k < kSteps; ++k) {
    // The single-process loss is the mean over the global batch = the mean of the ranks' means
    // (equal batch sizes).
    double mean = 0;
    for (auto& run : runs) mean += run.losses[k] / c.n;
    double rel = std::abs(mean - ref.losses[k]) / std::abs(ref.losses[k]);
    worst_loss = std::max(worst_loss, rel);
    EXPECT_LE(rel, 1e-5) << "step " << k + 1 << ": ranks' mean loss " << mean << " vs " << ref.losses[k];

    const Params& p0 = runs[0].params[k];
    ASSERT_EQ(p0.size(), ref.params[k].size());
    for (size_t i = 0; i < p0.size(); ++i) {
      double d = relative(p0[i], ref.params[k][i]);
      worst_param = std::max(worst_param, d);
      EXPECT_LE(d, 1e-5) << "step " << k + 1 << ", parameter " << i;
      for (int r = 1; r < c.n; ++r)
        EXPECT_TRUE(torch::equal(runs[r].params[k][i], p0[i]))
            << "step " << k + 1 << ": rank " << r << "'s parameter " << i << " differs from rank 0's";
    }
  }
  RecordProperty("worst_loss_rel", std::to_string(worst_loss));
  RecordProperty("worst_param_rel", std::to_string(worst_param));
  std::printf("[ worst    ] loss %.2e, parameters %.2e (relative, over %ld steps)\n", worst_loss,
              worst_param, static_cast<long>(kSteps));
}

// Every rank really trains: it runs forward and backward on every step, its DDP reduced every
// step, and it reads its own samples. Per step the ranks' samples together are exactly the
// single process's global batch; over the epoch they are disjoint and cover the whole split.
TEST_P(Equivalence, EveryRankTrainsOnItsOwnShard) {
  const Case c = GetParam();
  if (const std::string why = cannot_run(c.n); !why.empty()) GTEST_SKIP() << why;
  const History ref = single_process(c.opt);
  const std::vector<History> runs = distributed(c.n, c.overlap, c.opt, 2048, 8192);
  std::map<size_t, int> owner;
  for (int r = 0; r < c.n; ++r) {
    const History& run = runs[r];
    EXPECT_EQ(run.forwards, kSteps) << "rank " << r;
    EXPECT_EQ(run.backwards, kSteps) << "rank " << r;
    EXPECT_EQ(run.stats.steps, kSteps) << "rank " << r << ": DDP did not reduce every backward";
    // Observed on the wire: the broadcast of the float32 weights at construction, then one
    // all-reduce per bucket per step, no more, no fewer; with overlap, the buckets are rebuilt
    // after step 1 (one broadcast of rank 0's gradient order) and may change in number. And each
    // step's forward through the wrapper broadcasts rank 0's buffers first (the positions'
    // table), as PyTorch's broadcast_buffers does: one broadcast a step.
    const int64_t rebuild = c.overlap ? 1 : 0;
    EXPECT_EQ(run.stats.rebuilt, c.overlap) << "rank " << r;
    if (!c.overlap) EXPECT_EQ(run.first_buckets, run.buckets) << "rank " << r;
    const int64_t all_reduces = static_cast<int64_t>(run.first_buckets) +
                                (kSteps - 1) * static_cast<int64_t>(run.buckets);
    EXPECT_EQ(run.stats.all_reduces, all_reduces) << "rank " << r;
    EXPECT_EQ(run.collectives, 1 + all_reduces + rebuild + kSteps)
        << "rank " << r << ": " << run.first_buckets << " buckets in step 1, " << run.buckets
        << " after it, " << kSteps << " steps";
    ASSERT_EQ(run.batches.size(), static_cast<size_t>(kSteps));
    for (auto& batch : run.batches) {
      EXPECT_EQ(batch.size(), static_cast<size_t>(kGlobalBatch / c.n));
      for (size_t i : batch) {
        auto [it, fresh] = owner.emplace(i, r);
        EXPECT_TRUE(fresh) << "sample " << i << " read by rank " << it->second << " and rank " << r;
      }
    }
  }
  EXPECT_EQ(owner.size(), dataset().size()) << "the ranks together did not read the whole split";
  for (int64_t k = 0; k < kSteps; ++k) {
    std::set<size_t> together;
    for (auto& run : runs) together.insert(run.batches[k].begin(), run.batches[k].end());
    EXPECT_EQ(together, std::set<size_t>(ref.batches[k].begin(), ref.batches[k].end())) << "step " << k + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(
    DDP, Equivalence,
    ::testing::Values(Case{2, true, Opt::SGD}, Case{2, false, Opt::SGD}, Case{4, true, Opt::SGD},
                      Case{4, false, Opt::SGD}, Case{2, true, Opt::AdamW}, Case{4, false, Opt::AdamW}),
    [](const auto& info) { return name(info.param); });

// The default bucket sizes (25 MiB: the whole model in one bucket) give the same result.
TEST(DDPDefaults, OneBucketMatchesSmallBuckets) {
  const auto one = distributed(2, true, Opt::SGD, 1u << 20, 25u << 20);
  const auto many = distributed(2, true, Opt::SGD, 2048, 8192);
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(many.size(), 2u);
  EXPECT_EQ(one[0].buckets, 1u);
  ASSERT_EQ(one[0].params.size(), many[0].params.size());
  for (size_t i = 0; i < one[0].params.back().size(); ++i)
    EXPECT_LE(relative(one[0].params.back()[i], many[0].params.back()[i]), 1e-6) << "parameter " << i;
}

// ---------------------------------------------------------------------------------------------
// The broadcast at construction
// ---------------------------------------------------------------------------------------------

class Broadcast : public ::testing::TestWithParam<int> {};

TEST_P(Broadcast, DifferentlyInitialisedReplicasBecomeRankZeros) {
  const int n = GetParam();
  if (const std::string why = cannot_run(n); !why.empty()) GTEST_SKIP() << why;
  std::vector<kit::TransformerLM> models;
  for (int r = 0; r < n; ++r) {
    torch::manual_seed(1000 + r);
    models.emplace_back(small_lm());
    torch::NoGradGuard no_grad;
    for (auto& b : models[r]->buffers()) b.add_(r);  // buffers differ too
    models[r]->to(device_of(r));
  }
  const Params rank0 = state(*models[0]);
  for (int r = 1; r < n; ++r) {
    Params mine = state(*models[r]);
    ASSERT_FALSE(torch::equal(mine[0], rank0[0])) << "replicas started equal: nothing to test";
    ASSERT_FALSE(torch::equal(mine.back(), rank0.back()));
  }

  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(30), g_backend);
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.group = groups[r].get();
    kit::DistributedDataParallel ddp(models[r], o);
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  for (int r = 0; r < n; ++r) {
    Params mine = state(*models[r]);
    ASSERT_EQ(mine.size(), rank0.size());
    for (size_t i = 0; i < mine.size(); ++i)
      EXPECT_TRUE(torch::equal(mine[i], rank0[i])) << "rank " << r << ", tensor " << i
                                                   << (r == 0 ? ": rank 0's own weights changed" : "");
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Broadcast, ::testing::Values(2, 4),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

// A float64 model with an int64 buffer: the broadcast must not round anything through float32
// (rank 0's own weights must stay bit-exact), and gradients are averaged in float64.
struct MixedImpl : torch::nn::Module {
  torch::Tensor w, counter;
  explicit MixedImpl(int seed) {
    torch::manual_seed(seed);
    w = register_parameter("w", torch::randn({7}, torch::kDouble));
    counter = register_buffer("counter", torch::tensor({(int64_t{1} << 40) + 1 + seed}, torch::kLong));
  }
};
TORCH_MODULE(Mixed);

TEST(BroadcastDtypes, Float64ParametersAndInt64BuffersSurviveBitExact) {
  const int n = 2;
  std::vector<Mixed> models{Mixed(1), Mixed(2)};
  const auto w0 = models[0]->w.detach().clone();
  const auto counter0 = models[0]->counter.clone();
  auto groups = kit::ProcessGroup::local_groups(n);
  std::vector<torch::Tensor> grads(n);
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.group = groups[r].get();
    kit::DistributedDataParallel ddp(models[r], o);
    // loss = (r + 1) * sum(w^2): local gradient 2 (r + 1) w, average 2 w (n + 1) / 2.
    auto loss = ddp.forward_with([&] { return (models[r]->w * models[r]->w).sum() * double(r + 1); });
    loss.backward();
    grads[r] = models[r]->w.grad().clone();
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(torch::equal(models[r]->counter, counter0))
        << "rank " << r << ": counter " << models[r]->counter.item<int64_t>() << " != "
        << counter0.item<int64_t>();
    EXPECT_TRUE(torch::equal(grads[r], w0 * double(n + 1))) << "rank " << r;
    // Compare after the gradient check: w itself was not updated (no optimizer).
    EXPECT_TRUE(torch::equal(models[r]->w.detach(), w0))
        << "rank " << r << ": max difference " << (models[r]->w.detach() - w0).abs().max().item<double>();
  }
}

// A parameter that gets no gradient (unused in forward). By default, as PyTorch's Reducer, that
// is one error naming it, on every rank, after the step's all-reduces (no rank left waiting).
struct PartlyUsedImpl : torch::nn::Module {
  torch::nn::Linear used{nullptr}, unused{nullptr};
  PartlyUsedImpl() {
    used = register_module("used", torch::nn::Linear(4, 3));
    unused = register_module("unused", torch::nn::Linear(4, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return used(x); }
};
TORCH_MODULE(PartlyUsed);

TEST(DDPUnusedParameters, ByDefaultBackwardFailsNamingThem) {
  const int n = 2;
  std::vector<PartlyUsed> models{PartlyUsed(), PartlyUsed()};
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(10));
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.group = groups[r].get();
    kit::DistributedDataParallel ddp(models[r], o);
    ddp.forward(torch::full({1, 4}, float(r + 1))).sum().backward();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[r].find("DistributedDataParallel: parameters 'unused.weight', 'unused.bias' "
                             "got no gradient in this backward"), std::string::npos)
        << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("find_unused_parameters = true"), std::string::npos) << errors[r];
  }
}

// The same mistake in a program: one line on stderr, exit 1 (the kit's terminate handler, which
// a trainer's flag parser or setup() installs: kit/runtime/process.h).
TEST(DDPUnusedParametersDeathTest, OneLineAndExitOne) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      [] {
        kit::prepare_process();
        struct OneUnusedImpl : torch::nn::Module {
          torch::Tensor w = register_parameter("w", torch::ones({2}));
          torch::Tensor idle = register_parameter("idle", torch::ones({2}));
        };
        auto model = std::make_shared<OneUnusedImpl>();
        auto groups = kit::ProcessGroup::local_groups(1, std::chrono::seconds(10));
        kit::DistributedDataParallel::Options o;
        o.group = groups[0].get();
        kit::DistributedDataParallel ddp(model, o);
        // uncaught: std::terminate
        [&]() noexcept { ddp.forward_with([&] { return (model->w * 2).sum(); }).backward(); }();
      }(),
      ::testing::ExitedWithCode(1),
      "^error: DistributedDataParallel: parameter 'idle' got no gradient in this backward[^\n]*"
      "find_unused_parameters = true[^\n]*\n$");
}

// With find_unused_parameters, as PyTorch: a parameter unused on this rank adds zeros to the
// average; one used on another rank gets the average; one unused on every rank keeps .grad
// undefined, so AdamW's weight decay leaves it where it was.
struct BranchesImpl : torch::nn::Module {
  torch::Tensor a, b, c;
  BranchesImpl() {
    a = register_parameter("a", torch::ones({3}));
    b = register_parameter("b", torch::ones({3}));
    c = register_parameter("c", torch::ones({3}));
  }
  // a on every rank, b on rank 1 only, c nowhere.
  torch::Tensor forward(const torch::Tensor& x, int rank) {
    return rank == 1 ? (x * a).sum() + (x * b).sum() : (x * a).sum();
  }
};
TORCH_MODULE(Branches);

TEST(DDPUnusedParameters, FindUnusedLeavesTheirGradUndefinedAndAveragesTheRest) {
  const int n = 2;
  for (bool overlap : {true, false}) {
    std::vector<Branches> models{Branches(), Branches()};
    auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(10));
    std::vector<std::vector<torch::Tensor>> grads(n);
    auto errors = on_every_rank(n, [&](int r) {
      kit::DistributedDataParallel::Options o;
      o.group = groups[r].get();
      o.overlap = overlap;
      o.find_unused_parameters = true;
      kit::DistributedDataParallel ddp(models[r], o);
      torch::optim::AdamW optimizer(models[r]->parameters(), torch::optim::AdamWOptions(0.1).weight_decay(0.5));
      for (int step = 1; step <= 2; ++step) {
        optimizer.zero_grad();
        // rank r's input is all (r + 1): d/da = r + 1, average 1.5; d/db = 2 on rank 1, average 1.
        ddp.forward_with([&] { return models[r]->forward(torch::full({3}, float(r + 1)), r); }).backward();
        grads[r] = {models[r]->a.grad(), models[r]->b.grad(), models[r]->c.grad()};
        EXPECT_TRUE(grads[r][0].defined() && torch::allclose(grads[r][0], torch::full({3}, 1.5f)))
            << "rank " << r << ", step " << step;
        EXPECT_TRUE(grads[r][1].defined() && torch::allclose(grads[r][1], torch::full({3}, 1.0f)))
            << "rank " << r << ", step " << step << ": b, used on rank 1 only";
        EXPECT_FALSE(grads[r][2].defined()) << "rank " << r << ", step " << step << ": c, used nowhere, "
                                            << "has the gradient " << grads[r][2];
        optimizer.step();
      }
    });
    for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(torch::equal(models[r]->c.detach(), torch::ones({3})))
          << "overlap " << overlap << ", rank " << r << ": c moved to " << models[r]->c;
  }
}

// A second gradient for one parameter in one backward: what reentrant activation checkpointing
// does when it recomputes a block twice. The function below keeps its weight out of the outer
// graph and runs a backward of its own for it, as a reentrant checkpoint does.
struct Recompute : torch::autograd::Function<Recompute> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h,
                               const torch::Tensor& w) {
    ctx->saved_data["w"] = w;
    ctx->save_for_backward({h});
    return h * w.detach();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto h = ctx->get_saved_variables()[0].detach();
    auto w = ctx->saved_data["w"].toTensor();
    torch::AutoGradMode on(true);
    torch::autograd::backward({h * w}, {grad[0]});  // w's gradient, in a nested backward
    return {grad[0] * w.detach(), torch::Tensor()};
  }
};

struct ReentrantImpl : torch::nn::Module {
  torch::Tensor v, w, u;
  ReentrantImpl() {
    v = register_parameter("v", torch::ones({2}));
    w = register_parameter("w", torch::ones({2}));
    u = register_parameter("u", torch::ones({2}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x * v;
    // u last: its gradient arrives first, in the outer backward.
    return (Recompute::apply(h, w) + Recompute::apply(h, w)).sum() + (x * u).sum();
  }
};
TORCH_MODULE(Reentrant);

TEST(DDPReadyTwice, SecondGradientInOneBackwardIsAnErrorNamingTheParameter) {
  const int n = 2;
  std::vector<Reentrant> models{Reentrant(), Reentrant()};
  // Without DDP the same backward is fine: w gets both contributions.
  {
    Reentrant plain;
    plain->forward(torch::full({2}, 3.0f)).backward();
    ASSERT_TRUE(torch::allclose(plain->w.grad(), torch::full({2}, 6.0f))) << plain->w.grad();
  }
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(10));
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.group = groups[r].get();
    kit::DistributedDataParallel ddp(models[r], o);
    ddp.forward(torch::full({2}, 3.0f)).backward();
  });
  for (int r = 0; r < n; ++r)
    EXPECT_NE(errors[r].find("DistributedDataParallel: parameter 'w' got its gradient twice in one "
                             "backward"), std::string::npos)
        << "rank " << r << ": " << errors[r];
}

// broadcast_buffers: a forward through the wrapper starts from rank 0's buffers, as PyTorch's
// ddp(x). The probe's buffer moves by rank + 1 at every forward (as batch norm's statistics move
// by each rank's own batch) and records what it found. PyTorch's rule for when: the previous
// forward through the wrapper ran with gradients (and outside no_sync).
struct ProbeImpl : torch::nn::Module {
  torch::Tensor w, level;
  int rank;
  std::vector<float> seen;
  explicit ProbeImpl(int r) : rank(r) {
    w = register_parameter("w", torch::ones({1}));
    level = register_buffer("level", torch::zeros({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    seen.push_back(level.item<float>());
    level.add_(rank + 1);
    return x * w;
  }
};
TORCH_MODULE(Probe);

TEST(DDPBuffers, RankZerosBuffersAtEachForwardAsPyTorch) {
  const int n = 2;
  for (bool broadcast : {true, false}) {
    std::vector<Probe> models{Probe(0), Probe(1)};
    auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(10));
    auto errors = on_every_rank(n, [&](int r) {
      kit::DistributedDataParallel::Options o;
      o.group = groups[r].get();
      o.broadcast_buffers = broadcast;
      kit::DistributedDataParallel ddp(models[r], o);
      for (int step = 0; step < 3; ++step) ddp.forward(torch::ones({1})).sum().backward();
      torch::NoGradGuard no_grad;  // evaluation: two forwards without gradients
      ddp.forward(torch::ones({1}));
      ddp.forward(torch::ones({1}));
      torch::AutoGradMode train(true);
      ddp.forward(torch::ones({1})).sum().backward();
    });
    for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(models[0]->seen, (std::vector<float>{0, 1, 2, 3, 4, 5}));
    // Rank 1 (+2 per forward): rank 0's value at the 3 training forwards and at the first
    // evaluation forward (the previous one had gradients); its own after a forward without.
    const std::vector<float> want = broadcast ? std::vector<float>{0, 1, 2, 3, 5, 7}
                                              : std::vector<float>{0, 2, 4, 6, 8, 10};
    EXPECT_EQ(models[1]->seen, want) << "broadcast_buffers " << broadcast;
  }
}

// A sampler made before setup() with the default num_replicas and rank would give every process
// the whole dataset; PyTorch's raises, and so does the kit's. Explicit ones need no setup().
TEST(DistributedSamplerSetup, DefaultsBeforeSetupAreAnError) {
  try {
    kit::DistributedSampler sampler(size_t{10});
    FAIL() << "made before setup(), it covers " << sampler.size() << " of 10 samples on rank "
           << sampler.rank() << " of " << sampler.num_replicas();
  } catch (const c10::Error& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()).rfind(
                  "DistributedSampler: made before kit::setup(), so every rank would take the whole "
                  "dataset: call setup() first, or pass num_replicas and rank", 0), 0u)
        << e.what_without_backtrace();
  }
  EXPECT_EQ(kit::DistributedSampler(10, false, 0, 2, 1).indices(), (std::vector<size_t>{1, 3, 5, 7, 9}));
}

// Gradient accumulation with no_sync(): each rank splits its share of the global batch into
// micro-batches, backward on all but the last stays local, the last one averages the sum. The
// result must equal one process on the whole global batch, with one all-reduce round per step.
TEST(DDPNoSync, AccumulatedMicroBatchesMatchTheWholeBatch) {
  const int n = 2, micro = 2;
  const History ref = single_process(Opt::SGD);
  std::vector<kit::TransformerLM> models;
  for (int r = 0; r < n; ++r) {
    torch::manual_seed(r == 0 ? kModelSeed : kModelSeed + 100 + r);
    models.emplace_back(small_lm());
  }
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(30));
  std::vector<History> runs(n);
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.group = groups[r].get();
    kit::DistributedDataParallel ddp(models[r], o);
    auto optimizer = make_optimizer(Opt::SGD, models[r]->parameters());
    kit::DistributedSampler sampler(dataset().size(), true, kSamplerSeed, n, r);
    sampler.set_epoch(0);
    kit::DataLoader<kit::LanguageModelDataset> loader(dataset(), kGlobalBatch / n, sampler);
    for (kit::Batch b : loader) {
      optimizer->zero_grad();
      const int64_t part = b.input.size(0) / micro;
      const int64_t calls_before = groups[r]->collectives();
      for (int k = 0; k < micro; ++k) {
        auto x = b.input.narrow(0, k * part, part), y = b.target.narrow(0, k * part, part);
        // Each micro-batch's mean loss, scaled so that the sum is the mean over the rank's batch.
        // Forward and backward inside the guard: the forward is what reads it (PyTorch's rule).
        if (k + 1 < micro) {
          auto quiet = ddp.no_sync();
          // The forward may broadcast the buffers (at a step's first micro-batch, as PyTorch's);
          // the backward must not communicate.
          auto loss = kit::lm_loss(ddp.forward(x), y) / micro;
          const int64_t before_backward = groups[r]->collectives();
          loss.backward();
          EXPECT_EQ(groups[r]->collectives(), before_backward) << "no_sync backward communicated";
        } else {
          (kit::lm_loss(ddp.forward(x), y) / micro).backward();
        }
      }
      EXPECT_GT(groups[r]->collectives(), calls_before) << "the last micro-batch did not reduce";
      optimizer->step();
      runs[r].params.push_back(snapshot(*models[r]));
    }
    EXPECT_EQ(ddp.stats().steps, kSteps) << "one averaging per optimizer step, not per micro-batch";
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  ASSERT_EQ(runs[0].params.size(), ref.params.size());
  for (size_t k = 0; k < ref.params.size(); ++k)
    for (size_t i = 0; i < ref.params[k].size(); ++i) {
      EXPECT_LE(relative(runs[0].params[k][i], ref.params[k][i]), 1e-5)
          << "step " << k + 1 << ", parameter " << i;
      EXPECT_TRUE(torch::equal(runs[1].params[k][i], runs[0].params[k][i]))
          << "ranks differ at step " << k + 1 << ", parameter " << i;
    }
}


// PyTorch reads no_sync() at the FORWARD (its forward calls prepare_for_backward, or not): so do
// the kit's. Rank r's input is all (r + 1), so d(sum(W x + b))/dW is (r + 1) everywhere on rank
// r, and its average over 2 ranks 1.5.
std::vector<torch::nn::Linear> two_linears() {
  torch::manual_seed(3);
  return {torch::nn::Linear(3, 2), torch::nn::Linear(3, 2)};
}

// The old idiom: a forward outside the guard, its backward inside. PyTorch averages that backward
// (the forward prepared it), and so does the kit; and a forward inside the guard with its
// backward outside stays local.
TEST(DDPNoSync, TheGuardIsReadByTheForwardAsInPyTorch) {
  const int n = 2;
  auto models = two_linears();
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(10));
  std::vector<torch::Tensor> averaged(n), local(n);
  std::vector<int64_t> averaged_calls(n), local_calls(n);
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.group = groups[r].get();
    kit::DistributedDataParallel ddp(models[r], o);
    const auto x = torch::full({1, 3}, float(r + 1));
    int64_t before = groups[r]->collectives();
    auto out = ddp.forward(x).sum();  // outside the guard: prepares an averaged backward
    {
      auto quiet = ddp.no_sync();
      out.backward();
    }
    averaged_calls[r] = groups[r]->collectives() - before;
    averaged[r] = models[r]->weight.grad().clone();
    models[r]->zero_grad();
    before = groups[r]->collectives();
    torch::Tensor out2;
    {
      auto quiet = ddp.no_sync();
      out2 = ddp.forward(x).sum();  // inside the guard: prepares a local backward
    }
    out2.backward();
    local_calls[r] = groups[r]->collectives() - before;
    local[r] = models[r]->weight.grad().clone();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_GT(averaged_calls[r], 0) << "rank " << r << ": the forward outside no_sync() did not "
                                    << "prepare an averaged backward";
    EXPECT_TRUE(torch::allclose(averaged[r], torch::full({2, 3}, 1.5f))) << averaged[r];
    EXPECT_EQ(local_calls[r], 0) << "rank " << r << ": a forward inside no_sync() was averaged";
    EXPECT_TRUE(torch::equal(local[r], torch::full({2, 3}, float(r + 1)))) << local[r];
  }
}

// A backward whose forward went around the wrapper: PyTorch's DDP does not average it, silently,
// and the replicas drift apart. The kit refuses it on every rank, naming a parameter and the
// fix, before any collective; the same DDP object then works through ddp.forward.
TEST(DDPForward, ABackwardOfAForwardAroundTheWrapperIsRefused) {
  const int n = 2;
  auto models = two_linears();
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(10));
  std::vector<std::string> refused(n);
  std::vector<int64_t> calls(n);
  std::vector<torch::Tensor> after(n);
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.group = groups[r].get();
    kit::DistributedDataParallel ddp(models[r], o);
    const auto x = torch::full({1, 3}, float(r + 1));
    const int64_t before = groups[r]->collectives();
    try {
      models[r]->forward(x).sum().backward();
    } catch (const c10::Error& e) {
      refused[r] = e.what_without_backtrace();
    }
    calls[r] = groups[r]->collectives() - before;
    models[r]->zero_grad();
    ddp.forward(x).sum().backward();
    after[r] = models[r]->weight.grad().clone();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(refused[r].rfind("DistributedDataParallel (ddp_test.cpp:", 0), 0u)
        << "rank " << r << ": " << refused[r];
    EXPECT_NE(refused[r].find("): a backward reached parameter '"), std::string::npos) << refused[r];
    EXPECT_NE(refused[r].find("PyTorch's DDP would not average these gradients"), std::string::npos)
        << refused[r];
    EXPECT_NE(refused[r].find("ddp.forward(x)"), std::string::npos) << refused[r];
    EXPECT_EQ(refused[r].find('\n'), std::string::npos) << "not one line: " << refused[r];
    EXPECT_EQ(calls[r], 0) << "rank " << r << ": the refused backward communicated";
    EXPECT_TRUE(torch::allclose(after[r], torch::full({2, 3}, 1.5f))) << after[r];
  }
}

// broadcast_buffers with gradient accumulation: with the forwards inside no_sync(), rank 0's
// buffers are copied once per averaged step (at its first micro-batch), as PyTorch does; not at
// every micro-batch, which is what forwards outside the guard would do.
TEST(DDPBuffers, OncePerAveragedStepWhenTheForwardsAreInsideNoSync) {
  const int n = 2, micro = 3;
  std::vector<Probe> models{Probe(0), Probe(1)};
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(10));
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.group = groups[r].get();
    kit::DistributedDataParallel ddp(models[r], o);
    for (int step = 0; step < 2; ++step)
      for (int k = 0; k < micro; ++k) {
        if (k + 1 < micro) {
          auto quiet = ddp.no_sync();
          ddp.forward(torch::ones({1})).sum().backward();
        } else {
          ddp.forward(torch::ones({1})).sum().backward();
        }
      }
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  EXPECT_EQ(models[0]->seen, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  // Rank 1 moves by 2 a forward and takes rank 0's value at each step's first micro-batch only.
  EXPECT_EQ(models[1]->seen, (std::vector<float>{0, 2, 4, 3, 5, 7}));
}

// find_unused_parameters counts the no_sync() micro-steps, as PyTorch's local_used_map: b is
// used on rank 1 in the first micro-batch only (inside no_sync()), by no rank in the second. Both
// ranks must end the step with b's averaged gradient and step it alike. (Counting only the
// averaged backward, rank 1 kept its own gradient of b and rank 0 none: AdamW moved b on rank 1
// only, and the replicas drifted apart.)
struct SwitchImpl : torch::nn::Module {
  torch::Tensor a, b;
  SwitchImpl() {
    a = register_parameter("a", torch::ones({3}));
    b = register_parameter("b", torch::ones({3}));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_b) {
    return use_b ? (x * a).sum() + (x * b).sum() : (x * a).sum();
  }
};
TORCH_MODULE(Switch);

TEST(DDPUnusedParameters, AUseInAnEarlierMicroBatchOnOneRankKeepsTheReplicasEqual) {
  const int n = 2;
  for (bool overlap : {true, false}) {
    std::vector<Switch> models{Switch(), Switch()};
    auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(10));
    std::vector<torch::Tensor> grad_b(n), grad_a(n);
    auto errors = on_every_rank(n, [&](int r) {
      kit::DistributedDataParallel::Options o;
      o.group = groups[r].get();
      o.overlap = overlap;
      o.find_unused_parameters = true;
      kit::DistributedDataParallel ddp(models[r], o);
      torch::optim::AdamW optimizer(models[r]->parameters(),
                                    torch::optim::AdamWOptions(0.1).weight_decay(0.5));
      const auto x = torch::full({3}, float(r + 1));
      optimizer.zero_grad();
      {
        auto quiet = ddp.no_sync();
        ddp.forward_with([&] { return models[r]->forward(x, /*use_b=*/r == 1); }).backward();
      }
      ddp.forward_with([&] { return models[r]->forward(x, /*use_b=*/false); }).backward();
      grad_a[r] = models[r]->a.grad().defined() ? models[r]->a.grad().clone() : torch::Tensor();
      grad_b[r] = models[r]->b.grad().defined() ? models[r]->b.grad().clone() : torch::Tensor();
      optimizer.step();
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(errors[r], "") << "rank " << r;
      // a: (r + 1) per micro-batch, two of them: 2 and 4, average 3. b: 2 on rank 1, average 1.
      EXPECT_TRUE(grad_a[r].defined() && torch::allclose(grad_a[r], torch::full({3}, 3.0f)))
          << "overlap " << overlap << ", rank " << r;
      EXPECT_TRUE(grad_b[r].defined() && torch::allclose(grad_b[r], torch::full({3}, 1.0f)))
          << "overlap " << overlap << ", rank " << r << ": b's gradient "
          << (grad_b[r].defined() ? "is not the average" : "is undefined");
    }
    EXPECT_TRUE(torch::equal(models[0]->b.detach(), models[1]->b.detach()))
        << "overlap " << overlap << ": the replicas of b differ: " << models[0]->b << " vs "
        << models[1]->b;
  }
}

// A gradient hook that fires without a gradient is not a use (PyTorch: "hooks can be fired with
// undefined grads"): c is an input of a function that gives it no gradient, on every rank, so
// under find_unused_parameters c.grad stays undefined and AdamW's weight decay leaves c alone.
struct NoGradientFor : torch::autograd::Function<NoGradientFor> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x,
                               const torch::Tensor& c) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grad) {
    return {grad[0], torch::Tensor()};
  }
};

struct SkipsImpl : torch::nn::Module {
  torch::Tensor a, c;
  SkipsImpl() {
    a = register_parameter("a", torch::ones({3}));
    c = register_parameter("c", torch::ones({3}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return NoGradientFor::apply(x * a, c).sum(); }
};
TORCH_MODULE(Skips);

TEST(DDPUnusedParameters, AHookWithoutAGradientIsNotAUse) {
  const int n = 2;
  std::vector<Skips> models{Skips(), Skips()};
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(10));
  std::vector<bool> c_grad(n, true);
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.group = groups[r].get();
    o.find_unused_parameters = true;
    kit::DistributedDataParallel ddp(models[r], o);
    torch::optim::AdamW optimizer(models[r]->parameters(),
                                  torch::optim::AdamWOptions(0.1).weight_decay(0.5));
    optimizer.zero_grad();
    ddp.forward(torch::full({3}, float(r + 1))).backward();
    c_grad[r] = models[r]->c.grad().defined();
    optimizer.step();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_FALSE(c_grad[r]) << "rank " << r << ": c got a gradient from a hook that had none";
    EXPECT_TRUE(torch::equal(models[r]->c.detach(), torch::ones({3})))
        << "rank " << r << ": c moved to " << models[r]->c;
  }
}

// Batch norm under DDP (exercise 02). In training mode a batch-norm layer normalises with the
// statistics of the batch it is given, and each rank is given only its own b images. So N ranks
// with b images each are NOT one process with a batch of N x b: they are one process that
// accumulates N micro-batches of b (one forward and backward per micro-batch, each loss / N, one
// optimizer step). That is what must be equal: the weights after every step (gradients are
// averaged, and the mean of the ranks' gradients of their mean losses is the gradient of the sum
// of the micro-batches' losses / N).
// What is not equal: the running statistics (buffers; DDP averages gradients, not buffers). Each
// rank updates its own, once per step, from its own b images; the accumulating process updates
// its one set N times per step. Rank 0 saves its own unless the trainer averages them first
// (exercise 02, TODO 13). For the first batch-norm layer after the first step, the ranks' average
// running mean is exactly that of one forward of the whole N x b batch (the update is linear in
// the batch mean, and the layer's input does not depend on any normalisation yet).
TEST(DDPBatchNorm, NRanksEqualOneProcessAccumulatingMicroBatches) {
  const int n = 2;
  const int64_t b = 4, steps = 3;
  const kit::ResNetOptions options{.width = 4, .blocks = 1, .classes = 10};
  torch::manual_seed(7);
  const auto images = torch::randn({steps * n * b, 3, 8, 8});
  const auto labels = torch::randint(0, 10, {steps * n * b}, torch::kLong);
  // Step s, micro-batch (or rank) r: images [(s * n + r) * b, +b).
  auto part = [&](const torch::Tensor& t, int64_t s, int64_t r) { return t.narrow(0, (s * n + r) * b, b); };
  auto loss_of = [](kit::ResNet& m, const torch::Tensor& x, const torch::Tensor& y) {
    return torch::nn::functional::cross_entropy(m->forward(x), y);
  };
  auto stem_mean = [](const kit::ResNet& m) { return host_copy(m->named_buffers()["stem_bn.running_mean"]); };
  auto make = [&] { torch::manual_seed(kModelSeed); return kit::ResNet(options); };

  // One process accumulating n micro-batches per step.
  kit::ResNet ref = make();
  auto ref_optimizer = make_optimizer(Opt::SGD, ref->parameters());
  std::vector<Params> ref_params;
  torch::Tensor ref_stem_after_1;
  for (int64_t s = 0; s < steps; ++s) {
    ref_optimizer->zero_grad();
    for (int r = 0; r < n; ++r) (loss_of(ref, part(images, s, r), part(labels, s, r)) / n).backward();
    ref_optimizer->step();
    ref_params.push_back(snapshot(*ref));
    if (s == 0) ref_stem_after_1 = stem_mean(ref);
  }
  // One forward of the whole first global batch, from the same initial weights.
  kit::ResNet whole = make();
  loss_of(whole, images.narrow(0, 0, n * b), labels.narrow(0, 0, n * b));

  // n ranks, each with b images per step.
  std::vector<kit::ResNet> models;
  for (int r = 0; r < n; ++r) models.push_back(make());
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(30));
  std::vector<std::vector<Params>> params(n);
  std::vector<torch::Tensor> stem_after_1(n);
  auto errors = on_every_rank(n, [&](int r) {
    kit::DistributedDataParallel::Options o;
    o.group = groups[r].get();
    kit::DistributedDataParallel ddp(models[r], o);
    auto optimizer = make_optimizer(Opt::SGD, models[r]->parameters());
    for (int64_t s = 0; s < steps; ++s) {
      optimizer->zero_grad();
      const auto x = part(images, s, r), y = part(labels, s, r);
      torch::nn::functional::cross_entropy(ddp.forward(x), y).backward();
      optimizer->step();
      params[r].push_back(snapshot(*models[r]));
      if (s == 0) stem_after_1[r] = stem_mean(models[r]);
    }
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  for (int64_t s = 0; s < steps; ++s)
    for (size_t i = 0; i < ref_params[s].size(); ++i) {
      EXPECT_LE(relative(params[0][s][i], ref_params[s][i]), 1e-5) << "step " << s + 1 << ", parameter " << i;
      EXPECT_TRUE(torch::equal(params[1][s][i], params[0][s][i])) << "ranks differ at step " << s + 1;
    }
  // The running statistics: each rank's own, from its own images.
  EXPECT_FALSE(torch::allclose(stem_after_1[0], stem_after_1[1])) << "the ranks' running means agree";
  const auto average = (stem_after_1[0] + stem_after_1[1]) / 2;
  EXPECT_LE(relative(average, stem_mean(whole)), 1e-5) << "average over ranks != whole-batch forward";
  // The accumulating process moved its running mean twice (momentum applied per micro-batch).
  EXPECT_GT(relative(ref_stem_after_1, stem_mean(whole)), 1e-3);
}

}  // namespace

int main(int argc, char** argv) {
  // Process-global: set once, before any rank thread exists. One intra-op thread per rank keeps
  // 4 ranks on 2 cores from oversubscribing, and keeps the arithmetic order fixed.
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);  // takes the --gtest_* flags out of argv
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--backend=gloo" || arg == "--backend=nccl") {
      g_backend = arg.substr(std::string("--backend=").size());
    } else {
      std::fprintf(stderr, "ddp_tests: unknown argument '%s' (gtest's flags, --backend=gloo|nccl)\n",
                   arg.c_str());
      return 2;
    }
  }
  // Only the Equivalence and Broadcast cases are written for NCCL; the others stay Gloo tests.
  // The same pattern selects the gpu.ddp.* tests in CTest (tests/ddp/CMakeLists.txt).
  if (g_backend == "nccl" && GTEST_FLAG_GET(filter) == "*") GTEST_FLAG_SET(filter, KIT_DDP_NCCL_CASES);
  return RUN_ALL_TESTS();
}
