// kit/train/tp_checkpoint.cpp — one file per rank plus a manifest (see tp_checkpoint.h).
#include "kit/train/tp_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <torch/torch.h>

#include "kit/parallel/mesh.h"
#include "kit/runtime/files.h"     // write_atomically
#include "kit/train/checkpoint.h"  // Checkpoints::shard_file
#include "kit/train/checkpoint_format.h"  // load_values: in place, shapes checked first

namespace kit {
namespace {

// The mesh as the MANIFEST writes it, and as a refusal names it.
std::string mesh_line(const Mesh& mesh) {
  std::ostringstream s;
  s << "world " << mesh.layout().world_size() << " tp " << mesh.tp_size() << " cp "
    << mesh.cp_size() << " order " << mesh.layout().order();
  return s.str();
}

std::string tp_shard_path(const std::string& dir, const Mesh& mesh) {
  return dir + "/" + Checkpoints::shard_file(mesh.rank(), mesh.layout().world_size());
}

}  // namespace

void save_tp_checkpoint(const std::string& dir, ParallelTransformerLM& model,
                        torch::optim::Optimizer& optimizer) {
  const Mesh& mesh = model->mesh();
  std::filesystem::create_directories(dir);
  torch::serialize::OutputArchive archive, weights, state, streams;
  model->save(weights);  // this rank's parameters and buffers, by their names
  optimizer.save(state);
  const auto generators = model->streams().state();
  for (size_t i = 0; i < generators.size(); ++i) streams.write(std::to_string(i), generators[i]);
  archive.write("model", weights);
  archive.write("optimizer", state);
  archive.write("streams", streams);
  write_atomically(tp_shard_path(dir, mesh), archive, "tp checkpoint");
  if (mesh.rank() == 0)
    write_atomically(dir + "/MANIFEST", "kit-tp-checkpoint 1\n" + mesh_line(mesh) + "\n",
                     "tp checkpoint");
  mesh.world().barrier();  // every rank's file is there before anybody goes on (or is stopped)
}

void load_tp_checkpoint(const std::string& dir, ParallelTransformerLM& model,
                        torch::optim::Optimizer& optimizer) {
  const Mesh& mesh = model->mesh();
  std::ifstream in(dir + "/MANIFEST");
  std::string magic, written;
  std::getline(in, magic);
  std::getline(in, written);
  if (magic != "kit-tp-checkpoint 1")
    throw TpCheckpointError(dir + ": not a tensor-parallel checkpoint (no valid MANIFEST)");
  if (written != mesh_line(mesh))
    throw TpCheckpointError(dir + ": written on the mesh " + written + ", this run's is " +
                            mesh_line(mesh) + ": each rank's file holds its slices of that "
                            "mesh (load the whole model with load_from() to change tp)");
  const torch::Device device = model->parameters().front().device();
  torch::serialize::InputArchive archive, weights, state, streams;
  archive.load_from(tp_shard_path(dir, mesh), device);
  archive.read("model", weights);
  archive.read("optimizer", state);
  archive.read("streams", streams);
  std::vector<torch::Tensor> generators(model->streams().state().size());
  for (size_t i = 0; i < generators.size(); ++i) streams.read(std::to_string(i), generators[i]);
  // Everything read before anything is changed.
  checkpoint_format::load_values(*model, weights);  // copied into the model's own tensors
  optimizer.load(state);
  model->streams().set_state(generators);
}

}  // namespace kit
