// kit/train/checkpoint_hooks.h — where tests reach into Checkpoints (kit/train/checkpoint.h): a
// stop after a given step, a slower step, a crash in the middle of a save, another view of the
// checkpoints folder. Every hook is empty in a trainer, and nothing in the kit fills one in.
//
// Why: fault injection belongs to the tests, not to the path every training run takes. A trainer
// that read KIT_DIE_DURING_SAVE itself could be killed by a stray variable in a job script. The
// tests install hooks in one of two ways:
//   - a test program linking kit_common sets kit::testing::checkpoint_hooks() directly;
//   - a test that runs the real trainers preloads libkit_test_hooks.so (common/testing/,
//     LD_PRELOAD), which reads KIT_TEST_STOP_AFTER_STEP and friends and installs the hooks
//     through kit_testing_checkpoint_hooks() (see common/testing/checkpoint_hooks_env.cpp).
// Header-light on purpose: the preloaded library includes it without LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kit::testing {

struct CheckpointHooks {
  // Every rank, in Checkpoints::stop_requested after each optimizer step, before the ranks agree:
  // true requests a stop after this step (as SIGUSR1 would, but at once, not at the next polling
  // step: the ranks agree at this step). It must return the same on every rank for a step (the
  // preloaded library's does: every rank reads the same variables), or the ranks that return true
  // would wait in the agreement for the others. It may also sleep (a slower step).
  std::function<bool(int64_t global_step)> after_step;
  // Rank 0, in the middle of a save: the model and optimizer (or the shards) are in `tmp_dir`,
  // the MANIFEST is not. Raising SIGKILL here is a node failure half-way through a save.
  std::function<void(int64_t global_step, const std::string& tmp_dir)> mid_save;
  // The names this rank's listing of the checkpoints folder shows (complete ones, oldest first):
  // a test may change them, as a shared file system that shows a new folder late would.
  std::function<void(int rank, std::vector<std::string>& names)> listed;
};

// The one set of hooks of this process (all empty unless a test filled them in).
CheckpointHooks& checkpoint_hooks();

}  // namespace kit::testing

// The same, under a name that dlsym finds (the preloaded test library, which links nothing).
extern "C" kit::testing::CheckpointHooks* kit_testing_checkpoint_hooks();
