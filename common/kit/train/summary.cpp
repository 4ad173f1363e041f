// kit/train/summary.cpp — the scaling study's CSV row (see summary.h).
#include "kit/train/summary.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "kit/runtime/env.h"  // read_rank_env(): world size and ranks per node

namespace kit {

void StepTimer::lap(std::chrono::steady_clock::time_point now, int64_t steps) {
  if (steps <= 0) return;
  if (started_) {
    const double each = std::chrono::duration<double>(now - last_).count() / static_cast<double>(steps);
    seconds_.insert(seconds_.end(), static_cast<size_t>(steps), each);
  }
  start(now);
}

void StepTimer::start(std::chrono::steady_clock::time_point now) {
  last_ = now;
  started_ = true;
}

double StepTimer::median_seconds(size_t skip) const {
  if (seconds_.empty()) return 0;
  std::vector<double> kept(seconds_.begin() + (seconds_.size() > skip ? skip : 0), seconds_.end());
  std::nth_element(kept.begin(), kept.begin() + kept.size() / 2, kept.end());
  return kept[kept.size() / 2];
}

int node_count() {
  const RankEnv env = read_rank_env();
  return env.local_world_size > 0 ? (env.world_size + env.local_world_size - 1) / env.local_world_size : 1;
}

void append_summary(const std::string& path, const RunSummary& r) {
  std::error_code ec;
  const bool fresh = !std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) throw std::runtime_error("cannot write the summary " + path);
  if (fresh)
    std::fprintf(f, "label,world_size,nodes,batch_per_rank,global_batch,accum_steps,workers,steps,"
                    "step_time_s,images_per_s,images_per_s_per_rank,test_loss,test_acc,"
                    "time_to_target_s,device\n");
  const double per_s = r.step_time_s > 0 ? static_cast<double>(r.global_batch) / r.step_time_s : 0;
  std::string target = r.time_to_target_s < 0 ? "" : std::to_string(r.time_to_target_s);
  std::fprintf(f, "%s,%d,%d,%ld,%ld,%ld,%ld,%ld,%.6f,%.2f,%.2f,%.5f,%.5f,%s,%s\n",
               r.label.c_str(), r.world_size, r.nodes, static_cast<long>(r.batch_per_rank),
               static_cast<long>(r.global_batch), static_cast<long>(r.accum_steps),
               static_cast<long>(r.workers), static_cast<long>(r.steps), r.step_time_s, per_s,
               per_s / r.world_size, r.test_loss, r.test_acc, target.c_str(), r.device.c_str());
  if (std::fclose(f) != 0) throw std::runtime_error("cannot write the summary " + path);
}

}  // namespace kit
