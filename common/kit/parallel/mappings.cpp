// kit/parallel/mappings.cpp — the communicating autograd operators (see mappings.h).
//
// Each operator is a torch::autograd::Function: forward() runs with autograd off and says what to
// keep in ctx, backward() gets the gradient of forward's output and returns one per input of
// forward (undefined for the group and the call site, which have none).
#include "kit/parallel/mappings.h"

#include <stdexcept>
#include <string>

#include <torch/torch.h>

namespace kit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group, the trainer's line and the dimension, kept in ctx for backward.
struct Comm : torch::CustomClassHolder {
  Comm(ProcessGroup* g, CallSite s, int64_t d) : group(g), site(s), dim(d) {}
  ProcessGroup* group;
  CallSite site;
  int64_t dim;
};

void keep(AutogradContext* ctx, ProcessGroup* group, const CallSite& site, int64_t dim = 0) {
  ctx->saved_data["comm"] = c10::IValue::make_capsule(c10::make_intrusive<Comm>(group, site, dim));
}
const Comm& kept(AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<Comm>(ctx->saved_data["comm"].toCapsule());
}

// The collectives on plain tensors. A group of one: nothing to send.
torch::Tensor summed(const torch::Tensor& x, ProcessGroup& group, const CallSite& site) {
  if (group.size() == 1) return x;
  torch::Tensor out = x.clone(at::MemoryFormat::Contiguous);  // the caller's tensor stays as it was
  group.all_reduce(out, ReduceOp::SUM, site);
  return out;
}

// The group's parts of x, each x.size(dim), back to back along dim in group-rank order.
torch::Tensor gathered(const torch::Tensor& x, int64_t dim, ProcessGroup& group, const CallSite& site) {
  const int n = group.size();
  if (n == 1) return x;
  const torch::Tensor part = x.contiguous();
  auto flat = torch::empty({n * part.numel()}, part.options());
  group.all_gather(flat, part, site);
  // [n, *x.shape] -> the n parts side by side along dim.
  std::vector<int64_t> shape = part.sizes().vec();
  std::vector<int64_t> stacked = shape;
  stacked.insert(stacked.begin(), n);
  shape[dim] *= n;
  return flat.view(stacked).movedim(0, dim).reshape(shape);
}

// Part r (of n along dim) of the sum over the ranks of x, on group rank r.
torch::Tensor scattered(const torch::Tensor& x, int64_t dim, ProcessGroup& group, const CallSite& site) {
  const int n = group.size();
  if (n == 1) return x;
  std::vector<int64_t> parts = x.sizes().vec();  // [.., n, size / n, ..]: the parts split apart
  const int64_t part = parts[dim] / n;
  parts[dim] = part;
  std::vector<int64_t> out_shape = parts;
  parts.insert(parts.begin() + dim, n);
  auto input = x.reshape(parts).movedim(dim, 0).contiguous();  // part r at row r
  auto out = torch::empty({input.numel() / n}, x.options().memory_format(at::MemoryFormat::Contiguous));
  group.reduce_scatter(out, input.view({-1}), ReduceOp::SUM, site);  // flat: chunk r to rank r
  return out.view(out_shape);
}

// This rank's part of the last dimension.
torch::Tensor own_slice(const torch::Tensor& x, ProcessGroup& group) {
  const int n = group.size();
  if (n == 1) return x;
  const int64_t part = x.size(-1) / n;
  return x.narrow(-1, group.rank() * part, part).contiguous();
}

// `dim` counted from the front; refused (one line naming the call) outside the tensor's dimensions.
int64_t checked_dim(const torch::Tensor& x, int64_t dim, const char* what, const CallSite& site) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  if (d < 0 || d >= x.dim())
    throw std::invalid_argument(std::string("kit::") + what + " (" + site.str() + "): dimension " +
                                std::to_string(dim) + " of a tensor of " +
                                std::to_string(x.dim()) + " dimensions");
  return d;
}

// The same, and x's size along it must divide by the group's size.
int64_t check_divides(const torch::Tensor& x, int64_t dim, ProcessGroup& group, const char* what,
                      const CallSite& site) {
  const int64_t d = checked_dim(x, dim, what, site);
  if (x.size(d) % group.size() != 0)
    throw std::invalid_argument(std::string("kit::") + what + " (" + site.str() + "): size " +
                                std::to_string(x.size(d)) + " along dimension " +
                                std::to_string(dim) + " does not divide by the group's " +
                                std::to_string(group.size()) + " ranks");
  return d;
}

struct CopyTo : torch::autograd::Function<CopyTo> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, ProcessGroup* g, CallSite site) {
    keep(ctx, g, site);
    return x;  // identity (autograd makes the output a view of x)
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const Comm& c = kept(ctx);
    return {summed(grad[0], *c.group, c.site), {}, {}};
  }
};

struct ReduceFrom : torch::autograd::Function<ReduceFrom> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, ProcessGroup* g, CallSite site) {
    return summed(x, *g, site);
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], {}, {}}; }
};

struct GatherFrom : torch::autograd::Function<GatherFrom> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, ProcessGroup* g, CallSite site) {
    keep(ctx, g, site);
    return gathered(x, x.dim() - 1, *g, site);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {own_slice(grad[0], *kept(ctx).group), {}, {}};
  }
};

struct ScatterTo : torch::autograd::Function<ScatterTo> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, ProcessGroup* g, CallSite site) {
    keep(ctx, g, site);
    return own_slice(x, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const Comm& c = kept(ctx);
    return {gathered(grad[0], grad[0].dim() - 1, *c.group, c.site), {}, {}};
  }
};

struct AllGatherAlong : torch::autograd::Function<AllGatherAlong> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, int64_t dim, ProcessGroup* g,
                               CallSite site) {
    keep(ctx, g, site, dim);
    return gathered(x, dim, *g, site);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const Comm& c = kept(ctx);
    return {scattered(grad[0], c.dim, *c.group, c.site), {}, {}, {}};
  }
};

struct ReduceScatterAlong : torch::autograd::Function<ReduceScatterAlong> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, int64_t dim, ProcessGroup* g,
                               CallSite site) {
    keep(ctx, g, site, dim);
    return scattered(x, dim, *g, site);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const Comm& c = kept(ctx);
    return {gathered(grad[0], c.dim, *c.group, c.site), {}, {}, {}};
  }
};

}  // namespace

torch::Tensor copy_to(const torch::Tensor& x, ProcessGroup& group, CallSite site) {
  group.require_member("copy_to", &site);
  return CopyTo::apply(x, &group, site);
}

torch::Tensor reduce_from(const torch::Tensor& x, ProcessGroup& group, CallSite site) {
  group.require_member("reduce_from", &site);
  return ReduceFrom::apply(x, &group, site);
}

torch::Tensor gather_from(const torch::Tensor& x, ProcessGroup& group, CallSite site) {
  group.require_member("gather_from", &site);
  return GatherFrom::apply(x, &group, site);
}

torch::Tensor scatter_to(const torch::Tensor& x, ProcessGroup& group, CallSite site) {
  group.require_member("scatter_to", &site);
  check_divides(x, -1, group, "scatter_to", site);
  return ScatterTo::apply(x, &group, site);
}

torch::Tensor all_gather_along(const torch::Tensor& x, int64_t dim, ProcessGroup& group, CallSite site) {
  group.require_member("all_gather_along", &site);
  return AllGatherAlong::apply(x, checked_dim(x, dim, "all_gather_along", site), &group, site);
}

torch::Tensor reduce_scatter_along(const torch::Tensor& x, int64_t dim, ProcessGroup& group,
                                   CallSite site) {
  group.require_member("reduce_scatter_along", &site);
  return ReduceScatterAlong::apply(x, check_divides(x, dim, group, "reduce_scatter_along", site),
                                   &group, site);
}

}  // namespace kit
