// kit/pipeline/schedule.cpp — the schedules' lists and their run on paper (see schedule.h).
#include "kit/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace kit::pp {

Schedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return Schedule::kGPipe;
  if (name == "1f1b") return Schedule::k1F1B;
  if (name == "interleaved") return Schedule::kInterleaved;
  throw std::invalid_argument("unknown pipeline schedule '" + name +
                              "': one of gpipe, 1f1b, interleaved");
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kGPipe: return "gpipe";
    case Schedule::k1F1B: return "1f1b";
    case Schedule::kInterleaved: return "interleaved";
  }
  return "?";
}

std::string to_string(const Action& a) {
  return std::to_string(a.chunk) + a.kind + std::to_string(a.micro);
}

int rank_of(int chunk, const Shape& shape) { return chunk % shape.pp; }

namespace {
// Interleaved 1F1B's rounds: groups of micro-batches that go through a rank's chunks together.
int rounds(const Shape& s) { return std::max(1, s.micro / s.pp); }
}  // namespace

std::string refusal(Schedule s, const Shape& shape) {
  if (shape.pp < 1 || shape.v < 1 || shape.micro < 1)
    return "pipeline: pp (" + std::to_string(shape.pp) + "), chunks per rank (" +
           std::to_string(shape.v) + ") and micro-batches (" + std::to_string(shape.micro) +
           ") must each be at least 1";
  if (s != Schedule::kInterleaved && shape.v != 1)
    return std::string("pipeline: ") + schedule_name(s) + " runs one chunk per rank, not " +
           std::to_string(shape.v) + ": more chunks per rank is the interleaved schedule";
  if (s == Schedule::kInterleaved && shape.micro % rounds(shape) != 0)
    return "pipeline: interleaved 1F1B runs the micro-batches in rounds of about pp (" +
           std::to_string(shape.pp) + "): " + std::to_string(shape.micro) +
           " micro-batches are not a multiple of its " + std::to_string(rounds(shape)) +
           " rounds (PyTorch refuses it too); take a multiple of " + std::to_string(shape.pp);
  return "";
}

std::string few_micro_batches_warning(const Shape& shape) {
  if (shape.micro >= shape.pp) return "";
  Shape same = shape;
  same.micro = shape.pp;
  return "pipeline: " + std::to_string(shape.micro) + " micro-batches for " +
         std::to_string(shape.pp) + " stages: each rank waits about " +
         std::to_string(static_cast<int>(100 * bubble_formula(shape) + 0.5)) +
         "% of the step (" + std::to_string(static_cast<int>(100 * bubble_formula(same) + 0.5)) +
         "% with " + std::to_string(shape.pp) + ", less with more)";
}

std::vector<Action> actions(Schedule s, const Shape& shape, int rank) {
  if (std::string why = refusal(s, shape); !why.empty()) throw std::invalid_argument(why);
  if (rank < 0 || rank >= shape.pp)
    throw std::invalid_argument("pipeline: rank " + std::to_string(rank) + " is not in 0.." +
                                std::to_string(shape.pp - 1));
  const int p = shape.pp, m = shape.micro;
  std::vector<Action> out;
  if (s == Schedule::kGPipe) {
    for (int i = 0; i < m; ++i) out.push_back({'F', rank, i});
    for (int i = 0; i < m; ++i) out.push_back({'B', rank, i});
    return out;
  }
  if (s == Schedule::k1F1B) {
    // The last rank can start a backward after one forward, the one before it after two...
    const int warmup = std::min(m, p - rank);
    int f = 0, b = 0;
    while (f < warmup) out.push_back({'F', rank, f++});
    while (true) {  // a backward, then a forward, until the forwards run out
      out.push_back({'B', rank, b++});
      if (f == m) break;
      out.push_back({'F', rank, f++});
    }
    while (b < m) out.push_back({'B', rank, b++});
    return out;
  }
  // Interleaved: step `op` of the rank's list picks a chunk from its number, so that a round of
  // micro-batches goes through chunk r, then r + p, ... forward, and the other way backward.
  const int v = shape.v, per_round = m / rounds(shape);
  const int warmup = std::min((v - 1) * per_round + 2 * (p - 1 - rank), m * v);
  const int both = m * v - warmup;  // steps with a forward and a backward
  auto forward_chunk = [&](int op) { return ((op / per_round) % v) * p + rank; };
  auto backward_chunk = [&](int op) {
    return (v - 1 - ((op - warmup) / per_round) % v) * p + rank;
  };
  std::map<int, int> next_f, next_b;  // chunk -> its next micro-batch
  for (int op = 0; op < warmup + both + warmup; ++op) {
    if (op < warmup + both) {
      const int c = forward_chunk(op);
      out.push_back({'F', c, next_f[c]++});
    }
    if (op >= warmup) {
      const int c = backward_chunk(op);
      out.push_back({'B', c, next_b[c]++});
    }
  }
  return out;
}

std::vector<std::vector<Action>> all_actions(Schedule s, const Shape& shape) {
  std::vector<std::vector<Action>> out;
  for (int r = 0; r < shape.pp; ++r) out.push_back(actions(s, shape, r));
  return out;
}

Timeline simulate(const std::vector<std::vector<Action>>& per_rank, const Shape& shape,
                  int forward_cost, int backward_cost) {
  const int p = shape.pp, last = shape.chunks() - 1;
  if (static_cast<int>(per_rank.size()) != p)
    throw std::runtime_error("pipeline: " + std::to_string(per_rank.size()) +
                             " lists of actions for " + std::to_string(p) + " ranks");
  // Every action once, on its own rank.
  std::map<std::tuple<char, int, int>, int> seen;
  for (int r = 0; r < p; ++r)
    for (const Action& a : per_rank[r]) {
      if (a.chunk < 0 || a.chunk > last || a.micro < 0 || a.micro >= shape.micro ||
          (a.kind != 'F' && a.kind != 'B'))
        throw std::runtime_error("pipeline: rank " + std::to_string(r) + " runs " + to_string(a) +
                                 ", which is not an action of " + std::to_string(last + 1) +
                                 " chunks and " + std::to_string(shape.micro) + " micro-batches");
      if (rank_of(a.chunk, shape) != r)
        throw std::runtime_error("pipeline: rank " + std::to_string(r) + " runs " + to_string(a) +
                                 ", but chunk " + std::to_string(a.chunk) + " lives on rank " +
                                 std::to_string(rank_of(a.chunk, shape)));
      if (++seen[{a.kind, a.chunk, a.micro}] > 1)
        throw std::runtime_error("pipeline: rank " + std::to_string(r) + " runs " + to_string(a) +
                                 " twice");
    }
  for (int c = 0; c <= last; ++c)
    for (int i = 0; i < shape.micro; ++i)
      for (char k : {'F', 'B'})
        if (!seen.count({k, c, i}))
          throw std::runtime_error("pipeline: rank " + std::to_string(rank_of(c, shape)) +
                                   " never runs " + to_string({k, c, i}));

  // Each rank runs its next action as soon as it is free and the action's inputs exist.
  std::map<std::tuple<char, int, int>, int> done;  // action -> its end
  auto needs = [&](const Action& a) {
    std::vector<Action> n;
    if (a.kind == 'F' && a.chunk > 0) n.push_back({'F', a.chunk - 1, a.micro});
    if (a.kind == 'B') {
      n.push_back({'F', a.chunk, a.micro});
      if (a.chunk < last) n.push_back({'B', a.chunk + 1, a.micro});
    }
    return n;
  };
  Timeline t;
  t.ranks.resize(p);
  std::vector<size_t> next(p, 0);
  std::vector<int> free_at(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r)
      while (next[r] < per_rank[r].size()) {
        const Action& a = per_rank[r][next[r]];
        int start = free_at[r];
        bool ready = true;
        for (const Action& n : needs(a)) {
          auto it = done.find({n.kind, n.chunk, n.micro});
          if (it == done.end()) { ready = false; break; }
          start = std::max(start, it->second);
        }
        if (!ready) break;
        const int end = start + (a.kind == 'F' ? forward_cost : backward_cost);
        done[{a.kind, a.chunk, a.micro}] = end;
        t.ranks[r].push_back({a, start, end});
        free_at[r] = end;
        ++next[r];
        progress = true;
      }
  }
  std::string stuck;
  for (int r = 0; r < p; ++r)
    if (next[r] < per_rank[r].size()) {
      const Action& a = per_rank[r][next[r]];
      std::string waits;
      for (const Action& n : needs(a))
        if (!done.count({n.kind, n.chunk, n.micro}))
          waits += (waits.empty() ? "" : " and ") + to_string(n) + " (rank " +
                   std::to_string(rank_of(n.chunk, shape)) + ")";
      stuck += (stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits in " +
               to_string(a) + " for " + waits;
    }
  if (!stuck.empty())
    throw std::runtime_error("pipeline: these lists deadlock: " + stuck);

  int busy = 0;
  for (int r = 0; r < p; ++r) {
    int alive = 0, peak = 0;
    for (const auto& s : t.ranks[r]) {
      t.length = std::max(t.length, s.end);
      busy += s.end - s.start;
      alive += s.action.kind == 'F' ? 1 : -1;
      peak = std::max(peak, alive);
    }
    t.peak_in_flight.push_back(peak);
  }
  t.idle_fraction = t.length ? 1.0 - static_cast<double>(busy) / (p * t.length) : 0.0;
  return t;
}

std::string format(const Timeline& t) {
  const int p = static_cast<int>(t.ranks.size());
  std::vector<std::vector<std::string>> grid(t.length, std::vector<std::string>(p));
  size_t width = 6;  // "rank 0"
  for (int r = 0; r < p; ++r)
    for (const auto& s : t.ranks[r])
      for (int u = s.start; u < s.end; ++u) {
        grid[u][r] = to_string(s.action);
        width = std::max(width, grid[u][r].size());
      }
  const std::string last = std::to_string(std::max(0, t.length - 1));
  auto pad = [](std::string s, size_t w) { return s.append(w > s.size() ? w - s.size() : 0, ' '); };
  std::string out = pad("", last.size() + 1);
  for (int r = 0; r < p; ++r) out += " " + pad("rank " + std::to_string(r), width);
  out += "\n";
  for (int u = 0; u < t.length; ++u) {
    std::string n = std::to_string(u);
    std::string line = std::string(last.size() - n.size(), ' ') + n + " ";
    for (int r = 0; r < p; ++r) line += " " + pad(grid[u][r], width);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

double bubble_formula(const Shape& shape) {
  return static_cast<double>(shape.pp - 1) / (shape.v * shape.micro + shape.pp - 1);
}

}  // namespace kit::pp
