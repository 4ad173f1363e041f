// DistributedDataParallel with a parameter that takes part in some steps and not in others: a
// layer used in step 1, skipped in step 2 and used again in step 3. In step 2 every rank must end
// backward with a zero gradient for it (or none, as one process has after zero_grad()), never
// with the gradient of step 1 that its slot of the bucket still holds from the last all-reduce.
// Everything is compared, step by step, with one process that trains on the whole global batch.
//
// The ranks are threads of this process, each with its own model copy and its own
// kit::ProcessGroup from ProcessGroup::local_groups(), passed explicitly (DDP Options::group).
#include <chrono>
#include <functional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "batches.h"  // kit_test::random_batches (tests/support)
#include "kit/ddp.h"
#include "kit/process_group.h"

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
const torch::Tensor& global_batch(int step) {
  static const auto batches = kit_test::random_batches(1000, kSteps, kRanks * kPerRank, kIn);
  return batches.at(static_cast<size_t>(step));
}

torch::Tensor loss_of(TwoPaths& model, const torch::Tensor& x, bool use_b) {
  return model->forward(x, use_b).pow(2).mean();
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
           std::vector<Step>& steps) {
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < kSteps; ++s) {
    optimizer.zero_grad(set_to_none);
    loss_of(model, batch(s), kUseB[s]).backward();
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

  auto groups = kit::ProcessGroup::local_groups(kRanks, std::chrono::seconds(20));
  std::vector<std::vector<Step>> got(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      try {
        kit::DistributedDataParallel::Options o;
        o.overlap = c.overlap;
        o.group = groups[r].get();
        if (!c.one_bucket) o.first_bucket_bytes = o.bucket_cap_bytes = 1;  // one per parameter
        kit::DistributedDataParallel ddp(models[r], o);
        auto shard = [r](int s) { return global_batch(s).narrow(0, r * kPerRank, kPerRank); };
        train(models[r], shard, c.set_to_none, got[r]);
        EXPECT_EQ(ddp.stats().steps, kSteps) << "rank " << r;
        EXPECT_EQ(ddp.buckets().size(), c.one_bucket ? 1u : 4u) << "rank " << r;
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
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

}  // namespace

int main(int argc, char** argv) {
  // One intra-op thread per rank thread: the cores are few and the arithmetic order stays fixed.
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
