// Which worker's error a failed run reports. See Note [Failure] in worker_loop.hpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::detail {

// The errors of a run's workers (and of its watchdog), in the order they were caught. Thread-safe.
class FailureLog {
 public:
  void record(int global_rank, std::exception_ptr error, std::string device);
  bool empty() const;
  // Rethrows the first failure that caused the abort, not the CommAborted it triggered in the
  // others (the first of all when every one is CommAborted): an InputError unchanged, anything
  // else as a WorkerError naming the rank and device. Returns when nothing failed.
  // `why` (when given) is appended to its message: why the run could not go on without a lost
  // worker (Note [Shrink] in recovery.hpp).
  void rethrow_first(std::string_view why = {}) const;
  // The global ranks whose device was lost (DeviceLost), in the order caught.
  std::vector<int> lost_ranks() const;
  // What each of them reported, worded as WorkerError words it, in the same order.
  std::vector<std::string> losses() const;
  // Whether every failure is a lost device or the CommAborted it caused: what a shrink survives.
  bool only_losses() const;
  // Forgets every failure: the survivors' run after a shrink starts with none.
  void clear();

 private:
  struct Failure {
    std::uint64_t order = 0;  // when it was caught, across all workers
    int rank = 0;
    std::exception_ptr error;
    std::string device;
  };
  const Failure& first_cause() const;
  std::vector<const Failure*> lost() const;

  mutable std::mutex mutex_;
  std::vector<Failure> failures_;
  std::atomic<std::uint64_t> next_order_{0};
};

}  // namespace lockstep::detail
