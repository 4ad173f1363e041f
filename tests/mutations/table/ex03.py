"""Exercise 03's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds). Written from the TODO text, by class (issue 29): a formula off by a
factor, a wrong collective, op or buffer, a step in the wrong order, a flag the TODO must
honour, a run that stops; and correct rewrites that must pass. Issue 40 rewrote TODOs 1 to 4
(the bytes predicted, ZeRO-1's step by hand, which buffer ZeRO-2 frees, what a unit is): their
mistakes below were written from that text before the check's rules were."""
EXERCISE = "03-transformer-lm-zero"

# TODO 1: the formula (predicted_bytes) and the bytes line.
SHARD = "  const int64_t S = (P + N - 1) / N;  // one shard of the flat vector, padding included\n"
LARGEST = "    largest = std::max(largest, (u + N - 1) / N * N);\n"
PARAMS = "  b.params = 4 * (stage == 3 ? S3 : P);\n"
GRADS = "  b.grads = 4 * (stage == 3 ? S3 : stage == 2 ? S : P);\n"
OPTIMIZER = "  b.optimizer = 8 * (stage == 3 ? S3 : stage >= 1 ? S : P);\n"
GATHERED = "  b.gathered_peak = stage == 3 ? 4 * largest : 0;\n"
HELD_LINE = '  std::printf("rank %d: %s holds'
HELD_BLOCK = (
    "  const std::string held = figures(trainer.held());\n"
    "  const std::string formula = figures(predicted_bytes(zero_stage, P, world_size, unit_sizes));\n"
    "  const std::string name = zero_stage == 0 ? \"DDP\" : \"ZeRO-\" + std::to_string(zero_stage);\n"
    "  std::printf(\"rank %d: %s holds %s bytes, peak %lld; the formula: %s\\n\", rank, name.c_str(),\n"
    "              held.c_str(), static_cast<long long>(trainer.peak), formula.c_str());\n")
# TODO 2: ZeRO-1's step; TODO 3: what ZeRO-2 frees, inside it.
MAKE_GRAD = "    auto grad = torch::empty({flat->layout().shard()}, flat->params().options());\n"
REDUCE = "    kit::reduce_scatter(grad, flat->grads(), kit::ReduceOp::AVG);\n"
FREE = ("    if (zero_stage == 2) {\n"
        "      flat->drop_grads();\n"
        "      kept_grad = grad;\n"
        "    }\n")
CLIP = "    if (args.clip_grad > 0) kit::clip_shard_grads_({grad}, args.clip_grad, flat->group());\n"
UPDATE = "    adamw_shard->update(flat->layout().own(flat->params()), grad);\n"
GATHER = "    kit::all_gather(flat->params(), flat->layout().own(flat->params()).clone());\n"
# TODO 4: the units and the forward.
ZERO3 = "    sharded.emplace(model, model->units(),\n"
OPTIONS3 = "kit::ZeroOptions{.stage = 3, .adamw = adamw, .max_grad_norm = args.clip_grad}"
FORWARD3 = "    trainer.forward = [&](const torch::Tensor& x) { return sharded->forward(x); };\n"
SAVE = "    checkpoints.save_sharded(save_shard, s);\n"
RESUME = "    return checkpoints.resume_sharded(load_shard, device, args.resume);\n"
RESUMED = "  kit::TrainState state = trainer.resume();\n"
FINAL = '    save_model(args.out_dir + "/model-final.pt");\n'
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    # TODO 1, the formula: each a prediction that one stage's measurement contradicts.
    ("formula-zero1-shards-grads", "run", "1", "the formula shards the gradients from ZeRO-1 on "
     "(stage >= 1): ZeRO-1's predicted gradients are off by a factor N",
     [(GRADS, "  b.grads = 4 * (stage == 3 ? S3 : stage >= 1 ? S : P);\n")], []),
    ("formula-one-moment", "run", "1", "AdamW's state counted as one fp32 moment, 4 bytes a "
     "parameter, not two (exp_avg and exp_avg_sq): off at every stage, DDP's too",
     [(OPTIMIZER, OPTIMIZER.replace("8 * (", "4 * ("))], []),
    ("formula-shard-floor", "run", "1", "a shard of P / N elements, rounded down: the padding "
     "to N equal shards left out (P is odd here, so it is one element short)",
     [(SHARD, "  const int64_t S = P / N;\n")], []),
    ("formula-gathers-model", "run", "1", "ZeRO-3's gathered peak predicted as the whole model's "
     "weights (4P): one unit is gathered at a time, not every unit",
     [(GATHERED, "  b.gathered_peak = stage == 3 ? 4 * P : 0;\n")], []),
    ("formula-gathered-unpadded", "run", "1", "the largest unit's weights without its padding: "
     "a unit is gathered whole, N equal shards of it",
     [(LARGEST, "    largest = std::max(largest, u);\n")], []),
    # TODO 1, the bytes line.
    ("held-rank0-only", "run", "1", "the bytes line printed by rank 0 only, as print0 would: "
     "rank 1's share is never seen",
     [(HELD_LINE, '  if (rank == 0) std::printf("rank %d: %s holds')], ["2", "3", "4"]),
    # TODO 2: ZeRO-1's step. Its mistakes are ZeRO-2's too (TODO 3 runs the same step).
    ("zero1-sum", "run", "2", "the gradients reduce-scattered with SUM, not AVG: AdamW's step "
     "hardly depends on the gradient's scale, so the losses barely move, the weights do",
     [(REDUCE, REDUCE.replace("ReduceOp::AVG", "ReduceOp::SUM"))], ["3"]),
    ("zero1-own-local-grad", "run", "2", "no reduce-scatter: each rank updates its shard with its "
     "own slice of its own gradient (the wrong buffer: not averaged over the ranks)",
     [(REDUCE, "    grad.copy_(flat->layout().own(flat->grads()));\n")], ["3"]),
    ("zero1-gather-before-update", "run", "2", "the all-gather before the update: every rank "
     "gets the others' shards of the last step, and its own update stays its own",
     [(UPDATE + GATHER, GATHER + UPDATE)], ["3"]),
    # --clip-grad: the check's runs with --clip-grad 1e-6 (FLAG_RUNS) show these, the default
    # runs (no clipping) do not.
    ("zero1-clip-local-norm", "run", "2", "--clip-grad by the norm of this rank's shard, as "
     "clip_grad_norm_ would do with what the rank holds: each rank scales by its own factor",
     [(CLIP, "    if (args.clip_grad > 0) grad.mul_((args.clip_grad / (grad.norm() + 1e-6)).clamp_max(1.0));\n")],
     ["3"]),
    ("zero1-no-clip", "run", "2", "no clipping in the step: --clip-grad is ignored (the default "
     "run does not clip, so only another value shows it)",
     [(CLIP, "")], ["3"]),
    # A correct rewrite: the own shard named once.
    ("zero1-own-shard-named", "equivalent", "2", "the own shard of the weights taken once into a "
     "variable, updated and gathered from (correct: must pass)",
     [(UPDATE + GATHER, "    torch::Tensor mine = flat->layout().own(flat->params());\n"
                        "    adamw_shard->update(mine, grad);\n"
                        "    kit::all_gather(flat->params(), mine.clone());\n")], []),
    # TODO 3: which buffer ZeRO-2 frees, and when.
    ("zero2-frees-nothing", "run", "3", "ZeRO-2 frees no gradient: every rank keeps the whole "
     "flat gradient after the reduce-scatter has read it, as ZeRO-1 does",
     [(FREE, "")], []),
    ("zero2-keeps-no-shard", "run", "3", "ZeRO-2 frees the full gradient and keeps nothing: "
     "the averaged shard, the rank's gradient, is gone after the step",
     [(FREE, "    if (zero_stage == 2) flat->drop_grads();\n")], []),
    ("zero2-keeps-both", "run", "3", "ZeRO-2 keeps the averaged shard but frees nothing: the "
     "shard beside the whole gradient, more than ZeRO-1 holds",
     [(FREE, "    if (zero_stage == 2) kept_grad = grad;\n")], []),
    # TODO 4: what a unit is, and the forward.
    ("zero3-model-forward", "stops", "4", "ZeRO-3 trained through model->forward, whose weights "
     "the wrapper has emptied", [(FORWARD3, "")], []),
    ("zero3-one-unit", "run", "4", "ZeRO-3 with the whole model as its one unit: the bytes held "
     "between steps are the formula's, but every forward gathers the whole model",
     [(ZERO3, "    sharded.emplace(model, std::vector<kit::TransformerLMImpl::Unit>{\n"
              "        {model.ptr(), [&](const torch::Tensor& x) { return model->forward(x); }}},\n")],
     []),
    ("zero3-units-without-output", "stops", "4", "the units without the output layer: one "
     "trainable parameter in no unit, which FullyShardedModel refuses",
     [(ZERO3, "    auto units = model->units();\n    units.pop_back();\n"
              "    sharded.emplace(model, units,\n")], []),
    # Held bytes as the formula says, the losses DDP's: only the peak shows the copy.
    ("zero3-keeps-full-copy", "run", "4", "ZeRO-3 keeps a full copy of the initial weights alive "
     "(to compare with later): held() does not count it, the peak does",
     [("  if (zero_stage == 3) {\n" + ZERO3,
       "  std::vector<torch::Tensor> initial;  // the initial weights, to compare with later\n"
       "  if (zero_stage == 3) {\n"
       "    for (auto& p : model->parameters()) initial.push_back(p.detach().clone());\n" + ZERO3)],
     []),
    # A correct rewrite: another cut, the embedding and the first block as one unit.
    ("zero3-coarser-units", "equivalent", "4", "units of your own: the embedding and the first "
     "block as one unit, the rest as the model lists them (correct: must pass, with its larger "
     "gathered peak)",
     [(ZERO3 + "                    " + OPTIONS3 + ");\n",
       "    auto parts = model->units();\n"
       "    std::vector<torch::Tensor> first = parts[0].module->parameters();\n"
       "    for (auto& p : parts[1].module->parameters()) first.push_back(p);\n"
       "    std::vector<kit::ShardedUnit> units;\n"
       "    units.emplace_back(\"embedding and block 0\", [parts](const torch::Tensor& x) {\n"
       "      return parts[1].run(parts[0].run(x));\n"
       "    }, first);\n"
       "    for (size_t k = 2; k < parts.size(); ++k)\n"
       "      units.emplace_back(\"unit \" + std::to_string(k), parts[k].run, parts[k].module->parameters());\n"
       "    sharded.emplace(model, units, " + OPTIONS3 + ");\n")], []),
    # State: the shards are saved right; the resumed run starts from fresh weights.
    ("resume-loads-nothing", "run", "5", "the sharded checkpoint saved but never loaded: the "
     "resumed run goes on from freshly initialised weights",
     [("resume_sharded(load_shard, ", "resume_sharded([](const std::string&) {}, ")], []),
]

MUTANTS += [
    # The rank in the bytes line: on one node the local rank is the global one; the check's run
    # with one rank per node shows it.
    ("held-local-rank", "run", "1", "the bytes line labelled with the local rank: right on one "
     "node, two ranks called 0 on two",
     [('the formula: %s\\n", rank, name.c_str()', 'the formula: %s\\n", local_rank, name.c_str()')],
     []),
    # Order: the right line in the wrong place.
    ("held-before-training", "run", "1", "the bytes line printed before training (right code, "
     "wrong place): no gradient and no optimizer state exist yet, and the peak is 0",
     [(HELD_BLOCK, ""), (RESUMED, HELD_BLOCK + RESUMED)], ["2", "3", "4"]),
    # Runs that stop, each in the library, blamed on the student's calling line.
    ("save-nothing", "stops", "5", "save_sharded given a function that writes nothing: the "
     "library refuses the checkpoint at the first save",
     [(SAVE, "    checkpoints.save_sharded([](const std::string&) {}, s);\n")], ["2", "3", "4"]),
    ("save-rank0-only", "stops", "5", "the shards saved on rank 0 only (`if (rank == 0)`, as "
     "under DDP): rank 0 waits in the checkpoint's barrier while rank 1 trains on",
     [(SAVE, "    if (rank == 0) checkpoints.save_sharded(save_shard, s);\n")], ["2", "3", "4"]),
    ("resume-wrong-folder", "run", "5", "each rank reads its shard back from the run's folder, "
     "not the checkpoint's: the resumed run stops with the library's refusal",
     [(RESUME, "    return checkpoints.resume_sharded([&](const std::string&) { load_shard(args.out_dir "
               "+ \"/zero\"); }, device, args.resume);\n")], []),
    ("zero3-options-stage-2", "stops", "4", "FullyShardedModel made with ZeroOptions stage 2: it "
     "refuses, and the check names TODO 4's line, not zero3.cpp",
     [(OPTIONS3, OPTIONS3.replace(".stage = 3,", ".stage = 2,"))], []),
    # Outside the TODOs: every TODO passes, the closing row names the line.
    ("final-save0-under-zero3", "diverges", "-", "the final model saved with save0 of the model "
     "under ZeRO-3 too, not of the sharded model: the model's own weights are empty there, the "
     "file holds none of them",
     [(FINAL, '    kit::save0(model, args.out_dir + "/model-final.pt");\n')],
     ["model-final.pt", "empty"]),
    ("train-loss-sum", "diverges", "-", "the epoch's train loss all-reduced with SUM: the given "
     "DDP run already differs from the solution's; no ZeRO TODO is blamed for it",
     [("kit::all_reduce(mean, kit::ReduceOp::AVG);", "kit::all_reduce(mean, kit::ReduceOp::SUM);")],
     ["train loss"]),
    # Correct rewrites.
    ("save-own-lambda", "equivalent", "5", "the shard's save written as a lambda of its own at "
     "the call (correct: must pass)",
     [(SAVE, "    checkpoints.save_sharded([&](const std::string& dir) {\n"
             "      if (flat) kit::save_zero_checkpoint(dir, *flat, *adamw_shard, zero_stage);\n"
             "      else kit::save_zero_checkpoint(dir, *sharded);\n    }, s);\n")], []),
]
