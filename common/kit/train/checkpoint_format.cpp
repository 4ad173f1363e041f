// kit/train/checkpoint_format.cpp — a checkpoint on disk: folder names, the MANIFEST and its
// checksums, the random-number states' bytes, saved values copied into a model (see
// checkpoint_format.h; when and why they are written and read: checkpoint.cpp).
#include "kit/train/checkpoint_format.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <system_error>

#include <torch/torch.h>

#include "kit/compat.h"
#include "kit/runtime/distributed.h"
#include "kit/train/checkpoint.h"
#include "kit/train/checkpoint_hooks.h"

namespace kit::checkpoint_format {
namespace {

constexpr const char* kMagic = "kit-checkpoint 1";

// The files of a checkpoint folder under `sub` ("zero"), as "sub/name", sorted.
std::vector<std::string> files_under(const std::string& dir, const std::string& sub) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(dir + "/" + sub, ec))
    if (e.is_regular_file()) out.push_back(sub + "/" + e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// ZeRO's shards are rank r's alone ("zero/shard-<r>-of-<N>.pt", kit/train/zero_checkpoint.h): a
// rank reads and verifies only its own, not the N-fold data of all of them.
bool shard_of_another_rank(const std::string& file, int rank) {
  const std::string shards = "zero/shard-";
  return file.rfind(shards, 0) == 0 && file.rfind(shards + std::to_string(rank) + "-of-", 0) != 0;
}

// Pairs (the model's tensor, the saved tensor), following Module::save's layout: a module's own
// parameters and buffers by name, its children as sub-archives.
void collect(torch::nn::Module& module, torch::serialize::InputArchive& archive,
             const std::string& prefix, std::vector<std::pair<torch::Tensor, torch::Tensor>>& out,
             std::vector<std::string>& names) {
  for (auto& p : module.named_parameters(/*recurse=*/false)) {
    torch::Tensor saved;
    archive.read(p.key(), saved);
    out.emplace_back(p.value(), saved);
    names.push_back(prefix + p.key());
  }
  for (auto& b : module.named_buffers(/*recurse=*/false)) {
    torch::Tensor saved;
    archive.read(b.key(), saved, /*is_buffer=*/true);
    out.emplace_back(b.value(), saved);
    names.push_back(prefix + b.key());
  }
  for (auto& child : module.named_children()) {
    torch::serialize::InputArchive sub;
    archive.read(child.key(), sub);
    collect(*child.value(), sub, prefix + child.key() + ".", out, names);
  }
}

}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%09ld", static_cast<long>(step));
  return name;
}

namespace {
// The names in `dir` that start with "step-" (none when it cannot be read), in listing order.
std::vector<std::string> step_entries(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("step-", 0) == 0) names.push_back(n);
    }
    ::closedir(d);
  }
  return names;
}
}  // namespace

std::vector<std::string> complete_checkpoints(const std::string& dir) {
  std::vector<std::string> names;
  for (std::string& n : step_entries(dir))
    if (n.find(".tmp") == std::string::npos) names.push_back(std::move(n));
  std::sort(names.begin(), names.end());
  if (auto& listed = testing::checkpoint_hooks().listed) listed(get_rank(), names);
  return names;
}

std::vector<std::string> leftover_checkpoints(const std::string& dir) {
  std::vector<std::string> names;
  for (std::string& n : step_entries(dir))
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) names.push_back(std::move(n));
  return names;
}

// A checkpoint folder with everything in it, zero/ (ZeRO's shards) included. A failure (a file
// another process holds open on NFS, say) leaves it for the next save to try again: not a reason
// to stop a training that has just saved.
void remove_tree(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

std::string manifest_text(const std::string& dir, const std::string& fingerprint, int world,
                          bool cuda_rng, const std::map<std::string, FileSum>& written) {
  std::ostringstream m;
  m << kMagic << "\nconfig " << fingerprint << "\nworld_size " << world << "\n";
  std::vector<std::string> files{"state.pt"};
  for (int r = 0; r < world; ++r) files.push_back("rng-rank" + std::to_string(r) + ".bin");
  if (cuda_rng)
    for (int r = 0; r < world; ++r) files.push_back("cuda-rng-rank" + std::to_string(r) + ".bin");
  // ZeRO: every rank's shard and zero/MANIFEST (complete: save_shard ended on a barrier). With
  // their sums here, every rank can check its shard before a single collective of the resume.
  for (auto& f : files_under(dir, "zero")) files.push_back(f);
  // The sums this rank made while writing; another rank's files are read back a chunk at a time
  // (a whole state.pt read into one string doubled rank 0's memory at every save).
  for (auto& f : files) {
    // A file this rank cannot read is listed with the bytes it could read: refused at resume.
    FileSum sum;
    if (auto it = written.find(f); it != written.end()) sum = it->second;
    else sum_file(dir + "/" + f, sum);
    m << "file " << f << " " << sum.bytes << " " << sum.hex() << "\n";
  }
  return m.str();
}

Manifest verify_manifest(const std::string& checkpoint_dir, int rank) {
  Manifest out;
  std::istringstream manifest(read_file(checkpoint_dir + "/MANIFEST"));
  std::string line;
  std::getline(manifest, line);
  if (line != kMagic) {
    out.problem = "has no valid MANIFEST (not a kit checkpoint, or damaged)";
    return out;
  }
  // After the first damaged file the rest are listed, not read: one reason is enough.
  while (std::getline(manifest, line)) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key == "config") std::getline(words >> std::ws, out.config);
    else if (key == "world_size") words >> out.world;
    else if (key == "file") {
      std::string f, sum;
      size_t size = 0;
      words >> f >> size >> sum;
      out.listed.push_back(f);
      if (!out.problem.empty() || shard_of_another_rank(f, rank)) continue;
      FileSum found;  // read a chunk at a time: a rank never holds a whole file to check it
      if (!sum_file(checkpoint_dir + "/" + f, found))
        out.problem = "is damaged: " + f + " cannot be read";
      else if (found.bytes != static_cast<int64_t>(size))
        out.problem = "is damaged: " + f + " has " + std::to_string(found.bytes) + " of " + std::to_string(size) + " bytes";
      else if (found.hex() != sum)
        out.problem = "is damaged: " + f + " fails its checksum";
      if (!out.problem.empty()) out.bad_file = static_cast<int>(out.listed.size()) - 1;
      else out.verified.push_back(f);
    }
  }
  return out;
}

std::string rng_state_bytes() {
  auto t = at::detail::getDefaultCPUGenerator().get_state();
  return std::string(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()));
}

void set_rng_state_bytes(const std::string& bytes) {
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kByte);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(t);
}

std::string cuda_rng_bytes(const std::string& state) {
  if (state.empty()) return "";
  return "kit-cuda-rng 2\n" + std::to_string(state.size()) + "\n" + state;
}

std::string parse_cuda_rng(const std::string& bytes, int index, int visible, std::string& state) {
  const std::string damaged = "its CUDA random state is damaged";
  std::istringstream in(bytes);
  std::string magic;
  int version = 0;
  size_t n = 1;  // version 2: the rank's GPU only
  if (!(in >> magic >> version) || magic != "kit-cuda-rng" || (version != 1 && version != 2) ||
      (version == 1 && !(in >> n)) || in.get() != '\n')
    return damaged;
  std::vector<std::string> states(n);
  for (auto& st : states) {
    size_t size = 0;
    if (!(in >> size) || in.get() != '\n') return damaged;
    st.resize(size);
    if (!in.read(st.data(), static_cast<std::streamsize>(size))) return damaged;
  }
  if (version == 1) {  // every GPU the rank saw: which one was its own, only the same view tells
    if (static_cast<int>(n) != visible || index < 0 || index >= visible)
      return "holds the CUDA random state of " + std::to_string(n) + " GPU(s), and this rank sees " +
             std::to_string(visible) + " (a bit-exact resume of a checkpoint of an earlier kit "
             "needs the same GPUs)";
    state = states[static_cast<size_t>(index)];
    return "";
  }
  if (index < 0) return "holds the state of a GPU's random generator, and this rank has no GPU";
  state = states[0];
  return "";
}

// Copies the saved values INTO the model's existing tensors. Module::load would instead re-seat
// each parameter (Tensor::set_), which gives it a new gradient accumulator: the hooks that
// DistributedDataParallel put on the old ones would never fire again, and the ranks would
// silently stop averaging gradients. Every shape is checked before the first value is copied.
void load_values(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pairs;
  std::vector<std::string> names;
  collect(module, archive, "", pairs, names);
  for (size_t i = 0; i < pairs.size(); ++i)
    if (pairs[i].first.sizes() != pairs[i].second.sizes())
      throw CheckpointError(names[i] + " has shape " + c10::str(pairs[i].second.sizes()) +
                            " in the checkpoint but " + c10::str(pairs[i].first.sizes()) + " in the model");
  torch::NoGradGuard no_grad;
  for (auto& [mine, saved] : pairs) mine.copy_(saved);
}

}  // namespace kit::checkpoint_format
