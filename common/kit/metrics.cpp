// kit/metrics.cpp — metrics.csv and progress lines (see metrics.h).
#include "kit/metrics.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kit/distributed.h"
#include "kit/files.h"

namespace kit {
namespace {

// A resumed run (from the checkpoint after step `last`) continues metrics.csv. A run that was
// killed (node failure, SIGKILL) may have written rows after its last checkpoint, which the
// resumed run does again, and its very last line may be cut off: keep the header and the
// complete rows of steps 1..last only, so that every step appears exactly once.
void keep_rows_up_to(const std::string& path, int64_t last) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  std::string kept = "step,epoch,loss,samples_per_s,ranks,elapsed_s\n";
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
    const std::string line = text.substr(at, nl + 1 - at);
    char* end = nullptr;
    const long long step = std::strtoll(line.c_str(), &end, 10);
    if (end != line.c_str() && *end == ',' && step >= 1 && step <= last) kept += line;
  }
  if (kept != text) write_atomically(path, kept, "metrics");
}

}  // namespace

Metrics::Metrics(const std::string& out_dir, int64_t batch_size, int64_t first_step,
                 double progress_every_s)
    : batch_size_(batch_size), steps_(first_step), steps_at_last_line_(first_step),
      every_s_(progress_every_s) {
  start_ = last_step_ = last_line_ = std::chrono::steady_clock::now();
  if (get_rank() != 0) return;
  std::string path = out_dir + "/metrics.csv";
  if (first_step > 0) keep_rows_up_to(path, first_step);
  csv_ = std::fopen(path.c_str(), first_step > 0 ? "a" : "w");
  if (csv_ == nullptr) throw std::runtime_error("cannot write " + path);
  if (first_step == 0) std::fprintf(csv_, "step,epoch,loss,samples_per_s,ranks,elapsed_s\n");
}

Metrics::~Metrics() {
  if (csv_) std::fclose(csv_);
}

void Metrics::step(int64_t epoch, const torch::Tensor& loss) {
  ++steps_;
  if (csv_ == nullptr) return;
  auto now = std::chrono::steady_clock::now();
  double dt = std::chrono::duration<double>(now - last_step_).count();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  last_step_ = now;
  int ranks = get_world_size();
  double rate = dt > 0 ? static_cast<double>(batch_size_ * ranks) / dt : 0.0;
  double value = loss.item<double>();
  // %.9g: a float32 loss exactly, so two runs can be compared bit for bit from their CSVs.
  std::fprintf(csv_, "%ld,%ld,%.9g,%.1f,%d,%.3f\n", steps_, epoch + 1, value, rate, ranks, elapsed);
  // Every row reaches the file at once: a killed run keeps the rows up to its last checkpoint
  // (before, a SIGKILL lost everything since the last progress line, header included).
  std::fflush(csv_);
  // A line every few seconds: long runs show they are alive, short ones stay quiet.
  double since = std::chrono::duration<double>(now - last_line_).count();
  if (since >= every_s_) {
    double avg_rate = static_cast<double>((steps_ - steps_at_last_line_) * batch_size_ * ranks) / since;
    std::printf("  epoch %ld, step %ld: loss %.4f, %.0f samples/s, %.0f s elapsed\n", epoch + 1,
                steps_, value, avg_rate, elapsed);
    std::fflush(stdout);
    last_line_ = now;
    steps_at_last_line_ = steps_;
  }
}

}  // namespace kit
