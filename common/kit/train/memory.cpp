// kit/train/memory.cpp — the counting CPU allocator (see memory.h).
#include "kit/train/memory.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>  // c10::OutOfMemoryError

#include "kit/check/observe.h"  // count_live_bytes: the live bytes in the trace
#include "kit/compat.h"  // KIT_ALLOCATE_CONST, KIT_ALLOCATOR_HAS_COPY_DATA (note 9)

namespace kit::memory {

// A count of live bytes and its peak. An Account's counter lives as long as the Account or the last
// storage charged to it, whichever is later (`refs`): storage may outlive the thread that made it.
struct Counter {
  std::atomic<int64_t> live{0}, peak{0};
  std::atomic<int64_t> refs{1};
  void add(int64_t n) {
    const int64_t now = live.fetch_add(n) + n;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  void release() {
    if (refs.fetch_sub(1) == 1) delete this;
  }
};

namespace {

// Constant-initialized (Counter's constructor is constexpr) and never destroyed: it exists before
// any constructor runs (a counted operator new may come first) and after every destructor (frees
// come during static destruction).
Counter g_process;
static_assert(std::is_trivially_destructible_v<Counter>);
Counter& process() { return g_process; }
thread_local Counter* t_scope = nullptr;

// In front of each storage, 64 bytes (c10's alignment, so the data stays aligned) say how big it
// is and which Account paid for it. The data pointer is its own context, as with LibTorch's own CPU
// allocator, so code that asks for a "simple" data pointer (and raw_allocate) still works.
constexpr size_t kHeader = 64;
struct Header {
  int64_t bytes;
  Counter* scope;
};
static_assert(sizeof(Header) <= kHeader);

void release(void* data) {
  void* base = static_cast<char*>(data) - kHeader;
  const Header h = *static_cast<Header*>(base);
  process().add(-h.bytes);
  if (h.scope) {
    h.scope->add(-h.bytes);
    h.scope->release();
  }
  c10::free_cpu(base);
}

std::atomic<int64_t> g_cap{0};  // 0: no cap
std::string g_cap_text;          // how it was set, for the message ("KIT_MEMORY_CAP=256M")

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

std::atomic<int64_t> g_accounts{0};  // Accounts alive: ranks that are threads

// What a GPU's allocator does when the GPU is full: refuse, with the numbers, before allocating.
// `scope`: the Account charged, null for the process. While Accounts exist (ranks as threads),
// each is capped on its own, and what no Account pays for (Gloo's threads) is not capped: the
// process's total is then several ranks' memory, not one GPU's.
void check_cap(int64_t bytes, const Counter* scope) {
  const int64_t limit = g_cap.load(std::memory_order_relaxed);
  if (limit <= 0 || (scope == nullptr && g_accounts.load() > 0)) return;
  const Counter& counter = scope ? *scope : process();
  const int64_t live = counter.live.load();
  if (live + bytes <= limit) return;
  C10_THROW_ERROR(OutOfMemoryError,
                  "kit: out of memory: tried to allocate " + mib(bytes) + " with " + mib(live) +
                      " live (peak so far " + mib(counter.peak.load()) + "), above the cap of " +
                      mib(limit) + " (" + g_cap_text + ")");
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) KIT_ALLOCATE_CONST override {
    const auto bytes = static_cast<int64_t>(n);
    Counter* scope = t_scope;
    check_cap(bytes, scope);
    void* base = c10::alloc_cpu(n + kHeader);
    new (base) Header{bytes, scope};
    if (scope) {
      scope->refs.fetch_add(1);
      scope->add(bytes);
    }
    process().add(bytes);
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
#if KIT_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

CountingAllocator g_counting;
std::once_flag g_once;

Counter& current() {
  install();
  return t_scope ? *t_scope : process();
}

}  // namespace

void install() {
  std::call_once(g_once, [] {
    // Above LibTorch's own (registered at priority 0), so that every CPU tensor comes here.
    c10::SetCPUAllocator(&g_counting, /*priority=*/1);
    if (c10::GetCPUAllocator() != &g_counting)
      throw std::runtime_error("kit::memory: LibTorch kept another CPU allocator in front of the counting one");
    observe::count_live_bytes(&live_bytes);  // the pipeline's actions in the trace (observe.h)
  });
}

bool installed() { return c10::GetCPUAllocator() == &g_counting; }

int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double number = -1;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() ? 1 : unit == "K" ? 1 << 10 : unit == "M" ? 1 << 20 : unit == "G" ? 1 << 30 : -1;
  if (number < 0 || scale < 0 || !std::isfinite(number) || (unit.empty() && number != std::floor(number)))
    throw std::invalid_argument("'" + text + "' is not a size in bytes (e.g. 1048576, 512M, 1.5G)");
  return static_cast<int64_t>(number * scale);
}

void set_cap(int64_t bytes, const std::string& how) {
  install();
  g_cap_text = how.empty() ? "kit::memory::set_cap(" + std::to_string(bytes) + ")" : how;
  g_cap.store(bytes < 0 ? 0 : bytes);
}

int64_t cap() { return g_cap.load(); }

namespace {
// KIT_MEMORY_CAP, read when the library is loaded (before main): any trainer honours it.
const bool g_cap_from_env = [] {
  const char* text = std::getenv("KIT_MEMORY_CAP");
  if (text == nullptr || *text == '\0') return false;
  try {
    const int64_t bytes = parse_bytes(text);
    install();
    g_cap_text = std::string("KIT_MEMORY_CAP=") + text;
    g_cap.store(bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kit: KIT_MEMORY_CAP: %s\n", e.what());
    std::exit(2);
  }
  return true;
}();
// KIT_MEMORY_COUNT=1: the counting allocator without a cap, from the first tensor (kit check 05's
// runs: the live bytes of the pipeline's actions in the trace).
const bool g_count_from_env = [] {
  const char* text = std::getenv("KIT_MEMORY_COUNT");
  if (text == nullptr || *text == '\0' || std::string(text) == "0") return false;
  install();
  return true;
}();
}  // namespace

int64_t live_bytes() { return current().live.load(); }
int64_t peak_live_bytes() { return current().peak.load(); }
void reset_peak() {
  Counter& c = current();
  c.peak.store(c.live.load());
}

Counter* charge_heap(int64_t bytes) {
  Counter* scope = t_scope;
  if (scope) {
    scope->refs.fetch_add(1);
    scope->add(bytes);
  }
  process().add(bytes);
  return scope;
}

void credit_heap(Counter* account, int64_t bytes) {
  process().add(-bytes);
  if (account) {
    account->add(-bytes);
    account->release();
  }
}

Account::Account() : counter_(new Counter) {
  install();
  g_accounts.fetch_add(1);
}
Account::~Account() {
  g_accounts.fetch_sub(1);
  counter_->release();
}
int64_t Account::live() const { return counter_->live.load(); }
int64_t Account::peak() const { return counter_->peak.load(); }
void Account::reset_peak() { counter_->peak.store(counter_->live.load()); }

Account::Charge::Charge(Account& account) : outer_(t_scope) { t_scope = account.counter_; }
Account::Charge::~Charge() { t_scope = outer_; }

}  // namespace kit::memory
