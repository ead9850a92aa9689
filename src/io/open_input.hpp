// Opening the files a run reads: configs, data files and checkpoints.
//
// Note [Opening an input]
// Every input goes through open_input, so that a path which is not a regular file is refused by
// the same rule wherever it is given. The file is opened with O_NONBLOCK, so that a FIFO with no
// writer does not hang the open, and then fstat-ed: a FIFO, a character device (/dev/zero, a
// terminal), a block device, a socket or a directory is refused with its type in the message,
// before a byte is read. A regular file's size is known before it is read, so a cap per input
// kind (configs are small) is checked before any allocation.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace lockstep::detail {

// What an input is, for messages ("cannot open config file") and its size cap.
enum class InputKind { config, data, checkpoint };

// A config is a few kilobytes of YAML; anything near this is not one.
inline constexpr std::uint64_t kMaxConfigBytes = 16u << 20;

// An open regular file, read-only and blocking again once checked. Owns the descriptor.
class InputFd {
 public:
  InputFd(int fd, std::uint64_t size) noexcept : fd_(fd), size_(size) {}
  ~InputFd();
  InputFd(InputFd&& other) noexcept;
  InputFd& operator=(InputFd&&) = delete;
  InputFd(const InputFd&) = delete;
  InputFd& operator=(const InputFd&) = delete;

  int get() const noexcept { return fd_; }
  std::uint64_t size() const noexcept { return size_; }  // when opened
  int release() noexcept;

 private:
  int fd_;
  std::uint64_t size_;
};

// Opens `file` as described in Note [Opening an input]. Throws InputError
// "FILE: cannot open: REASON" ("cannot open config file" for a config), e.g. "it is a FIFO
// (named pipe), expected a regular file", or "FILE: KIND file of N bytes: expected at most M" over the kind's cap.
InputFd open_input(const std::filesystem::path& file, InputKind kind);

// The whole of `file`, opened by open_input. Throws InputError naming the file.
std::string read_input(const std::filesystem::path& file, InputKind kind);

// "config", "data", "checkpoint".
std::string_view to_string(InputKind kind);

}  // namespace lockstep::detail
