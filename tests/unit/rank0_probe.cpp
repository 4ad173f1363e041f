// rank0_probe — a tiny distributed program for tests/unit/rank0_test.cpp: it joins the job with
// kit::setup() (the default group, as a trainer does) and exercises one rank-0 helper, printing
// what it observed so that the test, a separate process, can judge it. Start it under ddprun:
//
//   ddprun --nproc-per-node 2 --tag-output -- rank0_probe save0 DIR/model.pt 1.5
//   ddprun --nproc-per-node 3 --tag-output -- rank0_probe print0 4
//   ddprun --nproc-per-node 3 --tag-output -- rank0_probe all_reduce
//
// Every rank first prints "rank R pid P" (to map the pid in a temporary file name to a rank).
//
//   save0 PATH SECONDS  Every rank builds the same module shape filled with rank + 1, so the
//                       file's content says whose module it is. Rank 0 sleeps SECONDS before
//                       calling save0, so the other ranks are in save0 long before rank 0
//                       writes. Right after save0 returns, every rank loads PATH and prints
//                       "rank R after save0: exists=0|1 loaded=V" (V: the value read back, or
//                       "error" when the file is missing, incomplete or unreadable).
//   print0 K            print0("print0 line i of K from rank R") K times on every rank, and one
//                       plain printf "alive: rank R" per rank, which shows that the launcher
//                       forwards every rank's output.
//   all_reduce          kit::all_reduce of a closed-form tensor per rank (x_r below) with every
//                       op, in float32 and float64; prints "all_reduce OP DTYPE rank R: a b c d".
//   abort               rank 1 logs a reason through c10's logging and calls std::abort().
//   thread_throws R     rank R throws from a std::thread of its own, as c10d's NCCL watchdog
//                       rethrows a collective's failure; the other ranks wait in a barrier.
//   main_throws R       rank R throws on its main thread (nobody catches it).
//   subgroups           (4 ranks) kit::new_group({0, 1}) and ({2, 3}); kit::all_reduce of
//                       rank + 1 on this rank's pair, "subgroup rank R: S"; then a world barrier.
//   group_error WHAT    a bad group, which must end the rank with one line naming this file:
//                       member (ranks other than 0 all-reduce on group {0}), world (a group of
//                       local_groups(), not of setup()'s world), ranks (new_group({0, 0})).
//   malloc              prints "malloc: mmapped=N": how many blocks glibc mapped for one 64 MiB
//                       allocation (above glibc's largest own threshold, 32 MiB: 1 unless the kit
//                       raised the threshold, kit/runtime/process.h).
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>  // mallinfo2
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "kit/runtime/distributed.h"

namespace {

// Large enough (16 MiB) that writing it takes rank 0 a noticeable time after the others could
// already be checking for the file.
struct BlobImpl : torch::nn::Module {
  torch::Tensor w;
  BlobImpl() { w = register_parameter("w", torch::zeros({1024, 4096})); }
};
TORCH_MODULE(Blob);

int save0(int rank, const std::string& path, double rank0_delay) {
  Blob mine;
  {
    torch::NoGradGuard no_grad;
    mine->w.fill_(static_cast<float>(rank + 1));
  }
  if (rank == 0) std::this_thread::sleep_for(std::chrono::duration<double>(rank0_delay));
  kit::save0(mine, path);
  // Right after save0 returned: the file must be there, complete and rank 0's.
  bool exists = std::filesystem::exists(path);
  std::string loaded = "error";
  try {
    Blob back;
    torch::load(back, path);
    float first = back->w[0][0].item<float>();
    // A file that holds one value everywhere is one module's, not a mix of two writes.
    loaded = torch::all(back->w == first).item<bool>() ? std::to_string(first) : "mixed";
  } catch (const std::exception&) {
  }
  std::printf("rank %d after save0: exists=%d loaded=%s\n", rank, exists ? 1 : 0, loaded.c_str());
  return 0;
}

int print0(int rank, int k) {
  std::printf("alive: rank %d\n", rank);
  std::fflush(stdout);
  for (int i = 1; i <= k; ++i) kit::print0("print0 line %d of %d from rank %d\n", i, k, rank);
  return 0;
}

// x_r = {r + 1, -(r + 1)^2, 10 if r == 1 else 0, 0.5 * r}: over n ranks
//   SUM = {n(n+1)/2, -n(n+1)(2n+1)/6, 10, n(n-1)/4}, AVG = SUM / n,
//   MAX = {n, -1, 10, (n-1)/2},  MIN = {1, -n^2, 0, 0}.
int all_reduce(int rank) {
  const std::pair<const char*, kit::ReduceOp> ops[] = {{"SUM", kit::ReduceOp::SUM},
                                                       {"AVG", kit::ReduceOp::AVG},
                                                       {"MAX", kit::ReduceOp::MAX},
                                                       {"MIN", kit::ReduceOp::MIN}};
  const std::pair<const char*, torch::Dtype> types[] = {{"float32", torch::kFloat32},
                                                        {"float64", torch::kFloat64}};
  const double r = rank;
  for (auto [type_name, type] : types)
    for (auto [op_name, op] : ops) {
      torch::Tensor x = torch::tensor({r + 1, -(r + 1) * (r + 1), rank == 1 ? 10.0 : 0.0, 0.5 * r},
                                      torch::dtype(type));
      kit::all_reduce(x, op);
      x = x.to(torch::kFloat64);
      std::printf("all_reduce %s %s rank %d: %.17g %.17g %.17g %.17g\n", op_name, type_name, rank,
                  x[0].item<double>(), x[1].item<double>(), x[2].item<double>(),
                  x[3].item<double>());
    }
  return 0;
}

// One 64 MiB block: does glibc map it from the kernel (1) or take it from the heap (0)?
int malloc_probe() {
#if defined(__GLIBC__)
#if __GLIBC_PREREQ(2, 33)
#define KIT_PROBE_MALLINFO2 1
#endif
#endif
#if defined(KIT_PROBE_MALLINFO2)
  const auto before = mallinfo2().hblks;
  void* volatile block = std::malloc(64 << 20);
  static_cast<char*>(block)[0] = 1;
  const auto after = mallinfo2().hblks;
  std::free(block);
  std::printf("malloc: mmapped=%d\n", static_cast<int>(after - before));
  return 0;
#else
  std::printf("malloc: not glibc 2.33 or newer\n");
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: rank0_probe save0 PATH SECONDS | print0 K | all_reduce | abort | "
                         "thread_throws R | main_throws R | subgroups | group_error WHAT | malloc\n");
    return 2;
  }
  const std::string cmd = argv[1];
  auto setup = kit::setup();
  std::printf("rank %d pid %d\n", setup.rank, static_cast<int>(getpid()));
  std::fflush(stdout);
  int rc = 2;
  if (cmd == "save0" && argc == 4) rc = save0(setup.rank, argv[2], std::atof(argv[3]));
  else if (cmd == "print0" && argc == 3) rc = print0(setup.rank, std::atoi(argv[2]));
  else if (cmd == "all_reduce" && argc == 2) rc = all_reduce(setup.rank);
  else if (cmd == "abort" && argc == 2) {
    // Rank 1 aborts as NCCL's watchdog would, after logging its reason through c10's logging
    // (which setup() must not have silenced); the others wait in a collective for it.
    if (setup.rank == 1) {
      LOG(ERROR) << "probe: a collective timed out (as the watchdog would say)";
      std::abort();
    }
    kit::barrier();
    rc = 0;
  }
  else if (cmd == "thread_throws" && argc == 3) {
    if (setup.rank == std::atoi(argv[2]))
      std::thread([] {
        throw std::runtime_error("probe: Watchdog caught collective operation timeout\n(c10d's "
                                 "second line)");
      }).join();
    kit::barrier();
    rc = 0;
  }
  else if (cmd == "main_throws" && argc == 3) {
    if (setup.rank == std::atoi(argv[2]))
      throw std::runtime_error("probe: a bad batch\n(a second line)");
    kit::barrier();
    rc = 0;
  }
  else if (cmd == "subgroups" && argc == 2) {
    auto low = kit::new_group({0, 1});
    auto high = kit::new_group({2, 3});
    auto& mine = low->is_member() ? low : high;
    torch::Tensor x = torch::tensor({float(setup.rank + 1)});
    kit::all_reduce(x, kit::ReduceOp::SUM, mine);
    std::printf("subgroup rank %d: %g\n", setup.rank, x.item<double>());
    kit::barrier();
    rc = 0;
  }
  else if (cmd == "group_error" && argc == 3) {
    const std::string what = argv[2];
    torch::Tensor t = torch::ones({1});
    kit::barrier();  // every rank is past setup() before one of them stops
    if (what == "member") {
      kit::all_reduce(t, kit::ReduceOp::SUM, kit::new_group({0}));  // rank 0 alone: fine
      kit::barrier();  // rank 0 waits here until the others have failed
    }
    if (what == "world") kit::all_reduce(t, kit::ReduceOp::SUM, kit::ProcessGroup::local_groups(1)[0]);
    if (what == "ranks") kit::new_group({0, 0});
    rc = 3;  // the error did not come
  }
  else if (cmd == "malloc" && argc == 2) rc = malloc_probe();
  else std::fprintf(stderr, "rank0_probe: bad arguments for '%s'\n", cmd.c_str());
  std::fflush(stdout);
  kit::destroy_process_group();
  return rc;
}
