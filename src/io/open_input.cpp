#include "io/open_input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

std::string errno_message(int error) { return std::generic_category().message(error); }

// What a file that is not a regular one is, for the message.
std::string_view file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void cannot_open(const std::filesystem::path& file, InputKind kind,
                              std::string_view reason) {
  // Data files and checkpoints are named by the key or flag that gave them; a config by itself.
  throw InputError(fmt::format("{}: cannot open{}: {}", file.string(),
                               kind == InputKind::config ? " config file" : "", reason));
}

[[noreturn]] void not_regular(const std::filesystem::path& file, InputKind kind, mode_t mode) {
  cannot_open(file, kind, fmt::format("it is {}, expected a regular file", file_type(mode)));
}

std::uint64_t size_cap(InputKind kind) {
  return kind == InputKind::config ? kMaxConfigBytes : UINT64_MAX;
}

}  // namespace

std::string_view to_string(InputKind kind) {
  switch (kind) {
    case InputKind::config: return "config";
    case InputKind::data: return "data";
    case InputKind::checkpoint: return "checkpoint";
  }
  return "input";
}

InputFd::~InputFd() {
  if (fd_ >= 0) ::close(fd_);
}

InputFd::InputFd(InputFd&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

int InputFd::release() noexcept { return std::exchange(fd_, -1); }

InputFd open_input(const std::filesystem::path& file, InputKind kind) {
  InputFd in(::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC), 0);
  if (in.get() < 0) {
    const int error = errno;
    // A socket cannot be opened at all (ENXIO): say what it is rather than errno's text.
    struct ::stat st {};
    if (::stat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) not_regular(file, kind, st.st_mode);
    cannot_open(file, kind, errno_message(error));
  }
  struct ::stat st {};
  if (::fstat(in.get(), &st) != 0) cannot_open(file, kind, errno_message(errno));
  if (!S_ISREG(st.st_mode)) not_regular(file, kind, st.st_mode);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > size_cap(kind))
    throw InputError(fmt::format("{}: {} file of {} bytes: expected at most {}", file.string(),
                                 to_string(kind), size, size_cap(kind)));
  // Regular files ignore O_NONBLOCK, but what reads the descriptor should not have to know.
  const int flags = ::fcntl(in.get(), F_GETFL);
  if (flags < 0 || ::fcntl(in.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
    cannot_open(file, kind, errno_message(errno));
  return InputFd(in.release(), size);
}

std::string read_input(const std::filesystem::path& file, InputKind kind) {
  const InputFd in = open_input(file, kind);
  std::string bytes(in.size(), '\0');
  std::size_t done = 0;
  // The size fstat saw: a file that grows meanwhile is read as it was; one that shrinks ends early.
  while (done < bytes.size()) {
    const ::ssize_t n = ::read(in.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw InputError(fmt::format("{}: cannot read {} file: {}", file.string(), to_string(kind),
                                   errno_message(errno)));
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

}  // namespace lockstep::detail
