// kit/check/observe.h — the one seam between the library and the checker: `observe::`, one
// function per event the library reports (a collective, setup(), a step's loss, a sampler, a
// batch, DDP's steps, print0/save0, a checkpoint, a model's forward, ...), each taking the
// library's own values (numbers, names, tensors, a Module).
//
// Why one seam: the run trace is test instrumentation. Which events exist, how each becomes a
// line of the trace (kit/check/trace.h: the format the checker parses), the files beside it,
// the model's fingerprints and every KIT_TRACE_* variable live in kit/check/ (observe.cpp,
// model_trace.cpp, trace.cpp); the rest of the library makes one call per event and formats
// nothing. common/tools/trace_seam.py (ctest kit.trace_seam) fails when a file of common/kit/
// outside check/ calls the tracer itself.
//
// Cost while tracing is off (KIT_TRACE_DIR unset, every training run): each function is an
// inline test of a flag cached at the first call, then returns; nothing is formatted, no loss is
// copied off the GPU. Arguments are taken as they are and read only when tracing is on.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

namespace torch::nn {
class Module;
}

namespace kit {
enum class ReduceOp;  // kit/runtime/process_group.h
struct CallSite;      // kit/runtime/process_group.h
}  // namespace kit

namespace kit::observe {

namespace detail {  // the out-of-line halves, in observe.cpp and model_trace.cpp
bool tracing();
void setup(int rank, int local_rank, int world_size, const torch::Device& device,
           const std::string& backend, std::chrono::milliseconds timeout, int threads,
           uint64_t seed, bool (*group_alive)());
void collective(int64_t seq, const char* kind, const char* op, const torch::Tensor& t,
                const CallSite& site, const std::string& group);
std::string small_values(const torch::Tensor& t);
void all_reduce(const std::string& before, ReduceOp op, const torch::Tensor& after);
void p2p(int64_t seq, const char* kind, int peer, int tag, const torch::Tensor& t,
         const CallSite& site, const std::string& group);
void p2p_wait(int64_t seq, const char* kind, int peer, const std::string& group,
              std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end);
void pipeline(const char* kind, int stage, int micro, std::chrono::steady_clock::time_point start,
              std::chrono::steady_clock::time_point end, int64_t live_before);
int64_t live_bytes();
void count_live_bytes(int64_t (*source)());
void after_destroy(const char* what, const CallSite* site);
void print0(const char* text);
void save0(const std::string& path);
void destroy();
void sampler(size_t dataset_size, int replicas, int rank, bool shuffle, uint64_t seed);
void set_epoch(int64_t epoch, size_t dataset_size);
void batch(const std::string& dataset, const std::vector<size_t>& order, size_t at,
           size_t batch_size);
void sample(const std::string& dataset, size_t index, int worker, int64_t start_ns,
            int64_t end_ns);
void ddp(size_t params, size_t buckets, bool overlap, const torch::Device& device);
void ddp_step(int64_t step, double waited_s);
void ddp_buffers(size_t count);
void ddp_rebuild(size_t buckets);
void mesh(int rank, const std::string& coords, const std::string& groups);
void ddp_no_sync();
void ddp_gradients(int64_t step, const std::vector<std::string>& names,
                   const std::vector<torch::Tensor>& params);
void step(int64_t epoch, int64_t step, const torch::Tensor& loss);
void epoch_report(int64_t epoch, int64_t steps, double samples_per_s, const std::string& device,
                  const char* host);
void checkpoint(const std::string& name);
void resume(const std::string& name);
void model_to(const torch::Device& device);
void training_forward(const torch::nn::Module& model, int64_t step);
void evaluation(const torch::nn::Module& model);
void forward_precision(int64_t step, c10::ScalarType output);
void optimizer_step(const char* kind, size_t tensors);
}  // namespace detail

// Whether this process writes a trace (KIT_TRACE_DIR set). Decided once, at the first call
// (which opens the trace): the environment of a running process does not switch it on or off.
inline bool on() {
  static const bool traced = detail::tracing();
  return traced;
}

// --- runtime: the processes and their group (kit/runtime/) -------------------------------------

// setup() is done. Also arranges, when tracing, that the process's exit records whether the
// group was still alive then (group_alive(): a trainer that never called
// destroy_process_group()).
inline void setup(int rank, int local_rank, int world_size, const torch::Device& device,
                  const std::string& backend, std::chrono::milliseconds timeout, int threads,
                  uint64_t seed, bool (*group_alive)()) {
  if (on())
    detail::setup(rank, local_rank, world_size, device, backend, timeout, threads, seed,
                  group_alive);
}
// A collective entered a group: its number in the group's sequence, kind ("all_reduce"), op
// ("SUM", "-" for none), tensor (undefined: none, as a barrier's), the line that called it and the
// group's name ("world", or a subgroup's world ranks "0,2": ProcessGroup::name()).
inline void collective(int64_t seq, const char* kind, const char* op, const torch::Tensor& t,
                       const CallSite& site, const std::string& group) {
  if (on()) detail::collective(seq, kind, op, t, site, group);
}
// A send or receive between two ranks (kit/runtime/process_group.h): its number for this peer
// and direction, kind ("send", "recv"), the peer's world rank, tag, tensor, the caller's line and
// the group's name. Then its wait (p2p_wait), with when the wait began and ended: the time a rank
// stood still for its peer, which the pipeline's timeline draws (common/tools/pp_timeline.py).
inline void p2p(int64_t seq, const char* kind, int peer, int tag, const torch::Tensor& t,
                const CallSite& site, const std::string& group) {
  if (on()) detail::p2p(seq, kind, peer, tag, t, site, group);
}
inline void p2p_wait(int64_t seq, const char* kind, int peer, const std::string& group,
                     std::chrono::steady_clock::time_point start,
                     std::chrono::steady_clock::time_point end) {
  if (on()) detail::p2p_wait(seq, kind, peer, group, start, end);
}
// kit::all_reduce's values, in and out: before_all_reduce() before the call, all_reduce() after
// it. Small tensors only (1 to 4 values: a loss, an evaluation's [sum, count]), the gradients'
// buckets would flood the trace; `before` is empty otherwise, and all_reduce() then records
// nothing.
struct AllReduceInput {
  std::string values;
};
inline AllReduceInput before_all_reduce(const torch::Tensor& t) {
  return on() ? AllReduceInput{detail::small_values(t)} : AllReduceInput{};
}
inline void all_reduce(const AllReduceInput& before, ReduceOp op, const torch::Tensor& after) {
  if (!before.values.empty()) detail::all_reduce(before.values, op, after);
}
// A kit call after destroy_process_group() (site: nullptr where the call has none, print0).
inline void after_destroy(const char* what, const CallSite* site) {
  if (on()) detail::after_destroy(what, site);
}
// print0's text, on every rank (rank 0 alone prints it).
inline void print0(const char* text) {
  if (on()) detail::print0(text);
}
// A save0 call, on every rank (who wrote the file is for the file system to say).
inline void save0(const std::string& path) {
  if (on()) detail::save0(path);
}
inline void destroy() {
  if (on()) detail::destroy();
}

// --- data: samplers and loaders (kit/data/) ----------------------------------------------------

inline void sampler(size_t dataset_size, int replicas, int rank, bool shuffle, uint64_t seed) {
  if (on()) detail::sampler(dataset_size, replicas, rank, shuffle, seed);
}
// The epoch as the trainer passed it; the size tells the checker which sampler it told.
inline void set_epoch(int64_t epoch, size_t dataset_size) {
  if (on()) detail::set_epoch(epoch, dataset_size);
}
// The batch that starts at `at` of `order`: the dataset's name() and the samples it reads.
// Written by the training thread, in training order, whichever thread assembled it.
template <typename Dataset>
void batch(const Dataset& data, const std::vector<size_t>& order, size_t at, size_t batch_size) {
  if (on()) detail::batch(data.name(), order, at, batch_size);
}
// One sample read by a dataset that reports its reads (kit/data/era5.h): the split, its index, the
// loader worker that read it (kit::loader_worker(): 0 is the training thread) and when, in
// steady_clock nanoseconds: the checker sees whether the workers really read at the same time.
inline void sample(const std::string& dataset, size_t index, int worker, int64_t start_ns,
                   int64_t end_ns) {
  if (on()) detail::sample(dataset, index, worker, start_ns, end_ns);
}

// --- ddp: DistributedDataParallel (kit/ddp/) ---------------------------------------------------

inline void ddp(size_t params, size_t buckets, bool overlap, const torch::Device& device) {
  if (on()) detail::ddp(params, buckets, overlap, device);
}
// A backward's gradients are averaged: the reducer's step count, and how long the step waited
// for the last bucket.
inline void ddp_step(int64_t step, double waited_s) {
  if (on()) detail::ddp_step(step, waited_s);
}
inline void ddp_buffers(size_t count) {  // rank 0's buffers broadcast before a forward
  if (on()) detail::ddp_buffers(count);
}
inline void ddp_rebuild(size_t buckets) {  // the buckets rebuilt in arrival order
  if (on()) detail::ddp_rebuild(buckets);
}
// The mesh a rank built (kit::Mesh): its coordinates ("tp=1/2 cp=0/1 dp=1/2 order=tp-cp-dp") and
// its groups' members ("group_tp=1,3 group_cp=3 group_dp=2,3 group_cp-dp=2,3 ...": each group's
// directions in alphabetical order), whatever the program prints: the
// checker judges each collective's group against the mesh the student made.
inline void mesh(int rank, const std::string& coords, const std::string& groups) {
  if (on()) detail::mesh(rank, coords, groups);
}
// A no_sync() scope opened: the checker tells "every backward ran inside no_sync()" from "DDP
// was a temporary" by it.
inline void ddp_no_sync() {
  if (on()) detail::ddp_no_sync();
}

// A backward's gradients are averaged (DDP's parameters, by the module's own names): with
// KIT_TRACE_WEIGHTS=1 the first one's weights and gradients go to a file beside the trace
// (kit/check/model_trace.h), so that the checker compares each rank's shard of a split model
// with the slice of tp = 1's.
inline void ddp_gradients(int64_t step, const std::vector<std::string>& names,
                          const std::vector<torch::Tensor>& params) {
  if (on() && step == 1) detail::ddp_gradients(step, names, params);
}

// --- train: metrics and checkpoints (kit/train/) -----------------------------------------------

// A training step's loss on this rank. epoch: counted from 0, as the library does; step: the
// run's step count. The loss is read (item(), which waits for the GPU) only when tracing.
inline void step(int64_t epoch, int64_t step, const torch::Tensor& loss) {
  if (on()) detail::step(epoch, step, loss);
}
// This rank's figures at an epoch's end (epoch counted from 0).
inline void epoch_report(int64_t epoch, int64_t steps, double samples_per_s,
                         const std::string& device, const char* host) {
  if (on()) detail::epoch_report(epoch, steps, samples_per_s, device, host);
}
inline void checkpoint(const std::string& name) {  // a checkpoint written (its folder's name)
  if (on()) detail::checkpoint(name);
}
inline void resume(const std::string& name) {  // a run resumed from this checkpoint
  if (on()) detail::resume(name);
}

// --- pipeline: stages and schedules (kit/pipeline/) --------------------------------------------

// One forward ("F") or backward ("B") of a micro-batch on a stage (the model chunk's number in
// the whole pipeline), with its start and end: the order `kit check` compares with the schedule's
// and the boxes of the timeline. `live_before`: live_bytes() when the action began; where it is
// counted (not -1) the trace also gets the live bytes when it ended, so that `kit check` sees the
// activations a schedule keeps alive at once (1F1B about pp micro-batches' worth, GPipe all).
inline void pipeline(const char* kind, int stage, int micro, std::chrono::steady_clock::time_point start,
                     std::chrono::steady_clock::time_point end, int64_t live_before = -1) {
  if (on()) detail::pipeline(kind, stage, micro, start, end, live_before);
}
// The bytes of this process's live CPU tensors, for the pipeline's actions: -1 while tracing is
// off or nothing counts them. The counting allocator of kit/train/memory.h counts them; its
// install() registers itself here (count_live_bytes), so that this seam includes nothing of the
// kit. `kit check 05` switches it on in its runs with KIT_MEMORY_COUNT=1.
inline int64_t live_bytes() { return on() ? detail::live_bytes() : -1; }
inline void count_live_bytes(int64_t (*source)()) { detail::count_live_bytes(source); }

// --- models (kit/models/): every kit model makes these calls, so that the checker judges any
// exercise's model alike (what each records: kit/check/model_trace.h) ----------------------------

inline void model_to(const torch::Device& device) {  // Module::to, with the device asked for
  if (on()) detail::model_to(device);
}
inline void training_forward(const torch::nn::Module& model, int64_t step) {
  if (on()) detail::training_forward(model, step);
}
inline void evaluation(const torch::nn::Module& model) {  // an evaluation's first forward
  if (on()) detail::evaluation(model);
}
// What a forward computed in (step: the training forward's number, 0 for an evaluation's): the
// dtype of the model's output (the last matmul's: under autocast bf16 or fp16, else fp32) and
// the float32 matmul precision ATen was set to at that moment ("highest": fp32; "high": TF32 on
// the GPUs that have it), read from ATen itself.
inline void forward_precision(int64_t step, c10::ScalarType output) {
  if (on()) detail::forward_precision(step, output);
}

// --- perf: one device fast (kit/perf/) --------------------------------------------------------

// An optimizer step of a kit optimizer (kit/perf/fused_adamw.h): its kind and the parameter
// tensors it updated. torch's own optimizers record nothing.
inline void optimizer_step(const char* kind, size_t tensors) {
  if (on()) detail::optimizer_step(kind, tensors);
}

}  // namespace kit::observe
