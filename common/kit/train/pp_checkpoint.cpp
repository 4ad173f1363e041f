// kit/train/pp_checkpoint.cpp — a pipelined run's checkpoint, a file per rank (see pp_checkpoint.h).
#include "kit/train/pp_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <torch/torch.h>

#include "kit/runtime/files.h"            // write_atomically
#include "kit/train/checkpoint.h"         // Checkpoints::shard_file
#include "kit/train/checkpoint_format.h"  // load_values: in place, shapes checked first

namespace kit {
namespace {

// This rank's chunks as one module, so that their parameters save and load by name.
std::shared_ptr<torch::nn::Module> held(std::vector<pp::Chunk>& chunks) {
  auto all = std::make_shared<torch::nn::Module>();
  for (auto& c : chunks) {
    auto chunk = std::make_shared<torch::nn::Module>();
    for (size_t u = 0; u < c.units.size(); ++u) chunk->register_module(std::to_string(u), c.units[u].module);
    all->register_module("chunk" + std::to_string(c.index), chunk);
  }
  return all;
}

std::string pp_shard_path(const std::string& dir, const Mesh& mesh) {
  return dir + "/" + Checkpoints::shard_file(mesh.rank(), mesh.layout().world_size());
}

}  // namespace

void save_pp_checkpoint(const std::string& dir, const Mesh& mesh, std::vector<pp::Chunk>& chunks,
                        torch::optim::Optimizer& optimizer) {
  std::filesystem::create_directories(dir);
  torch::serialize::OutputArchive archive, weights, state;
  held(chunks)->save(weights);
  optimizer.save(state);
  archive.write("model", weights);
  archive.write("optimizer", state);
  write_atomically(pp_shard_path(dir, mesh), archive, "pp checkpoint");
  if (mesh.rank() == 0)
    write_atomically(dir + "/MANIFEST",
                     "kit-pp-checkpoint 1\nworld " + std::to_string(mesh.layout().world_size()) +
                         " pp " + std::to_string(mesh.pp_size()) + " chunks per rank " +
                         std::to_string(chunks.size()) + " order " + mesh.layout().order() + "\n",
                     "pp checkpoint");
  mesh.world().barrier();  // every rank's file is there before anybody goes on (or is stopped)
}

void load_pp_checkpoint(const std::string& dir, const Mesh& mesh, std::vector<pp::Chunk>& chunks,
                        torch::optim::Optimizer& optimizer) {
  std::ifstream in(dir + "/MANIFEST");
  std::string magic, written;
  std::getline(in, magic);
  std::getline(in, written);
  if (magic != "kit-pp-checkpoint 1")
    throw PpCheckpointError(dir + ": not a pipeline checkpoint (no valid MANIFEST)");
  const std::string mine = "world " + std::to_string(mesh.layout().world_size()) + " pp " +
                           std::to_string(mesh.pp_size()) + " chunks per rank " +
                           std::to_string(chunks.size()) + " order " + mesh.layout().order();
  if (written != mine)
    throw PpCheckpointError(dir + ": written by a pipeline of " + written + ", this run is " +
                            mine + ": each rank's file holds the blocks of its stage in that split");
  const torch::Device device = chunks.front().parameters().front().device();
  torch::serialize::InputArchive archive, weights, state;
  archive.load_from(pp_shard_path(dir, mesh), device);
  archive.read("model", weights);
  archive.read("optimizer", state);
  // Everything read before anything is changed.
  auto module = held(chunks);
  checkpoint_format::load_values(*module, weights);
  optimizer.load(state);
}

}  // namespace kit
