#include "io/durable_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <optional>
#include <system_error>
#include <utility>

#include "io/file_roles.hpp"
#include "io/open_input.hpp"
#include "io/output_path.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

// Closes on scope exit; a failed close while unwinding has nothing left to report.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void fail_system(int error, const std::filesystem::path& file,
                              std::string_view doing) {
  throw std::system_error(error, std::generic_category(),
                          fmt::format("{}: cannot {}", file.string(), doing));
}

void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& file) {
  while (!bytes.empty()) {
    const ::ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_system(errno, file, "write");
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

// Without this, a rename can be lost on power failure even after the file's data is on disk.
void sync_directory(const std::filesystem::path& dir) {
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) fail_system(errno, dir, "open the directory to sync it");
  if (::fsync(d.fd) != 0) fail_system(errno, dir, "sync the directory");
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(const std::filesystem::path& link_or_target)
    // Through a symlink to what it names: renaming over the link would replace it with a file.
    : target_(follow_links(link_or_target)) {
  // A name of its own (pid and a counter), so that two writers of one target, even in one
  // process, never write into each other's temp file.
  static std::atomic<std::uint64_t> counter{0};
  temp_ = target_;
  temp_ += fmt::format(".{}.{}{}", ::getpid(), counter++, kTempSuffix);
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_system(errno, temp_, "create");
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicFileWriter::write(std::span<const std::byte> bytes) { write_all(fd_, bytes, temp_); }

void AtomicFileWriter::write_at(std::uint64_t offset, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ::ssize_t n = ::pwrite(fd_, bytes.data(), bytes.size(), static_cast<::off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_system(errno, temp_, "write");
    bytes = bytes.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
}

void AtomicFileWriter::truncate(std::uint64_t size) {
  if (::ftruncate(fd_, static_cast<::off_t>(size)) != 0) fail_system(errno, temp_, "truncate");
  if (::lseek(fd_, static_cast<::off_t>(size), SEEK_SET) < 0) fail_system(errno, temp_, "seek in");
}

void AtomicFileWriter::commit() {
  if (::fsync(fd_) != 0) fail_system(errno, temp_, "sync");
  // close() can report a deferred write error (NFS), so its result counts.
  if (::close(std::exchange(fd_, -1)) != 0) fail_system(errno, temp_, "close");
  if (::rename(temp_.c_str(), target_.c_str()) != 0) fail_system(errno, target_, "rename onto");
  temp_.clear();  // renamed: nothing left to remove
  sync_directory(directory_of(target_));
}

void write_file_atomically(const std::filesystem::path& target,
                           std::span<const std::span<const std::byte>> pieces) {
  AtomicFileWriter out(target);
  for (const std::span<const std::byte> piece : pieces) out.write(piece);
  out.commit();
}

namespace {

// The writer's pid in "<target>.<pid>.<n>.tmp"; nullopt for any other name.
std::optional<pid_t> temp_writer(const std::string& name) {
  if (!name.ends_with(kTempSuffix)) return std::nullopt;
  const std::string_view rest(name.data(), name.size() - kTempSuffix.size());
  const std::size_t counter_dot = rest.rfind('.');
  if (counter_dot == std::string_view::npos || counter_dot == 0) return std::nullopt;
  const std::size_t pid_dot = rest.rfind('.', counter_dot - 1);
  if (pid_dot == std::string_view::npos) return std::nullopt;
  const auto number = [](std::string_view digits, auto& out) {
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
    return ec == std::errc{} && end == digits.data() + digits.size() && !digits.empty();
  };
  pid_t pid = 0;
  std::uint64_t counter = 0;
  if (!number(rest.substr(pid_dot + 1, counter_dot - pid_dot - 1), pid) ||
      !number(rest.substr(counter_dot + 1), counter) || pid <= 0)
    return std::nullopt;
  return pid;
}

}  // namespace

std::vector<std::filesystem::path> remove_stale_temp_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> removed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::optional<pid_t> pid = temp_writer(entry.path().filename().string());
    // ESRCH: no such process. EPERM means alive (another user's): never touched.
    if (!pid || ::kill(*pid, 0) == 0 || errno != ESRCH) continue;
    if (std::filesystem::remove(entry.path(), ec)) removed.push_back(entry.path());
  }
  return removed;
}

void fail_input(const std::filesystem::path& file, std::string_view what) {
  throw InputError(fmt::format("{}: {}", file.string(), what));
}

InputFile::InputFile(std::filesystem::path path) : path_(std::move(path)) {
  InputFd in = open_input(path_, InputKind::checkpoint);
  size_ = in.size();
  fd_ = in.release();
}

InputFile::~InputFile() { ::close(fd_); }

void InputFile::read(std::span<std::byte> out, std::string_view what) {
  const std::uint64_t start = position_;
  std::size_t done = 0;
  while (done < out.size()) {
    const ::ssize_t n = ::read(fd_, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      fail_input(path_, fmt::format("offset {}: cannot read: {}", position_,
                                    std::generic_category().message(errno)));
    if (n == 0)
      fail_input(path_, fmt::format("offset {}: expected {} bytes of {}, the file ends at {}",
                                    start, out.size(), what, position_));
    done += static_cast<std::size_t>(n);
    position_ += static_cast<std::uint64_t>(n);
  }
}

void InputFile::seek(std::uint64_t offset) {
  if (offset > size_ || ::lseek(fd_, static_cast<::off_t>(offset), SEEK_SET) < 0)
    fail_input(path_, fmt::format("offset {}: cannot seek there (the file has {} bytes)", offset,
                                  size_));
  position_ = offset;
}

}  // namespace lockstep::detail
