// gloo/kit_declarations.h — the few names of Gloo that c10d's ProcessGroupGloo.hpp mentions,
// declared by the kit so that the kit builds where Gloo's own headers are missing.
//
// Why this is enough. LibTorch has Gloo compiled inside it (libtorch_cpu.so), but the pip wheel
// and most site modules ship no Gloo headers, and a login node cannot install Debian's
// libgloo-dev. The kit needs only four things from ProcessGroupGloo: Options::create(), the
// device factory functions, the constructor and the Backend interface. All of them are compiled
// inside libtorch; in the kit, Gloo objects travel only behind std::shared_ptr / unique_ptr, whose
// size does not depend on the pointee. So c10d's header must *parse*, and nothing more:
//   * transport::Device and transport::UnboundBuffer are only pointed to: a forward declaration
//     is all the header needs;
//   * Context is pointed to as well, and since LibTorch 2.14 one inline function of the header
//     (ProcessGroupGloo::setTimeout, which the kit does not call) calls Context::setTimeout():
//     the class is declared with that one member function. Its size and its other members are
//     not declared, since nothing in the kit creates, copies or destroys a Context;
//   * rendezvous::Store is the base class of c10d's GlooStore, which the header defines inline:
//     it needs a complete class with the virtual functions GlooStore overrides. The kit never
//     makes a GlooStore (ProcessGroupGloo's constructor, inside libtorch, does, with libtorch's
//     own Gloo), so no vtable or code of this class is ever emitted into the kit.
// GLOO_STORE_HAS_STORE_V2 stays undefined: c10d then leaves out the overrides of Gloo's newer
// store calls, which, again, only libtorch's own copy of GlooStore uses.
//
// Used when no Gloo headers are given (common/CMakeLists.txt says which in its configure line);
// -DKIT_GLOO_INCLUDE_DIR=<dir with gloo/algorithm.h> takes real ones instead. A future c10d that
// used a Gloo type by value would fail to compile here, naming the type: then add it, or point
// KIT_GLOO_INCLUDE_DIR at the Gloo of that torch's revision (pytorch/third_party/gloo).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo {

// Gloo's communication context (rank, size, the connections). Only what c10d's header calls.
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport

namespace rendezvous {

// The key-value store Gloo's rendezvous runs on: the calls c10d's GlooStore overrides.
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
};

}  // namespace rendezvous
}  // namespace gloo
