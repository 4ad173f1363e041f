"""Exercise 04's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds). Written from the TODO text before the check's rules (common/tools/rules/
ex04.py), one class at a time: a flag the TODO must honour, the wrong group for a collective
(tp's all-reduce on the world, DDP on the world), the wrong coordinate, a part done in one place
of two, a run that stops in the library with the trainer's line; and correct rewrites that must
pass."""
EXERCISE = "04-transformer-lm-tp"

MESH = "  kit::Mesh mesh({.tp = tp, .cp = cp, .order = order});\n"
DESCRIBE = '  std::printf("%s\\n", mesh.describe().c_str());'
TRAIN_SAMPLER = ("  kit::DistributedSampler train_sampler(train_data.size(), /*shuffle=*/true, args.seed,\n"
                 "                                        mesh.dp_size(), mesh.dp_rank());\n")
VAL_SAMPLER = "  kit::DistributedEvalSampler val_sampler(val_data.size(), mesh.dp_size(), mesh.dp_rank());\n"
TEST_SAMPLER = "  kit::DistributedEvalSampler test_sampler(test_data.size(), mesh.dp_size(), mesh.dp_rank());\n"
LINEAR1 = "kit::ColumnParallelLinear(linear1, mesh.tp())"
LINEAR2 = "kit::RowParallelLinear(linear2, mesh.tp())"
QKV = ("kit::ColumnParallelLinear(full->in_proj_weight, full->in_proj_bias,\n"
       "                                                    mesh.tp(), {.stacked = 3})")
OUT = "kit::RowParallelLinear(full->out_proj, mesh.tp())"
DDP = "  kit::DistributedDataParallel ddp(model, {.group = &mesh.dp_cp()});"
TRAIN_MEAN = "  kit::all_reduce(mean, kit::ReduceOp::AVG, mesh.dp_cp());"
EVAL_SUM = "  kit::all_reduce(totals, kit::ReduceOp::SUM, mesh.dp_cp());"
TRAIN_CP = ("    input = kit::cp_shard(input, 1, mesh);    // [batch, seq] -> [batch, seq / cp]: this rank's part\n"
            "    target = kit::cp_shard(target, 1, mesh);  // the same positions of the targets\n")
EVAL_CP = ("    input = kit::cp_shard(input, 1, mesh);\n"
           "    target = kit::cp_shard(target, 1, mesh);\n")
RESUME = ("  kit::TrainState state = checkpoints.resume_sharded(\n"
          "      [&](const std::string& dir) { kit::load_tp_checkpoint(dir, model, optimizer); }, device,\n"
          "      args.resume);\n")
SAVE = ("    checkpoints.save_sharded(\n"
        "        [&](const std::string& dir) { kit::save_tp_checkpoint(dir, model, optimizer); }, s);\n")

# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    # TODO 1: a flag the TODO must honour; a line the TODO wants on every rank.
    ("mesh-order-ignored", "run", "1", "the mesh made without .order: --order is ignored, every "
     "run is laid out tp-cp-dp",
     [(MESH, "  kit::Mesh mesh({.tp = tp, .cp = cp});\n")], []),
    ("mesh-print0", "run", "1", "the mesh's line printed with print0: only rank 0 says where it "
     "sits", [(DESCRIBE, '  kit::print0("%s\\n", mesh.describe().c_str());')], []),
    # TODO 2: the wrong coordinate; one sampler of three left on the world.
    ("sampler-tp-rank", "run", "2", "the samplers split by the tp coordinate (mesh.tp_size(), "
     "mesh.tp_rank()): the ranks of one tp group read different batches",
     [(TRAIN_SAMPLER, TRAIN_SAMPLER.replace("mesh.dp_size(), mesh.dp_rank()",
                                            "mesh.tp_size(), mesh.tp_rank()"))], []),
    ("eval-samplers-world", "run", "2", "only the training sampler follows the dp rank; the "
     "validation and test samplers still split the data over every rank",
     [(VAL_SAMPLER, "  kit::DistributedEvalSampler val_sampler(val_data);\n"),
      (TEST_SAMPLER, "  kit::DistributedEvalSampler test_sampler(test_data);\n")], []),
    # TODO 3: tp's all-reduce on the world; on the dp group; the two layers on different groups.
    ("mlp-world", "run", "3", "the MLP split over the world (kit::default_group()), not the tp "
     "group: right at tp 2 on 2 ranks, a split over every rank with dp 2",
     [(LINEAR1, "kit::ColumnParallelLinear(linear1, kit::default_group())"),
      (LINEAR2, "kit::RowParallelLinear(linear2, kit::default_group())")], []),
    ("mlp-dp-group", "run", "3", "the MLP split over mesh.dp(): the ranks of other data hold the "
     "slices, the ranks of one tp group the whole layer",
     [(LINEAR1, "kit::ColumnParallelLinear(linear1, mesh.dp())"),
      (LINEAR2, "kit::RowParallelLinear(linear2, mesh.dp())")], []),
    ("mlp-linear2-whole", "stops", "3", "linear2 left whole (mesh.alone()) while linear1 is split: "
     "the library refuses the pair, naming TODO 3's line",
     [(LINEAR2, "kit::RowParallelLinear(linear2, mesh.alone())")], ["4", "5", "6", "8"]),
    # TODO 4: q, k and v split as one block; the heads split over the world.
    ("qkv-not-stacked", "stops", "4", "q, k and v split without .stacked = 3: rank 0 would hold "
     "all of q and part of k; the library refuses, naming TODO 4's line",
     [(QKV, "kit::ColumnParallelLinear(full->in_proj_weight, full->in_proj_bias,\n"
            "                                                    mesh.tp())")], ["3", "5", "6", "8"]),
    ("attention-world", "run", "4", "the heads split over the world (kit::default_group()): every "
     "rank a share of the heads at dp 2 x tp 2, and the all-reduces on the world",
     [(QKV, QKV.replace("mesh.tp(), {", "kit::default_group(), {")),
      (OUT, "kit::RowParallelLinear(full->out_proj, kit::default_group())")], []),
    # TODO 5: DDP on the world (the shipped line), on the dp group only, on the tp group.
    ("ddp-world", "run", "5", "DDP on the world: it averages different slices together and, at "
     "construction, gives every rank rank 0's slices",
     [(DDP, "  kit::DistributedDataParallel ddp(model);")], []),
    ("ddp-dp-only", "run", "5", "DDP on mesh.dp(): the cp ranks' gradients are never averaged, "
     "so at cp 2 their weights part after the first step",
     [(DDP, "  kit::DistributedDataParallel ddp(model, {.group = &mesh.dp()});")], []),
    ("ddp-tp-group", "run", "5", "DDP on mesh.tp(): the ranks that hold different slices",
     [(DDP, "  kit::DistributedDataParallel ddp(model, {.group = &mesh.tp()});")], []),
    # TODO 6: over the world (the right number by luck, every rank waits); over dp only.
    ("loss-world", "run", "6", "the training mean averaged over the world: the tp copies of each "
     "loss counted again", [(TRAIN_MEAN, "  kit::all_reduce(mean, kit::ReduceOp::AVG);")], []),
    ("loss-dp-only", "run", "6", "the training mean averaged over mesh.dp(): at cp 2 each rank "
     "reports the loss of its part of the sequences",
     [(TRAIN_MEAN, TRAIN_MEAN.replace("mesh.dp_cp()", "mesh.dp()"))], []),
    ("eval-sum-world", "run", "6", "the evaluation's sums added up over the world: one place of "
     "two", [(EVAL_SUM, "  kit::all_reduce(totals, kit::ReduceOp::SUM);")], []),
    # TODO 7: one place of two; the targets forgotten; the wrong dimension.
    ("cp-eval-whole", "run", "7", "the evaluation's sequences not split over cp: the model gets "
     "whole sequences where it expects this rank's part", [(EVAL_CP, "")], []),
    ("cp-targets-whole", "run", "7", "the training inputs split over cp, the targets not",
     [(TRAIN_CP, TRAIN_CP.split("\n")[0] + "\n")], []),
    ("cp-batch-dim", "run", "7", "cp_shard along dimension 0, the batch, instead of 1, the "
     "sequence", [(TRAIN_CP, TRAIN_CP.replace("cp_shard(input, 1,", "cp_shard(input, 0,")
                  .replace("cp_shard(target, 1,", "cp_shard(target, 0,"))], []),
    # TODO 8: saved right, resumed as under DDP; a resume that loads nothing.
    ("resume-whole-model", "run", "8", "every rank saves its shard, but the resume is exercise "
     "01's (rank 0's whole model): the library refuses the checkpoint",
     [(RESUME, "  kit::TrainState state = checkpoints.resume(model, optimizer, device, args.resume);\n")],
     []),
    ("resume-loads-nothing", "run", "8", "the shards saved, never loaded: the resumed run goes on "
     "from fresh weights",
     [(RESUME, RESUME.replace("{ kit::load_tp_checkpoint(dir, model, optimizer); }",
                              "{ (void)dir; }"))], []),
    # TODO 9.
    ("no-destroy", "run", "9", "destroy_process_group() dropped",
     [("  kit::destroy_process_group();\n", "")], []),
    # Correct rewrites: the check must pass them.
    ("mesh-options-by-field", "equivalent", "1", "MeshOptions filled field by field",
     [(MESH, "  kit::MeshOptions mesh_options;\n  mesh_options.tp = tp;\n  mesh_options.cp = cp;\n"
             "  mesh_options.order = order;\n  kit::Mesh mesh(mesh_options);\n")], []),
    ("ddp-group-by-name", "equivalent", "5", "DDP's group asked for by its directions' names, "
     "cp before dp", [(DDP, '  kit::DistributedDataParallel ddp(model, {.group = &mesh.group("cp-dp")});')],
     []),
    ("loss-on-tp-rank0", "equivalent", "6", "the training mean averaged by the first rank of "
     "each tp group only (the others' copy goes unused): every member of each dp x cp group calls "
     "it, so no rank waits",
     [(TRAIN_MEAN, "  if (mesh.tp_rank() == 0) kit::all_reduce(mean, kit::ReduceOp::AVG, mesh.dp_cp());")],
     []),
]
