// kit/train/zero_checkpoint.cpp — one file per rank plus a manifest (see zero_checkpoint.h).
#include "kit/train/zero_checkpoint.h"

#include <filesystem>
#include <fstream>
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
};

// The MANIFEST's version: 2 for ZeRO-1/2's shards as slices of gradient-ordered buckets
// (kit/sharding/sharding.h, BucketLayout); 1 for ZeRO-3, and for ZeRO-1/2 in the layout before it,
// whose shards were contiguous runs of the flat vector and cannot be loaded into the new one.
int version_of(int stage) { return stage == 3 ? 1 : 2; }

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
    text << "kit-zero-checkpoint " << version_of(m.stage) << "\nstage " << m.stage << "\nranks "
         << m.ranks << "\nparameters " << m.parameters << "\n";
    write_atomically(dir + "/MANIFEST", text.str(), "ZeRO checkpoint");
  }
  group.barrier();  // complete on every rank before anybody goes on (or is stopped)
}

// Every rank: checks the manifest against this run, then reads its own file into `into` (copies
// in place) and returns the step counts.
std::vector<int64_t> load(const std::string& dir, ProcessGroup& group, const Manifest& want,
                          const std::vector<torch::Tensor>& into) {
  std::ifstream in(dir + "/MANIFEST");
  std::string magic, key;
  int version = 0;
  Manifest m;
  if (!(in >> magic >> version) || magic != "kit-zero-checkpoint" || version < 1 || version > 2 ||
      !(in >> key >> m.stage >> key >> m.ranks >> key >> m.parameters))
    throw ZeroCheckpointError(dir + ": not a ZeRO checkpoint (no valid MANIFEST)");
  if (m.ranks != group.size())
    throw ZeroCheckpointError(dir + ": written by " + std::to_string(m.ranks) +
                              " ranks, this run has " + std::to_string(group.size()) +
                              ": a sharded checkpoint resumes only on as many ranks");
  if (m.stage != want.stage || m.parameters != want.parameters)
    throw ZeroCheckpointError(dir + ": a ZeRO-" + std::to_string(m.stage) + " checkpoint of " +
                              std::to_string(m.parameters) + " parameters, this run is ZeRO-" +
                              std::to_string(want.stage) + " with " +
                              std::to_string(want.parameters));
  if (version != version_of(m.stage))
    throw ZeroCheckpointError(dir + ": a ZeRO-" + std::to_string(m.stage) + " checkpoint in the " +
                              "layout before gradient-ordered buckets: this kit cannot resume it");
  const std::string path = shard_path(dir, group.rank(), group.size());
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const std::exception&) {
    throw ZeroCheckpointError(path + ": missing or damaged");
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < into.size(); ++i) {
    torch::Tensor t;
    if (!archive.try_read(std::to_string(i), t) || t.numel() != into[i].numel())
      throw ZeroCheckpointError(path + ": tensor " + std::to_string(i) + " missing or of the wrong size");
    into[i].copy_(t.view(into[i].sizes()));
  }
  torch::Tensor steps;
  if (!archive.try_read(std::to_string(into.size()), steps))
    throw ZeroCheckpointError(path + ": the step counts are missing");
  steps = steps.contiguous();
  return std::vector<int64_t>(steps.data_ptr<int64_t>(), steps.data_ptr<int64_t>() + steps.numel());
}

}  // namespace

void save_zero_checkpoint(const std::string& dir, ZeroOptimizer& o) {
  Manifest m{o.stage(), o.group().size(), o.layout().numel()};
  save(dir, o.group(), m, {o.own_params(), o.adamw().exp_avg(), o.adamw().exp_avg_sq()},
       {o.adamw().steps()});
}

void load_zero_checkpoint(const std::string& dir, ZeroOptimizer& o) {
  Manifest m{o.stage(), o.group().size(), o.layout().numel()};
  torch::Tensor shard = o.own_params();
  auto steps = load(dir, o.group(), m, {shard, o.adamw().exp_avg(), o.adamw().exp_avg_sq()});
  o.adamw().set_steps(steps.at(0));
  o.load_own_params(shard);  // all-gathers: every rank has the whole model again
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
  save(dir, model.group(), {3, model.group().size(), model.numel()}, tensors_of(model), steps);
}

void load_zero_checkpoint(const std::string& dir, FullyShardedModel& model) {
  auto steps = load(dir, model.group(), {3, model.group().size(), model.numel()}, tensors_of(model));
  auto adamw = model.adamw();
  if (steps.size() != adamw.size())
    throw ZeroCheckpointError(dir + ": step counts for " + std::to_string(steps.size()) +
                              " units, the model has " + std::to_string(adamw.size()));
  for (size_t u = 0; u < adamw.size(); ++u) adamw[u]->set_steps(steps[u]);
}

}  // namespace kit
