// pp_orders SCHEDULE PP V MICRO: each rank's list of actions (kit/pipeline/schedule.h), one line
// per rank ("rank 0: 0F0 0F1 ..."), for oracle_pp_orders.py to compare with PyTorch's. A shape
// the schedule refuses: its one line on stderr, exit 2.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "kit/pipeline/schedule.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: pp_orders gpipe|1f1b|interleaved PP V MICRO\n");
    return 2;
  }
  try {
    const auto s = kit::pp::parse_schedule(argv[1]);
    const kit::pp::Shape shape{std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4])};
    const auto lists = kit::pp::all_actions(s, shape);
    for (size_t r = 0; r < lists.size(); ++r) {
      std::printf("rank %zu:", r);
      for (const auto& a : lists[r]) std::printf(" %s", kit::pp::to_string(a).c_str());
      std::printf("\n");
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
