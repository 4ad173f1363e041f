// libkit_test_hooks.so — the tests' fault injection for the real trainers, from environment
// variables, installed when a test preloads it (LD_PRELOAD=<build>/lib/libkit_test_hooks.so).
// The trainers themselves never read these variables (kit/train/checkpoint_hooks.h says why).
//
//   KIT_TEST_STOP_AFTER_STEP=n     a stop request after global step n, as SIGUSR1 would make
//   KIT_TEST_STEP_DELAY_MS=n       every step n ms slower (the same numbers): a tiny training
//                                  outlasts a short time limit (tests/slurm/test_requeue.sh)
//   KIT_TEST_DIE_DURING_SAVE=n     rank 0 is SIGKILLed half-way through the save of step n
//   KIT_TEST_PHANTOM_CHECKPOINT=r  rank r's listing of the checkpoints folder shows a newer
//                                  checkpoint that is not there (step-999999999), as a file
//                                  system that disagrees between nodes would
//
// It links nothing: it finds the hooks with dlsym in the process it is loaded into, so that
// ddprun (no kit_common), which passes its environment on to the ranks, is left alone.
#include <dlfcn.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <string>
#include <thread>

#include "kit/train/checkpoint_hooks.h"

namespace {

int64_t number(const char* var) {
  const char* s = std::getenv(var);
  return s && *s ? std::atoll(s) : -1;
}

__attribute__((constructor)) void install() {
  auto find = reinterpret_cast<kit::testing::CheckpointHooks* (*)()>(
      ::dlsym(RTLD_DEFAULT, "kit_testing_checkpoint_hooks"));
  if (!find) return;  // not a trainer (ddprun, a shell)
  kit::testing::CheckpointHooks& hooks = *find();
  const int64_t stop_after = number("KIT_TEST_STOP_AFTER_STEP");
  const int64_t delay_ms = number("KIT_TEST_STEP_DELAY_MS");
  if (stop_after > 0 || delay_ms > 0)
    hooks.after_step = [stop_after, delay_ms](int64_t step) {
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      return stop_after > 0 && step == stop_after;
    };
  if (const int64_t die_at = number("KIT_TEST_DIE_DURING_SAVE"); die_at >= 0)
    hooks.mid_save = [die_at](int64_t step, const std::string&) {
      if (step == die_at) std::raise(SIGKILL);
    };
  if (const int64_t phantom_rank = number("KIT_TEST_PHANTOM_CHECKPOINT"); phantom_rank >= 0)
    hooks.listed = [phantom_rank](int rank, std::vector<std::string>& names) {
      if (rank == phantom_rank) names.push_back("step-999999999");
    };
}

}  // namespace
