// ddprun's rendezvous port (see ddprun.h): a free one picked, or the one given checked, before
// any rank starts.
//
// Apart from the rest because it is the one part that talks to the network stack, and its
// reasoning (why bind and close, why SO_REUSEADDR, the window it leaves) is its own.
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "ddprun.h"

namespace ddprun {

// Rank 0's TCPStore will listen on MASTER_ADDR:MASTER_PORT. With port 0 we ask the kernel for
// a free port by binding to port 0 and reading back what it chose, then close the socket so
// rank 0 can take it. (There is a small window in which another program could grab the same
// port; torchrun --standalone has the same window. It is rare enough to accept.)
//
// An explicit port is checked the same way: if we cannot bind it, the TCPStore will not be able
// to either, and it is far kinder to say so now than to let every rank time out in 30 minutes.
// SO_REUSEADDR keeps a port whose old connections linger in TIME_WAIT from being reported as
// busy, while a port somebody is listening on is still refused.

namespace {

enum class BindResult { kOk, kInUse, kNotLocal, kBadAddress };

BindResult try_bind(const std::string& addr, int port, int* bound_port, std::string* detail) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  int rc = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc != 0) {
    *detail = ::gai_strerror(rc);
    return BindResult::kBadAddress;
  }
  // A name such as "localhost" may stand for several addresses (::1 and 127.0.0.1). The port
  // counts as in use if it is taken on any of them; a free port is taken from the first one.
  BindResult result = BindResult::kNotLocal;
  *detail = "no usable address";
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      int got = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      ::close(fd);
      if (result != BindResult::kInUse) {
        result = BindResult::kOk;
        *bound_port = got;
      }
      if (port == 0) break;  // picking: the first address that works is enough
    } else {
      int err = errno;
      ::close(fd);
      if (err == EADDRINUSE) {
        result = BindResult::kInUse;
      } else if (result != BindResult::kOk && result != BindResult::kInUse) {
        *detail = std::strerror(err);
      }
    }
  }
  ::freeaddrinfo(list);
  return result;
}

}  // namespace

int choose_port(const Options& opt) {
  int port = 0;
  std::string detail;
  switch (try_bind(opt.master_addr, opt.master_port, &port, &detail)) {
    case BindResult::kOk:
      return port;
    case BindResult::kInUse:
      fail_usage("MASTER_PORT " + std::to_string(opt.master_port) + " on " + opt.master_addr +
                 " is in use by another program; choose another --master-port or leave it out "
                 "to get a free one");
    case BindResult::kBadAddress:
      fail_usage("cannot resolve --master-addr '" + opt.master_addr + "': " + detail);
    case BindResult::kNotLocal:
      break;
  }
  fail_usage("cannot listen on --master-addr '" + opt.master_addr + "' (" + detail +
             "); ddprun starts every rank on this machine, so use one of its own addresses");
}

}  // namespace ddprun
