// kit_oracle_probe — what the kit computes, written out for tests/oracle/oracle_kit.py to compare
// with references that are not the kit (PyTorch, or the documented algorithm written in Python).
//
//   kit_oracle_probe sampler < cases        one line per case "size seed epoch replicas rank eval"
//                                           (eval 1: DistributedEvalSampler; else a shuffling
//                                           DistributedSampler, or in order when seed < 0):
//                                           prints that rank's indices, space-separated
//   kit_oracle_probe augment N SEED EPOCHS OUT
//                                           N generated images (pixel (i,c,y,x) = (37 i + 101 c +
//                                           7 y + 3 x) mod 256), augmented with SEED, epochs
//                                           0..EPOCHS-1: OUT gets the float32 images, epoch-major
//   kit_oracle_probe adamw OUT              AdamW over 5 steps on fixed weights and gradients
//                                           (OUT/init.bin, OUT/grads.bin), the weights after each
//                                           step from ShardedAdamW on 3 shards (OUT/sharded.bin)
//                                           and from ZeroOptimizer stages 1 and 2 on 2 in-process
//                                           ranks (OUT/zero1.bin, OUT/zero2.bin), whose ranks'
//                                           gradients average to grads.bin
// Bad usage: one line on stderr, exit 2.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "kit/data/cifar10.h"           // Cifar10Dataset: the augmentation
#include "kit/data/data_loader.h"       // DistributedSampler, DistributedEvalSampler
#include "kit/runtime/process_group.h"  // ProcessGroup::local_groups
#include "kit/sharding/sharding.h"      // ShardLayout, ShardedAdamW
#include "kit/sharding/zero.h"          // ZeroOptimizer

namespace {

constexpr int kSteps = 5;

void write_floats(std::ofstream& out, const torch::Tensor& t) {
  auto c = t.detach().to(torch::kFloat32).contiguous();
  out.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * sizeof(float));
}

int sampler() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    long long size, seed, epoch, replicas, rank, eval;
    if (!(in >> size >> seed >> epoch >> replicas >> rank >> eval)) {
      std::fprintf(stderr, "kit_oracle_probe: bad sampler case '%s'\n", line.c_str());
      return 2;
    }
    std::vector<size_t> got;
    if (eval) {
      got = kit::DistributedEvalSampler(size, replicas, rank).indices();
    } else {
      kit::DistributedSampler s(size, seed >= 0, seed >= 0 ? seed : 0, replicas, rank);
      s.set_epoch(epoch);
      got = s.indices();
    }
    for (size_t k = 0; k < got.size(); ++k) std::printf(k ? " %zu" : "%zu", got[k]);
    std::printf("\n");
  }
  return 0;
}

int augment(int64_t n, uint64_t seed, int64_t epochs, const std::string& path) {
  auto i = torch::arange(n).view({n, 1, 1, 1}), c = torch::arange(3).view({1, 3, 1, 1});
  auto y = torch::arange(32).view({1, 1, 32, 1}), x = torch::arange(32).view({1, 1, 1, 32});
  auto images = ((37 * i + 101 * c + 7 * y + 3 * x) % 256).to(torch::kUInt8);
  kit::Cifar10Dataset data(images, torch::arange(n) % 10, "train");
  data.set_augment(seed);
  std::ofstream out(path, std::ios::binary);
  for (int64_t e = 0; e < epochs; ++e) {
    data.set_epoch(e);
    for (int64_t k = 0; k < n; ++k) write_floats(out, data.get(static_cast<size_t>(k)).input);
  }
  return out ? 0 : 1;
}

// Weights of three parameters (23 elements: 3 shards of 8, the last padded) and, per step and
// rank, gradients whose average over the 2 ranks is step k's gradient of grads.bin. A large rate
// and weight decay: an operation out of place shows far above rounding.
// A large eps (0.5, against gradients of about 0.1 to 1): AdamW divides the gradient's scale out
// except against eps, so with the default 1e-8 a sum over the ranks instead of their average
// would change no bit of the weights; here it changes them by percents.
torch::optim::AdamWOptions options() {
  return torch::optim::AdamWOptions(0.05).weight_decay(0.3).betas(std::make_tuple(0.8, 0.95)).eps(0.5);
}

int adamw(const std::string& dir) {
  torch::manual_seed(11);
  const std::vector<std::vector<int64_t>> shapes{{3, 4}, {7}, {4}};
  std::vector<torch::Tensor> init;
  for (auto& s : shapes) init.push_back(torch::randn(s));
  // rank_grads[k][r][i]: step k, rank r, parameter i. With two ranks the average (a + b) / 2 has
  // the same bits whichever rank's gradient comes first: DDP, ZeRO and torch agree on it exactly.
  std::vector<std::vector<std::vector<torch::Tensor>>> rank_grads(kSteps);
  for (int k = 0; k < kSteps; ++k)
    for (int r = 0; r < 2; ++r) {
      rank_grads[k].emplace_back();
      for (auto& s : shapes) rank_grads[k][r].push_back(torch::randn(s) * (0.2 * (k + 1)));
    }
  std::ofstream init_out(dir + "/init.bin", std::ios::binary), grads_out(dir + "/grads.bin", std::ios::binary);
  for (auto& p : init) write_floats(init_out, p);
  for (int k = 0; k < kSteps; ++k)
    for (size_t i = 0; i < shapes.size(); ++i)
      write_floats(grads_out, (rank_grads[k][0][i] + rank_grads[k][1][i]) / 2);

  {  // ShardedAdamW: three ranks' shards of the flat vector, updated one after the other
    std::vector<torch::Tensor> params;
    for (auto& p : init) params.push_back(p.clone());
    std::vector<kit::ShardLayout> layouts;
    for (int r = 0; r < 3; ++r) layouts.emplace_back(params, 3, r);
    auto flat = layouts[0].flatten(params);
    std::vector<kit::ShardedAdamW> shards;
    for (int r = 0; r < 3; ++r) shards.emplace_back(options(), layouts[r].own(flat));
    std::ofstream out(dir + "/sharded.bin", std::ios::binary);
    for (int k = 0; k < kSteps; ++k) {
      std::vector<torch::Tensor> grads;
      for (size_t i = 0; i < shapes.size(); ++i)
        grads.push_back((rank_grads[k][0][i] + rank_grads[k][1][i]) / 2);
      auto flat_grad = layouts[0].flatten(grads);
      for (int r = 0; r < 3; ++r) shards[r].update(layouts[r].own(flat), layouts[r].own(flat_grad));
      write_floats(out, flat.narrow(0, 0, layouts[0].numel()));
    }
  }
  for (int stage : {1, 2}) {  // ZeroOptimizer: its public face, ranks as threads
    auto groups = kit::ProcessGroup::local_groups(2);
    std::vector<std::vector<torch::Tensor>> after(2);
    std::vector<std::string> errors(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        try {
          std::vector<torch::Tensor> params;
          for (auto& p : init) params.push_back(p.clone().set_requires_grad(true));
          kit::ZeroOptimizer zero(params, {stage, options(), groups[r].get()});
          for (int k = 0; k < kSteps; ++k) {
            // d/dp of sum(p * g) is g exactly: backward delivers this rank's gradient as is.
            torch::Tensor loss = torch::zeros({});
            for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i] * rank_grads[k][r][i]).sum();
            loss.backward();
            zero.step();
            zero.zero_grad();
            std::vector<torch::Tensor> flat;
            for (auto& p : params) flat.push_back(p.detach().reshape(-1).clone());
            after[r].push_back(torch::cat(flat));
          }
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 2; ++r)
      if (!errors[r].empty()) {
        std::fprintf(stderr, "kit_oracle_probe: ZeRO-%d rank %d: %s\n", stage, r, errors[r].c_str());
        return 1;
      }
    std::ofstream out(dir + "/zero" + std::to_string(stage) + ".bin", std::ios::binary);
    for (int k = 0; k < kSteps; ++k) {
      if (!torch::equal(after[0][k], after[1][k])) {
        std::fprintf(stderr, "kit_oracle_probe: ZeRO-%d: the ranks' weights differ after step %d\n", stage, k + 1);
        return 1;
      }
      write_floats(out, after[0][k]);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "sampler" && argc == 2) return sampler();
  if (what == "augment" && argc == 6)
    return augment(std::stoll(argv[2]), std::stoull(argv[3]), std::stoll(argv[4]), argv[5]);
  if (what == "adamw" && argc == 3) return adamw(argv[2]);
  std::fprintf(stderr, "usage: kit_oracle_probe sampler | augment N SEED EPOCHS OUT | adamw OUT\n");
  return 2;
}
