#include "io/dir_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <string>
#include <system_error>

#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

// The pid the holder wrote, or "unknown" (it may not have written it yet).
std::string holder_of(int fd) {
  char text[32] = {};
  const ::ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string pid(text, n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid.empty() ? "unknown" : pid;
}

[[noreturn]] void fail_system(const std::filesystem::path& file, std::string_view doing) {
  throw std::system_error(errno, std::generic_category(),
                          fmt::format("{}: cannot {}", file.string(), doing));
}

}  // namespace

DirLock::DirLock(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / kLockFileName;
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_system(file, "create the checkpoint directory's lock file");
  int locked = -1;
  do {
    locked = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (locked != 0 && errno == EINTR);
  if (locked != 0) {
    const int error = errno;
    const std::string holder = error == EWOULDBLOCK ? holder_of(fd_) : "";
    ::close(fd_);
    errno = error;
    if (error != EWOULDBLOCK) fail_system(file, "lock the checkpoint directory");
    throw InputError(fmt::format(
        "{}: checkpoint directory in use by another run (pid {}, holding {}): two runs saving "
        "into one directory would destroy each other's checkpoints; wait for it to end or set "
        "another trainer.checkpoint.dir",
        dir.string(), holder, file.string()));
  }
  const std::string pid = fmt::format("{}\n", ::getpid());
  // For the message of a second writer only: a failure here does not matter to the lock.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace lockstep::detail
