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
