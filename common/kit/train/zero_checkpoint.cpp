// kit/train/zero_checkpoint.cpp — one file per rank plus a manifest (see zero_checkpoint.h).
#include "kit/train/zero_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <vector>

#include <torch/torch.h>

#include "kit/train/checkpoint.h"  // Checkpoints::shard_file
#include "kit/runtime/files.h"     // write_atomically

namespace kit {
namespace {

struct Manifest {
  int stage = 0, ranks = 0;
  int64_t parameters = 0;
  double lr = -1;  // the learning rate (set_lr's), as torch's optimizer state keeps it; -1: none
  bool flat = false;  // ZeRO-1/2 on FlatParameters: one contiguous run (ShardLayout), no buckets
};

// The MANIFEST's version: 2 for ZeRO-1/2's shards as slices of gradient-ordered buckets
// (kit/sharding/sharding.h, BucketLayout); 1 for ZeRO-3, and for ZeRO-1/2 in the layout before it,
// whose shards were contiguous runs of the flat vector and cannot be loaded into the new one.
// FlatParameters' ZeRO-1/2 (exercise 03's step by hand) is that contiguous layout: version 1 too.
int version_of(int stage, bool flat = false) { return stage == 3 || flat ? 1 : 2; }

std::string shard_path(const std::string& dir, int rank, int ranks) {
  return dir + "/" + Checkpoints::shard_file(rank, ranks);
}

// Every rank: its tensors (and the AdamW step counts, as one int64 tensor at the end).
void save(const std::string& dir, ProcessGroup& group, const Manifest& m,
          std::vector<torch::Tensor> tensors, const std::vector<int64_t>& steps) {
  std::filesystem::create_directories(dir);
  tensors.push_back(torch::tensor(steps, torch::kLong));
  torch::serialize::OutputArchive archive;
  for (size_t i = 0; i < tensors.size(); ++i)
    archive.write(std::to_string(i), tensors[i].detach().cpu());
  write_atomically(shard_path(dir, group.rank(), group.size()), archive, "ZeRO checkpoint");
  if (group.rank() == 0) {
    std::ostringstream text;
    text << "kit-zero-checkpoint " << version_of(m.stage, m.flat) << "\nstage " << m.stage << "\nranks "
         << m.ranks << "\nparameters " << m.parameters << "\n"
         << std::setprecision(17) << "lr " << m.lr << "\n";  // 17 digits: the same double back
    write_atomically(dir + "/MANIFEST", text.str(), "ZeRO checkpoint");
  }
  group.barrier();  // complete on every rank before anybody goes on (or is stopped)
}

// Rank `from_rank` of `from_ranks`'s part of one tensor of the state (its shard of the weights,
// or of a moment) into this rank's `to` (rank `to_rank` of `to_ranks`): where the two overlap.
// Both are cut as the layouts cut them: the state is `segments` of L elements each (ZeRO-1/2:
// the buckets; ZeRO-3: the unit, one segment), each padded to N slices of ceil(L / N) elements,
// and a rank's tensor is its slice of every segment, end to end (kit/sharding/sharding.h).
void copy_overlap(const torch::Tensor& from, int from_rank, int from_ranks, const torch::Tensor& to,
                  int to_rank, int to_ranks, const std::vector<int64_t>& segments) {
  int64_t at_from = 0, at_to = 0;  // where the segment's slice starts in each tensor
  for (int64_t L : segments) {
    const int64_t s_from = (L + from_ranks - 1) / from_ranks, s_to = (L + to_ranks - 1) / to_ranks;
    const int64_t lo = std::max(from_rank * s_from, to_rank * s_to);
    const int64_t hi = std::min({(from_rank + 1) * s_from, (to_rank + 1) * s_to, L});
    if (lo < hi)
      to.narrow(0, at_to + lo - to_rank * s_to, hi - lo)
          .copy_(from.narrow(0, at_from + lo - from_rank * s_from, hi - lo));
    at_from += s_from;
    at_to += s_to;
  }
}

int64_t sliced_numel(const std::vector<int64_t>& segments, int ranks) {
  int64_t n = 0;
  for (int64_t L : segments) n += (L + ranks - 1) / ranks;
  return n;
}

// Every rank: checks the manifest against this run, then reads the state into `into` (copies in
// place; into[i] is cut in `segments[i]`, see copy_overlap) and returns the step counts; `lr` gets
// the saved learning rate (unchanged where a checkpoint of an earlier kit has none). On as many
// ranks as saved it, each rank reads its own file. On another number, each rank reads every old
// rank's file in turn, one at a time, and keeps what falls in its new shard: the state is the
// same end to end, cut anew (resharding; the padding stays zero).
std::vector<int64_t> load(const std::string& dir, ProcessGroup& group, const Manifest& want,
                          const std::vector<torch::Tensor>& into,
                          const std::vector<std::vector<int64_t>>& segments, double& lr) {
  std::ifstream in(dir + "/MANIFEST");
  std::string magic, key;
  int version = 0;
  Manifest m;
  if (!(in >> magic >> version) || magic != "kit-zero-checkpoint" || version < 1 || version > 2 ||
      !(in >> key >> m.stage >> key >> m.ranks >> key >> m.parameters) || m.ranks < 1)
    throw ZeroCheckpointError(dir + ": not a ZeRO checkpoint (no valid MANIFEST)");
  if (m.stage != want.stage || m.parameters != want.parameters)
    throw ZeroCheckpointError(dir + ": a ZeRO-" + std::to_string(m.stage) + " checkpoint of " +
                              std::to_string(m.parameters) + " parameters, this run is ZeRO-" +
                              std::to_string(want.stage) + " with " +
                              std::to_string(want.parameters));
  if (version != version_of(m.stage, want.flat))
    throw ZeroCheckpointError(dir + ": a ZeRO-" + std::to_string(m.stage) + " checkpoint in " +
                              (want.flat ? "ZeroOptimizer's buckets: FlatParameters' one contiguous "
                                           "layout cannot resume it"
                                         : "the layout before gradient-ordered buckets: this kit "
                                           "cannot resume it"));
  const bool same = m.ranks == group.size();
  torch::NoGradGuard no_grad;
  if (!same)
    for (auto& t : into) t.zero_();  // the padding, which no old shard covers
  torch::Tensor steps;
  for (int q = same ? group.rank() : 0; q < (same ? group.rank() + 1 : m.ranks); ++q) {
    const std::string path = shard_path(dir, q, m.ranks);
    torch::serialize::InputArchive archive;
    try {
      archive.load_from(path);
    } catch (const std::exception&) {
      throw ZeroCheckpointError(path + ": missing or damaged");
    }
    for (size_t i = 0; i < into.size(); ++i) {
      torch::Tensor t;
      if (!archive.try_read(std::to_string(i), t) ||
          t.numel() != (same ? into[i].numel() : sliced_numel(segments[i], m.ranks)))
        throw ZeroCheckpointError(path + ": tensor " + std::to_string(i) + " missing or of the wrong size");
      if (same) into[i].copy_(t.view(into[i].sizes()));
      else copy_overlap(t.reshape(-1), q, m.ranks, into[i].view(-1), group.rank(), group.size(), segments[i]);
    }
    if (!steps.defined() && !archive.try_read(std::to_string(into.size()), steps))
      throw ZeroCheckpointError(path + ": the step counts are missing");
  }
  if (in >> key >> m.lr && key == "lr" && m.lr >= 0) lr = m.lr;
  steps = steps.contiguous();
  return std::vector<int64_t>(steps.data_ptr<int64_t>(), steps.data_ptr<int64_t>() + steps.numel());
}

}  // namespace

void save_zero_checkpoint(const std::string& dir, ZeroOptimizer& o) {
  Manifest m{o.stage(), o.group().size(), o.layout().numel(), o.lr()};
  save(dir, o.group(), m, {o.own_params(), o.adamw().exp_avg(), o.adamw().exp_avg_sq()},
       {o.adamw().steps()});
}

void load_zero_checkpoint(const std::string& dir, ZeroOptimizer& o) {
  Manifest m{o.stage(), o.group().size(), o.layout().numel()};
  torch::Tensor shard = o.own_params();
  double lr = o.lr();
  std::vector<int64_t> buckets;  // the segments of ZeRO-1/2's shard: one per bucket
  for (const auto& b : o.layout().buckets()) buckets.push_back(b.numel);
  auto steps = load(dir, o.group(), m, {shard, o.adamw().exp_avg(), o.adamw().exp_avg_sq()},
                    {buckets, buckets, buckets}, lr);
  o.adamw().set_steps(steps.at(0));
  o.set_lr(lr);
  o.load_own_params(shard);  // all-gathers: every rank has the whole model again
}

// One segment, the whole flat vector: a shard is one contiguous run of it (ShardLayout).
void save_zero_checkpoint(const std::string& dir, FlatParameters& flat, ShardedAdamW& adamw,
                          int stage) {
  Manifest m{stage, flat.group().size(), flat.layout().numel(), adamw.options().lr(), true};
  save(dir, flat.group(), m, {flat.layout().own(flat.params()), adamw.exp_avg(), adamw.exp_avg_sq()},
       {adamw.steps()});
}

void load_zero_checkpoint(const std::string& dir, FlatParameters& flat, ShardedAdamW& adamw,
                          int stage) {
  Manifest m{stage, flat.group().size(), flat.layout().numel(), -1, true};
  double lr = adamw.options().lr();
  const std::vector<int64_t> whole{flat.layout().numel()};
  auto shard = flat.layout().own(flat.params());
  auto steps = load(dir, flat.group(), m, {shard, adamw.exp_avg(), adamw.exp_avg_sq()},
                    {whole, whole, whole}, lr);
  adamw.set_steps(steps.at(0));
  adamw.set_lr(lr);
  // Every rank has its own shard back; the others' come with one all-gather.
  if (flat.group().size() > 1) flat.group().all_gather(flat.params(), shard.clone());
}

namespace {
std::vector<torch::Tensor> tensors_of(FullyShardedModel& model) {
  std::vector<torch::Tensor> out;
  auto shards = model.shards();
  auto adamw = model.adamw();
  for (size_t u = 0; u < shards.size(); ++u) {
    out.push_back(shards[u]);
    out.push_back(adamw[u]->exp_avg());
    out.push_back(adamw[u]->exp_avg_sq());
  }
  return out;
}
}  // namespace

void save_zero_checkpoint(const std::string& dir, FullyShardedModel& model) {
  std::vector<int64_t> steps;
  for (auto* a : model.adamw()) steps.push_back(a->steps());
  save(dir, model.group(), {3, model.group().size(), model.numel(), model.lr()}, tensors_of(model),
       steps);
}

void load_zero_checkpoint(const std::string& dir, FullyShardedModel& model) {
  double lr = model.lr();
  std::vector<std::vector<int64_t>> segments;  // per tensor of tensors_of(): its unit, whole
  for (int64_t n : model.unit_numels()) segments.insert(segments.end(), 3, {n});
  auto steps = load(dir, model.group(), {3, model.group().size(), model.numel()}, tensors_of(model),
                    segments, lr);
  auto adamw = model.adamw();
  if (steps.size() != adamw.size())
    throw ZeroCheckpointError(dir + ": step counts for " + std::to_string(steps.size()) +
                              " units, the model has " + std::to_string(adamw.size()));
  for (size_t u = 0; u < adamw.size(); ++u) adamw[u]->set_steps(steps[u]);
  model.set_lr(lr);
}

}  // namespace kit
