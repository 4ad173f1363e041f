// Exercise 02 — a residual CNN on CIFAR-10, from one GPU to many.
//
// As shipped this is a complete single-GPU trainer. TODOs 1-12 make it data-parallel, in the
// same steps as exercise 01. TODOs 13-15 are what an image model and a bigger global batch add:
// batch norm's running statistics (13), the learning rate for the global batch (14), and
// gradient accumulation that talks to the other ranks only once per step (15).
// `./kit check 02` tells you which TODOs already work.
#include <chrono>
#include <cstdio>

#include <torch/torch.h>          // tensors, autograd, optimizers

#include "kit/data/cifar10.h"      // load_cifar10(), Cifar10Dataset: the images and their labels
#include "kit/data/data_loader.h"  // DataLoader, Distributed(Eval)Sampler, LoaderOptions: batches
#include "kit/train/image_args.h"  // ImageTrainArgs, parse_image_args(): the command-line flags
#include "kit/train/lr_rule.h"     // scale_lr(), warmup_factor(): the learning rate
#include "kit/train/metrics.h"     // Metrics: metrics.csv, progress lines, the step time; device_model()
#include "kit/models/resnet.h"     // ResNet, running_statistics(): the model
#include "kit/train/summary.h"     // append_summary(): the scaling study's CSV row
//@ todo 1
//@ | Include kit/runtime/distributed.h and kit/ddp/ddp.h, as in exercise 01.
//@ solution
#include "kit/ddp/ddp.h"              // DistributedDataParallel: keeps the model copies identical
#include "kit/runtime/distributed.h"  // setup(), all_reduce(), print0(), save0(), destroy_process_group()
//@ end

using Loader = kit::DataLoader<kit::Cifar10Dataset>;

// The loss and the accuracy over a whole split, without training: the sums of the loss and of
// the correct predictions over every image, divided by the number of images. (A mean of
// per-rank means is not that loss: on several ranks the slices differ in length.)
std::pair<torch::Tensor, torch::Tensor> evaluate(kit::ResNet& model, const Loader& loader,
                                                 torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();  // batch norm uses its running statistics, not the batch's
  // In double: exact counts, and a sum over 10^4 images that keeps the loss's decimals.
  auto options = torch::TensorOptions().dtype(torch::kDouble).device(device);
  auto loss_sum = torch::zeros({}, options), correct = torch::zeros({}, options),
       images = torch::zeros({}, options);
  for (kit::Batch batch : loader) {
    // The model itself, not a DDP wrapper (Python's ddp_model.module(x)): in training, every
    // forward goes through ddp.forward, which copies rank 0's batch-norm statistics to all ranks
    // (broadcast_buffers). Here that copy would undo TODO 13: the first forward of an evaluation
    // would replace the statistics averaged over every rank's data by rank 0's own, and without
    // TODO 13 it would hide that the ranks' statistics differ. Evaluation only reads weights and
    // statistics, so it needs nothing from the wrapper.
    auto logits = model->forward(batch.input.to(device));
    auto target = batch.target.to(device);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, target,
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .to(torch::kDouble);
    correct += logits.argmax(1).eq(target).sum().to(torch::kDouble);
    images += target.size(0);
  }
  auto totals = torch::stack({loss_sum, correct, images});  // one tensor: one collective for all
  //@ todo 9
  //@ | `totals` holds this rank's loss sum, its number of correct predictions and its number of
  //@ | images, and every rank read a different part of the split. Add them up over all ranks,
  //@ | so that the ratios below are the loss and the accuracy of the whole split, the same on
  //@ | every rank. Call it once, after the loop: the ranks' slices may differ by an image.
  //@ solution
  kit::all_reduce(totals, kit::ReduceOp::SUM);  // the sums and counts of all ranks, on every rank
  //@ end
  return {totals[0] / totals[2], totals[1] / totals[2]};
}

int main(int argc, char** argv) {
  kit::ImageTrainArgs args = kit::parse_image_args(argc, argv);

  //@ todo 2-3
  //@ | Replace the next lines by one call to kit::setup(args.seed); read its fields local_rank,
  //@ | rank, device and world_size by name, and print which rank runs on which device.
  torch::manual_seed(args.seed);
  torch::Device device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  const int rank = 0, world_size = 1;  // one process
  std::printf("training on %s\n", device.str().c_str());
  //@ solution
  const kit::Setup me = kit::setup(args.seed);  // fields by name: no positional unpacking
  const int local_rank = me.local_rank, rank = me.rank, world_size = me.world_size;
  const torch::Device device = me.device;
  std::printf("rank %d of %d: local rank %d, device %s\n", rank, world_size, local_rank,
              device.str().c_str());
  //@ end
  const int64_t batch = args.batch_per_rank(world_size);  // --global-batch is split over ranks

  // CIFAR-10: 50000 training and 10000 test images of 32x32 pixels in 10 classes.
  // A missing or damaged file ends the run with one line that names it (kit::DataError).
  kit::Cifar10Dataset train_data =
      kit::load_cifar10(args.data_dir, kit::Cifar10Split::train, args.train_images);
  kit::Cifar10Dataset test_data =
      kit::load_cifar10(args.data_dir, kit::Cifar10Split::test, args.test_images);
  if (args.augment) train_data.set_augment(args.seed);
  // Pinned batches: the copies to the GPU below are non_blocking (kit/data/data_loader.h).
  const kit::LoaderOptions loading{.workers = args.workers, .prefetch = 2, .pin_memory = true};

  //@ todo 4
  //@ | A kit::DistributedSampler for the training set: it shuffles with args.seed (the same
  //@ | seed on every rank). For the test set a kit::DistributedEvalSampler: every image once, in
  //@ | order, where a DistributedSampler repeats a few to give all ranks equally many, and so
  //@ | would make the test loss and accuracy depend on the number of ranks.
  //@ solution
  kit::DistributedSampler train_sampler(train_data, /*shuffle=*/true, args.seed);
  kit::DistributedEvalSampler test_sampler(test_data);
  //@ end
  //@ todo 5
  //@ | Hand train_sampler to the training loader in place of shuffle=true.
  Loader train_loader(train_data, batch, /*shuffle=*/true, loading);
  //@ solution
  Loader train_loader(train_data, batch, train_sampler, loading);
  //@ end
  //@ todo 6
  //@ | Hand test_sampler to the test loader.
  Loader test_loader(test_data, args.eval_batch_size, /*shuffle=*/false, loading);
  //@ solution
  Loader test_loader(test_data, args.eval_batch_size, test_sampler, loading);
  //@ end

  kit::ResNet model(kit::ResNetOptions{.width = args.width, .blocks = args.blocks});
  model->to(device);
  //@ todo 7
  //@ | Wrap the model in kit::DistributedDataParallel (name it ddp: TODO 15 needs it), and run
  //@ | the training forward through the wrapper (second place, in the training loop), as
  //@ | Python's ddp_model(x): it first copies rank 0's batch-norm buffers to every rank.
  //@ solution
  kit::DistributedDataParallel ddp(model);  // rank 0's weights everywhere; averaged gradients
  //@ end
  //@ todo 14
  //@ | --lr was tuned for one process and a batch of args.lr_base_batch() images. A step now
  //@ | sees batch x world_size images: scale the rate by the rule of --lr-scaling with
  //@ | kit::scale_lr (kit/train/lr_rule.h). Scale once: warm-up below multiplies, it does not
  //@ | scale.
  const double lr = args.lr;
  //@ solution
  const double lr = kit::scale_lr(args.lr, args.lr_scaling, batch * world_size, args.lr_base_batch());
  //@ end
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  kit::Metrics metrics(args.out_dir, batch, device);
  const auto start = std::chrono::steady_clock::now();
  double best_acc = -1, time_to_target = -1, test_loss = 0, test_acc = 0;
  int64_t step = 0;

  for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
    //@ todo 8
    //@ | Tell train_sampler which epoch starts, so that every epoch has its own order.
    //@ solution
    train_sampler.set_epoch(epoch);
    //@ end
    train_data.set_epoch(epoch);  // the augmentation's random crops and flips, per epoch
    model->train();
    auto total = torch::zeros({}, torch::TensorOptions().device(device));  // the epoch's loss sum
    int64_t steps = 0;
    for (kit::Batch b : train_loader) {
      for (auto& group : optimizer.param_groups())
        group.options().set_lr(lr * kit::warmup_factor(step, args.warmup_steps));
      optimizer.zero_grad();
      // Gradient accumulation: the batch in micro-batches; their gradients add up in .grad,
      // each scaled by 1/K so that the sum is the mean over the whole batch.
      auto inputs = b.input.to(device, /*non_blocking=*/true).chunk(args.accum_steps);
      auto targets = b.target.to(device, /*non_blocking=*/true).chunk(args.accum_steps);
      const size_t micro = inputs.size();
      auto step_loss = torch::zeros({}, torch::TensorOptions().device(device));
      for (size_t k = 0; k < micro; ++k) {
        // One micro-batch: forward, backward; its gradients add up in .grad.
        auto forward_backward = [&] {
          //@ todo 7
          auto loss = torch::nn::functional::cross_entropy(model->forward(inputs[k]), targets[k]) /
                      static_cast<double>(micro);
          //@ solution
          // Through the wrapper, as Python's ddp_model(x): rank 0's batch-norm running statistics
          // to every rank first (DDP's broadcast_buffers, on by default), then model->forward;
          // and the backward of this forward is the one DDP averages.
          auto loss = torch::nn::functional::cross_entropy(ddp.forward(inputs[k]), targets[k]) /
                      static_cast<double>(micro);
          //@ end
          loss.backward();
          step_loss += loss.detach();
        };
        //@ todo 15
        //@ | Every backward under DDP averages the gradients over the ranks. With K micro-batches
        //@ | only the last one needs to: run the others inside ddp.no_sync() (kit/ddp/ddp.h), and
        //@ | the last backward averages the sum of all K at once. The guard is read by the
        //@ | forward, as in PyTorch: a micro-batch's forward and its backward both go inside.
        forward_backward();
        //@ solution
        if (k + 1 < micro) {
          auto quiet = ddp.no_sync();  // forward and backward: only adds to this rank's .grad
          forward_backward();
        } else {
          forward_backward();  // the step's one all-reduce, of the accumulated gradients
        }
        //@ end
      }
      optimizer.step();
      total += step_loss;
      ++steps, ++step;
      metrics.step(epoch, step_loss, steps);  // reads no loss: the GPU is not waited for
      if (steps == args.max_steps) break;
    }
    auto train_loss = total / static_cast<double>(steps);
    //@ todo 9
    //@ | Average the epoch's training loss over all ranks, as in exercise 01.
    //@ solution
    kit::all_reduce(train_loss, kit::ReduceOp::AVG);
    //@ end
    metrics.end_epoch(epoch);
    //@ todo 13
    //@ | Batch norm keeps running statistics (buffers, not parameters: DDP averages no
    //@ | buffers), and each rank updated its own from its own batches. Evaluation uses them, and
    //@ | rank 0 saves its own. Average them over the ranks (kit::running_statistics(*model)
    //@ | lists them), so that every rank evaluates, and rank 0 saves, the same model, made of
    //@ | every rank's data. (PyTorch's DDP, and ddp.forward of TODO 7, copy rank 0's buffers to
    //@ | all at each training forward: they then hold rank 0's batches, plus each rank's last one.
    //@ | Averaging is what timm's distribute_bn does in Python.)
    //@ solution
    for (auto stat : kit::running_statistics(*model)) kit::all_reduce(stat, kit::ReduceOp::AVG);
    //@ end
    auto [loss, accuracy] = evaluate(model, test_loader, device);
    test_loss = loss.item<double>(), test_acc = accuracy.item<double>();
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (time_to_target < 0 && args.target_acc > 0 && test_acc >= args.target_acc) time_to_target = elapsed;
    //@ todo 10
    //@ | Print with kit::print0 in place of std::printf, here and at the end.
    std::printf("[%ld/%ld] train loss %.5f, test loss %.5f, test accuracy %.5f\n", epoch + 1,
                args.epochs, train_loss.item<double>(), test_loss, test_acc);
    //@ solution
    kit::print0("[%ld/%ld] train loss %.5f, test loss %.5f, test accuracy %.5f\n", epoch + 1,
                args.epochs, train_loss.item<double>(), test_loss, test_acc);
    //@ end
    if (test_acc > best_acc) {
      best_acc = test_acc;
      //@ todo 11
      //@ | Save with kit::save0 in place of torch::save, here and at the end.
      torch::save(model, args.out_dir + "/model-best.pt");
      //@ solution
      kit::save0(model, args.out_dir + "/model-best.pt");
      //@ end
    }
  }

  //@ todo 10
  std::printf("final test loss %.5f, test accuracy %.5f\n", test_loss, test_acc);
  //@ solution
  kit::print0("final test loss %.5f, test accuracy %.5f\n", test_loss, test_acc);
  //@ end
  //@ todo 11
  torch::save(model, args.out_dir + "/model-final.pt");
  //@ solution
  kit::save0(model, args.out_dir + "/model-final.pt");
  //@ end
  if (!args.summary_csv.empty() && rank == 0) {
    kit::append_summary(args.summary_csv,
                        {.label = args.run_label, .world_size = world_size,
                         .nodes = kit::node_count(), .batch_per_rank = batch,
                         .global_batch = batch * world_size, .accum_steps = args.accum_steps,
                         .workers = args.workers, .steps = step,
                         .step_time_s = metrics.step_timer().median_seconds(),
                         .test_loss = test_loss, .test_acc = test_acc,
                         .time_to_target_s = time_to_target,
                         .device = kit::device_model(device)});
  }
  //@ todo 12
  //@ | Leave the job cleanly with kit::destroy_process_group().
  //@ solution
  kit::destroy_process_group();
  //@ end
  return 0;
}
