// ddprun's forwarding of the ranks' output (see ddprun.h): read from each rank's pipes, written
// on in whole lines (tagged "[rank N] " with --prefix-ranks) to ddprun's stdout/stderr and the
// rank's log file, drained without waiting for an EOF that may never come.
//
// Apart from the supervision because it never decides anything about the ranks: whatever goes
// wrong here (a closed stdout, a full disk) must leave the job running.
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <string>

#include "ddprun.h"

namespace ddprun {
namespace {

constexpr size_t kMaxLine = 64 * 1024;  // longer "lines" are forwarded in pieces

// write() until everything is out. Returns false when the destination is gone (e.g. EPIPE
// because `ddprun ... | head` closed its end); the caller then stops writing there but keeps
// supervising, because the ranks must not be abandoned just because nobody reads the output.
bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      // Somebody made our stdout non-blocking: wait for room instead of spinning.
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

// Forward one complete line. It goes out in a single write(), so lines of different ranks
// never mix inside a line (a write to a pipe or terminal of a few KiB is not split).
void Launcher::emit_line(Rank& r, Stream& s, const char* data, size_t size, bool add_newline) {
  if (!dest_broken_[s.dest]) {
    std::string line;
    if (opt_.tag_output) line = "[rank " + std::to_string(r.rank) + "] ";
    line.append(data, size);
    if (add_newline) line.push_back('\n');
    if (!write_all(s.dest, line.data(), line.size())) dest_broken_[s.dest] = true;
  }
  if (r.log_fd >= 0) {
    std::string line(data, size);  // the log is per rank already: no tag needed
    if (add_newline) line.push_back('\n');
    if (!write_all(r.log_fd, line.data(), line.size())) {
      ::close(r.log_fd);  // disk full: keep the job going, lose the log
      r.log_fd = -1;
    }
  }
}

void Launcher::read_stream(Rank& r, Stream& s) {
  char buf[65536];
  ssize_t n;
  do n = ::read(s.fd, buf, sizeof buf);
  while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN) return;
  if (n <= 0) {
    // EOF (or a read error): send what is left as a last line, so the next rank's line does
    // not continue it on the same terminal line.
    if (!s.pending.empty()) emit_line(r, s, s.pending.data(), s.pending.size(), true);
    s.pending.clear();
    ::close(s.fd);
    s.fd = -1;
    return;
  }
  s.pending.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1)
    emit_line(r, s, s.pending.data() + start, nl + 1 - start, false);
  s.pending.erase(0, start);
  // A rank writing megabytes without a newline (a progress bar with \r) must not make us
  // hold megabytes: forward it in pieces.
  if (s.pending.size() >= kMaxLine) {
    emit_line(r, s, s.pending.data(), s.pending.size(), true);
    s.pending.clear();
  }
}

// After a rank has exited, everything it wrote is already in the pipe: read it out and close.
// We do not wait for EOF, because a process the rank started in the background may hold the
// pipe open for hours; waiting for it would be exactly the hang this tool must never have.
// The number of reads is bounded for the same reason (that process may still be writing).
void Launcher::drain(Rank& r) {
  for (Stream* s : {&r.out, &r.err}) {
    for (int reads = 0; s->fd >= 0 && reads < 64; ++reads) {
      pollfd p{s->fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;  // nothing more right now
      read_stream(r, *s);
    }
    if (s->fd >= 0) {
      if (!s->pending.empty()) emit_line(r, *s, s->pending.data(), s->pending.size(), true);
      s->pending.clear();
      ::close(s->fd);
      s->fd = -1;
    }
  }
}

}  // namespace ddprun
