// kit/train/memory.h — the bytes of live CPU tensors, and their peak: what a step really holds at
// its highest, not what survives between steps (kit::HeldBytes counts that).
//
//   kit::memory::install();           // once, before the model is made
//   kit::memory::reset_peak();        // at the start of a step
//   ... forward, backward, step ...
//   int64_t peak = kit::memory::peak_live_bytes();
//
// install() puts a counting allocator in front of LibTorch's CPU allocator (c10::SetCPUAllocator):
// every CPU tensor's storage made after it is counted when made and when freed. Counted: tensor
// storage only (activations, gradients, weights, optimizer state, communication buffers made
// as tensors); not counted: what Gloo or the C++ runtime allocate for themselves, and storage made
// before install(). On GPU the caching allocator keeps its own peak: compat::peak_gpu_bytes.
//
// A program may also count its C++ heap (std::string, std::vector, ...): common/bench/heap_count.cpp,
// linked into a benchmark or a test, replaces operator new and delete and charges every block
// through charge_heap()/credit_heap() on the same counters, so that the peak is tensors + heap at
// the same moment (a save's peak, common/bench/save_peak.cpp). The kit's library itself does not.
//
// Ranks that are threads of one process (kit::ProcessGroup::local_groups) each get an Account:
// the storage a thread makes while it is charging an Account (Account::Charge) is counted there as
// well, wherever it is freed, so that each rank gets its own peak. Without one: the process's.
//
// A cap, as a GPU's memory is one: with KIT_MEMORY_CAP=<bytes> (512M, 1.5G, 1048576; K, M, G are
// powers of 1024) or set_cap(), an allocation that would take the live bytes (the Account's, else
// the process's) above the cap throws c10::OutOfMemoryError, the type PyTorch's CUDA allocator
// throws when the GPU is full, whose first line names the request, the live bytes, the peak so far
// and the cap:
//   kit: out of memory: tried to allocate 64.00 MiB with 200.00 MiB live (peak so far 230.00 MiB),
//   above the cap of 256.00 MiB (KIT_MEMORY_CAP=256M)
// A trainer ends with that line (kit/runtime/process.h: exit 1); a checkpoint is written whole or
// not at all (kit/runtime/files.h), so the last one stays and resumes. KIT_MEMORY_CAP installs the
// allocator when the kit's library is loaded, so any trainer honours it, from its first tensor
// (a value that is not a size is one line and exit 2 then). It caps CPU tensors only: on a GPU,
// the GPU's own memory is the cap. No allocation is refused while no cap is set. Ranks that are
// threads: each Account is capped on its own, and while any Account exists, what no Account pays
// for (Gloo's own threads) is not capped.
// KIT_MEMORY_COUNT=1 installs the allocator when the library is loaded, without a cap: a traced
// run (kit/check/observe.h) then records the live bytes before and after each of the pipeline's
// forwards and backwards, which `kit check 05` compares with the solution's.
#pragma once

#include <cstdint>
#include <string>

namespace kit::memory {

// Installs the counting allocator (idempotent, thread-safe). Every function below calls it.
void install();
bool installed();

// The cap in bytes (0: none). set_cap() installs the allocator; it applies to every Account and
// to the process from the next allocation on. `how`: what the error line says set it (a flag,
// "--memory-cap 256M"); default "kit::memory::set_cap(<bytes>)".
void set_cap(int64_t bytes, const std::string& how = "");
int64_t cap();
// "512M" -> 536870912: a whole number of bytes, or a number followed by K, M or G (powers of 1024).
// std::invalid_argument (one line) for anything else.
int64_t parse_bytes(const std::string& text);

int64_t live_bytes();       // the Account this thread charges, else the whole process
int64_t peak_live_bytes();  // the highest live_bytes() since the last reset_peak()
void reset_peak();          // the peak starts again from the bytes live now

struct Counter;

// Counts `bytes` of heap made by this thread on the Account it charges (if any) and on the process;
// returns the Account's counter, to hand to credit_heap() when the block is freed (on any thread).
// Safe to call from a replaced operator new: it allocates nothing and needs no constructor to have run.
Counter* charge_heap(int64_t bytes);
void credit_heap(Counter* account, int64_t bytes);

class Account {
 public:
  Account();
  ~Account();
  Account(const Account&) = delete;
  Account& operator=(const Account&) = delete;
  int64_t live() const;
  int64_t peak() const;
  void reset_peak();

  // While it exists, the storage this thread makes is charged to `account` (nests: the inner
  // Charge wins, and the outer Account does not see it).
  class Charge {
   public:
    explicit Charge(Account& account);
    ~Charge();
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;

   private:
    Counter* outer_;
  };

 private:
  Counter* counter_;
};

}  // namespace kit::memory
