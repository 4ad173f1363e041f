// Slow HDF5 reads, for exercise 06's check: with KIT_TEST_READ_DELAY_MS=<n> in the environment,
// every H5Dread() of the process (preloaded: LD_PRELOAD=<build>/lib/libkit_test_hooks.so) sleeps
// n ms before it reads, the values unchanged.
//
// Why: the generated fields of a check are tiny, and a worker thread reads a batch of them in a
// fraction of a millisecond: on a busy machine one worker may read every batch before the other
// has started, and the run shows nothing of the workers' parallelism whatever the trainer does.
// Reads as slow as a real file system's make the loader the bottleneck, so that both workers are
// busy at once, as on real data (common/tools/rules/ex06.py, TODO 1). Without the variable the
// call goes straight to HDF5's. A process without HDF5 never calls it.
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>

// HDF5's declaration (H5Dpublic.h, 1.10 and newer: hid_t is int64_t, herr_t int), written out so
// that this library needs no HDF5 headers.
extern "C" int H5Dread(int64_t dataset, int64_t memory_type, int64_t memory_space,
                       int64_t file_space, int64_t transfer, void* buffer) {
  using Read = int (*)(int64_t, int64_t, int64_t, int64_t, int64_t, void*);
  static const auto next = reinterpret_cast<Read>(::dlsym(RTLD_NEXT, "H5Dread"));
  static const long delay_ms = [] {
    const char* s = std::getenv("KIT_TEST_READ_DELAY_MS");
    return s && *s ? std::atol(s) : 0L;
  }();
  if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  return next(dataset, memory_type, memory_space, file_space, transfer, buffer);
}
