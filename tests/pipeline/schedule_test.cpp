// The pipeline's schedules as lists (kit/pipeline/schedule.h): their orders worked out by hand,
// their run on paper against the textbook bubble, the activations each keeps alive, and the
// refusals. No tensors and no LibTorch: this binary compiles in seconds. That the orders are
// PyTorch's is oracle_pp_orders.py's job (label oracle).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "kit/pipeline/schedule.h"

namespace {

using kit::pp::Action;
using kit::pp::Schedule;
using kit::pp::Shape;

std::string listed(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) s += (s.empty() ? "" : " ") + kit::pp::to_string(a);
  return s;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST(PipelineSchedule, OrdersWorkedOutByHand) {
  const Shape four{.pp = 4, .v = 1, .micro = 6};
  EXPECT_EQ(listed(kit::pp::actions(Schedule::kGPipe, four, 2)),
            "2F0 2F1 2F2 2F3 2F4 2F5 2B0 2B1 2B2 2B3 2B4 2B5");
  // 1F1B: rank r starts with pp - r forwards, then a backward and a forward in turn.
  EXPECT_EQ(listed(kit::pp::actions(Schedule::k1F1B, four, 0)),
            "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5");
  EXPECT_EQ(listed(kit::pp::actions(Schedule::k1F1B, four, 3)),
            "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5");
  // Fewer micro-batches than stages: every forward first.
  EXPECT_EQ(listed(kit::pp::actions(Schedule::k1F1B, {.pp = 4, .micro = 2}, 1)), "1F0 1F1 1B0 1B1");
  // Interleaved, 2 ranks x 2 chunks, 4 micro-batches (2 rounds of 2): rank 0 holds chunks 0 and 2;
  // warm-up (2 - 1) x 2 + 2 x (2 - 1 - 0) = 4 forwards: a round through chunk 0, then chunk 2.
  EXPECT_EQ(listed(kit::pp::actions(Schedule::kInterleaved, {.pp = 2, .v = 2, .micro = 4}, 0)),
            "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
}

TEST(PipelineSchedule, OnPaperTheIdleFractionIsTheTextbookBubble) {
  // Backward twice as long as forward, messages free: (pp - 1) / (v m + pp - 1), exactly, for
  // micro-batches that fill whole rounds.
  struct Case { Schedule s; Shape shape; };
  for (const Case& c : {Case{Schedule::kGPipe, {4, 1, 8}}, Case{Schedule::k1F1B, {4, 1, 8}},
                        Case{Schedule::k1F1B, {4, 1, 16}}, Case{Schedule::k1F1B, {2, 1, 1}},
                        Case{Schedule::kInterleaved, {4, 2, 8}}, Case{Schedule::kInterleaved, {4, 4, 8}},
                        Case{Schedule::kInterleaved, {2, 2, 4}}, Case{Schedule::kInterleaved, {4, 2, 12}}}) {
    const auto t = kit::pp::simulate(kit::pp::all_actions(c.s, c.shape), c.shape);
    EXPECT_NEAR(t.idle_fraction, kit::pp::bubble_formula(c.shape), 1e-12)
        << kit::pp::schedule_name(c.s) << " pp " << c.shape.pp << " v " << c.shape.v << " m " << c.shape.micro;
  }
  EXPECT_DOUBLE_EQ(kit::pp::bubble_formula({.pp = 4, .v = 1, .micro = 8}), 3.0 / 11);
  EXPECT_DOUBLE_EQ(kit::pp::bubble_formula({.pp = 4, .v = 2, .micro = 8}), 3.0 / 19);
}

TEST(PipelineSchedule, OneFOneBKeepsAtMostPpMicroBatchesAliveGPipeKeepsThemAll) {
  const Shape shape{.pp = 4, .v = 1, .micro = 8};
  const auto gpipe = kit::pp::simulate(kit::pp::all_actions(Schedule::kGPipe, shape), shape);
  const auto ofob = kit::pp::simulate(kit::pp::all_actions(Schedule::k1F1B, shape), shape);
  EXPECT_EQ(gpipe.peak_in_flight, (std::vector<int>{8, 8, 8, 8}));
  EXPECT_EQ(ofob.peak_in_flight, (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(gpipe.length, ofob.length);  // same bubble, less memory
}

TEST(PipelineSchedule, ADeadlockNamesEachStuckRankAndWhatItWaitsFor) {
  // Rank 0 runs micro-batch 0's backward before micro-batch 1's forward, rank 1 wants forward 1
  // before backward 0: each waits for the other.
  const Shape shape{.pp = 2, .v = 1, .micro = 2};
  std::vector<std::vector<Action>> lists = {
      {{'F', 0, 0}, {'B', 0, 0}, {'F', 0, 1}, {'B', 0, 1}},
      {{'F', 1, 0}, {'F', 1, 1}, {'B', 1, 0}, {'B', 1, 1}}};
  EXPECT_EQ(error_of([&] { kit::pp::simulate(lists, shape); }),
            "pipeline: these lists deadlock: rank 0 waits in 0B0 for 1B0 (rank 1); rank 1 waits in "
            "1F1 for 0F1 (rank 0)");
  lists[1] = {{'F', 1, 0}, {'B', 1, 0}, {'F', 1, 1}};
  EXPECT_EQ(error_of([&] { kit::pp::simulate(lists, shape); }), "pipeline: rank 1 never runs 1B1");
  lists[1] = {{'F', 1, 0}, {'B', 1, 0}, {'F', 0, 1}, {'B', 1, 1}};
  EXPECT_EQ(error_of([&] { kit::pp::simulate(lists, shape); }),
            "pipeline: rank 1 runs 0F1, but chunk 0 lives on rank 0");
}

TEST(PipelineSchedule, RefusalsAreOneLine) {
  EXPECT_EQ(error_of([] { kit::pp::actions(Schedule::k1F1B, {.pp = 2, .v = 2, .micro = 4}, 0); }),
            "pipeline: 1f1b runs one chunk per rank, not 2: more chunks per rank is the interleaved schedule");
  EXPECT_EQ(error_of([] { kit::pp::actions(Schedule::kInterleaved, {.pp = 4, .v = 2, .micro = 9}, 0); }),
            "pipeline: interleaved 1F1B runs the micro-batches in rounds of about pp (4): 9 "
            "micro-batches are not a multiple of its 2 rounds (PyTorch refuses it too); take a multiple of 4");
  EXPECT_EQ(error_of([] { kit::pp::actions(Schedule::kGPipe, {.pp = 2, .v = 1, .micro = 0}, 0); }),
            "pipeline: pp (2), chunks per rank (1) and micro-batches (0) must each be at least 1");
  EXPECT_EQ(error_of([] { kit::pp::parse_schedule("zb"); }),
            "unknown pipeline schedule 'zb': one of gpipe, 1f1b, interleaved");
  EXPECT_EQ(kit::pp::few_micro_batches_warning({.pp = 4, .v = 1, .micro = 2}),
            "pipeline: 2 micro-batches for 4 stages: each rank waits about 60% of the step (43% with 4, less with more)");
  EXPECT_EQ(kit::pp::few_micro_batches_warning({.pp = 4, .v = 1, .micro = 4}), "");
}

TEST(PipelineSchedule, TheGridShowsEachRankAtEachMoment) {
  const Shape shape{.pp = 2, .v = 1, .micro = 2};
  const auto t = kit::pp::simulate(kit::pp::all_actions(Schedule::k1F1B, shape), shape, 1, 1);
  EXPECT_EQ(kit::pp::format(t),
            "   rank 0 rank 1\n"
            "0  0F0\n"
            "1  0F1    1F0\n"
            "2         1B0\n"
            "3  0B0    1F1\n"
            "4         1B1\n"
            "5  0B1\n");
}

}  // namespace
