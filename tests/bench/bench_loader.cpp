// bench_loader: how long exercise 02's DataLoader takes to hand out a batch on its own (no
// model), with 0, 1, 2 ... workers: the cost that the loader's workers can hide behind a step.
// A benchmark, not a test: it prints figures and asserts no time.
//
//   bench_loader --data DIR [--batch 32] [--batches 100] [--repeats 5] [--max-workers 2]
//                [--augment 1]
//
// One thread for torch's own operations (OMP_NUM_THREADS=1, like one rank per core); each
// worker is a further thread. Prints one line per worker count:
//   LOADER workers=N batch=B batches=K ms_per_batch_median=X ms_per_batch_min=Y
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <torch/torch.h>

#include "kit/train/args.h"        // parse_flags(): the small programs' flags
#include "kit/data/cifar10.h"      // load_cifar10(): the images
#include "kit/data/data_loader.h"  // DataLoader, LoaderOptions: what is measured

int main(int argc, char** argv) {
  std::string data;
  int64_t batch = 32, batches = 100, repeats = 5, max_workers = 2, augment = 1;
  kit::parse_flags(argc, argv, {
      {"--data", "the CIFAR-10-format folder (required)", [&](auto v) { data = v; }},
      {"--batch", "images per batch (default 32)",
       [&](auto v) { batch = kit::flag_int("--batch", v, 1, 100000); }},
      {"--batches", "batches timed per repeat (default 100)",
       [&](auto v) { batches = kit::flag_int("--batches", v, 1, 1000000); }},
      {"--repeats", "repeats; the median is printed (default 5)",
       [&](auto v) { repeats = kit::flag_int("--repeats", v, 1, 1000); }},
      {"--max-workers", "the largest worker count (default 2)",
       [&](auto v) { max_workers = kit::flag_int("--max-workers", v, 0, 64); }},
      {"--augment", "1: random crops and flips, as in training (default 1)",
       [&](auto v) { augment = kit::flag_int("--augment", v, 0, 1); }},
  });
  if (data.empty()) kit::flag_error("--data DIR is required");
  try {
    torch::set_num_threads(1);
    kit::Cifar10Dataset images = kit::load_cifar10(data, kit::Cifar10Split::train);
    if (augment) images.set_augment(1);
    kit::DistributedSampler sampler(images.size(), /*shuffle=*/true, /*seed=*/1, 1, 0);
    for (int64_t workers = 0; workers <= max_workers; ++workers) {
      kit::DataLoader loader(images, static_cast<size_t>(batch), sampler,
                             kit::LoaderOptions{.workers = workers});
      std::vector<double> ms;
      for (int64_t r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        int64_t n = 0;
        for (kit::Batch b : loader) {
          (void)b;
          if (++n == batches) break;
        }
        ms.push_back(std::chrono::duration<double, std::milli>(
                         std::chrono::steady_clock::now() - start).count() / static_cast<double>(n));
      }
      std::sort(ms.begin(), ms.end());
      std::printf("LOADER workers=%ld batch=%ld batches=%ld ms_per_batch_median=%.3f "
                  "ms_per_batch_min=%.3f\n", static_cast<long>(workers), static_cast<long>(batch),
                  static_cast<long>(batches), ms[ms.size() / 2], ms.front());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_loader: %s\n", e.what());
    return 1;
  }
  return 0;
}
