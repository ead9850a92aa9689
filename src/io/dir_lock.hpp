// One writer per checkpoint directory.
//
// Note [One writer per checkpoint directory]
// Two runs saving into one directory rotate (keep_last) each other's checkpoints away and
// interleave their steps, so that neither can be resumed. A run that writes checkpoints holds an
// advisory lock (flock) on "<dir>/.lock" from before its first step to its end, and a second
// writer is refused at start-up, naming the holder's pid, which the holder writes into the file.
// flock is released by the kernel when the holder dies, so a crash leaves no stale lock (a file
// that stays is harmless: it is the lock, not its existence, that counts). Readers (eval,
// export, sample, --resume) take no lock: they re-list when a file vanishes under them.
#pragma once

#include <filesystem>

namespace lockstep::detail {

inline constexpr const char* kLockFileName = ".lock";

class DirLock {
 public:
  // Creates `dir` if needed and locks it. Throws InputError "DIR: checkpoint directory in use by
  // another run (pid N) ..." when another holder has it, std::system_error when the lock file
  // cannot be made.
  explicit DirLock(const std::filesystem::path& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace lockstep::detail
