"""Exercise 05's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds). Written from the TODO text before the check's rules (common/tools/rules/
ex05.py), one class at a time: a flag the TODO must honour, the wrong stage or group, a message
that never arrives (a blocking send facing a blocking send, a send dropped, the wrong tag), a part
done in one place of two, the schedule ignored; and correct rewrites that must pass."""
EXERCISE = "05-transformer-lm-pp"

MESH = "  kit::Mesh mesh({.pp = pp});\n"
DESCRIBE = '  std::printf("%s\\n", mesh.describe().c_str());'
CHUNKS = "  auto chunks = kit::pp::take_chunks(model, mesh.pp_size(), v, mesh.pp_rank());\n"
RECV_X = "        kit::recv(x, p.rank_of(a.chunk - 1), p.mesh.pp(), p.tag('F', a.chunk - 1, a.micro));\n"
NEEDS_GRAD = "        x.requires_grad_(train);\n"
SEND_Y = ("        sends.push_back(kit::isend(sent.back(), p.rank_of(a.chunk + 1), p.mesh.pp(),\n"
          "                                   p.tag('F', a.chunk, a.micro)));\n")
SEND_DX = ("      if (!c.first) {\n"
           "        sent.push_back(x.grad());\n"
           "        sends.push_back(kit::isend(sent.back(), p.rank_of(a.chunk - 1), p.mesh.pp(),\n"
           "                                   p.tag('B', a.chunk, a.micro)));\n"
           "      }\n")
SPLIT = ("  const std::vector<torch::Tensor> inputs = input.tensor_split(p.shape.micro, 0);\n"
         "  const std::vector<torch::Tensor> targets = target.tensor_split(p.shape.micro, 0);\n")
ORDER = "  const std::vector<kit::pp::Action>& order = p.schedule;\n"
BROADCAST = "  kit::broadcast(sum, p.last_rank(), p.mesh.pp());\n"
AVERAGE = "    average_gradients(p.chunks, p.mesh.dp());  // the replicas of this stage\n"

# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    # TODO 1: the flag honoured in the wrong direction; a line the TODO wants on every rank.
    ("mesh-pp-as-tp", "run", "1", "the mesh made with .tp = pp: the ranks split each block "
     "instead of the model's depth, and the mesh has no pp (the pipeline's group is the rank "
     "alone: the runs stop, and nothing after TODO 1 is judged)",
     [(MESH, "  kit::Mesh mesh({.tp = pp});\n")], []),
    ("mesh-print0", "run", "1", "the mesh's line printed with print0: only rank 0 says where it "
     "sits", [(DESCRIBE, '  kit::print0("%s\\n", mesh.describe().c_str());')], []),
    # TODO 2: every rank the first stage; the chunks per rank ignored.
    ("chunks-stage-0", "stops", "2", "every rank keeps stage 0's blocks (take_chunks with stage "
     "0): the last stage has no output layer, and its schedule names chunks it does not hold",
     [(CHUNKS, CHUNKS.replace("mesh.pp_rank())", "0)"))], ["3", "4", "5", "6", "7", "8"]),
    ("chunks-v-ignored", "run", "2", "take_chunks with one chunk per rank whatever --chunks says: "
     "the interleaved run's ranks hold half the chunks its schedule runs",
     [(CHUNKS, CHUNKS.replace(", v, ", ", 1, "))], []),
    # TODO 3: a blocking send; the received input without a gradient; the wrong tag.
    ("send-blocking", "stops", "3", "the activation sent with the blocking kit::send: in the "
     "interleaved schedule two ranks each wait in a send for the other's receive",
     [(SEND_Y, "        kit::send(sent.back(), p.rank_of(a.chunk + 1), p.mesh.pp(),\n"
               "                  p.tag('F', a.chunk, a.micro));\n")], ["4", "5", "7", "8"]),
    ("recv-no-grad", "stops", "3", "the received input left without requires_grad_: its "
     "backward has no gradient to send back",
     [(NEEDS_GRAD, "")], ["4", "5", "6", "7", "8"]),
    ("recv-own-tag", "stops", "3", "the receive asks for the tag of this chunk's own output "
     "(a.chunk, not a.chunk - 1): the message it waits for is never sent",
     [(RECV_X, RECV_X.replace("p.tag('F', a.chunk - 1, a.micro)", "p.tag('F', a.chunk, a.micro)"))],
     ["4", "5", "6", "7", "8"]),
    # TODO 5: the gradient never sent back; the gradient received sent on instead of the input's.
    ("grad-not-sent", "stops", "5", "the input's gradient never sent back: the stage before waits "
     "for it forever", [(SEND_DX, "")], ["6", "7", "8"]),
    ("grad-sent-is-received", "run", "5", "the gradient received from the next stage sent back "
     "as it came (same shape), not the input's gradient after the backward",
     [(SEND_DX, SEND_DX.replace("sent.push_back(x.grad());", "sent.push_back(grad.defined() ? grad : x.grad());"))],
     []),
    # TODO 7: the targets not cut; the pieces of a size instead of a number.
    ("micro-targets-whole", "stops", "7", "the inputs cut into micro-batches, the targets not",
     [(SPLIT, SPLIT.split("\n")[0] + "\n  const std::vector<torch::Tensor> targets = {target};\n")],
     ["8", "9"]),
    ("micro-split-by-size", "stops", "7", "torch::split(micro): pieces of --micro-batches rows "
     "each, not --micro-batches pieces",
     [(SPLIT, SPLIT.replace("tensor_split(p.shape.micro, 0)", "split(p.shape.micro, 0)"))],
     ["8", "9"]),
    # TODO 4: the loss never leaves the last stage; broadcast from the first.
    ("loss-not-broadcast", "run", "4", "the loss stays on the last stage: rank 0, which prints, "
     "reports 0", [(BROADCAST, "")], []),
    ("loss-broadcast-world", "run", "4", "the loss broadcast over the world: at pp 2 x dp 2 every "
     "replica reports the first replica's loss",
     [(BROADCAST, "  kit::broadcast(sum, p.last_rank());\n")], []),
    # TODO 8: the schedule's kind ignored.
    ("order-always-1f1b", "run", "8", "the order made here as 1F1B whatever --schedule says",
     [(ORDER, "  const std::vector<kit::pp::Action> order =\n"
              "      kit::pp::actions(kit::pp::Schedule::k1F1B, {.pp = p.shape.pp, .v = 1, .micro = p.shape.micro},\n"
              "                       p.mesh.pp_rank());\n")], []),
    # TODO 6: the gradients never averaged; averaged over the pipeline.
    ("dp-no-average", "run", "6", "the gradients not averaged: at pp 2 x dp 2 the replicas of a "
     "stage part after the first step", [(AVERAGE, "")], []),
    ("dp-over-pp", "stops", "6", "the gradients averaged over mesh.pp(): the stages of one "
     "pipeline hold different blocks (and numbers of gradients)",
     [(AVERAGE, "    average_gradients(p.chunks, p.mesh.pp());\n")], []),
    # TODO 9.
    ("no-destroy", "run", "9", "destroy_process_group() dropped",
     [("  kit::destroy_process_group();\n", "")], []),
    # Correct rewrites: the check must pass them.
    ("mesh-options-by-field", "equivalent", "1", "MeshOptions filled field by field",
     [(MESH, "  kit::MeshOptions mesh_options;\n  mesh_options.pp = pp;\n  kit::Mesh mesh(mesh_options);\n")], []),
    ("micro-default-dim", "equivalent", "7", "tensor_split without its dimension (0 is the "
     "default)", [(SPLIT, SPLIT.replace("tensor_split(p.shape.micro, 0)", "tensor_split(p.shape.micro)"))], []),
    ("order-copied", "equivalent", "8", "the schedule's list copied into the loop's own vector",
     [(ORDER, "  const std::vector<kit::pp::Action> order(p.schedule.begin(), p.schedule.end());\n")], []),
]
