// kit/train/checkpoint.h — TrainState and Checkpoints: save the whole training state, resume it bit
// for bit, and stop cleanly when the scheduler says time is up.
//
//   kit::Checkpoints checkpoints(args.out_dir, fingerprint);     // finds earlier checkpoints
//   kit::TrainState state = checkpoints.resume(model, optimizer);  // continue where it stopped
//   ... after every optimizer step:
//   if (checkpoints.stop_requested(state)) { checkpoints.save(model, optimizer, state); ... }
//
// A stop signal (Slurm's SIGUSR1 before the time limit, SIGTERM) is looked at every
// kStopPollSteps = 10 optimizer steps, at global steps 10, 20, 30...: the ranks must agree to stop
// after the same step, and agreeing is a collective whose answer the host waits for (on a GPU:
// until the device has caught up). So a signal stops the training within 10 steps; ask Slurm
// for a warning that covers 10 steps and a save (sbatch/README.md).
//
// Why: every cluster job has a time limit and nodes fail. A checkpoint holds the model, the
// optimizer state, where training is (epoch, step in the epoch, the epoch's loss so far), the
// best validation loss and every rank's random-number state, so a resumed run continues exactly
// as if it had never stopped (same batches, same dropout masks, same losses).
//
// On disk: <out_dir>/checkpoints/step-<global step>/ with state.pt (rank 0), rng-rank<r>.bin
// (each rank) and, on a GPU, cuda-rng-rank<r>.bin (the generator of the rank's own GPU, not of
// every GPU it sees: a resume with another CUDA_VISIBLE_DEVICES finds it), under ZeRO zero/ with
// every rank's shard, and a MANIFEST with the size and
// checksum of every one of these files. A folder becomes visible under its final name only when
// complete (written as .tmp, flushed, renamed), so a crash mid-save leaves the previous checkpoint
// as the newest (the next save removes the leftover .tmp, whole). The last `keep` checkpoints are
// kept; older ones are removed with everything in them. A save holds the training state plus one
// buffer: the archive goes to disk tensor by tensor, each file is summed as it is written (another
// rank's, read back 1 MiB at a time), and a resume checks each file 1 MiB at a time. (ZeRO-1/2's
// shard file adds one copy of the rank's weight shard: common/bench/README.md.)
//
// Resume: rank 0 chooses the newest checkpoint and tells the others (a shared file system may
// show a new folder to one node before another). Every rank verifies what it will read, and the
// ranks agree that all is fine before anything is loaded: a damaged file, even another rank's
// shard, is one line on every rank, never one rank waiting for the others until the timeout.
// Tests reach in through kit/train/checkpoint_hooks.h; the training path reads no test variables.
#pragma once

#include <csignal>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "kit/runtime/process_group.h"  // CallSite: the caller's line in an error

namespace kit {

struct TrainState {
  int64_t epoch = 0;           // the epoch in progress (0-based)
  int64_t step_in_epoch = 0;   // optimizer steps already done in it
  int64_t global_step = 0;     // optimizer steps since the start of training
  double best_val_loss = std::numeric_limits<double>::infinity();
  torch::Tensor epoch_loss_sum;  // sum of this epoch's step losses so far (for the epoch mean)
  bool stopped = false;        // a stop was requested: save, then leave the training loop

  void next_epoch();           // epoch + 1, step 0, loss sum 0
};

// Thrown for a checkpoint that cannot be used; what() is one line.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Checkpoints {
 public:
  // fingerprint: what must match for a checkpoint to be resumable (model sizes, batch size,
  // data, seed...; see config_fingerprint in kit/train/args.h). Installs the SIGUSR1/SIGTERM
  // handler.
  Checkpoints(const std::string& out_dir, std::string fingerprint, int keep = 3);

  // Loads the newest checkpoint, if there is one, into model and optimizer, and returns the
  // state to continue from; a fresh TrainState otherwise. Everything is verified before anything
  // is loaded: a damaged or foreign checkpoint is a CheckpointError, never a half-loaded model.
  // require = true: no checkpoint is an error too (the --resume flag).
  template <typename M>
  TrainState resume(torch::nn::ModuleHolder<M>& model, torch::optim::Optimizer& optimizer,
                    torch::Device device, bool require = false) {
    return resume(*model, optimizer, device, require);
  }
  TrainState resume(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                    torch::Device device, bool require);

  // Every rank calls it; rank 0 writes the model and optimizer, each rank its RNG state.
  template <typename M>
  void save(const torch::nn::ModuleHolder<M>& model, const torch::optim::Optimizer& optimizer,
            TrainState& state) {
    save(*model, optimizer, state);
  }
  void save(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
            TrainState& state);

  // True (and state.stopped set) on every rank once any rank got SIGUSR1 or SIGTERM (Slurm's
  // warning before the time limit, or scancel), at the first polling step after it: a global
  // step that is a multiple of kStopPollSteps. There the ranks agree with a tiny all-reduce, so
  // that all stop after the same step; at every other step it returns at once, without a
  // collective and without waiting for the device. Every rank must call it after every step.
  // A test's after_step hook (kit/train/checkpoint_hooks.h) may request a stop after any step:
  // every rank runs the same hook, so that step polls on every rank.
  bool stop_requested(TrainState& state);
  static constexpr int64_t kStopPollSteps = 10;

  // ZeRO (kit/train/zero_checkpoint.h): no rank holds the whole model and optimizer, so instead
  // of rank 0 writing them, every rank writes its own shard with save_shard(<checkpoint>/zero) and
  // reads it back with load_shard(<checkpoint>/zero). The rest (where training is, the RNG, the
  // manifest with every shard's checksum, the same-number-of-ranks rule) is the same as above.
  // A save whose save_shard left some rank's shard out of <checkpoint>/zero is refused on every
  // rank (CheckpointError): its resume could not work. An error of either call ends with the
  // caller's line, "(train.cpp:251)", so that kit check blames the trainer's line, not this file.
  using ShardIO = std::function<void(const std::string& dir)>;
  // The file rank r of N writes into that folder, "shard-<r>-of-<N>.pt": the one spelling of the
  // name, for zero_checkpoint.cpp (which writes it) and for the check above (which looks for it).
  static std::string shard_file(int rank, int ranks);
  void save_sharded(const ShardIO& save_shard, TrainState& state, CallSite caller = {});
  TrainState resume_sharded(const ShardIO& load_shard, torch::Device device, bool require = false,
                            CallSite caller = {});

  const std::string& dir() const { return dir_; }

 private:
  // The one save and the one resume behind both forms: model and optimizer (rank 0) or shards.
  // caller: the site its barriers name (a rank that waits there alone names the trainer's line).
  void save(const torch::nn::Module* model, const torch::optim::Optimizer* optimizer,
            const ShardIO* save_shard, TrainState& state, CallSite caller = {});
  TrainState resume(torch::nn::Module* model, torch::optim::Optimizer* optimizer,
                    const ShardIO* load_shard, torch::Device device, bool require);

  std::string dir_, fingerprint_;
  int keep_;
};

}  // namespace kit
