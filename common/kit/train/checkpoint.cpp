// kit/train/checkpoint.cpp — when and how a training saves, resumes and stops (see checkpoint.h):
// the stop signals and the ranks' agreement to stop, the order of a save (temporary folder, every
// rank's files, the MANIFEST last, the rename, the old ones removed), and the resume (rank 0
// chooses, every rank verifies, all agree, then load).
//
// The files themselves (names, MANIFEST, checksums, RNG bytes) are checkpoint_format.cpp: apart
// so that this file reads as the protocol between the ranks, and the format as what is on disk.
#include "kit/train/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <vector>

#include <torch/serialize.h>
#include <torch/torch.h>

#include "kit/train/checkpoint_format.h"
#include "kit/train/checkpoint_hooks.h"
#include "kit/compat.h"
#include "kit/runtime/distributed.h"
#include "kit/runtime/files.h"
#include "kit/check/observe.h"

namespace kit {

using namespace checkpoint_format;

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

bool everyone() { return is_initialized() && get_world_size() > 1; }

}  // namespace

namespace testing {
CheckpointHooks& checkpoint_hooks() {
  static CheckpointHooks hooks;
  return hooks;
}
}  // namespace testing

void TrainState::next_epoch() {
  ++epoch;
  step_in_epoch = 0;
  epoch_loss_sum = torch::Tensor();
}

Checkpoints::Checkpoints(const std::string& out_dir, std::string fingerprint, int keep)
    : dir_(out_dir + "/checkpoints"), fingerprint_(std::move(fingerprint)), keep_(std::max(1, keep)) {
  ::mkdir(dir_.c_str(), 0755);
  // Slurm sends SIGUSR1 (with --signal=B:USR1@T, forwarded by the job script) before the time
  // limit, and SIGTERM when a job is cancelled or preempted. Either way: finish the step, save.
  std::signal(SIGUSR1, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

bool Checkpoints::stop_requested(TrainState& state) {
  bool mine = g_stop_signal != 0;
  // A test's stop after a given step, or its slower step (kit/train/checkpoint_hooks.h). Every
  // rank runs the same hook, so a step it stops at polls on every rank.
  bool hook = false;
  if (auto& after_step = testing::checkpoint_hooks().after_step; after_step && after_step(state.global_step))
    mine = hook = true;
  // Only every kStopPollSteps steps (the same steps on every rank): the agreement below is a
  // collective, and its answer a value the host waits for. A signal waits for the next one.
  if (!hook && state.global_step % kStopPollSteps != 0) return state.stopped;
  if (everyone()) {
    // Signals reach the ranks at slightly different moments: agree, so all stop after the same
    // step. A host value: kit::control stages it through the rank's device (NCCL moves nothing
    // else; a CPU tensor here stopped every GPU run at step 1).
    auto flag = control::all_reduce(default_group(), torch::tensor({mine ? 1.0f : 0.0f}), ReduceOp::MAX);
    mine = flag.item<float>() > 0;
  }
  state.stopped = state.stopped || mine;
  return state.stopped;
}

void Checkpoints::save(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                       TrainState& state) {
  save(&model, &optimizer, nullptr, state);
}

// An error of a sharded save or resume, ended with the trainer's line that called it: the one
// line a rank dies with then names the student's call (kit check places it in its TODO), not a
// line of this file or of zero_checkpoint.cpp. A CheckpointError stays one; any other error (a
// collective's CommError) becomes a runtime_error with the same text.
namespace {
[[noreturn]] void rethrow_at(const CallSite& caller) {
  auto at = [&](const char* what) {
    const std::string s = std::string(what).substr(0, std::string(what).find('\n'));
    const std::string site = " (" + caller.str() + ")";
    return s.find(site) == std::string::npos ? s + site : s;  // a barrier of the save names it
  };
  try {
    throw;
  } catch (const CheckpointError& e) {
    throw CheckpointError(at(e.what()));
  } catch (const std::exception& e) {
    throw std::runtime_error(at(e.what()));
  }
}
}  // namespace

std::string Checkpoints::shard_file(int rank, int ranks) {
  return "shard-" + std::to_string(rank) + "-of-" + std::to_string(ranks) + ".pt";
}

void Checkpoints::save_sharded(const ShardIO& save_shard, TrainState& state, CallSite caller) {
  try {
    save(nullptr, nullptr, &save_shard, state, caller);
  } catch (...) {
    rethrow_at(caller);
  }
}

void Checkpoints::save(const torch::nn::Module* model, const torch::optim::Optimizer* optimizer,
                       const ShardIO* save_shard, TrainState& state, CallSite caller) {
  const std::string name = step_name(state.global_step);
  const std::string final_dir = dir_ + "/" + name;
  // Without a process group (a single process) the temp name is per process, so that several
  // independent processes writing into one folder cannot clash.
  const std::string tmp = final_dir + ".tmp" + (everyone() ? "" : "." + std::to_string(getpid()));
  const int rank = get_rank(), world = get_world_size();

  if (rank == 0) {
    remove_tree(tmp);
    // A save that died half-way (a node failure) leaves a step-N.tmp folder that nothing loads,
    // with a zero/ folder of shards under ZeRO: the line above removes this step's, whole (a
    // non-empty one made the mkdir below fail). A stop's mid-epoch step is never saved again:
    // remove every such leftover here (with a process group the run folder is this job's;
    // single processes use per-pid names and leave the others' alone).
    if (everyone())
      for (const std::string& n : leftover_checkpoints(dir_)) remove_tree(dir_ + "/" + n);
    if (::mkdir(tmp.c_str(), 0755) != 0)
      throw std::runtime_error("checkpoint: cannot create " + tmp + ": " + std::strerror(errno));
  }
  if (everyone()) barrier(caller);

  // The size and checksum of each file this rank writes, summed as it goes out: rank 0's MANIFEST
  // lists them without reading its own files back (kit/runtime/files.h).
  std::map<std::string, FileSum> written;
  // Each rank: its own random-number state (dropout masks differ per rank).
  const std::string rng_file = "rng-rank" + std::to_string(rank) + ".bin";
  written[rng_file] = write_atomically(tmp + "/" + rng_file, rng_state_bytes(), "checkpoint");
  // ... and its own GPU's, not every visible GPU's (a CUDA build with GPUs: rank 0 lists the file
  // of every rank if it has one).
  const std::string cuda_rng = cuda_rng_bytes(compat::cuda_rng_state(compat::rank_cuda_index()));
  if (!cuda_rng.empty()) {
    const std::string cuda_file = "cuda-rng-rank" + std::to_string(rank) + ".bin";
    written[cuda_file] = write_atomically(tmp + "/" + cuda_file, cuda_rng, "checkpoint");
  }
  // Each rank's own loss sum of the epoch so far (the ranks see different batches), gathered into
  // one vector: entry r is rank r's sum, exactly (the other ranks add zeros). Saving rank 0's sum
  // for everybody made the resumed epoch's mean train loss differ from the uninterrupted run's.
  torch::Tensor loss_sums = torch::zeros({world});
  if (state.step_in_epoch > 0 && state.epoch_loss_sum.defined()) {  // the same on every rank
    loss_sums = torch::zeros({world}, state.epoch_loss_sum.options());
    loss_sums[rank] = state.epoch_loss_sum.detach();
    if (everyone()) default_group().all_reduce(loss_sums, ReduceOp::SUM);
    loss_sums = loss_sums.to(torch::kCPU);
  }
  if (save_shard) {
    (*save_shard)(tmp + "/zero");  // every rank its shard (it ends on a barrier)
    // Every rank's shard must be in zero/ now: a function that wrote elsewhere, or nothing,
    // would leave a checkpoint that resumes nothing. Every rank looks at every shard, so all
    // refuse together, and before the barrier below, after which rank 0 renames the folder.
    std::string missing;
    for (int r = 0; r < world; ++r)
      if (!std::filesystem::exists(tmp + "/zero/" + shard_file(r, world)))
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    if (!missing.empty())
      throw CheckpointError("checkpoint " + name + ": the ZeRO save wrote no shard of rank(s) " +
                            missing + " into " + tmp + "/zero (save_sharded's function must " +
                            "write this rank's shard into the folder it is given)");
  }
  if (rank == 0) {
    torch::serialize::OutputArchive archive, model_archive, optimizer_archive;
    if (model) {
      model->save(model_archive);
      optimizer->save(optimizer_archive);
      archive.write("model", model_archive);
      archive.write("optimizer", optimizer_archive);
    }
    archive.write("epoch", torch::tensor(state.epoch, torch::kLong));
    archive.write("step_in_epoch", torch::tensor(state.step_in_epoch, torch::kLong));
    archive.write("global_step", torch::tensor(state.global_step, torch::kLong));
    archive.write("best_val_loss", torch::tensor(state.best_val_loss, torch::kDouble));
    archive.write("epoch_loss_sum", loss_sums);  // [world]: one per rank
    written["state.pt"] = write_atomically(tmp + "/state.pt", archive, "checkpoint");
    // A test may crash rank 0 here, half-way through the save (kit/train/checkpoint_hooks.h).
    if (auto& mid_save = testing::checkpoint_hooks().mid_save) mid_save(state.global_step, tmp);
  }
  if (everyone()) barrier(caller);

  if (rank == 0) {
    // The manifest is written last: its presence, checked sums and the rename make it complete.
    write_atomically(tmp + "/MANIFEST",
                     manifest_text(tmp, fingerprint_, world, !cuda_rng.empty(), written), "checkpoint");
    if (std::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      // Another independent process (same folder, no process group) saved this step first.
      remove_tree(tmp);
    }
    fsync_dir(dir_);
    auto all = complete_checkpoints(dir_);
    for (size_t i = 0; i + static_cast<size_t>(keep_) < all.size(); ++i) remove_tree(dir_ + "/" + all[i]);
  }
  if (everyone()) barrier(caller);
  observe::checkpoint(name);
  if (state.stopped)
    print0("stopping after step %ld: checkpoint %s written; run the same command again to continue\n",
           static_cast<long>(state.global_step), final_dir.c_str());
}

TrainState Checkpoints::resume(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                               torch::Device device, bool require) {
  return resume(&model, &optimizer, nullptr, device, require);
}

TrainState Checkpoints::resume_sharded(const ShardIO& load_shard, torch::Device device,
                                       bool require, CallSite caller) {
  try {
    return resume(nullptr, nullptr, &load_shard, device, require);
  } catch (...) {
    rethrow_at(caller);
  }
}

TrainState Checkpoints::resume(torch::nn::Module* model, torch::optim::Optimizer* optimizer,
                               const ShardIO* load_shard, torch::Device device, bool require) {
  TrainState state;
  // 0. Rank 0 chooses the checkpoint and tells the others (-1: none). Were each rank to list the
  // folder itself, a shared file system that shows a new folder to some nodes later than to
  // others would have the ranks load different checkpoints.
  int64_t chosen = -1;
  if (get_rank() == 0) {
    auto all = complete_checkpoints(dir_);
    if (!all.empty()) chosen = std::atoll(all.back().c_str() + 5);  // "step-<n>"
  }
  if (everyone())
    chosen = control::broadcast(default_group(), torch::tensor({chosen}, torch::kLong), 0).item<int64_t>();
  if (chosen < 0) {
    if (require)
      throw CheckpointError("--resume: no checkpoint in " + dir_ + " to continue from");
    return state;
  }
  const std::string name = step_name(chosen), path = dir_ + "/" + name;
  auto refuse = [&](const std::string& why) {
    throw CheckpointError("checkpoint " + path + " " + why + "; nothing was loaded (move it away to start afresh)");
  };

  // 1. Verify everything before touching the model: the manifest, every file this rank will
  // read (the shared ones, every rank's small RNG files, its own shard), the configuration.
  // The first reason to refuse, "" if none (manifest.bad_file: which file, when one is bad).
  Manifest manifest;
  std::string cuda_state;  // the rank's GPU's generator
  const std::string cuda_rng = "cuda-rng-rank" + std::to_string(get_rank()) + ".bin";
  bool has_cuda_rng = false;
  const std::string why = [&]() -> std::string {
    manifest = verify_manifest(path, get_rank());
    if (!manifest.problem.empty()) return manifest.problem;
    if (manifest.config != fingerprint_)
      return "was written for another configuration (" + manifest.config + "), not this one (" + fingerprint_ + ")";
    if (manifest.world != get_world_size())
      return "was written by " + std::to_string(manifest.world) + " ranks; this run has " +
             std::to_string(get_world_size()) + " (a bit-exact resume needs the same number)";
    // This rank's GPU random state, when the checkpoint has one: checked here, restored last.
    const auto& ok = manifest.verified;
    has_cuda_rng = std::find(ok.begin(), ok.end(), cuda_rng) != ok.end();
    if (has_cuda_rng)
      return parse_cuda_rng(read_file(path + "/" + cuda_rng), compat::rank_cuda_index(),
                            compat::cuda_device_count(), cuda_state);
    return "";
  }();
  // The ranks agree before any collective of the load (ZeRO's all-gather of the shards): a rank
  // that refused alone would leave the others waiting in it until the timeout. Entry r: 0 when
  // rank r found everything fine, 1 + the index of its bad file, or -1 for another reason.
  if (everyone()) {
    auto verdict = torch::zeros({get_world_size()}, torch::kLong);
    verdict[get_rank()] = why.empty() ? 0 : manifest.bad_file >= 0 ? manifest.bad_file + 1 : -1;
    verdict = control::all_reduce(default_group(), verdict, ReduceOp::SUM);
    if (why.empty())
      for (int r = 0; r < get_world_size(); ++r) {
        const int64_t v = verdict[r].item<int64_t>();
        if (v > 0 && v <= static_cast<int64_t>(manifest.listed.size()))
          refuse("is damaged: " + manifest.listed[static_cast<size_t>(v - 1)] + " fails its check on rank " + std::to_string(r));
        if (v != 0) refuse("was refused by rank " + std::to_string(r) + " (its line says why)");
      }
  }
  if (!why.empty()) refuse(why);

  // 2. Load: the shared state from state.pt, this rank's RNG from its own file.
  try {
    torch::serialize::InputArchive archive, model_archive, optimizer_archive;
    archive.load_from(path + "/state.pt", device);
    // A checkpoint of the other form (DDP's for a ZeRO run, or back) has the wrong parts.
    bool has_model = archive.try_read("model", model_archive);
    if (has_model != (model != nullptr))
      throw CheckpointError(has_model ? "it holds a whole model, not ZeRO shards"
                                      : "it holds ZeRO shards, not a whole model");
    if (model) archive.read("optimizer", optimizer_archive);
    // A fresh tensor per entry: reading into a defined tensor copies into its dtype.
    auto entry = [&](const char* key) {
      torch::Tensor t;
      archive.read(key, t);
      return t;
    };
    state.epoch = entry("epoch").item<int64_t>();
    state.step_in_epoch = entry("step_in_epoch").item<int64_t>();
    state.global_step = entry("global_step").item<int64_t>();
    state.best_val_loss = entry("best_val_loss").item<double>();
    torch::Tensor t = entry("epoch_loss_sum");  // one entry per rank: this rank's own sum
    if (t.dim() != 1 || t.size(0) != manifest.world)
      throw CheckpointError("epoch_loss_sum has shape " + c10::str(t.sizes()) + ", not [" +
                            std::to_string(manifest.world) + "]");
    state.epoch_loss_sum = state.step_in_epoch > 0 ? t[get_rank()].clone().to(device) : torch::Tensor();
    // Last: everything above is read and checked first.
    if (model) {
      load_values(*model, model_archive);
      optimizer->load(optimizer_archive);
    } else {
      (*load_shard)(path + "/zero");
    }
  } catch (const c10::OutOfMemoryError&) {
    // Not the checkpoint's fault (kit/train/memory.h's cap, a GPU's memory): it stays as it is, for
    // a run that fits, and the line says out of memory, not "move it away".
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    refuse("does not fit this model: " + what.substr(0, what.find('\n')));
  }
  set_rng_state_bytes(read_file(path + "/rng-rank" + std::to_string(get_rank()) + ".bin"));
  if (has_cuda_rng) compat::set_cuda_rng_state(compat::rank_cuda_index(), cuda_state);
  observe::resume(name);
  print0("resuming from %s: epoch %ld, step %ld\n", path.c_str(), static_cast<long>(state.epoch + 1),
         static_cast<long>(state.global_step));
  return state;
}

}  // namespace kit

kit::testing::CheckpointHooks* kit_testing_checkpoint_hooks() { return &kit::testing::checkpoint_hooks(); }
