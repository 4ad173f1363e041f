// DistributedDataParallel and its gradients, rank by rank against one process (issue 14 and the
// partial-gradient bug of issue 16):
//
//   * a parameter that takes part in some steps and not in others (a layer used in step 1,
//     skipped in step 2, used again in step 3), with find_unused_parameters: in step 2 every rank
//     must end backward with what one process has, no gradient after zero_grad() to none (not
//     zeros, which weight decay and momentum would act on) and zeros after zero_grad(false),
//     never with the gradient of step 1 that its place in the bucket still holds;
//   * assign_buckets(): which gradients travel together (kit/ddp/buckets.h);
//   * after backward, every .grad is a window on its bucket (nothing copied into or out of
//     buckets): the gradients of one bucket lie back to back in one block, in the bucket's order,
//     and zero_grad(false) keeps them there from step to step with nothing copied;
//   * with overlap, the buckets are rebuilt after the first backward in the order the gradients
//     arrived, rank 0's order on every rank, even when another rank saw another order;
//   * zero_grad (to none, to zero, the module's own) and optimizers with state (SGD with
//     momentum, AdamW) train exactly as one process on the whole batch;
//   * checkpoints hold the same tensors as without DDP, and load back bit for bit.
//
// The ranks are threads of this process, each with its own model copy and its own
// kit::ProcessGroup from ProcessGroup::local_groups(), passed explicitly (DDP Options::group).
// One file, one binary: each translation unit that includes <torch/torch.h> costs ~20 s to build.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <numeric>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/ddp/buckets.h"
#include "kit/train/checkpoint.h"
#include "kit/ddp/ddp.h"
#include "kit/runtime/process_group.h"

namespace {

constexpr int kRanks = 2, kSteps = 3;
constexpr int64_t kPerRank = 2, kIn = 3, kOut = 2;
const bool kUseB[kSteps] = {true, false, true};  // whether steps 1, 2, 3 use the layer b

// y = a(x) + b(x) when b is switched on, a(x) alone otherwise: b gets no gradient in a step that
// leaves it out, as a branch of a model taken only for some inputs.
struct TwoPathsImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  TwoPathsImpl() {
    a = register_module("a", torch::nn::Linear(kIn, kOut));
    b = register_module("b", torch::nn::Linear(kIn, kOut));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_b) { return use_b ? a(x) + b(x) : a(x); }
};
TORCH_MODULE(TwoPaths);


// The global batch of each step; rank r trains on rows [r * kPerRank, (r + 1) * kPerRank).
// Drawn once, before any rank thread starts (on_ranks() makes sure): torch's random generator is
// shared by the threads.
const torch::Tensor& global_batch(int step) {
  static const std::vector<torch::Tensor> batches = [] {
    torch::manual_seed(1000);
    std::vector<torch::Tensor> out;
    for (int s = 0; s < kSteps; ++s) out.push_back(torch::randn({kRanks * kPerRank, kIn}));
    return out;
  }();
  return batches.at(static_cast<size_t>(step));
}
torch::Tensor shard(int step, int rank) { return global_batch(step).narrow(0, rank * kPerRank, kPerRank); }

// body(rank, its group) on kRanks threads; each rank's exception text, "" if none.
std::vector<std::string> on_ranks(const std::function<void(int, kit::ProcessGroup&)>& body) {
  global_batch(0);
  auto groups = kit::ProcessGroup::local_groups(kRanks, std::chrono::seconds(20));
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r, *groups[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// The loss of a step; under DDP its forward goes through the wrapper (ddp), as a trainer's must.
torch::Tensor loss_of(TwoPaths& model, const torch::Tensor& x, bool use_b,
                      kit::DistributedDataParallel* ddp = nullptr) {
  auto out = [&] { return model->forward(x, use_b); };
  return (ddp ? ddp->forward_with(out) : out()).pow(2).mean();
}

// A gradient as a tensor: an undefined one (no gradient at all) counts as zeros, which is how an
// optimizer without momentum treats both.
torch::Tensor dense(const torch::Tensor& grad, const torch::Tensor& param) {
  return grad.defined() ? grad.detach().clone() : torch::zeros_like(param);
}

struct Step {
  std::vector<torch::Tensor> grads;   // after backward, one per parameter (dense)
  std::vector<bool> defined;          // whether .grad was defined after backward
  std::vector<torch::Tensor> params;  // after the optimizer step
};

void train(TwoPaths& model, const std::function<torch::Tensor(int)>& batch, bool set_to_none,
           std::vector<Step>& steps, kit::DistributedDataParallel* ddp = nullptr) {
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < kSteps; ++s) {
    optimizer.zero_grad(set_to_none);
    loss_of(model, batch(s), kUseB[s], ddp).backward();
    Step out;
    for (auto& p : model->parameters()) {
      out.grads.push_back(dense(p.grad(), p));
      out.defined.push_back(p.grad().defined());
    }
    optimizer.step();
    for (auto& p : model->parameters()) out.params.push_back(p.detach().clone());
    steps.push_back(std::move(out));
  }
}

struct Case {
  bool overlap;
  bool set_to_none;  // optimizer.zero_grad(set_to_none)
  bool one_bucket;   // a and b share one bucket, or each parameter gets its own
};

void PrintTo(const Case& c, std::ostream* os) {  // for CTest's test names
  *os << "overlap=" << c.overlap << " set_to_none=" << c.set_to_none << " one_bucket=" << c.one_bucket;
}

std::string name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.overlap ? "Overlap" : "AfterBackward") +
         (c.set_to_none ? "_GradsToNone" : "_GradsToZero") + (c.one_bucket ? "_OneBucket" : "_SmallBuckets");
}

class PartialGradients : public ::testing::TestWithParam<Case> {};

TEST_P(PartialGradients, ParameterSkippedInStepTwoGetsNoGradientThere) {
  const Case c = GetParam();
  torch::manual_seed(7);
  TwoPaths reference;
  std::vector<TwoPaths> models;
  for (int r = 0; r < kRanks; ++r) {
    models.emplace_back();
    // Rank 0 starts from the reference's weights, the others from their own: DDP's broadcast
    // must make them all rank 0's.
    torch::NoGradGuard no_grad;
    if (r == 0)
      for (size_t i = 0; i < reference->parameters().size(); ++i)
        models[0]->parameters()[i].copy_(reference->parameters()[i]);
  }

  std::vector<Step> want;
  train(reference, [](int s) { return global_batch(s); }, c.set_to_none, want);

  std::vector<std::vector<Step>> got(kRanks);
  auto errors = on_ranks([&](int r, kit::ProcessGroup& g) {
    kit::DistributedDataParallel::Options o;
    o.overlap = c.overlap;
    o.group = &g;
    o.find_unused_parameters = true;  // b sits out step 2
    if (!c.one_bucket) o.first_bucket_bytes = o.bucket_cap_bytes = 1;  // one per parameter
    kit::DistributedDataParallel ddp(models[r], o);
    train(models[r], [r](int s) { return shard(s, r); }, c.set_to_none, got[r], &ddp);
    EXPECT_EQ(ddp.stats().steps, kSteps) << "rank " << r;
    EXPECT_EQ(ddp.buckets().size(), c.one_bucket ? 1u : 4u) << "rank " << r;
  });
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  // parameters(): a.weight, a.bias, b.weight, b.bias.
  const std::vector<std::string> names = {"a.weight", "a.bias", "b.weight", "b.bias"};
  // The test only bites if b's gradient in step 1 is far from zero (a stale copy would show)
  // and one process really gives b no gradient in step 2.
  for (size_t i : {2, 3}) {
    ASSERT_GT(want[0].grads[i].abs().max().item<double>(), 1e-3) << names[i];
    ASSERT_EQ(want[1].defined[i], !c.set_to_none) << names[i];
    ASSERT_EQ(want[1].grads[i].abs().max().item<double>(), 0.0) << names[i];
  }
  for (int r = 0; r < kRanks; ++r)
    for (int s = 0; s < kSteps; ++s)
      for (size_t i = 0; i < names.size(); ++i) {
        const auto& g = got[r][s].grads[i];
        const auto& w = want[s].grads[i];
        EXPECT_EQ(got[r][s].defined[i], want[s].defined[i])
            << "rank " << r << ", step " << s + 1 << ", " << names[i] << ": .grad defined";
        if (s == 1 && i >= 2) {
          // Exactly zero, not merely small: a stale gradient would be step 1's.
          EXPECT_EQ(g.abs().max().item<double>(), 0.0)
              << "rank " << r << ", step 2: " << names[i] << " was not used, yet its gradient is\n"
              << g << "\n(step 1's was\n" << got[r][0].grads[i] << ")";
        } else {
          EXPECT_TRUE(torch::allclose(g, w, 1e-5, 1e-6))
              << "rank " << r << ", step " << s + 1 << ", " << names[i] << ": " << g << " vs " << w;
        }
        EXPECT_TRUE(torch::allclose(got[r][s].params[i], want[s].params[i], 1e-5, 1e-6))
            << "rank " << r << ", after step " << s + 1 << ", " << names[i];
      }
}

INSTANTIATE_TEST_SUITE_P(
    DDP, PartialGradients,
    ::testing::Values(Case{true, true, true}, Case{true, false, true}, Case{false, true, true},
                      Case{false, false, true}, Case{true, true, false}, Case{false, false, false}),
    name);


// ---------------------------------------------------------------------------------------------
// assign_buckets()
// ---------------------------------------------------------------------------------------------

size_t total(const std::vector<size_t>& bytes, const std::vector<size_t>& bucket) {
  size_t s = 0;
  for (size_t i : bucket) s += bytes[i];
  return s;
}

TEST(AssignBuckets, EmptyModelHasNoBuckets) {
  EXPECT_TRUE(kit::assign_buckets({}, 100, 1000).empty());
}

TEST(AssignBuckets, ReverseOrderInOneBucketWhenEverythingFits) {
  auto b = kit::assign_buckets({10, 20, 30, 40}, 1000, 1000);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0], (std::vector<size_t>{3, 2, 1, 0}));
}

TEST(AssignBuckets, SmallFirstBucketThenCappedBuckets) {
  std::vector<size_t> bytes(10, 100);
  auto b = kit::assign_buckets(bytes, 250, 400);  // a bucket closes once it holds its limit
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], (std::vector<size_t>{9, 8, 7}));
  EXPECT_EQ(b[1], (std::vector<size_t>{6, 5, 4, 3}));
  EXPECT_EQ(b[2], (std::vector<size_t>{2, 1, 0}));
}

TEST(AssignBuckets, OversizeParameterClosesItsBucketWhole) {
  auto b = kit::assign_buckets({10, 5000, 10, 10}, 100, 100);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], (std::vector<size_t>{3, 2, 1}));
  EXPECT_EQ(b[1], (std::vector<size_t>{0}));
  // Oversize as the very first (last) parameter, too.
  b = kit::assign_buckets({10, 10, 5000}, 100, 100);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], (std::vector<size_t>{2}));
  EXPECT_EQ(b[1], (std::vector<size_t>{1, 0}));
}

// The order DDP saw in the first backward of an LM: the head's bias, then its weight, then the
// rest. The head travels whole in the first bucket, its bias with it, never alone.
TEST(AssignBuckets, GivenOrderIsFollowedAndTheHeadKeepsItsBias) {
  // embed.weight, encoder, head.weight, head.bias
  const std::vector<size_t> bytes{16000, 300, 16000, 128};
  auto b = kit::assign_buckets(bytes, 1000, 25000, {3, 2, 1, 0});
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], (std::vector<size_t>{3, 2}));
  EXPECT_EQ(b[1], (std::vector<size_t>{1, 0}));
  EXPECT_EQ(kit::assign_buckets(bytes, 1000, 25000, {1, 0, 3, 2})[0], (std::vector<size_t>{1, 0}));
  EXPECT_THROW(kit::assign_buckets(bytes, 1000, 25000, {3, 2, 1}), std::invalid_argument);
  EXPECT_THROW(kit::assign_buckets(bytes, 1000, 25000, {3, 2, 1, 1}), std::invalid_argument);
  EXPECT_THROW(kit::assign_buckets(bytes, 1000, 25000, {3, 2, 1, 4}), std::invalid_argument);
}

// Properties on random models and orders: every index exactly once, in the given order (by
// default reverse parameter order), and a bucket closes exactly when it reaches its limit: every
// bucket but the last holds at least its limit, and none held it before its last parameter.
TEST(AssignBuckets, RandomModelsKeepEveryRule) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<size_t> bytes(1 + rng() % 40);
    for (auto& x : bytes) x = 1 + rng() % (rng() % 4 == 0 ? 5000 : 300);
    size_t first = 1 + rng() % 600, cap = 1 + rng() % 2000;
    std::vector<size_t> want(bytes.size());
    std::iota(want.rbegin(), want.rend(), size_t{0});
    const bool shuffled = trial % 2 == 1;
    if (shuffled) std::shuffle(want.begin(), want.end(), rng);
    auto buckets = shuffled ? kit::assign_buckets(bytes, first, cap, want)
                            : kit::assign_buckets(bytes, first, cap);

    std::vector<size_t> order;
    for (auto& b : buckets) {
      ASSERT_FALSE(b.empty());
      order.insert(order.end(), b.begin(), b.end());
    }
    ASSERT_EQ(order, want) << "trial " << trial << ": not every index once, in order";

    for (size_t k = 0; k < buckets.size(); ++k) {
      size_t limit = k == 0 ? first : cap;
      size_t held = total(bytes, buckets[k]);
      if (k + 1 < buckets.size()) EXPECT_GE(held, limit) << "trial " << trial;
      EXPECT_LT(held - bytes[buckets[k].back()], limit) << "trial " << trial << ": closed late";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Gradients in the buckets
// ---------------------------------------------------------------------------------------------

// Three layers: y = third(tanh(first(x) + second(x))). Backward meets third first, then the
// branch autograd created last (it runs the newest ready node first): with swap, second(x) is
// computed before first(x), and the gradients arrive as third, first, second, which is not the
// reverse of the registration order (third, second, first). Without swap they arrive in exactly
// that reverse order. The result is the same either way.
struct ThreeLayersImpl : torch::nn::Module {
  torch::nn::Linear first{nullptr}, second{nullptr}, third{nullptr};
  ThreeLayersImpl() {
    first = register_module("first", torch::nn::Linear(kIn, kIn));
    second = register_module("second", torch::nn::Linear(kIn, kIn));
    third = register_module("third", torch::nn::Linear(kIn, kIn));
  }
  torch::Tensor forward(const torch::Tensor& x, bool swap = false) {
    torch::Tensor a, b;
    if (swap) {
      b = second(x);
      a = first(x);
    } else {
      a = first(x);
      b = second(x);
    }
    return third(torch::tanh(a + b));
  }
};
TORCH_MODULE(ThreeLayers);

const std::vector<std::string> kNames = {"first.weight", "first.bias", "second.weight",
                                         "second.bias", "third.weight", "third.bias"};

torch::Tensor loss_of(ThreeLayers& m, const torch::Tensor& x, bool swap = false,
                      kit::DistributedDataParallel* ddp = nullptr) {
  auto out = [&] { return m->forward(x, swap); };
  return (ddp ? ddp->forward_with(out) : out()).pow(2).mean();
}

// Models that all start from one set of weights (rank 0's and the reference's).
std::vector<ThreeLayers> same_models(int n) {
  torch::manual_seed(5);
  ThreeLayers proto;
  std::vector<ThreeLayers> out(n);
  torch::NoGradGuard no_grad;
  for (auto& m : out)
    for (size_t i = 0; i < proto->parameters().size(); ++i) m->parameters()[i].copy_(proto->parameters()[i]);
  return out;
}

kit::DDPOptions options(kit::ProcessGroup& g, bool overlap, size_t bucket_bytes) {
  kit::DDPOptions o;
  o.group = &g;
  o.overlap = overlap;
  o.first_bucket_bytes = o.bucket_cap_bytes = bucket_bytes;
  return o;
}

std::vector<size_t> flatten(const std::vector<std::vector<size_t>>& buckets) {
  std::vector<size_t> out;
  for (auto& b : buckets) out.insert(out.end(), b.begin(), b.end());
  return out;
}

// After backward each gradient sits in its bucket: same storage as the others of the bucket, at
// the next offset, in bucket order. With zero_grad(false) the windows stay from step to step,
// and DDP copies nothing; with zero_grad() (to none) it copies each fresh gradient in once.
TEST(DDPGradients, GradIsAWindowOnItsBucket) {
  auto models = same_models(kRanks);
  auto errors = on_ranks([&](int r, kit::ProcessGroup& g) {
    kit::DistributedDataParallel ddp(models[r], options(g, true, 60));  // several buckets
    torch::optim::SGD sgd(models[r]->parameters(), torch::optim::SGDOptions(0.1));
    auto params = models[r]->parameters();
    std::vector<const void*> where;
    for (int s = 0; s < kSteps; ++s) {
      sgd.zero_grad(/*set_to_none=*/s == 0);
      if (s > 0)  // zero_grad(false) zeroed the windows in place
        for (auto& p : params) EXPECT_EQ(p.grad().abs().max().item<float>(), 0.0f);
      loss_of(models[r], shard(s, r), false, &ddp).backward();
      ASSERT_GE(ddp.buckets().size(), 2u);
      for (auto& bucket : ddp.buckets()) {
        const auto& head = params[bucket[0]].grad();
        auto* next = static_cast<const char*>(head.data_ptr());
        for (size_t i : bucket) {
          const auto& grad = params[i].grad();
          ASSERT_TRUE(grad.defined()) << kNames[i];
          EXPECT_TRUE(grad.is_alias_of(head)) << kNames[i] << " is not in its bucket's memory";
          EXPECT_EQ(grad.data_ptr(), next) << kNames[i] << " is not at its place in the bucket";
          EXPECT_EQ(grad.sizes(), params[i].sizes()) << kNames[i];
          next += grad.numel() * grad.element_size();
        }
      }
      if (s == 0) {
        EXPECT_GT(ddp.stats().last_copy_seconds, 0.0) << "after zero_grad() to none, a copy is due";
      } else {
        EXPECT_EQ(ddp.stats().last_copy_seconds, 0.0) << "step " << s + 1 << ": a gradient was copied";
      }
      std::vector<const void*> now;
      for (auto& p : params) now.push_back(p.grad().data_ptr());
      if (s == 2) EXPECT_EQ(now, where) << "the windows moved between steps 2 and 3";
      where = now;
      sgd.step();
    }
    int64_t bytes = 0;
    for (auto& p : params) bytes += p.numel() * p.element_size();
    EXPECT_EQ(ddp.stats().last_reduce_bytes, bytes) << "every gradient travels once per step";
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The order backward delivers the gradients in, seen from outside DDP: a tensor hook on each
// parameter fires just before its gradient is accumulated, in the same order as DDP's hooks.
struct ArrivalOrder {
  std::vector<size_t> seen;
  void watch(ThreeLayers& m) {
    auto params = m->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].register_hook([this, i](const torch::Tensor&) { seen.push_back(i); });
  }
};

// One bucket per parameter, so that the bucket order is the gradient order. Rank 0 computes its
// branches in swapped order, rank 1 does not, so they deliver their gradients in different
// orders: both ranks must still build rank 0's buckets, and train as one process does.
TEST(DDPBuckets, RebuiltInRankZerosArrivalOrderAfterTheFirstStep) {
  auto models = same_models(kRanks + 1);
  ThreeLayers reference = models.back();
  std::vector<std::vector<size_t>> before(kRanks), after(kRanks), arrived(kRanks);
  std::vector<kit::DDPStats> stats(kRanks);
  auto errors = on_ranks([&](int r, kit::ProcessGroup& g) {
    ArrivalOrder order;
    order.watch(models[r]);
    kit::DistributedDataParallel ddp(models[r], options(g, true, 1));
    before[r] = flatten(ddp.buckets());
    torch::optim::SGD sgd(models[r]->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < kSteps; ++s) {
      sgd.zero_grad();
      order.seen.clear();
      loss_of(models[r], shard(s, r), /*swap=*/r == 0, &ddp).backward();
      if (s == 0) arrived[r] = order.seen;
      sgd.step();
    }
    after[r] = flatten(ddp.buckets());
    stats[r] = ddp.stats();
  });
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  const std::vector<size_t> reverse{5, 4, 3, 2, 1, 0};
  ASSERT_NE(arrived[0], reverse) << "the model does not test anything: reverse order is right";
  ASSERT_NE(arrived[0], arrived[1]) << "both ranks saw one order: the broadcast is not tested";
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(before[r], reverse) << "rank " << r << ": before the first backward, the guess";
    EXPECT_EQ(after[r], arrived[0]) << "rank " << r << ": rank 0's arrival order";
    EXPECT_TRUE(stats[r].rebuilt);
    EXPECT_EQ(stats[r].buckets, 6);
    EXPECT_EQ(stats[r].all_reduces, 6 * kSteps);
  }
  // third.*, then first.*, then second.* (whatever the weight/bias order inside a layer).
  EXPECT_EQ(std::min(after[0][0], after[0][1]), 4u);
  EXPECT_EQ(std::max(after[0][2], after[0][3]), 1u);

  torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    sgd.zero_grad();
    loss_of(reference, global_batch(s)).backward();
    sgd.step();
  }
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < kNames.size(); ++i)
      EXPECT_TRUE(torch::allclose(models[r]->parameters()[i], reference->parameters()[i], 1e-5, 1e-6))
          << "rank " << r << ", " << kNames[i];
}

TEST(DDPBuckets, AfterBackwardModeKeepsItsBuckets) {
  auto models = same_models(kRanks);
  auto errors = on_ranks([&](int r, kit::ProcessGroup& g) {
    kit::DistributedDataParallel ddp(models[r], options(g, false, 1));
    const auto layout = ddp.buckets();
    for (int s = 0; s < 2; ++s) loss_of(models[r], shard(s, r), false, &ddp).backward();
    EXPECT_EQ(ddp.buckets(), layout);
    EXPECT_FALSE(ddp.stats().rebuilt);
    EXPECT_EQ(g.collectives(), 1 + 2 * static_cast<int64_t>(layout.size())) << "no broadcast of an order";
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// zero_grad in every form, and optimizers with state, train as one process on the whole batch.
enum class Zero { ToNone, ToZero, ModuleToZero };
struct ZeroCase {
  Zero zero;
  bool adamw;
};
class ZeroGradAndOptimizers : public ::testing::TestWithParam<ZeroCase> {};

// AdamW with PyTorch's default eps (1e-8): ThreeLayers has no gradient that is only rounding
// noise, and with it the ranks still match the one process at allclose(1e-5, 1e-6) below.
std::unique_ptr<torch::optim::Optimizer> optimizer_for(bool adamw, ThreeLayers& m) {
  if (adamw)
    return std::make_unique<torch::optim::AdamW>(m->parameters(), torch::optim::AdamWOptions(0.01));
  return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
}

void zero(Zero how, torch::optim::Optimizer& opt, ThreeLayers& m) {
  if (how == Zero::ToNone) opt.zero_grad(true);
  if (how == Zero::ToZero) opt.zero_grad(false);
  if (how == Zero::ModuleToZero) m->zero_grad(false);
}

TEST_P(ZeroGradAndOptimizers, TrainLikeOneProcess) {
  const ZeroCase c = GetParam();
  auto models = same_models(kRanks + 1);
  ThreeLayers reference = models.back();
  auto opt = optimizer_for(c.adamw, reference);
  for (int s = 0; s < kSteps; ++s) {
    zero(c.zero, *opt, reference);
    loss_of(reference, global_batch(s)).backward();
    opt->step();
  }
  auto errors = on_ranks([&](int r, kit::ProcessGroup& g) {
    kit::DistributedDataParallel ddp(models[r], options(g, true, 120));
    auto mine = optimizer_for(c.adamw, models[r]);
    for (int s = 0; s < kSteps; ++s) {
      zero(c.zero, *mine, models[r]);
      loss_of(models[r], shard(s, r), false, &ddp).backward();
      mine->step();
    }
  });
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < kNames.size(); ++i)
      EXPECT_TRUE(torch::allclose(models[r]->parameters()[i], reference->parameters()[i], 1e-5, 1e-6))
          << "rank " << r << ", " << kNames[i];
}

std::string zero_case_name(const ::testing::TestParamInfo<ZeroCase>& info) {
  const char* how[] = {"ToNone", "ToZero", "ModuleToZero"};
  return std::string(how[static_cast<int>(info.param.zero)]) + (info.param.adamw ? "_AdamW" : "_SGD");
}

INSTANTIATE_TEST_SUITE_P(
    DDP, ZeroGradAndOptimizers,
    ::testing::Values(ZeroCase{Zero::ToNone, false}, ZeroCase{Zero::ToZero, false},
                      ZeroCase{Zero::ModuleToZero, false}, ZeroCase{Zero::ToNone, true},
                      ZeroCase{Zero::ToZero, true}),
    zero_case_name);

// What a checkpoint file holds: the bytes of its tensors, and the bytes of the memory behind them,
// over every archive inside it. torch writes a tensor's whole storage: a tensor that were a window
// on a bucket would bring the whole bucket along.
struct Held {
  int64_t tensors = 0, storage = 0;
};
void add_up(torch::serialize::InputArchive& archive, Held& held) {
  for (const auto& key : archive.keys()) {
    torch::Tensor t;
    torch::serialize::InputArchive sub;
    if (archive.try_read(key, t, /*is_buffer=*/true)) {
      held.tensors += t.numel() * t.element_size();
      held.storage += static_cast<int64_t>(t.storage().nbytes());
    } else if (archive.try_read(key, sub)) {
      add_up(sub, held);
    }
  }
}
Held held_by(const std::filesystem::path& file) {
  torch::serialize::InputArchive archive;
  archive.load_from(file.string());
  Held held;
  add_up(archive, held);
  return held;
}

// A checkpoint written while the gradients live in the buckets holds exactly what one written
// by one process without DDP holds (no bucket memory slipped into it), and it loads back into a
// fresh model and optimizer bit for bit.
TEST(DDPCheckpoints, HoldWhatAPlainRunHoldsAndLoadBack) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kit-ddp-grads-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "plain");
  std::filesystem::create_directories(dir / "ddp");
  auto models = same_models(kRanks + 1);
  ThreeLayers reference = models.back();
  auto train = [](ThreeLayers& m, torch::optim::Optimizer& opt, const std::function<torch::Tensor(int)>& x,
                  kit::DistributedDataParallel* ddp = nullptr) {
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      loss_of(m, x(s), false, ddp).backward();
      opt.step();
    }
  };
  kit::TrainState state;
  state.global_step = kSteps;
  {
    auto opt = optimizer_for(true, reference);
    train(reference, *opt, global_batch);
    kit::Checkpoints((dir / "plain").string(), "test").save(reference, *opt, state);
  }
  auto errors = on_ranks([&](int r, kit::ProcessGroup& g) {
    kit::DistributedDataParallel ddp(models[r], options(g, true, 120));
    auto opt = optimizer_for(true, models[r]);
    train(models[r], *opt, [r](int s) { return shard(s, r); }, &ddp);
    if (r == 0) kit::Checkpoints((dir / "ddp").string(), "test").save(models[r], *opt, state);
  });
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  auto state_file = [](const std::filesystem::path& under) {  // <under>/step-N/state.pt
    for (auto& e : std::filesystem::recursive_directory_iterator(under))
      if (e.path().filename() == "state.pt") return e.path();
    return std::filesystem::path();
  };
  const auto ddp_state = state_file(dir / "ddp"), plain_state = state_file(dir / "plain");
  ASSERT_FALSE(ddp_state.empty()) << "no state.pt under " << dir / "ddp";
  ASSERT_FALSE(plain_state.empty()) << "no state.pt under " << dir / "plain";
  const Held with_ddp = held_by(ddp_state), without = held_by(plain_state);
  EXPECT_GT(with_ddp.tensors, 0);
  EXPECT_EQ(with_ddp.tensors, without.tensors);
  EXPECT_EQ(with_ddp.storage, with_ddp.tensors) << "a tensor in the checkpoint carries extra memory";

  ThreeLayers fresh;
  auto opt = optimizer_for(true, fresh);
  auto resumed = kit::Checkpoints((dir / "ddp").string(), "test").resume(fresh, *opt, torch::kCPU, true);
  EXPECT_EQ(resumed.global_step, kSteps);
  for (size_t i = 0; i < kNames.size(); ++i)
    EXPECT_TRUE(torch::equal(fresh->parameters()[i], models[0]->parameters()[i])) << kNames[i];
  std::filesystem::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  // One intra-op thread per rank thread: the cores are few and the arithmetic order stays fixed.
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
