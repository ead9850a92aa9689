// File I/O for checkpoints and token files: crash-safe writes, whole or streamed, and
// bounds-checked reads whose errors name the file and the byte offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/export.hpp"

namespace lockstep::detail {

// Ends a file's name while it is being written: "<target>.<pid>.<n>.tmp".
inline constexpr std::string_view kTempSuffix = ".tmp";

// Writes the concatenation of `pieces` to `target` so that, after a crash at any point,
// `target` holds either its previous contents or all of the new ones: write
// "<target>.<pid>.<n>.tmp" in the same directory, fsync it, rename it over `target`, fsync the
// directory. A symlink's target is replaced and the link kept. Throws std::system_error naming
// the file; the temp file is removed on failure. Exported for the CLI.
LOCKSTEP_API void write_file_atomically(const std::filesystem::path& target,
                                        std::span<const std::span<const std::byte>> pieces);

// Removes the temp files of write_file_atomically() in `dir` whose writer (the pid in the name)
// is dead: what a killed save leaves. Their targets are untouched. Call it only while holding
// the directory (Note [One writer per checkpoint directory]), so that no live writer of this
// host loses its file; a pid reused since is taken for alive, and its file stays. Returns the
// files removed; errors leave a file in place.
std::vector<std::filesystem::path> remove_stale_temp_files(const std::filesystem::path& dir);

// The same, for a file written as it is made (a token file larger than memory): the bytes go to
// "<target>.<pid>.<n>.tmp", and commit() makes them `target` as above. Until then `target` is
// untouched; destroyed without a commit (an error, an interrupted run), the temp file is
// removed. Throws std::system_error naming the file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::filesystem::path& target);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(std::span<const std::byte> bytes);                       // at the end
  void write_at(std::uint64_t offset, std::span<const std::byte> bytes);  // over earlier bytes
  void truncate(std::uint64_t size);  // drops the bytes from `size` on; writes go on from there
  void commit();
  const std::filesystem::path& temp_path() const noexcept { return temp_; }

 private:
  std::filesystem::path target_, temp_;
  int fd_ = -1;
};

// InputError "FILE: what".
[[noreturn]] void fail_input(const std::filesystem::path& file, std::string_view what);

// A regular file opened for sequential reading; seek() moves to another offset (a safetensors
// reader reads one tensor at a time).
class InputFile {
 public:
  // Opened by open_input (Note [Opening an input]): throws InputError "FILE: cannot open:
  // REASON", also for a directory, a FIFO or a device.
  explicit InputFile(std::filesystem::path path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }
  std::uint64_t size() const noexcept { return size_; }  // when opened
  std::uint64_t position() const noexcept { return position_; }

  // Fills `out` from the current position and advances it. Throws InputError
  // "FILE: offset N: expected K bytes of WHAT, the file ends at M" when it cannot.
  void read(std::span<std::byte> out, std::string_view what);
  // Moves the position to `offset` (at most size()).
  void seek(std::uint64_t offset);

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::uint64_t position_ = 0;
};

}  // namespace lockstep::detail
