// common/bench/heap_count.cpp — counts the C++ heap of the program it is linked into: replaces the
// global operator new and delete, and charges every block to kit::memory (kit/train/memory.h), on
// the same counters as the CPU tensors. Linked only into a benchmark or a test that measures a
// peak of tensors + heap (save_peak, tests/unit/checkpoint_memory_test.cpp), never into the kit.
//
// Tensor storage comes from c10's CPU allocator (posix_memalign), not from operator new: nothing is
// counted twice. Not counted: plain malloc (C libraries, miniz inside LibTorch's archive writer).
#include <cstdint>
#include <cstdlib>
#include <new>

#include "kit/train/memory.h"

namespace {

// In front of each block, 16 bytes (operator new's own alignment) say how big it is and which
// Account paid for it; an over-aligned block keeps them just below its data.
struct Header {
  int64_t bytes;
  kit::memory::Counter* account;
};
constexpr size_t kHeader = __STDCPP_DEFAULT_NEW_ALIGNMENT__;
static_assert(sizeof(Header) <= kHeader);

size_t front(std::align_val_t align) {
  return static_cast<size_t>(align) > kHeader ? static_cast<size_t>(align) : kHeader;
}

void* allocate(size_t n, size_t front) noexcept {
  void* base = nullptr;
  if (posix_memalign(&base, front, n + front) != 0) return nullptr;
  char* data = static_cast<char*>(base) + front;
  const auto bytes = static_cast<int64_t>(n);
  new (data - sizeof(Header)) Header{bytes, kit::memory::charge_heap(bytes)};
  return data;
}

void release(void* p, size_t front) noexcept {
  if (!p) return;
  char* data = static_cast<char*>(p);
  const Header h = *reinterpret_cast<Header*>(data - sizeof(Header));
  kit::memory::credit_heap(h.account, h.bytes);
  std::free(data - front);
}

void* allocate_or_throw(size_t n, size_t front) {
  if (void* p = allocate(n, front)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(size_t n) { return allocate_or_throw(n, kHeader); }
void* operator new[](size_t n) { return allocate_or_throw(n, kHeader); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return allocate(n, kHeader); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return allocate(n, kHeader); }
void* operator new(size_t n, std::align_val_t a) { return allocate_or_throw(n, front(a)); }
void* operator new[](size_t n, std::align_val_t a) { return allocate_or_throw(n, front(a)); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, front(a));
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, front(a));
}

void operator delete(void* p) noexcept { release(p, kHeader); }
void operator delete[](void* p) noexcept { release(p, kHeader); }
void operator delete(void* p, size_t) noexcept { release(p, kHeader); }
void operator delete[](void* p, size_t) noexcept { release(p, kHeader); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p, kHeader); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p, kHeader); }
void operator delete(void* p, std::align_val_t a) noexcept { release(p, front(a)); }
void operator delete[](void* p, std::align_val_t a) noexcept { release(p, front(a)); }
void operator delete(void* p, size_t, std::align_val_t a) noexcept { release(p, front(a)); }
void operator delete[](void* p, size_t, std::align_val_t a) noexcept { release(p, front(a)); }
void operator delete(void* p, std::align_val_t a, const std::nothrow_t&) noexcept {
  release(p, front(a));
}
void operator delete[](void* p, std::align_val_t a, const std::nothrow_t&) noexcept {
  release(p, front(a));
}
