// kit/train/checkpoint_format.h — internal to kit/train/checkpoint*.cpp; nothing else includes it
// but the unit test of its formats (tests/unit).
//
// A checkpoint on disk, apart from when and why one is written or read (checkpoint.cpp: the
// policy of saving, choosing, resuming and stopping): the names of its folders, its MANIFEST
// with every file's size and checksum, the bytes of the random-number states, and the copy of
// saved values into a model. The layout itself is described in kit/train/checkpoint.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>

#include "kit/runtime/files.h"  // FileSum, sum_file: sizes and checksums in bounded chunks

namespace kit::checkpoint_format {

// --- Folders: <out_dir>/checkpoints/step-<n>/, written as step-<n>.tmp[.<pid>] ---

std::string step_name(int64_t step);  // "step-000000042"
// Complete checkpoints (final names, no .tmp), oldest first, as this rank's listing shows them
// (a test's hook may change what it shows: kit/train/checkpoint_hooks.h).
std::vector<std::string> complete_checkpoints(const std::string& dir);
// Folders of saves that never completed with a process group: "step-<n>.tmp".
std::vector<std::string> leftover_checkpoints(const std::string& dir);
// A checkpoint folder with everything in it; a failure leaves it for the next save.
void remove_tree(const std::string& path);

// --- Files and the MANIFEST ---

// The whole file, "" when it cannot be read: for the small ones only (the RNG states). Large ones
// are summed a chunk at a time (sum_file, kit/runtime/files.h), never read into one string.
std::string read_file(const std::string& path);
// The MANIFEST of the checkpoint folder `dir` (written last, once every file is complete): its
// magic line, the configuration's fingerprint, the number of ranks, and "file <name> <bytes>
// <checksum>" (FNV-1a, FileSum) for state.pt, every rank's RNG files (its GPU's if `cuda_rng`)
// and everything under zero/ (ZeRO's shards and their own manifest). `written`: the sums this
// rank made as it wrote its files (by name in `dir`); the others are read back in chunks of
// kFileChunk bytes.
std::string manifest_text(const std::string& dir, const std::string& fingerprint, int world,
                          bool cuda_rng, const std::map<std::string, FileSum>& written);

// A checkpoint's MANIFEST as rank `rank` reads it: every file it lists, and those of them this
// rank reads (not another rank's ZeRO shard) checked against their size and checksum, each read
// a chunk at a time (sum_file).
struct Manifest {
  std::string problem;              // "" or why it is unusable: "has no valid MANIFEST (...)",
                                    // "is damaged: <file> ..." (the first damaged file)
  std::string config;               // the fingerprint it was written for
  int world = 0;                    // the number of ranks that wrote it
  std::vector<std::string> listed;  // every file it lists, in its order
  std::vector<std::string> verified;  // those this rank checked and found intact
  int bad_file = -1;                // the damaged file's index in `listed`, or -1
};
Manifest verify_manifest(const std::string& checkpoint_dir, int rank);

// --- Random-number states: restored as saved, so a resumed run draws the same numbers ---

std::string rng_state_bytes();  // the CPU generator's state
void set_rng_state_bytes(const std::string& bytes);
// The CUDA generator of the rank's own GPU (compat::rank_cuda_index(); dropout on a GPU draws from
// it, not from the CPU generator), whose state is `state`: "kit-cuda-rng 2\n<size>\n" and the
// state's bytes. Only the rank's GPU, not every visible one: a resume that sees the GPUs otherwise
// (another CUDA_VISIBLE_DEVICES or --gpu-bind, on another node) restores it into its own GPU.
std::string cuda_rng_bytes(const std::string& state);
// Reads cuda_rng_bytes() back into `state`; the reason in words when it cannot be used, else "".
// A file of an earlier kit ("kit-cuda-rng 1 <n>\n", then per GPU "<size>\n" and its bytes) holds
// every GPU the rank saw: usable only where the rank sees as many (`visible`), and then the
// state of GPU `index`, the rank's, is taken.
std::string parse_cuda_rng(const std::string& bytes, int index, int visible, std::string& state);

// --- The model ---

// Copies the saved values of `archive` INTO the model's existing tensors (not Module::load: see
// checkpoint_format.cpp). Every shape is checked first: a mismatch is a CheckpointError naming it.
void load_values(torch::nn::Module& module, torch::serialize::InputArchive& archive);

}  // namespace kit::checkpoint_format
