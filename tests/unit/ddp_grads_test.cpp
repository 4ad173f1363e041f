// Where DistributedDataParallel keeps the gradients, and the buckets it rebuilds (issue 14):
//
//   * after backward, every .grad is a window on its bucket (no copy into or out of buckets):
//     the gradients of one bucket lie back to back in one memory block, in the bucket's order,
//     and zero_grad(false) keeps them there from step to step with nothing copied;
//   * with overlap, the buckets are rebuilt after the first backward in the order the gradients
//     arrived, rank 0's order on every rank, even when another rank saw another order;
//   * zero_grad (to none, to zero, the module's own) and the optimizers (SGD with momentum,
//     AdamW) train exactly as one process on the whole batch;
//   * checkpoints hold the same tensors as without DDP, and load back bit for bit.
//
// Every rank is a thread of this process with its own model and kit::ProcessGroup
// (ProcessGroup::local_groups), passed to DDP explicitly.
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "batches.h"  // kit_test::random_batches (tests/support)
#include "kit/checkpoint.h"
#include "kit/ddp.h"
#include "kit/process_group.h"

namespace {

constexpr int kRanks = 2, kSteps = 3;
constexpr int64_t kPerRank = 2, kWidth = 4;

// Three layers: y = third(tanh(first(x) + second(x))). Backward meets third first, then the
// branch autograd created last (it runs the newest ready node first): with swap, second(x) is
// computed before first(x), and the gradients arrive as third, first, second, which is not the
// reverse of the registration order (third, second, first). Without swap they arrive in exactly
// that reverse order. The result is the same either way.
struct ThreeLayersImpl : torch::nn::Module {
  torch::nn::Linear first{nullptr}, second{nullptr}, third{nullptr};
  ThreeLayersImpl() {
    first = register_module("first", torch::nn::Linear(kWidth, kWidth));
    second = register_module("second", torch::nn::Linear(kWidth, kWidth));
    third = register_module("third", torch::nn::Linear(kWidth, kWidth));
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

// The global batch of step s; rank r trains on rows [r * kPerRank, (r + 1) * kPerRank).
const torch::Tensor& global_batch(int s) {
  static const auto batches = kit_test::random_batches(99, kSteps, kRanks * kPerRank, kWidth);
  return batches.at(static_cast<size_t>(s));
}
torch::Tensor shard(int s, int r) { return global_batch(s).narrow(0, r * kPerRank, kPerRank); }

torch::Tensor loss_of(ThreeLayers& m, const torch::Tensor& x, bool swap = false) {
  return m->forward(x, swap).pow(2).mean();
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

// body(rank) on kRanks threads, each with its own group; each rank's exception text, "" if none.
std::vector<std::string> on_ranks(const std::function<void(int, kit::ProcessGroup&)>& body) {
  global_batch(0);  // the batches are drawn here, before any rank thread starts
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

// ---------------------------------------------------------------------------------------------

// After backward each gradient sits in its bucket: same storage as the others of the bucket, at
// the next offset, in bucket order. With zero_grad(false) the windows stay from step to step,
// and DDP copies nothing; with zero_grad() (to none) it copies each fresh gradient in once.
TEST(DDPGradients, GradIsAWindowOnItsBucket) {
  auto models = same_models(kRanks);
  auto errors = on_ranks([&](int r, kit::ProcessGroup& g) {
    kit::DistributedDataParallel ddp(models[r], options(g, true, 120));  // several buckets
    torch::optim::SGD sgd(models[r]->parameters(), torch::optim::SGDOptions(0.1));
    auto params = models[r]->parameters();
    std::vector<const void*> where;
    for (int s = 0; s < kSteps; ++s) {
      sgd.zero_grad(/*set_to_none=*/s == 0);
      if (s > 0)  // zero_grad(false) zeroed the windows in place
        for (auto& p : params) EXPECT_EQ(p.grad().abs().max().item<float>(), 0.0f);
      loss_of(models[r], shard(s, r)).backward();
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
      loss_of(models[r], shard(s, r), /*swap=*/r == 0).backward();
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
    for (int s = 0; s < 2; ++s) loss_of(models[r], shard(s, r)).backward();
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

std::unique_ptr<torch::optim::Optimizer> optimizer_for(bool adamw, ThreeLayers& m) {
  if (adamw)
    return std::make_unique<torch::optim::AdamW>(m->parameters(), torch::optim::AdamWOptions(0.01).eps(1e-3));
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
      loss_of(models[r], shard(s, r)).backward();
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
  auto train = [](ThreeLayers& m, torch::optim::Optimizer& opt, const std::function<torch::Tensor(int)>& x) {
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      loss_of(m, x(s)).backward();
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
    train(models[r], *opt, [r](int s) { return shard(s, r); });
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
