// Unit tests of common/kit: collectives and subgroups (with DDP on a subgroup), save0, the rank
// environment, device choice, the DistributedSampler and the steps at which Checkpoints look at a
// stop signal (assign_buckets() is tested with DDP, in tests/ddp/ddp_grads_test.cpp).
// Everything runs inside this one process: the collectives use ProcessGroup::local_groups(), one
// std::thread per rank.
//
// One translation unit on purpose: each TU that includes <torch/torch.h> costs ~20 s to build.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/data/data_loader.h"
#include "kit/ddp/ddp.h"
#include "kit/runtime/distributed.h"
#include "kit/runtime/env.h"
#include "kit/runtime/process_group.h"
#include "kit/train/checkpoint_format.h"  // cuda_rng_bytes, parse_cuda_rng: the file's format
#include "kit/train/checkpoint.h"
#include "kit/train/checkpoint_hooks.h"

namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

// Runs fn(group) on n in-process ranks at once, one thread each. An exception on any rank fails
// the test with the rank's number (gtest's EXPECT_* are thread-safe on Linux).
template <typename Fn>
void on_ranks(int n, Fn fn, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto groups = kit::ProcessGroup::local_groups(n, timeout);
  ASSERT_EQ(groups.size(), static_cast<size_t>(n));
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(*groups[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r << " threw";
}

// A fresh, empty directory under $TMPDIR, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kit-unit-XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path = made;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::set<std::string> names() const {  // what the directory holds, by file name
    std::set<std::string> out;
    for (auto& e : fs::directory_iterator(path)) out.insert(e.path().filename().string());
    return out;
  }
};

// ---------------------------------------------------------------------------------------------
// Collectives on N = 2 and 4 in-process ranks
// ---------------------------------------------------------------------------------------------

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, AllReduceSumAddsEveryRanksTensor) {
  const int n = GetParam();
  on_ranks(n, [n](kit::ProcessGroup& g) {
    const int r = g.rank();
    auto t = torch::tensor({float(r + 1), float(10 * r), float(-r)});
    g.all_reduce(t, kit::ReduceOp::SUM);
    const float s = n * (n + 1) / 2.0f, s10 = 10.0f * n * (n - 1) / 2.0f;
    EXPECT_TRUE(torch::equal(t, torch::tensor({s, s10, -s10 / 10}))) << "rank " << r << ": " << t;
    // Integers too (the sampler and the trainer's counters are int64).
    auto i = torch::full({2, 3}, int64_t{r}, torch::kLong);
    g.all_reduce(i, kit::ReduceOp::SUM);
    EXPECT_TRUE(torch::equal(i, torch::full({2, 3}, int64_t{n * (n - 1) / 2}, torch::kLong)));
  });
}

TEST_P(Collectives, AllReduceAvgIsTheMeanOverRanks) {
  const int n = GetParam();
  on_ranks(n, [n](kit::ProcessGroup& g) {
    const int r = g.rank();
    // A 2-D tensor: AVG must divide every element, and by the world size (not e.g. by 2).
    auto t = torch::full({3, 2}, float(2 * (r + 1)));
    t[1][1] = float(r == 0 ? 4 * n : 0);
    g.all_reduce(t, kit::ReduceOp::AVG);
    auto want = torch::full({3, 2}, float(n + 1));
    want[1][1] = 4.0f;
    EXPECT_TRUE(torch::allclose(t, want, 0, 1e-6)) << "rank " << r << ": " << t;
  });
}

TEST_P(Collectives, AllReduceMaxAndMinPickTheExtremes) {
  const int n = GetParam();
  on_ranks(n, [n](kit::ProcessGroup& g) {
    const int r = g.rank();
    auto t = torch::tensor({float(r), float(-r), r == 1 ? 100.0f : 0.0f});
    auto u = t.clone();
    g.all_reduce(t, kit::ReduceOp::MAX);
    EXPECT_TRUE(torch::equal(t, torch::tensor({float(n - 1), 0.0f, 100.0f}))) << "rank " << r << ": " << t;
    g.all_reduce(u, kit::ReduceOp::MIN);
    EXPECT_TRUE(torch::equal(u, torch::tensor({0.0f, float(1 - n), 0.0f}))) << "rank " << r << ": " << u;
  });
}

TEST_P(Collectives, AllReduceAsyncReducesEveryTensorOfTheCall) {
  const int n = GetParam();
  on_ranks(n, [n](kit::ProcessGroup& g) {
    const int r = g.rank();
    std::vector<torch::Tensor> ts = {torch::full({4}, float(r)), torch::full({2, 2}, float(2 * r))};
    kit::Work w = g.all_reduce_async(ts, kit::ReduceOp::AVG);
    w.wait();
    const float mean = (n - 1) / 2.0f;
    EXPECT_TRUE(torch::allclose(ts[0], torch::full({4}, mean), 0, 1e-6)) << ts[0];
    EXPECT_TRUE(torch::allclose(ts[1], torch::full({2, 2}, 2 * mean), 0, 1e-6)) << ts[1];
    // Same shapes (e.g. a loss sum and a token count): each is reduced on its own, never mixed.
    std::vector<torch::Tensor> pair = {torch::tensor(float(r + 1)), torch::tensor(float(10 * (r + 1)))};
    g.all_reduce_async(pair, kit::ReduceOp::SUM).wait();
    const float s = n * (n + 1) / 2.0f;
    EXPECT_EQ(pair[0].item<float>(), s) << "rank " << r;
    EXPECT_EQ(pair[1].item<float>(), 10 * s) << "rank " << r;
  });
}

TEST_P(Collectives, BroadcastCopiesTheRootsTensorEverywhere) {
  const int n = GetParam();
  for (int root : {0, n - 1}) {
    on_ranks(n, [root](kit::ProcessGroup& g) {
      const int r = g.rank();
      auto t = torch::arange(6, torch::kFloat).view({2, 3}) + 100.0f * r;
      g.broadcast(t, root);
      auto want = torch::arange(6, torch::kFloat).view({2, 3}) + 100.0f * root;
      EXPECT_TRUE(torch::equal(t, want)) << "root " << root << ", rank " << r << ": " << t;
    });
  }
}

TEST_P(Collectives, BarrierWaitsForTheLastRank) {
  const int n = GetParam();
  std::atomic<int> arrived{0};
  on_ranks(n, [&](kit::ProcessGroup& g) {
    // The last rank arrives 150+ ms late; nobody may leave the barrier before it arrived.
    std::this_thread::sleep_for(std::chrono::milliseconds(50 * g.rank()));
    arrived++;
    g.barrier();
    EXPECT_EQ(arrived.load(), n) << "rank " << g.rank() << " left the barrier too early";
  });
}

TEST_P(Collectives, AllGatherPutsEveryRanksTensorInRankOrder) {
  const int n = GetParam();
  on_ranks(n, [n](kit::ProcessGroup& g) {
    const int r = g.rank();
    auto in = torch::tensor({float(r), float(10 * r + 1), float(-r)});
    // Flat output, and an output shaped [n, 3] that is a non-contiguous view (a transpose).
    auto flat = torch::full({3 * n}, -7.0f);
    g.all_gather(flat, in);
    auto shaped = torch::zeros({3, n}).t();
    g.all_gather(shaped, in);
    for (int k = 0; k < n; ++k) {
      auto want = torch::tensor({float(k), float(10 * k + 1), float(-k)});
      EXPECT_TRUE(torch::equal(flat.narrow(0, 3 * k, 3), want)) << "rank " << r << ": " << flat;
      EXPECT_TRUE(torch::equal(shaped[k], want)) << "rank " << r << ": " << shaped;
    }
  });
}

TEST_P(Collectives, ReduceScatterGivesRankRItsReducedChunk) {
  const int n = GetParam();
  on_ranks(n, [n](kit::ProcessGroup& g) {
    const int r = g.rank();
    // Chunk k of rank r's input holds 100 * k + r (+ 0.5 in the second element).
    auto in = torch::empty({2 * n});
    for (int k = 0; k < n; ++k) {
      in[2 * k] = float(100 * k + r);
      in[2 * k + 1] = float(100 * k + r) + 0.5f;
    }
    const float ranks = n * (n - 1) / 2.0f;  // sum of r over ranks
    auto sum = torch::zeros({2});
    g.reduce_scatter(sum, in, kit::ReduceOp::SUM);
    auto want = torch::tensor({100.0f * r * n + ranks, 100.0f * r * n + ranks + 0.5f * n});
    EXPECT_TRUE(torch::allclose(sum, want, 0, 1e-4)) << "rank " << r << ": " << sum;
    auto avg = torch::zeros({2});
    g.reduce_scatter(avg, in, kit::ReduceOp::AVG);
    EXPECT_TRUE(torch::allclose(avg, want / n, 0, 1e-5)) << "rank " << r << ": " << avg;
    auto mx = torch::zeros({2});
    g.reduce_scatter(mx, in, kit::ReduceOp::MAX);
    EXPECT_EQ(mx[0].item<float>(), float(100 * r + n - 1)) << "rank " << r;
  });
}

TEST_P(Collectives, StatsCountCallsAndBytesByKind) {
  const int n = GetParam();
  on_ranks(n, [n](kit::ProcessGroup& g) {
    auto t = torch::zeros({5});
    g.all_reduce(t, kit::ReduceOp::SUM);
    g.all_reduce(t, kit::ReduceOp::SUM);
    auto out = torch::zeros({5 * n});
    g.all_gather(out, t);
    g.barrier();
    EXPECT_EQ(g.collectives(), 4);
    EXPECT_EQ(g.stats().calls.at("all_reduce"), 2);
    EXPECT_EQ(g.stats().bytes.at("all_reduce"), 2 * 5 * 4);
    EXPECT_EQ(g.stats().bytes.at("all_gather"), 5 * 4);
    EXPECT_EQ(g.stats().calls.at("barrier"), 1);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(2, 4),
                         [](const auto& info) { return "N" + std::to_string(info.param); });

// After shutdown() (what destroy_process_group() does) a collective is one CommError that names
// the call and its line, never a crash on the released connection.
TEST(CollectivesFailure, AfterShutdownEveryCollectiveIsACommErrorNamingTheCall) {
  on_ranks(2, [](kit::ProcessGroup& g) {
    g.barrier();
    g.shutdown();
    EXPECT_FALSE(g.alive());
    auto t = torch::zeros({2});
    try {
      g.all_reduce(t, kit::ReduceOp::SUM); const int line = __LINE__;
      ADD_FAILURE() << "no error";
      (void)line;
    } catch (const kit::CommError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("all_reduce #2"), std::string::npos) << what;
      EXPECT_NE(what.find("unit_test.cpp:"), std::string::npos) << what;
      EXPECT_NE(what.find("after destroy_process_group()"), std::string::npos) << what;
    }
    EXPECT_THROW(g.barrier(), kit::CommError);
    auto out = torch::zeros({4});
    EXPECT_THROW(g.all_gather(out, t), kit::CommError);
  });
}

// KIT_DEBUG_COLLECTIVES=1: a rank that calls another collective, or the same one with another
// shape, is named at once on every rank instead of a hang until the timeout.
TEST(CollectivesFailure, DebugModeNamesRanksThatDisagree) {
  ::setenv("KIT_DEBUG_COLLECTIVES", "1", 1);
  auto groups = kit::ProcessGroup::local_groups(2, std::chrono::seconds(20));
  ::unsetenv("KIT_DEBUG_COLLECTIVES");
  std::vector<std::string> errors(2);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto& g = *groups[r];
      auto ok = torch::ones({3});
      g.all_reduce(ok, kit::ReduceOp::SUM);  // the same on both: passes
      try {
        if (r == 0) {
          auto t = torch::ones({3});
          g.all_reduce(t, kit::ReduceOp::SUM);
        } else {
          g.barrier();
        }
      } catch (const kit::CommError& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10) << "the mismatch was found only by the timeout";
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("disagree on collective #2"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 0 called all_reduce #2 of 3 elements"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 1 called barrier #2"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("same order"), std::string::npos) << errors[r];
  }
}

// reduce_scatter and its scratch form (what ZeRO-2 uses on Gloo) refuse the same wrong arguments
// with the same line, naming the call, and before the call is numbered: a refused call leaves the
// ranks' sequences in step.
TEST(CollectivesFailure, ReduceScatterRefusesWrongSizesAndDtypesInBothForms) {
  on_ranks(2, [](kit::ProcessGroup& g) {
    auto refusal = [](const std::function<void()>& call) {
      try {
        call();
      } catch (const kit::CommError& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    auto out = torch::zeros({3});
    auto five = torch::zeros({5});               // not 2 x 3 elements
    auto doubles = torch::zeros({6}, torch::kDouble);  // the right size, another dtype
    auto wrong_size = [](int line) {  // the one line both forms give, for the call on `line`
      return "reduce_scatter (unit_test.cpp:" + std::to_string(line) +
             "): the input must hold world size (2) x the output's 3 elements of the same dtype, "
             "it holds 5";
    };
    const auto sum = kit::ReduceOp::SUM;
    // One call a line, outside gtest's macros (a call inside one gets the macro's last line).
    const int line = __LINE__ + 1;
    const std::string plain = refusal([&] { g.reduce_scatter(out, five, sum); });
    const std::string scratch = refusal([&] { g.reduce_scatter_scratch_async(out, five, sum).wait(); });
    EXPECT_EQ(plain, wrong_size(line));
    EXPECT_EQ(scratch, wrong_size(line + 1));
    for (const auto& what : {refusal([&] { g.reduce_scatter(out, doubles, kit::ReduceOp::SUM); }),
                             refusal([&] {
                               g.reduce_scatter_scratch_async(out, doubles, kit::ReduceOp::SUM).wait();
                             })})
      EXPECT_NE(what.find("elements of the same dtype, it holds 6"), std::string::npos) << what;
    EXPECT_EQ(g.collectives(), 0) << "a refused call was numbered";
    // The arguments put right, both forms run (1 + 2 in every element).
    g.reduce_scatter(out, torch::full({6}, float(g.rank() + 1)), kit::ReduceOp::SUM);
    EXPECT_TRUE(torch::equal(out, torch::full({3}, 3.0f))) << out;
    out.zero_();
    g.reduce_scatter_scratch_async(out, torch::full({6}, float(g.rank() + 1)), kit::ReduceOp::SUM).wait();
    EXPECT_TRUE(torch::equal(out, torch::full({3}, 3.0f))) << out;
    EXPECT_EQ(g.collectives(), 2);
  });
}

// A collective that one rank never joins must end in a CommError after the group's timeout,
// never in a hang (this is what a rank that died looks like to the others).
TEST(CollectivesFailure, MissingPeerGivesCommErrorAfterTheTimeout) {
  auto groups = kit::ProcessGroup::local_groups(2, std::chrono::milliseconds(1500));
  auto start = std::chrono::steady_clock::now();
  auto t = torch::ones({4});
  std::string what;
  try {
    groups[0]->all_reduce(t, kit::ReduceOp::SUM);
  } catch (const kit::CommError& e) {
    what = e.what();
  }
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 1.0);
  EXPECT_LT(waited, 20.0);
  // The error says which collective, on which rank, after how long, and what usually causes it.
  EXPECT_NE(what.find("rank 0: all_reduce #1 (unit_test.cpp:"), std::string::npos) << what;
  EXPECT_NE(what.find("timed out after 1 s"), std::string::npos) << what;
  EXPECT_NE(what.find("every rank must call every collective, in the same order"),
            std::string::npos) << what;
}

// ---------------------------------------------------------------------------------------------
// Subgroups: new_group() on in-process ranks (kit/runtime/process_group.h)
// ---------------------------------------------------------------------------------------------

// Every rank of `world` makes the two groups {0, 1} and {2, 3}, in this order, and returns its own.
std::shared_ptr<kit::ProcessGroup> pair_of(kit::ProcessGroup& world) {
  auto low = world.new_group({1, 0});  // sorted, as torch's new_group: group rank 0 is world rank 0
  auto high = world.new_group({2, 3});
  EXPECT_NE(low->is_member(), high->is_member()) << "rank " << world.rank();
  return low->is_member() ? low : high;
}

// x_k = {k + 1, -(k + 1)^2, 10 if k is odd else 0, k / 2}: rank k's input to the all-reduces.
torch::Tensor x_of(int k) {
  const double r = k;
  return torch::tensor({r + 1, -(r + 1) * (r + 1), k % 2 ? 10.0 : 0.0, 0.5 * r}, torch::kDouble);
}

// Four ranks as two groups of two: each collective of distributed.h and kit::control, on each
// group, gives the reduction over that group's two ranks only.
TEST(Subgroups, EveryCollectiveOnTwoGroupsOfTwoReducesOverItsOwnGroup) {
  std::atomic<int> arrived[2] = {0, 0};
  on_ranks(4, [&](kit::ProcessGroup& world) {
    const int r = world.rank();
    auto mine = pair_of(world);
    kit::ProcessGroup& g = *mine;
    const std::vector<int> members = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    EXPECT_EQ(g.ranks(), members);
    EXPECT_EQ(g.rank(), r % 2);
    EXPECT_EQ(g.size(), 2);
    EXPECT_EQ(g.global_rank(1), members[1]);
    EXPECT_EQ(g.group_rank(r), r % 2);
    EXPECT_EQ(g.group_rank(r < 2 ? 2 : 0), -1);
    EXPECT_EQ(g.name(), r < 2 ? "0,1" : "2,3");
    EXPECT_TRUE(g.same_world(world));

    // all_reduce, every op (the free function, as a trainer calls it, with the group).
    const std::pair<kit::ReduceOp, std::function<torch::Tensor(torch::Tensor, torch::Tensor)>> ops[] = {
        {kit::ReduceOp::SUM, [](auto a, auto b) { return a + b; }},
        {kit::ReduceOp::AVG, [](auto a, auto b) { return (a + b) / 2; }},
        {kit::ReduceOp::MAX, [](auto a, auto b) { return torch::maximum(a, b); }},
        {kit::ReduceOp::MIN, [](auto a, auto b) { return torch::minimum(a, b); }}};
    for (auto& [op, reduce] : ops) {
      auto t = x_of(r);
      kit::all_reduce(t, op, mine);
      auto want = reduce(x_of(members[0]), x_of(members[1]));
      EXPECT_TRUE(torch::equal(t, want)) << kit::to_string(op) << " on rank " << r << ": " << t;
    }

    // broadcast from group rank 1: its world rank, as torch's src.
    auto b = torch::arange(6, torch::kFloat) + 100.0f * r;
    kit::broadcast(b, g.global_rank(1), mine);
    EXPECT_TRUE(torch::equal(b, torch::arange(6, torch::kFloat) + 100.0f * members[1])) << b;

    // all_gather: the group's inputs, in group-rank order.
    auto out = torch::zeros({2, 3});
    kit::all_gather(out, torch::tensor({float(r), float(10 * r + 1), float(-r)}), mine);
    for (int k = 0; k < 2; ++k) {
      const float m = float(members[k]);
      EXPECT_TRUE(torch::equal(out[k], torch::tensor({m, 10 * m + 1, -m}))) << "rank " << r << ": " << out;
    }

    // reduce_scatter: chunk k of rank m holds 100 k + m; group rank k gets the group's sum of it.
    auto in = torch::tensor({100.0f * 0 + r, 100.0f * 1 + r});
    auto chunk = torch::zeros({1});
    kit::reduce_scatter(chunk, in, kit::ReduceOp::SUM, mine);
    EXPECT_EQ(chunk.item<float>(), 2 * 100.0f * (r % 2) + members[0] + members[1]) << "rank " << r;

    // barrier: each group's second rank comes 200 ms late; its partner waits for it, for it only.
    if (r % 2) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    arrived[r / 2]++;
    kit::barrier(mine);
    EXPECT_EQ(arrived[r / 2].load(), 2) << "rank " << r << " left the barrier before its partner";

    // kit::control, on the group (roots and order: group ranks).
    auto sum = kit::control::all_reduce(g, torch::tensor({int64_t(r), int64_t(1)}), kit::ReduceOp::SUM);
    EXPECT_TRUE(torch::equal(sum, torch::tensor({int64_t(members[0] + members[1]), int64_t(2)}))) << sum;
    auto all = kit::control::all_gather(g, torch::tensor({int64_t(r)}));
    EXPECT_TRUE(torch::equal(all, torch::tensor({int64_t(members[0]), int64_t(members[1])}))) << all;
    auto root = kit::control::broadcast(g, torch::tensor({int64_t(10 + r)}), 1);
    EXPECT_EQ(root.item<int64_t>(), 10 + members[1]);

    // The world is untouched by it all: its own sequence, every rank in it.
    auto w = torch::ones({1});
    kit::all_reduce(w, kit::ReduceOp::SUM, world);
    EXPECT_EQ(w.item<float>(), 4.0f);
    EXPECT_EQ(world.collectives(), 1);
  });
}

// A group of a group, and two groups of the same ranks: each its own communicator and sequence.
TEST(Subgroups, GroupsOfAGroupAndRepeatedRanksAreGroupsOfTheirOwn) {
  on_ranks(4, [&](kit::ProcessGroup& world) {
    const int r = world.rank();
    auto three = world.new_group({0, 1, 2});
    auto again = world.new_group({0, 1, 2});
    if (r == 3) {
      EXPECT_FALSE(three->is_member());
      EXPECT_EQ(three->rank(), -1);
      EXPECT_EQ(three->size(), -1);
      EXPECT_EQ(three->ranks(), (std::vector<int>{0, 1, 2}));
      return;
    }
    auto inner = three->new_group({2, 1});  // world ranks, members of the parent
    if (r == 0) {
      EXPECT_FALSE(inner->is_member());
    } else {
      EXPECT_EQ(inner->ranks(), (std::vector<int>{1, 2}));
      EXPECT_EQ(inner->rank(), r - 1);
      auto t = torch::tensor({double(r)});
      kit::all_reduce(t, kit::ReduceOp::SUM, inner);
      EXPECT_EQ(t.item<double>(), 3.0);
    }
    auto a = torch::tensor({1.0}), b = torch::tensor({double(r)});
    kit::all_reduce(a, kit::ReduceOp::SUM, three);
    kit::all_reduce(b, kit::ReduceOp::MAX, again);
    EXPECT_EQ(a.item<double>(), 3.0);
    EXPECT_EQ(b.item<double>(), 2.0);
    EXPECT_EQ(three->collectives(), 1);
    EXPECT_EQ(again->collectives(), 1);
  });
}

// Each bad use is one CommError of one line that names the call and its line in this file.
TEST(Subgroups, BadRanksAndNonMembersAreOneLineNamingTheCall) {
  auto one_line = [](const std::function<void()>& call, const std::string& says) {
    try {
      call();
      ADD_FAILURE() << "no error; expected: " << says;
    } catch (const kit::CommError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(says), std::string::npos) << what;
      EXPECT_NE(what.find("unit_test.cpp:"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  on_ranks(4, [&](kit::ProcessGroup& world) {
    const int r = world.rank();
    one_line([&] { world.new_group({}); }, "new_group (unit_test.cpp:");
    one_line([&] { world.new_group({}); }, "was given no ranks");
    one_line([&] { world.new_group({0, 4}); }, "was given rank 4, which is not in the world (ranks 0 to 3)");
    one_line([&] { world.new_group({-1, 0}); }, "was given rank -1");
    one_line([&] { world.new_group({1, 2, 1}); }, "was given rank 1 twice");
    auto pair = pair_of(world);  // refused calls made no group: the numbering is still in step
    one_line([&] { pair->new_group({r, (r + 2) % 4}); }, "which is not in its parent, group");
    auto first = world.new_group({0});
    if (r == 0) {
      auto t = torch::ones({1});
      kit::all_reduce(t, kit::ReduceOp::SUM, first);  // a group of one: its own value
      EXPECT_EQ(t.item<float>(), 1.0f);
      return;
    }
    auto t = torch::ones({2});
    auto out = torch::zeros({4});
    const std::string not_member = "on group 0, which rank " + std::to_string(r) + " is not a member of";
    one_line([&] { kit::all_reduce(t, kit::ReduceOp::SUM, first); }, "all_reduce (unit_test.cpp:");
    one_line([&] { kit::all_reduce(t, kit::ReduceOp::SUM, first); }, not_member);
    one_line([&] { kit::broadcast(t, 0, first); }, not_member);
    one_line([&] { kit::all_gather(out, t, first); }, not_member);
    one_line([&] { kit::reduce_scatter(t, out, kit::ReduceOp::SUM, first); }, not_member);
    one_line([&] { kit::barrier(first); }, "barrier (unit_test.cpp:");
    one_line([&] { first->all_reduce(t, kit::ReduceOp::SUM); }, not_member);
    one_line([&] { kit::control::all_gather(*first, t); }, not_member);
    one_line([&] { first->new_group({0}); }, "new_group (unit_test.cpp:");
    // The root of kit::broadcast is a world rank, and must be in the group.
    auto b = torch::zeros({1});
    one_line([&] { kit::broadcast(b, r < 2 ? 2 : 0, pair); }, " is not in group ");
    // An object on a group this rank is not in.
    torch::nn::Linear model(2, 1);
    kit::DistributedDataParallel::Options o;
    o.group = first.get();
    try {
      kit::DistributedDataParallel ddp(model, o);
      ADD_FAILURE() << "DDP on a group without this rank";
    } catch (const kit::CommError& e) {
      EXPECT_NE(std::string(e.what()).find("DistributedDataParallel on group 0, which rank"),
                std::string::npos) << e.what();
    }
  });
}

// Members that were given different ranks for one call find out at once, instead of pairing up
// with the wrong peers (or waiting for ones that never come until the timeout).
TEST(Subgroups, MembersGivenDifferentRanksAreTold) {
  auto groups = kit::ProcessGroup::local_groups(3, std::chrono::seconds(3));
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      try {
        groups[r]->new_group(r < 2 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2});
      } catch (const kit::CommError& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  int told = 0;
  for (auto& e : errors) told += e.find("must make the same groups, in the same order") != std::string::npos;
  EXPECT_GE(told, 1) << errors[0] << "\n" << errors[1] << "\n" << errors[2];
}

// Groups of two worlds (two calls of local_groups) are not the same world; a subgroup is its
// parent's. (kit::all_reduce refusing another world's group after setup(): tests/unit/rank0_test.)
TEST(Subgroups, AGroupKnowsItsWorld) {
  auto a = kit::ProcessGroup::local_groups(1), b = kit::ProcessGroup::local_groups(1);
  auto sub = a[0]->new_group({0});
  EXPECT_TRUE(sub->same_world(*a[0]));
  EXPECT_FALSE(sub->same_world(*b[0]));
  EXPECT_FALSE(a[0]->same_world(*b[0]));
  EXPECT_EQ(a[0]->name(), "world");
  EXPECT_EQ(sub->name(), "0");
}

// DDP on each of two groups of two, with different data: each group's replicas start from their
// group rank 0's weights, stay equal within the group, differ between the groups, and match one
// process that trains on the group's two batches together (the average is over the group only).
TEST(Subgroups, DistributedDataParallelOnEachGroupAveragesOverItsGroupOnly) {
  constexpr int kSteps = 3;
  auto initial = [](int r) { return torch::arange(4, torch::kDouble).view({1, 4}) * 0.1 + r; };
  auto batch = [](int r, int step) {
    auto x = torch::arange(8, torch::kDouble).view({2, 4}) * (0.05 * (r + 1)) + 0.1 * step;
    auto y = torch::full({2, 1}, (r < 2 ? 1.0 : -1.0) * (r + 1), torch::kDouble);
    return std::make_pair(x, y);
  };
  auto make = [&](int r) {
    torch::nn::Linear m(torch::nn::LinearOptions(4, 1));
    m->to(torch::kDouble);
    torch::NoGradGuard no_grad;
    m->weight.copy_(initial(r));
    m->bias.fill_(-r);
    return m;
  };
  std::vector<torch::nn::Linear> models;
  for (int r = 0; r < 4; ++r) models.push_back(make(r));
  on_ranks(4, [&](kit::ProcessGroup& world) {
    const int r = world.rank();
    auto mine = pair_of(world);
    kit::DistributedDataParallel::Options o;
    o.group = mine.get();
    kit::DistributedDataParallel ddp(models[r], o);
    torch::optim::SGD sgd(models[r]->parameters(), torch::optim::SGDOptions(0.01));
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = batch(r, step);
      sgd.zero_grad();
      torch::mse_loss(ddp.forward(x), y).backward();
      sgd.step();
    }
  });
  for (int group = 0; group < 2; ++group) {
    // One process, the group's two batches in one: the mean of the two ranks' mean losses.
    auto ref = make(2 * group);
    torch::optim::SGD sgd(ref->parameters(), torch::optim::SGDOptions(0.01));
    for (int step = 0; step < kSteps; ++step) {
      auto [x0, y0] = batch(2 * group, step);
      auto [x1, y1] = batch(2 * group + 1, step);
      sgd.zero_grad();
      torch::mse_loss(ref->forward(torch::cat({x0, x1})), torch::cat({y0, y1})).backward();
      sgd.step();
    }
    for (int r : {2 * group, 2 * group + 1}) {
      EXPECT_TRUE(torch::allclose(models[r]->weight, ref->weight, 1e-10, 1e-12))
          << "rank " << r << ": " << models[r]->weight << " vs " << ref->weight;
      EXPECT_TRUE(torch::allclose(models[r]->bias, ref->bias, 1e-10, 1e-12)) << "rank " << r;
    }
  }
  EXPECT_TRUE(torch::equal(models[0]->weight, models[1]->weight));
  EXPECT_TRUE(torch::equal(models[2]->weight, models[3]->weight));
  EXPECT_FALSE(torch::allclose(models[0]->weight, models[2]->weight));
}

// ---------------------------------------------------------------------------------------------
// save0: atomic checkpoint writing (no process group: this process is rank 0 of 1)
// ---------------------------------------------------------------------------------------------

// Parameters of `m` as name -> tensor copies.
std::map<std::string, torch::Tensor> snapshot(const torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (auto& b : m.named_buffers()) out[b.key()] = b.value().detach().clone();
  return out;
}

// Loads `path` into a fresh module of the same shape and returns its state.
std::map<std::string, torch::Tensor> load_linear(const std::string& path, int64_t in, int64_t out) {
  torch::nn::Linear fresh(in, out);
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  fresh->load(archive);
  return snapshot(*fresh);
}

void expect_same_state(const std::map<std::string, torch::Tensor>& a,
                       const std::map<std::string, torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, b.at(name))) << name;
  }
}

TEST(Save0, WritesACompleteLoadableFileAndNoTempFile) {
  ASSERT_FALSE(kit::is_initialized());
  TempDir dir;
  torch::manual_seed(1);
  torch::nn::Linear model(16, 32);
  const std::string path = (dir.path / "model.pt").string();
  kit::save0(model, path);
  EXPECT_EQ(dir.names(), std::set<std::string>{"model.pt"});
  expect_same_state(load_linear(path, 16, 32), snapshot(*model));

  // Overwriting an existing checkpoint replaces it completely.
  torch::manual_seed(2);
  torch::nn::Linear other(16, 32);
  kit::save0(other, path);
  EXPECT_EQ(dir.names(), std::set<std::string>{"model.pt"});
  expect_same_state(load_linear(path, 16, 32), snapshot(*other));
}

TEST(Save0, MissingDirectoryIsAnErrorAndCreatesNothing) {
  TempDir dir;
  torch::nn::Linear model(4, 4);
  const fs::path missing = dir.path / "no-such-dir";
  EXPECT_ANY_THROW(kit::save0(model, (missing / "model.pt").string()));
  EXPECT_FALSE(fs::exists(missing));
  EXPECT_TRUE(dir.names().empty());
}

// The disk fills up half-way through the save (simulated with RLIMIT_FSIZE, which also works
// as root, unlike a read-only directory): save0 must fail, the previous checkpoint must survive
// byte for byte, and the half-written temporary file must not be left behind.
TEST(Save0, FailedSaveKeepsTheOldFileIntactAndLeavesNoTempFile) {
  TempDir dir;
  const std::string path = (dir.path / "model.pt").string();
  torch::manual_seed(3);
  torch::nn::Linear good(64, 256);  // ~66 KB of parameters
  kit::save0(good, path);
  const auto good_state = snapshot(*good);
  const auto good_size = fs::file_size(path);
  ASSERT_GT(good_size, 60000u);

  torch::manual_seed(4);
  torch::nn::Linear newer(64, 256);
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 8192;  // writes past 8 KB fail with EFBIG (SIGXFSZ ignored below)
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  std::string what;
  try {
    kit::save0(newer, path);
  } catch (const std::exception& e) {
    threw = true;
    what = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_TRUE(threw) << "save0 reported success although the file could not be written";
  EXPECT_EQ(dir.names(), std::set<std::string>{"model.pt"}) << "save0 left files behind: " << what;
  EXPECT_EQ(fs::file_size(path), good_size);
  expect_same_state(load_linear(path, 64, 256), good_state);
}

// The rename at the end fails (the target name is taken by a non-empty directory): an error,
// and the temporary file is cleaned up.
TEST(Save0, FailedRenameIsAnErrorAndLeavesNoTempFile) {
  TempDir dir;
  const fs::path target = dir.path / "model.pt";
  fs::create_directory(target);
  { std::ofstream(target / "keep") << "x"; }
  torch::nn::Linear model(8, 8);
  try {
    kit::save0(model, target.string());
    ADD_FAILURE() << "save0 over a non-empty directory did not fail";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(target.string()), std::string::npos)
        << "the message should name the checkpoint: " << e.what();
  }
  EXPECT_EQ(dir.names(), std::set<std::string>{"model.pt"});
  EXPECT_TRUE(fs::is_directory(target));
  EXPECT_TRUE(fs::exists(target / "keep"));
}

// ---------------------------------------------------------------------------------------------
// read_rank_env(): the launcher's environment
// ---------------------------------------------------------------------------------------------

using Vars = std::map<std::string, std::string>;

kit::RankEnv read_env(const Vars& vars) {
  return kit::read_rank_env([&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// The SetupError message read_env(vars) throws; fails the test if it throws nothing.
std::string setup_error(const Vars& vars) {
  try {
    kit::RankEnv env = read_env(vars);
    ADD_FAILURE() << "no SetupError; got rank " << env.rank << " of " << env.world_size;
  } catch (const kit::SetupError& e) {
    std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
    return what;
  }
  return "";
}

const Vars kTorchrun = {{"RANK", "5"},        {"LOCAL_RANK", "1"},        {"WORLD_SIZE", "8"},
                        {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node07"}, {"MASTER_PORT", "29500"}};

Vars with(Vars v, const Vars& changes) {
  for (auto& [k, x] : changes) v[k] = x;
  return v;
}
Vars without(Vars v, std::initializer_list<const char*> names) {
  for (auto n : names) v.erase(n);
  return v;
}

TEST(RankEnv, FullTorchrunEnvironment) {
  kit::RankEnv e = read_env(kTorchrun);
  EXPECT_EQ(e.launcher, "env");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node07");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(RankEnv, TorchrunWithoutLocalWorldSizeAssumesEveryRankOnThisNode) {
  // Without LOCAL_WORLD_SIZE the kit cannot tell how many ranks share this node, and takes the
  // worst case, all 8 of them: each rank then uses fewer threads, and the cores are never
  // oversubscribed. (Asserted as the exact number: read_rank_env() raises any value below
  // local_rank + 1 anyway, so "local_world_size > local_rank" would hold whatever it computed.)
  kit::RankEnv e = read_env(without(kTorchrun, {"LOCAL_WORLD_SIZE"}));
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 8);
}

TEST(RankEnv, NoLauncherIsASingleProcess) {
  kit::RankEnv e = read_env({});
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.master_port, 0);
}

// The part of a "partial rank environment" message before "not set": the missing variables.
std::string missing_part(const std::string& msg) {
  auto end = msg.find("not set");
  EXPECT_NE(end, std::string::npos) << msg;
  return msg.substr(0, end);
}

TEST(RankEnv, PartialEnvironmentNamesExactlyTheMissingVariables) {
  std::string msg = setup_error(without(kTorchrun, {"WORLD_SIZE"}));  // RANK set, WORLD_SIZE not
  EXPECT_NE(msg.find("WORLD_SIZE is not set"), std::string::npos) << msg;
  for (auto present : {"LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    EXPECT_EQ(missing_part(msg).find(present), std::string::npos) << present << " in: " << msg;

  msg = setup_error({{"RANK", "0"}, {"MASTER_ADDR", "h"}});
  std::string missing = missing_part(msg);
  for (auto name : {"LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"})
    EXPECT_NE(missing.find(name), std::string::npos) << name << " not named in: " << msg;
  EXPECT_EQ(missing.find("MASTER_ADDR"), std::string::npos) << msg;

  // An empty value counts as not set.
  msg = setup_error(with(kTorchrun, {{"MASTER_PORT", ""}}));
  EXPECT_NE(missing_part(msg).find("MASTER_PORT"), std::string::npos) << msg;
}

TEST(RankEnv, BadNumbersNameTheVariable) {
  const std::pair<const char*, const char*> cases[] = {
      {"WORLD_SIZE", "abc"}, {"WORLD_SIZE", "0"},      {"WORLD_SIZE", "2x"},
      {"RANK", "-1"},        {"RANK", " 1"},           {"LOCAL_RANK", "1.5"},
      {"MASTER_PORT", "70000"}, {"MASTER_PORT", "0"}, {"MASTER_PORT", "29500x"},
      {"LOCAL_WORLD_SIZE", "0"}, {"WORLD_SIZE", "99999999999999999999"}};
  for (auto [name, value] : cases) {
    std::string msg = setup_error(with(kTorchrun, {{name, value}}));
    EXPECT_NE(msg.find(name), std::string::npos) << name << "=" << value << ": " << msg;
  }
}

TEST(RankEnv, RankMustBeBelowWorldSize) {
  std::string msg = setup_error(with(kTorchrun, {{"RANK", "8"}}));
  EXPECT_NE(msg.find("RANK"), std::string::npos) << msg;
  msg = setup_error(with(kTorchrun, {{"RANK", "1"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "1"},
                                     {"LOCAL_WORLD_SIZE", "1"}}));
  EXPECT_NE(msg.find("RANK"), std::string::npos) << msg;
  kit::RankEnv e = read_env(with(kTorchrun, {{"RANK", "7"}}));  // the last valid rank
  EXPECT_EQ(e.rank, 7);
}

TEST(RankEnv, LocalRankMustBeBelowAGivenLocalWorldSize) {
  std::string msg = setup_error(with(kTorchrun, {{"LOCAL_RANK", "4"}}));  // 4 ranks on this node
  EXPECT_NE(msg.find("LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"), std::string::npos) << msg;
  EXPECT_EQ(read_env(with(kTorchrun, {{"LOCAL_RANK", "3"}})).local_rank, 3);  // the last valid one
}

const Vars kSlurm = {{"SLURM_PROCID", "5"},       {"SLURM_LOCALID", "1"},
                     {"SLURM_NTASKS", "8"},       {"SLURM_NTASKS_PER_NODE", "4"},
                     {"SLURM_JOB_NODELIST", "n[01-04]"}, {"SLURM_JOB_ID", "123456"}};

TEST(RankEnv, SlurmOnlyEnvironment) {
  kit::RankEnv e = read_env(kSlurm);
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "n01");
  EXPECT_EQ(e.master_port, 23456);  // 20000 + 123456 mod 10000, as sbatch/ computes it
}

TEST(RankEnv, SlurmNodelistForms) {
  const std::pair<const char*, const char*> cases[] = {
      {"n[01-04]", "n01"}, {"a1,b2", "a1"}, {"x[3,5-7]", "x3"}, {"node7", "node7"},
      {"jwb[0012-0015,0020],login1", "jwb0012"}, {"gpu-[10-12],cpu[1-2]", "gpu-10"}};
  for (auto [list, host] : cases) {
    EXPECT_EQ(kit::first_host(list), host) << list;
    EXPECT_EQ(read_env(with(kSlurm, {{"SLURM_JOB_NODELIST", list}})).master_addr, host) << list;
  }
  // The older name of the variable is understood too.
  Vars old = without(kSlurm, {"SLURM_JOB_NODELIST"});
  old["SLURM_NODELIST"] = "c[7-8]";
  EXPECT_EQ(read_env(old).master_addr, "c7");
}

// Node names may contain several numeric ranges (slurm.conf: "rack[0-63]_blade[0-41]"); the
// first host takes the first value of every range and keeps the text between and after them.
TEST(RankEnv, SlurmNodelistWithSeveralRangesAndASuffix) {
  EXPECT_EQ(kit::first_host("rack[0-3]_blade[07-41]"), "rack0_blade07");
  EXPECT_EQ(kit::first_host("n[1-2]-ib,m1"), "n1-ib");
}

TEST(RankEnv, SlurmTasksPerNodeFormsAndFallbacks) {
  Vars v = without(kSlurm, {"SLURM_NTASKS_PER_NODE"});
  v["SLURM_TASKS_PER_NODE"] = "4(x2)";
  EXPECT_EQ(read_env(v).local_world_size, 4);
  // With no per-node count at all the kit assumes one task per node, but local task 1 proves
  // that there are at least 2 here: exactly 2, never fewer than the local rank implies.
  kit::RankEnv e = read_env(without(kSlurm, {"SLURM_NTASKS_PER_NODE"}));
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(read_env(with(without(kSlurm, {"SLURM_NTASKS_PER_NODE"}), {{"SLURM_LOCALID", "0"}}))
                .local_world_size, 1);
}

TEST(RankEnv, SlurmWithExplicitMasterAddrAndPort) {
  // An sbatch script that exports MASTER_ADDR/MASTER_PORT and then calls a plain `srun`: the
  // variables win over the node list and the job-id port (env.h), and this is not a "partial"
  // torchrun environment.
  kit::RankEnv e = read_env(with(kSlurm, {{"MASTER_ADDR", "login3"}, {"MASTER_PORT", "23456"}}));
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.master_addr, "login3");
  EXPECT_EQ(e.master_port, 23456);
}

TEST(RankEnv, SlurmProblemsAreSetupErrors) {
  EXPECT_NE(setup_error(with(kSlurm, {{"SLURM_NTASKS", "eight"}})).find("SLURM_NTASKS"), std::string::npos);
  EXPECT_NE(setup_error(with(kSlurm, {{"SLURM_PROCID", "8"}})).find("SLURM_PROCID"), std::string::npos);
  EXPECT_NE(setup_error(without(kSlurm, {"SLURM_LOCALID"})).find("SLURM_LOCALID"), std::string::npos);
  EXPECT_NE(setup_error(with(kSlurm, {{"SLURM_JOB_ID", "12x"}})).find("SLURM_JOB_ID"), std::string::npos);
  EXPECT_NE(setup_error(without(kSlurm, {"SLURM_JOB_NODELIST"})).find("NODELIST"), std::string::npos);
  EXPECT_NE(setup_error(without(kSlurm, {"SLURM_JOB_ID"})).find("SLURM_JOB_ID"), std::string::npos);
}

TEST(RankEnv, PortForJobIsStableDistinctAndOutsideTheEphemeralRange) {
  // The formula the job scripts use too (sbatch/job.sh): 20000 + job id mod 10000. Both sides
  // must agree, so the values are written out here, not computed by the code under test.
  EXPECT_EQ(kit::port_for_job(0), 20000);
  EXPECT_EQ(kit::port_for_job(123456), 23456);
  EXPECT_EQ(kit::port_for_job(9999), 29999);
  EXPECT_EQ(kit::port_for_job(10000), 20000);
  EXPECT_EQ(kit::port_for_job(2147483646), 23646);
  std::set<int> seen;
  for (long job : {0L, 1L, 2L, 9999L, 123456L, 123457L, 2147483646L}) {
    int p = kit::port_for_job(job);
    EXPECT_GE(p, 1024) << job;
    EXPECT_LT(p, 32768) << job;  // Linux's ephemeral ports start at 32768
    seen.insert(p);
  }
  EXPECT_EQ(seen.size(), 7u) << "nearby job ids should get different ports";
}

// ---------------------------------------------------------------------------------------------
// device_for()
// ---------------------------------------------------------------------------------------------

kit::RankEnv node(int local_rank, int local_world_size) {
  kit::RankEnv e;
  e.local_rank = local_rank;
  e.local_world_size = local_world_size;
  e.world_size = 16;
  e.rank = local_rank;
  e.launcher = "env";
  return e;
}

// What Slurm shows each task of a node: its CUDA_VISIBLE_DEVICES (the node's GPU numbers, in
// the order CUDA numbers them). For every local rank, device_for() must pick a device that exists
// in its own list, and no two ranks of the node may end up on the same physical GPU.
std::vector<int> physical_gpus(const std::vector<std::string>& seen_by_task) {
  std::vector<int> gpus;
  const int ranks = static_cast<int>(seen_by_task.size());
  for (int r = 0; r < ranks; ++r) {
    std::vector<int> visible;
    std::stringstream list(seen_by_task[r]);
    for (std::string id; std::getline(list, id, ',');) visible.push_back(std::stoi(id));
    std::string d = kit::device_for(node(r, ranks), static_cast<int>(visible.size()),
                                    seen_by_task[r].c_str());
    EXPECT_EQ(d.rfind("cuda:", 0), 0u) << d;
    size_t index = std::stoul(d.substr(5));
    EXPECT_LT(index, visible.size()) << "local rank " << r << " got " << d << " of " << seen_by_task[r];
    gpus.push_back(index < visible.size() ? visible[index] : -1);
  }
  return gpus;
}

TEST(DeviceFor, EveryTaskSeesAllGpusGresOrGpusPerNode) {
  // --gres=gpu:4 (or --gpus-per-node=4) with --ntasks-per-node=4: each task sees all four.
  EXPECT_EQ(physical_gpus({"0,1,2,3", "0,1,2,3", "0,1,2,3", "0,1,2,3"}), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(kit::device_for(node(3, 4), 4, nullptr), "cuda:3");
}

TEST(DeviceFor, EachTaskSeesOneGpuGpusPerTask) {
  // --gpus-per-task=1 (Slurm binds each task to its GPU): task r sees GPU r alone, as cuda:0.
  EXPECT_EQ(physical_gpus({"0", "1", "2", "3"}), (std::vector<int>{0, 1, 2, 3}));
  // The same when the node's device cgroup renumbers: every task's one GPU is its cuda:0.
  EXPECT_EQ(kit::device_for(node(2, 4), 1, "0"), "cuda:0");
}

TEST(DeviceFor, GpuBindClosestOneGpuPerNumaDomain) {
  // --gpu-bind=closest gives a task the GPUs of its NUMA domain (Slurm's man page); where each
  // domain has one GPU and one task, as with 4 tasks per node on a node of 4 domains, each task
  // sees one GPU, and it is not in local-rank order.
  EXPECT_EQ(physical_gpus({"3", "2", "1", "0"}), (std::vector<int>{3, 2, 1, 0}));
}

TEST(DeviceFor, GpuBindClosestTwoGpusPerSocketIsOneClearError) {
  // Two sockets with two GPUs each, 4 tasks, --gpu-bind=closest: each task sees the two GPUs of
  // its socket. Which one is this rank's depends on the binding of the others: refused.
  for (int rank = 0; rank < 4; ++rank) {
    const char* seen = rank < 2 ? "0,1" : "2,3";
    try {
      std::string d = kit::device_for(node(rank, 4), 2, seen);
      ADD_FAILURE() << "local rank " << rank << " of 4 seeing " << seen << " got " << d;
    } catch (const kit::SetupError& e) {
      std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find("sees 2 GPUs (CUDA_VISIBLE_DEVICES=" + std::string(seen) + ")"), std::string::npos) << msg;
      EXPECT_NE(msg.find("--gpus-per-task=1"), std::string::npos) << msg;
      EXPECT_NE(msg.find("--gres=gpu:N"), std::string::npos) << msg;
      EXPECT_NE(msg.find("--ntasks-per-node=N"), std::string::npos) << msg;
    }
  }
  // CUDA_VISIBLE_DEVICES unset: the message says so by leaving it out.
  try {
    kit::device_for(node(5, 8), 4, nullptr);
    ADD_FAILURE() << "8 ranks on 4 visible GPUs accepted";
  } catch (const kit::SetupError& e) {
    EXPECT_EQ(std::string(e.what()).find("CUDA_VISIBLE_DEVICES"), std::string::npos) << e.what();
  }
}

TEST(DeviceFor, FewerRanksThanVisibleGpus) {
  // One process on a workstation with two GPUs, or ddprun --nproc 2 on a node of 8.
  EXPECT_EQ(kit::device_for(node(0, 1), 2, nullptr), "cuda:0");
  EXPECT_EQ(kit::device_for(node(1, 2), 8, "0,1,2,3,4,5,6,7"), "cuda:1");
}

TEST(DeviceFor, CpuWithoutGpus) {
  EXPECT_EQ(kit::device_for(node(0, 1), 0, nullptr), "cpu");
  EXPECT_EQ(kit::device_for(node(3, 8), 0, ""), "cpu");
}

TEST(DeviceFor, TwoRanksOnOneGpuAreNamed) {
  // ddprun --nproc-per-node 2 on a node of one GPU: both ranks see one GPU and take cuda:0, which
  // device_for() cannot tell apart from --gpus-per-task=1; the gathered (node, GPU) pairs can.
  EXPECT_EQ(kit::shared_gpu({"n1 00000000:65:00.0", "n1 00000000:66:00.0", "n2 00000000:65:00.0"}), "");
  EXPECT_EQ(kit::shared_gpu({"", ""}), "");  // ranks on the CPU share nothing
  const std::string why = kit::shared_gpu({"n1 00000000:65:00.0", "n1 00000000:66:00.0",
                                           "n1 00000000:65:00.0"});
  EXPECT_NE(why.find("ranks 0 and 2 both drive GPU 00000000:65:00.0 on n1"), std::string::npos) << why;
  EXPECT_NE(why.find("one rank per GPU"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
}

TEST(DeviceFor, SlurmGaveGpusButTheRankSeesNone) {
  auto lookup = [](const std::map<std::string, std::string>& vars) {
    return [vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  // A --gpu-bind that left this task without a GPU: Slurm's variables say the job has some.
  const std::string why = kit::gpus_given_but_unseen(
      lookup({{"SLURM_JOB_GPUS", "0,1,2,3"}, {"CUDA_VISIBLE_DEVICES", ""}}), 0);
  EXPECT_NE(why.find("SLURM_JOB_GPUS=0,1,2,3"), std::string::npos) << why;
  EXPECT_NE(why.find("--gpus-per-task=1"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  // It sees one: fine. No GPUs in the job (a CPU partition), or none asked for: fine.
  EXPECT_EQ(kit::gpus_given_but_unseen(lookup({{"SLURM_JOB_GPUS", "0"}}), 1), "");
  EXPECT_EQ(kit::gpus_given_but_unseen(lookup({{"SLURM_GPUS_ON_NODE", "0"}}), 0), "");
  EXPECT_EQ(kit::gpus_given_but_unseen(lookup({}), 0), "");
}

TEST(DeviceFor, CpuBuildInAJobWithGpusIsRefusedUnlessAllowed) {
  auto lookup = [](const std::map<std::string, std::string>& vars) {
    return [vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  // Slurm gave the job GPUs here: the CPU build would train on the CPU while they idle.
  std::map<std::string, std::string> job = {{"SLURM_JOB_ID", "4711"}, {"SLURM_JOB_GPUS", "0,1,2,3"}};
  std::string why = kit::cpu_build_in_gpu_job(lookup(job), 0);
  EXPECT_NE(why.find("CPU-only LibTorch"), std::string::npos) << why;
  EXPECT_NE(why.find("SLURM_JOB_GPUS=0,1,2,3"), std::string::npos) << why;
  EXPECT_NE(why.find("module spider PyTorch"), std::string::npos) << why;  // no site profile
  EXPECT_NE(why.find("--allow-cpu"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  // The site profile's modules, where it exported them, are the module to load.
  job["KIT_MODULES"] = "Stages/2025 GCC OpenMPI PyTorch CMake";
  why = kit::cpu_build_in_gpu_job(lookup(job), 0);
  EXPECT_NE(why.find("'module load Stages/2025 GCC OpenMPI PyTorch CMake'"), std::string::npos) << why;
  // No GRES, but the driver lists GPUs (whole GPU nodes): refused too.
  why = kit::cpu_build_in_gpu_job(lookup({{"SLURM_JOB_ID", "4711"}}), 4);
  EXPECT_NE(why.find("the NVIDIA driver lists 4 GPU(s)"), std::string::npos) << why;
  // Allowed, a job without GPUs, or no job at all (a laptop, ddprun on a workstation): fine.
  job["KIT_ALLOW_CPU"] = "1";
  EXPECT_EQ(kit::cpu_build_in_gpu_job(lookup(job), 4), "");
  EXPECT_EQ(kit::cpu_build_in_gpu_job(lookup({{"SLURM_JOB_ID", "4711"}, {"SLURM_GPUS_ON_NODE", "0"}}), 0), "");
  EXPECT_EQ(kit::cpu_build_in_gpu_job(lookup({{"SLURM_JOB_GPUS", "0,1"}}), 4), "");
  // A value of KIT_ALLOW_CPU that is neither 0 nor 1 is an error, not a silent "no".
  job["KIT_ALLOW_CPU"] = "yes";
  EXPECT_THROW(kit::cpu_build_in_gpu_job(lookup(job), 0), kit::SetupError);
  job["KIT_ALLOW_CPU"] = "0";
  EXPECT_NE(kit::cpu_build_in_gpu_job(lookup(job), 0), "");
}

// ---------------------------------------------------------------------------------------------
// DistributedSampler
// ---------------------------------------------------------------------------------------------

std::vector<std::vector<size_t>> shards(size_t n, int replicas, bool shuffle, uint64_t seed,
                                        int64_t epoch = 0) {
  std::vector<std::vector<size_t>> out;
  for (int r = 0; r < replicas; ++r) {
    kit::DistributedSampler s(n, shuffle, seed, replicas, r);
    s.set_epoch(epoch);
    EXPECT_EQ(s.num_replicas(), replicas);
    EXPECT_EQ(s.rank(), r);
    out.push_back(s.indices());
  }
  return out;
}

TEST(DistributedSampler, DisjointShardsCoverTheWholeRange) {
  for (int replicas : {1, 2, 3, 4}) {
    for (bool shuffle : {false, true}) {
      const size_t n = 120;  // divisible by every replica count: no padding
      auto parts = shards(n, replicas, shuffle, 11);
      std::vector<int> count(n, 0);
      for (auto& p : parts) {
        EXPECT_EQ(p.size(), n / replicas);
        for (size_t i : p) {
          ASSERT_LT(i, n);
          count[i]++;
        }
      }
      for (size_t i = 0; i < n; ++i)
        EXPECT_EQ(count[i], 1) << "index " << i << ", " << replicas << " replicas, shuffle " << shuffle;
    }
  }
}

TEST(DistributedSampler, PaddingGivesEveryRankTheSameLength) {
  for (auto [n, replicas] : {std::pair<size_t, int>{103, 4}, {10, 3}, {3, 4}, {1, 2}}) {
    kit::DistributedSampler probe(n, true, 5, replicas, 0);
    const size_t per_rank = (n + replicas - 1) / replicas;
    EXPECT_EQ(probe.size(), per_rank);
    auto parts = shards(n, replicas, true, 5);
    std::map<size_t, int> count;
    for (auto& p : parts) {
      EXPECT_EQ(p.size(), per_rank) << n << " samples on " << replicas;
      for (size_t i : p) count[i]++;
    }
    EXPECT_EQ(count.size(), n) << "every sample is used";
    int extra = 0;
    for (auto& [i, c] : count) {
      EXPECT_LT(i, n);
      extra += c - 1;
    }
    EXPECT_EQ(extra, static_cast<int>(per_rank * replicas - n)) << "only the padding repeats";
  }
}

TEST(DistributedSampler, NoShuffleIsInOrder) {
  auto parts = shards(10, 3, false, 99);
  EXPECT_EQ(parts[0], (std::vector<size_t>{0, 3, 6, 9}));
  EXPECT_EQ(parts[1], (std::vector<size_t>{1, 4, 7, 0}));  // padded with the start
  EXPECT_EQ(parts[2], (std::vector<size_t>{2, 5, 8, 1}));
  // set_epoch does not reorder an unshuffled sampler.
  EXPECT_EQ(shards(10, 3, false, 99, 5), parts);
}

TEST(DistributedSampler, SameOrderOnAllRanksAndEveryRun) {
  // Every rank computes the same global order; ranks are independent objects (as in separate
  // processes), so the order can only come from (seed, epoch), not from torch's global RNG.
  auto a = shards(64, 4, true, 123, 2);
  torch::manual_seed(999);  // must not matter
  auto b = shards(64, 4, true, 123, 2);
  EXPECT_EQ(a, b);
  // Rank r's j-th index is the (j * replicas + r)-th of one global order: that order is a
  // permutation, and it is what a single process (replicas = 1) with the same seed uses.
  std::vector<size_t> global;
  for (size_t j = 0; j < a[0].size(); ++j)
    for (auto& p : a) global.push_back(p[j]);
  EXPECT_EQ(global, shards(64, 1, true, 123, 2)[0]);
  std::vector<size_t> sorted = global;
  std::sort(sorted.begin(), sorted.end());
  std::vector<size_t> all(64);
  std::iota(all.begin(), all.end(), size_t{0});
  EXPECT_EQ(sorted, all);
  EXPECT_NE(global, all) << "shuffle=true left the data in order";
}

TEST(DistributedSampler, SetEpochChangesTheOrder) {
  kit::DistributedSampler s(200, true, 7, 2, 1);
  auto e0 = s.indices();
  s.set_epoch(1);
  auto e1 = s.indices();
  s.set_epoch(2);
  auto e2 = s.indices();
  EXPECT_NE(e0, e1);
  EXPECT_NE(e1, e2);
  s.set_epoch(0);
  EXPECT_EQ(s.indices(), e0) << "the order must depend on the epoch only";
  // Another seed, another order.
  EXPECT_NE(kit::DistributedSampler(200, true, 8, 2, 1).indices(), e0);
}

TEST(DistributedSampler, RankOutOfRangeIsRejected) {
  EXPECT_ANY_THROW(kit::DistributedSampler(10, true, 0, 2, 2));
  EXPECT_ANY_THROW(kit::DistributedSampler(0, true, 0, 2, 0));
}

// ---------------------------------------------------------------------------------------------
// A checkpoint's CUDA generator: the rank's own GPU's (kit/train/checkpoint_format.h)
// ---------------------------------------------------------------------------------------------

// What a rank saves is its own GPU's generator and nothing of the others it sees: the file is the
// same whatever the GPUs visible, and reads back on any view that gives the rank a GPU (another
// CUDA_VISIBLE_DEVICES, another --gpu-bind). The states here are made up: the format is what is
// tested (tests/gpu: Ex01OnGpus.ResumeWithAnotherGpuVisibility restores real ones).
TEST(CudaRngFile, HoldsTheRanksOwnGpuAndReadsBackUnderAnyVisibility) {
  namespace cf = kit::checkpoint_format;
  const std::string state("state\n of \0 one GPU", 19);
  const std::string bytes = cf::cuda_rng_bytes(state);
  EXPECT_EQ(bytes, "kit-cuda-rng 2\n19\n" + state);
  EXPECT_EQ(cf::cuda_rng_bytes(""), "") << "no GPU, no file";
  for (int visible : {1, 2, 8})
    for (int index : {0, visible - 1}) {
      std::string got;
      EXPECT_EQ(cf::parse_cuda_rng(bytes, index, visible, got), "") << visible << " visible";
      EXPECT_EQ(got, state) << visible << " visible, cuda:" << index;
    }
  std::string got;
  EXPECT_EQ(cf::parse_cuda_rng(bytes, -1, 0, got),
            "holds the state of a GPU's random generator, and this rank has no GPU");
  EXPECT_EQ(cf::parse_cuda_rng(bytes.substr(0, bytes.size() - 1), 0, 1, got),
            "its CUDA random state is damaged");
  EXPECT_EQ(cf::parse_cuda_rng("kit-cuda-rng 3\n1\nx", 0, 1, got), "its CUDA random state is damaged");
  // A checkpoint of an earlier kit holds every GPU the rank saw: its own is found only on the
  // same view (then by the rank's index), and another view is refused as before.
  const std::string old = "kit-cuda-rng 1 2\n3\naaa4\nbbbb";
  EXPECT_EQ(cf::parse_cuda_rng(old, 1, 2, got), "");
  EXPECT_EQ(got, "bbbb");
  EXPECT_EQ(cf::parse_cuda_rng(old, 0, 1, got),
            "holds the CUDA random state of 2 GPU(s), and this rank sees 1 (a bit-exact resume of "
            "a checkpoint of an earlier kit needs the same GPUs)");
}

// ---------------------------------------------------------------------------------------------
// Checkpoints::stop_requested: a signal is looked at every kStopPollSteps steps, a hook's stop at
// its own step (one process: the same rule as on N ranks, without the all-reduce)
// ---------------------------------------------------------------------------------------------

// SIGUSR1 arrives before step 1: the training goes on to step 10, the first polling step, and
// stops there; a later Checkpoints object (a resumed run) does not forget it either.
TEST(StopPoll, ASignalStopsAtTheNextMultipleOfTenSteps) {
  ASSERT_EQ(kit::Checkpoints::kStopPollSteps, 10);
  const fs::path dir = fs::temp_directory_path() / ("kit-stop-poll-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  kit::Checkpoints checkpoints(dir.string(), "test");  // installs the signal handler
  ASSERT_EQ(::raise(SIGUSR1), 0);
  kit::TrainState state;
  for (int64_t step = 1; step <= 9; ++step) {
    state.global_step = step;
    EXPECT_FALSE(checkpoints.stop_requested(state)) << "step " << step << " does not poll";
  }
  state.global_step = 10;
  EXPECT_TRUE(checkpoints.stop_requested(state));
  EXPECT_TRUE(state.stopped);
  kit::TrainState resumed;
  resumed.global_step = 13;
  EXPECT_FALSE(kit::Checkpoints(dir.string(), "test").stop_requested(resumed));
  resumed.global_step = 20;
  EXPECT_TRUE(checkpoints.stop_requested(resumed));
  fs::remove_all(dir);
}

// A test's hook stops after the step it names, whichever it is (every rank runs the same hook, so
// that step polls everywhere); without a signal or a hook, a polling step goes on.
TEST(StopPoll, AHookStopsAfterItsOwnStep) {
  const fs::path dir = fs::temp_directory_path() / ("kit-stop-hook-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  kit::Checkpoints checkpoints(dir.string(), "test");
  std::vector<int64_t> asked;
  kit::testing::checkpoint_hooks().after_step = [&](int64_t step) {
    asked.push_back(step);
    return step == 7;
  };
  kit::TrainState state;
  for (int64_t step = 1; step <= 6; ++step) {
    state.global_step = step;
    EXPECT_FALSE(checkpoints.stop_requested(state)) << "step " << step;
  }
  state.global_step = 7;
  EXPECT_TRUE(checkpoints.stop_requested(state));
  kit::TrainState other;
  other.global_step = 10;  // polls: no signal, no hook's stop
  EXPECT_FALSE(checkpoints.stop_requested(other));
  EXPECT_EQ(asked, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 10})) << "the hook runs after every step";
  kit::testing::checkpoint_hooks().after_step = nullptr;
  fs::remove_all(dir);
}

}  // namespace
