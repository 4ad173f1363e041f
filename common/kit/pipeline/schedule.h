// kit/pipeline/schedule.h — the pipeline's schedules as lists of actions: which forward and which
// backward each rank runs, in which order. Pure arithmetic, no tensors: the order a pipelined
// trainer follows, prints and is checked against, and the run of the lists on paper.
//
// The model is cut into chunks, numbered along the pipeline: chunk c runs on rank c % pp, so with
// v chunks per rank (interleaved 1F1B) rank r holds chunks r, r + pp, r + 2 pp, ... and a
// micro-batch's activation goes round the ranks v times. With v = 1 a chunk is a stage. Each
// micro-batch goes forward through chunks 0, 1, ..., pp * v - 1, the last one computes its loss,
// and its backward comes back the other way.
//
// The orders are PyTorch's (torch.distributed.pipelining, checked by tests/oracle/oracle_pp_orders.py
// against torch's own classes):
//   gpipe        every forward, then every backward, micro-batches in order (ScheduleGPipe):
//                memory for all m micro-batches' activations at once;
//   1f1b         min(m, pp - r) forwards, then one backward and one forward in turn, then the
//                remaining backwards (Schedule1F1B): at most pp - r micro-batches in flight on
//                rank r, whatever m is;
//   interleaved  v chunks per rank, warm-up (v - 1) * mpr + 2 (pp - 1 - r) forwards with mpr the
//                micro-batches per round, then forward and backward in turn
//                (ScheduleInterleaved1F1B, Narayanan et al. 2021): the bubble is about v times
//                smaller, for v times more messages.
// Actions print as PyTorch prints them: "1F0" is chunk 1's forward of micro-batch 0, "0B3" chunk
// 0's backward of micro-batch 3.
#pragma once

#include <string>
#include <vector>

namespace kit::pp {

enum class Schedule { kGPipe, k1F1B, kInterleaved };

// "gpipe", "1f1b", "interleaved" <-> Schedule. parse() throws std::invalid_argument (one line
// listing the names) on anything else.
Schedule parse_schedule(const std::string& name);
const char* schedule_name(Schedule s);

struct Shape {
  int pp = 1;     // ranks along the pipeline
  int v = 1;      // model chunks per rank (interleaved only; 1 for gpipe and 1f1b)
  int micro = 1;  // micro-batches per step
  int chunks() const { return pp * v; }
};

// One forward ('F') or backward ('B') of micro-batch `micro` through model chunk `chunk`.
struct Action {
  char kind = 'F';
  int chunk = 0;
  int micro = 0;
  bool operator==(const Action&) const = default;
};
std::string to_string(const Action& a);  // "1F0"
int rank_of(int chunk, const Shape& shape);  // chunk % pp

// One line saying why this shape cannot run `s` ("" when it can): pp, v or micro below 1; v > 1
// for gpipe or 1f1b; for interleaved, micro not a multiple of its rounds (max(1, micro / pp)), as
// PyTorch refuses it.
std::string refusal(Schedule s, const Shape& shape);
// One line on the bubble when micro < pp ("" otherwise): such a step runs, but most of it waits.
std::string few_micro_batches_warning(const Shape& shape);

// Rank `rank`'s actions, in the order it runs them. Throws std::invalid_argument with refusal()'s
// line when the shape cannot run the schedule.
std::vector<Action> actions(Schedule s, const Shape& shape, int rank);
std::vector<std::vector<Action>> all_actions(Schedule s, const Shape& shape);  // every rank's

// --- Running the lists on paper ---------------------------------------------------------------
// Each rank runs its list in order; an action starts when the rank is free and its inputs exist:
// a forward needs the previous chunk's forward of its micro-batch (done on another rank, or on
// this one for chunk 0's tokens), a backward its own forward and the next chunk's backward (the
// last chunk: its loss, i.e. its own forward). Sends and receives cost nothing here.
struct Timeline {
  // Per rank, its actions with their start and end in units of time.
  struct Slot {
    Action action;
    int start = 0, end = 0;
  };
  std::vector<std::vector<Slot>> ranks;
  int length = 0;             // end of the last action
  double idle_fraction = 0;   // idle rank-time over pp x length
  std::vector<int> peak_in_flight;  // per rank: most micro-batch forwards alive at once
};
// A forward takes `forward_cost` units, a backward `backward_cost` (about twice as long in
// practice). Throws std::runtime_error, one line naming each stuck rank's next action and what it
// waits for, when the lists deadlock (no rank can start its next action), or when they do not run
// every forward and backward of every chunk exactly once on its own rank.
Timeline simulate(const std::vector<std::vector<Action>>& per_rank, const Shape& shape,
                  int forward_cost = 1, int backward_cost = 2);

// The grid of a timeline, a row per unit of time and a column per rank, as PyTorch's
// _format_pipeline_order prints its schedules (an empty cell: the rank waits); what
// `--print-schedule` shows, with the lists themselves above it.
std::string format(const Timeline& t);

// The textbook idle fraction of a step with equal stages and free messages:
// (pp - 1) / (v * micro + pp - 1). For v = 1, (p - 1) / (m + p - 1): the pipe fills for p - 1
// stage-times and drains for as long, against m stage-times of work. Interleaving makes each
// chunk's time v times shorter, so the fill and drain cost 1/v as much.
double bubble_formula(const Shape& shape);

}  // namespace kit::pp
