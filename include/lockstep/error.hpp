// Exceptions shared by every part of lockstep.
//
// Two tiers, as the CLI sees them:
//   InputError   - the user gave us something wrong (a config key, a flag, a data file).
//                  The message names the file, key or line and what was expected. Exit code 2.
//   everything else derived from std::exception is a run-time failure. Exit code 1.
// Each of the errors below derives from Error, so that an embedder can catch them in one
// clause. Library code never calls exit(); it throws, and the trainer stops every
// worker.
#pragma once

#include <cstddef>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>

#include "lockstep/export.hpp"

namespace lockstep {

class LOCKSTEP_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class LOCKSTEP_API InputError : public Error {
 public:
  using Error::Error;
};

// Thrown inside a worker whose communication group was aborted because another worker
// failed. The trainer reports the original error, not this one.
class LOCKSTEP_API CommAborted : public Error {
 public:
  CommAborted() : Error("communicator aborted by another worker") {}
};

// A worker's device is gone or unusable (a poisoned CUDA context, an NCCL error naming it, the
// injected `lost` fault): a device-class failure, which trainer.on_worker_failure: shrink
// survives by going on without that worker (Note [Shrink] in src/train/recovery.hpp).
class LOCKSTEP_API DeviceLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Note [Naming an allocation]
// An allocation that failed says what was being allocated: a std::bad_alloc names nothing. A
// device's allocate() throws OutOfMemory::on_device ("12.0 MiB on cpu:1"), and the worker's
// set-up adds what it was making ("the model replica (parameters, gradients, activations): ...");
// the CLI ends with exit 1 on it, naming its phase. It is a std::bad_alloc, so that whatever
// catches those still does.
class LOCKSTEP_API OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string allocation)
      : allocation_(std::move(allocation)), what_("out of memory allocating " + allocation_) {}
  const char* what() const noexcept override { return what_.c_str(); }
  const std::string& allocation() const noexcept { return allocation_; }

  // A device's allocation of `bytes`: "12.0 MiB on cpu:1".
  static OutOfMemory on_device(std::size_t bytes, const std::string& device) {
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    return OutOfMemory(std::string(mib) + " on " + device);
  }

 private:
  std::string allocation_, what_;
};

// A failure inside one worker, tagged with where it happened.
class LOCKSTEP_API WorkerError : public Error {
 public:
  WorkerError(int rank, std::string device, const std::string& what)
      : Error("worker " + std::to_string(rank) + " (" + device + "): " + what),
        rank_(rank),
        device_(std::move(device)) {}
  int rank() const noexcept { return rank_; }
  const std::string& device() const noexcept { return device_; }

 private:
  int rank_;
  std::string device_;
};

}  // namespace lockstep
