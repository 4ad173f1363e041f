// Exercise 00 — ranks and the five collectives: broadcast, all_reduce, all_gather,
// reduce_scatter, barrier.
//
// As shipped this program runs alone: one process, "rank 0 of a world of 1", where every
// collective is trivial (the sum over one rank is its own tensor). The TODOs make it join a job
// of N ranks and call each collective for real. Every rank starts from its own tensor
//     mine = (rank + 1) x [1, 2, ..., n]
// and prints what each collective gave it, so that every result can be worked out by hand
// (`./kit check 00` does exactly that, for every rank). Run it on 2 ranks:
//     build/bin/ddprun --nproc-per-node 2 -- build/bin/ex00-exercise
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <torch/torch.h>   // tensors

#include "kit/train/args.h"      // parse_flags(): the command-line flags
// TODO 1: Include kit/runtime/distributed.h: setup() and the collectives. C++ LibTorch has no
//         torch.distributed module; this header is the course's stand-in for it.

// One line per result, "rank R: NAME v1 v2 ...", from every rank.
void show(int rank, const char* name, const torch::Tensor& t) {
  std::string values;
  auto cpu = t.to(torch::kCPU, torch::kDouble).contiguous();
  char number[32];
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    std::snprintf(number, sizeof number, " %g", cpu[i].item<double>());
    values += number;
  }
  std::printf("rank %d: %s%s\n", rank, name, values.c_str());
}

int main(int argc, char** argv) {
  std::string out_dir = ".";
  int64_t n = 4;  // numbers in each rank's tensor
  kit::parse_flags(argc, argv, {
      {"--out-dir", "where the ranks leave their marks at the barrier",
       [&](auto v) { out_dir = v; }},
      {"--elements", "numbers in each rank's tensor (1 to 1000000)",
       [&](auto v) { n = kit::flag_int("--elements", v, 1, 1000000); }},
  });

  // TODO 2: Join the job: replace the next two lines by one call to kit::setup(). It returns a
  //         kit::Setup whose fields local_rank, rank, device and world_size you read by name
  //         (keep the names rank, world_size and device for the code below). At the end of main()
  //         leave the job again (TODO 2 has a second place).
  int rank = 0, world_size = 1;  // alone: rank 0 of a world of 1
  torch::Device device(torch::kCPU);
  // TODO 3: Every rank says who it is: print rank, world size, local rank and device in the
  //         form "rank 1 of 2: local rank 1, device cpu", from every rank (std::printf, not
  //         print0: here each rank has something of its own to say).
  std::printf("running alone on %s\n", device.str().c_str());
  // Rank 0 clears the barrier's marks of an earlier run. The collectives below keep the other
  // ranks from leaving theirs before this is done.
  const std::filesystem::path marks = std::filesystem::path(out_dir) / "barrier";
  if (rank == 0) std::filesystem::remove_all(marks);

  auto options = torch::TensorOptions().dtype(torch::kFloat).device(device);
  torch::Tensor mine = (rank + 1) * torch::arange(1, n + 1, options);
  show(rank, "mine", mine);

  // Broadcast: rank 0's tensor, copied to every rank.
  torch::Tensor shared = mine.clone();
  // TODO 4: Overwrite `shared` with rank 0's values on every rank: kit::broadcast, root 0.
  //         Alone, `shared` already is rank 0's tensor.
  show(rank, "broadcast", shared);

  // All-reduce: every rank ends with the element-wise sum (or average) over all ranks.
  torch::Tensor sum = mine.clone(), average = mine.clone();
  // TODO 5: Reduce `sum` over all ranks with kit::ReduceOp::SUM, and `average` with
  //         kit::ReduceOp::AVG: two calls of kit::all_reduce, which works in place.
  show(rank, "all_reduce SUM", sum);
  show(rank, "all_reduce AVG", average);

  // All-gather: every rank ends with all ranks' tensors, back to back in rank order.
  // TODO 6: Make `gathered` hold world_size x n numbers and fill it with kit::all_gather(output,
  //         input). Alone, all the ranks' tensors are just mine.
  torch::Tensor gathered = mine.clone();
  show(rank, "all_gather", gathered);

  // Reduce-scatter: the input is world_size chunks of n numbers (chunk c is (c + 1) x mine);
  // rank r ends with chunk r, summed over all ranks. It is the first half of an all-reduce.
  torch::Tensor chunks =
      torch::outer(torch::arange(1, world_size + 1, options), mine).reshape({-1});
  // TODO 7: Make `scattered` hold n numbers and fill it with kit::reduce_scatter(output, input,
  //         kit::ReduceOp::SUM). Alone, my chunk summed over one rank is just my chunk.
  torch::Tensor scattered = chunks.narrow(0, rank * n, n).clone();
  show(rank, "reduce_scatter", scattered);

  // Barrier: nobody goes on before everybody has arrived. Rank 0 is made slow on purpose;
  // each rank leaves a mark when it arrives, and counts the marks after the barrier.
  if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::filesystem::create_directories(marks);
  std::ofstream(marks / ("rank" + std::to_string(rank))) << "arrived\n";
  // TODO 8: Wait here until every rank has arrived: kit::barrier().
  int arrived = 0;  // on a cluster, out_dir is on the file system that all nodes share
  for (int r = 0; r < world_size; ++r)
    arrived += std::filesystem::exists(marks / ("rank" + std::to_string(r)));
  std::printf("rank %d: after the barrier %d of %d ranks had arrived\n", rank, arrived,
              world_size);
  // TODO 2: Leave the job: kit::destroy_process_group() closes the connections to the other
  //         ranks. It is the last kit call of the program.
  return 0;
}
