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
#pragma once

#include <cstdint>

namespace kit::memory {

// Installs the counting allocator (idempotent, thread-safe). Every function below calls it.
void install();
bool installed();

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
