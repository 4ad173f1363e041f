// Exercise 01 — a Transformer language model on WikiText-2, from one GPU to many.
//
// As shipped this is a complete single-GPU trainer: build it, run it, watch the loss fall.
// The numbered TODOs turn it into a data-parallel trainer that uses every GPU of every node:
// each GPU gets its own process (a "rank") with a full copy of the model and its own slice of
// the data, and the ranks average their gradients after every backward pass.
// Work through the TODOs in order; `./kit check 01` tells you which ones already work.
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>

#include <torch/torch.h>          // tensors, autograd, optimizers

#include "kit/train/args.h"             // TrainArgs, parse_args(): the command-line flags
#include "kit/train/checkpoint.h"       // Checkpoints, TrainState: save, resume, stop before the time limit
#include "kit/data/data_loader.h"       // DataLoader, DistributedSampler, DistributedEvalSampler: batches
#include "kit/train/metrics.h"          // Metrics: metrics.csv, progress lines, per-rank reports
#include "kit/train/clip.h"             // clip_grad_norm_(): --clip-grad, the norm left on the device
#include "kit/models/transformer_lm.h"  // TransformerLM, lm_loss(): the model and its loss
#include "kit/data/wikitext.h"          // load_wikitext2(), LanguageModelDataset: the data
//@ todo 1
//@ | Include kit/runtime/distributed.h and kit/ddp/ddp.h. C++ LibTorch has no torch.distributed
//@ | module; these two headers are the course's stand-in for it (setup, collectives, DDP).
//@ solution
#include "kit/ddp/ddp.h"              // DistributedDataParallel: keeps the model copies identical
#include "kit/runtime/distributed.h"  // setup(), all_reduce(), print0(), save0(), destroy_process_group()
//@ end

using Loader = kit::DataLoader<kit::LanguageModelDataset>;
// The training forward, input -> logits: in Python, `model(x)` (main() says which one it is).
using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// One pass over the training data (or the rest of it, after a resume). Returns the mean training
// loss of the pass. Stops early, with state.stopped set, when the job is asked to stop.
torch::Tensor train_one_epoch(kit::TransformerLM& model, const Forward& forward, const Loader& loader,
                              torch::optim::Optimizer& optimizer, torch::Device device,
                              kit::TrainState& state, kit::Checkpoints& checkpoints,
                              kit::Metrics& metrics, int64_t max_steps, double clip_grad) {
  model->train();
  // The loss sum lives on the device: no GPU -> CPU copy in the hot loop.
  auto total = state.epoch_loss_sum.defined()
                   ? state.epoch_loss_sum
                   : torch::zeros({}, torch::TensorOptions().device(device));
  // A resumed run skips the steps already done; after a stop at the last step of a --max-steps
  // epoch, that is the whole epoch.
  const size_t first = max_steps > 0 && state.step_in_epoch >= max_steps
                           ? loader.size()
                           : static_cast<size_t>(state.step_in_epoch);
  // The steps of this epoch on this rank, for the progress line's ETA.
  const auto steps_per_epoch = static_cast<int64_t>(
      max_steps > 0 ? std::min<size_t>(loader.size(), max_steps) : loader.size());
  for (kit::Batch batch : loader.from(first)) {
    // The loader pinned the batch (main()): non_blocking queues the copy behind the GPU's work,
    // and the host goes on queueing this step instead of waiting for it.
    auto input = batch.input.to(device, /*non_blocking=*/true);
    auto target = batch.target.to(device, /*non_blocking=*/true);
    optimizer.zero_grad();
    auto loss = kit::lm_loss(forward(input), target);
    loss.backward();
    // --clip-grad: the gradient's global L2 norm at most clip_grad. Under DDP backward returns
    // only when every bucket's average has arrived, so every rank clips the same gradient alike.
    // The kit's clip_grad_norm_ (Python's torch.nn.utils.clip_grad_norm_): LibTorch's C++ one
    // returns the norm as a host double, so the host would wait there for the GPU every step.
    if (clip_grad > 0) kit::clip_grad_norm_(model->parameters(), clip_grad);
    optimizer.step();
    total += loss.detach();
    state.epoch_loss_sum = total;
    ++state.step_in_epoch;
    ++state.global_step;
    metrics.step(state.epoch, loss, state.step_in_epoch, steps_per_epoch);
    if (checkpoints.stop_requested(state)) return {};  // time is up: main() saves and leaves
    if (state.step_in_epoch == max_steps) break;
  }
  auto mean = total / static_cast<double>(state.step_in_epoch);
  //@ todo 10
  //@ | `mean` is this rank's loss over the batches it saw, and every rank saw different
  //@ | batches. Replace it by its average over all ranks (a collective from
  //@ | kit/runtime/distributed.h), so that the number reported describes the whole epoch and is the
  //@ | same on every rank.
  //@ solution
  kit::all_reduce(mean, kit::ReduceOp::AVG);  // this rank's mean -> the mean over all ranks
  //@ end
  return mean;
}

// The loss over a whole validation or test split, without training: the sum of the loss over
// every predicted word divided by the number of words. (A mean of per-batch means is not that
// loss: the last batch is shorter, and on several ranks the slices differ in length.)
torch::Tensor evaluate(kit::TransformerLM& model, const Loader& loader, torch::Device device) {
  torch::NoGradGuard no_grad;  // no gradients needed: saves memory and time
  model->eval();               // dropout off
  // In double: a float32 sum over 10^5 words keeps only about 3 of the loss's decimals.
  auto options = torch::TensorOptions().dtype(torch::kDouble).device(device);
  auto loss_sum = torch::zeros({}, options), words = torch::zeros({}, options);
  for (kit::Batch batch : loader) {
    auto target = batch.target.to(device);
    auto loss = kit::lm_loss(model->forward(batch.input.to(device)), target);  // per-word mean
    loss_sum += loss.to(torch::kDouble) * target.numel();
    words += target.numel();
  }
  auto totals = torch::stack({loss_sum, words});  // one tensor: one collective for both
  //@ todo 10
  //@ | `totals` holds this rank's loss sum and word count, and every rank read a different part
  //@ | of the split. Add them up over all ranks (the same collective, another reduction), so
  //@ | that the ratio below is the loss of the whole split, the same on every rank. Call it
  //@ | once, after the loop: the ranks may have read different numbers of batches.
  //@ solution
  kit::all_reduce(totals, kit::ReduceOp::SUM);  // the sums and counts of all ranks, on every rank
  //@ end
  return totals[0] / totals[1];
}

int main(int argc, char** argv) {
  kit::TrainArgs args = kit::parse_args(argc, argv);

  //@ todo 2-3
  //@ | Replace the next three lines by one call to kit::setup(args.seed). It joins the other
  //@ | ranks and tells this process who it is: a kit::Setup with the fields local_rank, rank,
  //@ | device and world_size, read by name (the code below uses rank, world_size and device).
  //@ | It also seeds each rank differently and selects the GPU that belongs to this rank.
  //@ | Keep a line that says which rank runs on which device: every rank should print it.
  torch::manual_seed(args.seed);
  torch::Device device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  std::printf("training on %s\n", device.str().c_str());
  //@ solution
  // Join the job. Who we are comes from the launcher (ddprun, or srun on a cluster).
  const kit::Setup me = kit::setup(args.seed);  // fields by name: no positional unpacking
  const int local_rank = me.local_rank, rank = me.rank, world_size = me.world_size;
  const torch::Device device = me.device;
  std::printf("rank %d of %d: local rank %d, device %s\n", rank, world_size, local_rank,
              device.str().c_str());
  //@ end

  // WikiText-2: ~2 million words of Wikipedia. Each sample is a window of seq_len words, and
  // the target is the same window shifted by one word: predict the next word everywhere.
  kit::WikiText2 corpus = kit::load_wikitext2(args.data_dir);
  kit::LanguageModelDataset train_data(corpus.train, args.seq_len, "train");
  kit::LanguageModelDataset val_data(corpus.valid, args.seq_len, "valid");
  kit::LanguageModelDataset test_data(corpus.test, args.seq_len, "test");

  //@ todo 4
  //@ | Every rank must read a different part of each split, or all ranks just repeat the same
  //@ | work. Create a kit::DistributedSampler for the training set: it shuffles, so give every
  //@ | rank the same seed (all ranks shuffle the same list the same way, then each takes its own
  //@ | slice of it). For the validation and test sets, a kit::DistributedEvalSampler each: it
  //@ | reads every sample once, in order, where a DistributedSampler repeats a few to give all
  //@ | ranks equally many, and so would make the losses depend on the number of ranks.
  //@ solution
  kit::DistributedSampler train_sampler(train_data, /*shuffle=*/true, args.seed);
  kit::DistributedEvalSampler val_sampler(val_data);
  kit::DistributedEvalSampler test_sampler(test_data);
  //@ end
  // Training batches in pinned memory, for the non_blocking copy of train_one_epoch (on a GPU).
  const kit::LoaderOptions pinned{.pin_memory = true};
  //@ todo 5
  //@ | Hand train_sampler to the training loader in place of shuffle=true: the sampler does
  //@ | the shuffling now, per epoch and consistently across ranks.
  Loader train_loader(train_data, args.batch_size, /*shuffle=*/true, pinned);
  //@ solution
  Loader train_loader(train_data, args.batch_size, train_sampler, pinned);
  //@ end
  //@ todo 6
  //@ | Hand val_sampler to the validation loader.
  Loader val_loader(val_data, args.eval_batch_size);
  //@ solution
  Loader val_loader(val_data, args.eval_batch_size, val_sampler);
  //@ end
  //@ todo 7
  //@ | Hand test_sampler to the test loader.
  Loader test_loader(test_data, args.eval_batch_size);
  //@ solution
  Loader test_loader(test_data, args.eval_batch_size, test_sampler);
  //@ end

  kit::TransformerLM model(kit::lm_options(args, corpus.vocab.size()));
  model->to(device);
  // Training calls the model through `forward`, as Python calls model(x).
  Forward forward = [&](const torch::Tensor& x) { return model->forward(x); };
  //@ todo 8
  //@ | Wrap the model in kit::DistributedDataParallel. Each rank initialised its weights at
  //@ | random; the wrapper copies rank 0's weights to all ranks, then averages the gradients
  //@ | of all ranks in the backward of every forward that went through it, so that all copies
  //@ | stay identical. So send `forward` through it (ddp.forward(x): Python's ddp_model(x)); a
  //@ | backward of model->forward(x) would not be averaged. The wrapper must stay alive for
  //@ | the whole training.
  //@ solution
  kit::DistributedDataParallel ddp(model);  // rank 0's weights everywhere
  forward = [&](const torch::Tensor& x) { return ddp.forward(x); };  // its backward averages
  //@ end
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(args.lr));

  // Jobs hit time limits and nodes fail: a run folder with a checkpoint continues from it.
  kit::Checkpoints checkpoints(args.out_dir, kit::config_fingerprint(args, corpus.vocab.size()),
                               args.keep_checkpoints);
  kit::TrainState state = checkpoints.resume(model, optimizer, device, args.resume);
  kit::Metrics metrics(args.out_dir, args.batch_size, device, state.global_step);

  while (state.epoch < args.epochs) {
    const int64_t epoch = state.epoch;
    //@ todo 9
    //@ | Tell train_sampler which epoch starts. Its shuffle is seeded with seed + epoch; without
    //@ | this call every epoch visits the samples in the same order.
    //@ solution
    train_sampler.set_epoch(epoch);
    //@ end
    torch::Tensor train_mean = train_one_epoch(model, forward, train_loader, optimizer, device,
                                               state, checkpoints, metrics, args.max_steps,
                                               args.clip_grad);
    if (state.stopped) break;
    metrics.end_epoch(epoch);  // every rank's device, samples/s and peak memory, shown by rank 0
    double train_loss = train_mean.item<double>();
    double val_loss = evaluate(model, val_loader, device).item<double>();
    //@ todo 11
    //@ | Print with kit::print0 in place of std::printf (same arguments). Every rank runs this
    //@ | line; print0 prints it once, from rank 0, instead of once per rank.
    std::printf("[%ld/%ld] train loss %.5f, validation loss %.5f (perplexity %.2f)\n", epoch + 1,
                args.epochs, train_loss, val_loss, std::exp(val_loss));
    //@ solution
    kit::print0("[%ld/%ld] train loss %.5f, validation loss %.5f (perplexity %.2f)\n", epoch + 1,
                args.epochs, train_loss, val_loss, std::exp(val_loss));
    //@ end
    if (val_loss < state.best_val_loss) {
      state.best_val_loss = val_loss;
      //@ todo 12
      //@ | Save with kit::save0 in place of torch::save. All ranks hold the same model, so one
      //@ | copy is enough; several ranks writing one file at once can corrupt it.
      torch::save(model, args.out_dir + "/model-best.pt");
      //@ solution
      kit::save0(model, args.out_dir + "/model-best.pt");
      //@ end
    }
    state.next_epoch();
    checkpoints.save(model, optimizer, state);  // every rank calls it; rank 0 writes the model
  }

  if (state.stopped) {
    checkpoints.save(model, optimizer, state);  // mid-epoch: the next run continues from here
  } else {
    double test_loss = evaluate(model, test_loader, device).item<double>();
    //@ todo 11
    //@ | Here too: kit::print0 in place of std::printf.
    std::printf("final test loss %.5f (perplexity %.2f)\n", test_loss, std::exp(test_loss));
    //@ solution
    kit::print0("final test loss %.5f (perplexity %.2f)\n", test_loss, std::exp(test_loss));
    //@ end
    //@ todo 12
    //@ | Here too: kit::save0 in place of torch::save.
    torch::save(model, args.out_dir + "/model-final.pt");
    //@ solution
    kit::save0(model, args.out_dir + "/model-final.pt");
    //@ end
  }
  //@ todo 13
  //@ | Leave the job cleanly: kit::destroy_process_group() closes the connections to the
  //@ | other ranks before the program ends.
  //@ solution
  kit::destroy_process_group();
  //@ end
  return 0;
}
