"""Exercise 06's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds), written from the TODO texts of solutions/06-weather-vit-one-device/
train.annotated.cpp before the check's rules (common/tools/rules/ex06.py): each is something a
student who read the TODO could write. What this CPU cannot show is left out and said where the
check says it (pinned memory, the copy's overlap, fp16 and its scaler, TF32's speed)."""
EXERCISE = "06-weather-vit-one-device"

LOADING = "  const kit::LoaderOptions loading{.workers = args.workers, .prefetch = 2, .pin_memory = true};\n"
VALID = "  Loader valid_loader(valid_data, args.batch_size, /*shuffle=*/false, loading);\n"
LOOP = (
    "    for (kit::Batch b : kit::DeviceBatches(train_loader, device)) {  // the next one is on its way\n"
    "      const torch::Tensor& input = b.input;\n"
    "      const torch::Tensor& target = b.target;\n")
AUTOCAST = "        kit::Autocast autocast(device, args.amp);  // matmuls in bf16/fp16; the weights stay fp32\n"
FORWARD = "        loss = torch::mse_loss(model->forward(input), target);\n"
EVAL_AUTOCAST = "  kit::Autocast autocast(device, amp);  // this function's forwards in --amp's precision\n"
TF32 = '  kit::set_tf32(args.tf32, device);  // ATen\'s float32 matmul precision: "high" or "highest"\n'
FUSED = "  if (args.fused_adamw) made = std::make_unique<kit::FusedAdamW>(model->parameters(), adamw);\n"
UNFUSED = "  else made = std::make_unique<torch::optim::AdamW>(model->parameters(), adamw);\n"
PROFILER = ("  kit::StepProfiler profiler(\n"
            "      {.dir = args.profile_dir, .start = args.profile_start, .steps = args.profile_steps}, device);\n")
PROFILER_STEP = "      profiler.step();  // a step ended: the profile's window moves on\n"
TRAINING_END = '  std::printf("final valid loss %.5f, u10 RMSE %.5f\\n", valid_loss, rmse);\n'

# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    # TODO 1: "Give both loaders args.workers threads ... in pinned host memory ... Then, in the
    # training loop, take the batches through kit::DeviceBatches".
    ("workers-not-passed", "run", "1", "the not_done line removed but the workers left at 0: "
     "--workers 2 reads every sample on the training thread",
     [(LOADING, LOADING.replace(".workers = args.workers", ".workers = 0"))], []),
    ("workers-one", "run", "1", "one worker thread whatever --workers says: nothing is read in "
     "parallel",
     [(LOADING, LOADING.replace(".workers = args.workers", ".workers = 1"))], []),
    ("valid-loader-default", "run", "1", "only the training loader given the options (\"both "
     "loaders\"): the validation samples are read on the training thread",
     [(VALID, VALID.replace(", loading);", ", kit::LoaderOptions{});"))], []),
    ("no-device-batches", "run", "1", "the loop's second place not done: the batches copied with "
     ".to(device) when the step needs them, none on its way while the model computes",
     [(LOOP, "    for (kit::Batch cpu : train_loader) {\n"
             "      auto input = cpu.input.to(device), target = cpu.target.to(device);\n")], []),
    # TODO 2: "the forward and the loss under a kit::Autocast(device, args.amp) scope that ends
    # before backward ... and the same autocast in evaluate()".
    ("autocast-temporary", "run", "2", "the Autocast made as a temporary (no name): it ends at "
     "the semicolon, and the forward runs in fp32",
     [(AUTOCAST, "        kit::Autocast(device, args.amp);\n")], []),
    ("autocast-bf16-always", "run", "2", "bf16 written in place of args.amp: a run without --amp "
     "is no longer fp32",
     [(AUTOCAST, AUTOCAST.replace("args.amp", "kit::Precision::bf16"))], []),
    ("eval-without-autocast", "run", "2", "evaluate() left without autocast: the validation "
     "forward stays in fp32 under --amp bf16",
     [(EVAL_AUTOCAST, "")], []),
    ("autocast-fp16", "stops", "2", "fp16 written in place of args.amp (\"mixed precision\" "
     "taken for fp16): a CPU has no fp16 autocast, and Autocast stops every run at that line",
     [(AUTOCAST, AUTOCAST.replace("args.amp", "kit::Precision::fp16"))], ["1", "3", "4", "5"]),
    # A correct rewrite: only the forward under autocast, the loss outside on the float32
    # prediction (autocast runs mse_loss in float32 anyway): must pass.
    ("loss-outside-autocast", "equivalent", "2", "only the forward inside the autocast scope, the "
     "loss computed after it in float32 (correct: must pass)",
     [(AUTOCAST + FORWARD,
       "        torch::Tensor prediction;\n"
       "        {\n"
       "          kit::Autocast autocast(device, args.amp);\n"
       "          prediction = model->forward(input);\n"
       "        }\n"
       "        loss = torch::mse_loss(prediction.to(torch::kFloat), target);\n")], []),
    # TODO 3: "One call to kit::set_tf32 with the flag's value".
    ("tf32-always", "run", "3", "TF32 switched on whatever the flag says: a run without --tf32 "
     "no longer computes its matmuls in full fp32",
     [(TF32, TF32.replace("args.tf32", "true"))], []),
    ("tf32-after-training", "run", "3", "set_tf32 called after the training (right call, wrong "
     "place): the training's matmuls never see it",
     [(TF32, ""), (TRAINING_END, TF32 + TRAINING_END)], []),
    # TODO 4: "a kit::FusedAdamW with the same options in place of torch::optim::AdamW ...
    # Without the flag, torch::optim::AdamW as before".
    ("fused-default-options", "run", "4", "the FusedAdamW made without the trainer's options: "
     "AdamW's default learning rate (1e-3) in place of --lr",
     [(FUSED, FUSED.replace("(model->parameters(), adamw)", "(model->parameters())"))], []),
    ("fused-never", "run", "4", "the not_done line removed but torch::optim::AdamW made for "
     "--fused-adamw too: the step is not fused",
     [(FUSED, FUSED.replace("kit::FusedAdamW", "torch::optim::AdamW"))], []),
    ("fused-always", "run", "4", "FusedAdamW whatever the flag says: a run without "
     "--fused-adamw is no longer torch::optim::AdamW's",
     [(FUSED + UNFUSED, "  made = std::make_unique<kit::FusedAdamW>(model->parameters(), adamw);\n")],
     []),
    # TODO 5: "a kit::StepProfiler over steps args.profile_start .. + args.profile_steps - 1,
    # and its step() at the end of every training step".
    ("profiler-step-missing", "run", "5", "the profiler made but its step() never called: the "
     "window never opens, no trace is written",
     [(PROFILER_STEP, "")], []),
    ("profile-steps-fixed", "run", "5", "the window's length written as 3 in place of "
     "args.profile_steps",
     [(PROFILER, PROFILER.replace(".steps = args.profile_steps", ".steps = 3"))], []),
    ("profile-dir-fixed", "run", "5", "the trace written to a folder \"profile\" of the working "
     "directory in place of --profile-dir",
     [(PROFILER, PROFILER.replace(".dir = args.profile_dir", '.dir = "profile"'))], []),
    ("profiler-temporary", "compile", "5", "the StepProfiler made as a temporary (no name): "
     "profiler.step() names nothing",
     [(PROFILER, PROFILER.replace("kit::StepProfiler profiler(", "kit::StepProfiler("))], []),
]
