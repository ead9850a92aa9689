#include "train/failures.hpp"

#include <algorithm>
#include <stdexcept>

#include "lockstep/error.hpp"

namespace lockstep::detail {

void FailureLog::record(int global_rank, std::exception_ptr error, std::string device) {
  Failure f{next_order_.fetch_add(1), global_rank, std::move(error), std::move(device)};
  std::lock_guard lock(mutex_);
  failures_.push_back(std::move(f));
}

bool FailureLog::empty() const {
  std::lock_guard lock(mutex_);
  return failures_.empty();
}

// Called with mutex_ held.
const FailureLog::Failure& FailureLog::first_cause() const {
  std::vector<const Failure*> in_order;
  for (const Failure& f : failures_) in_order.push_back(&f);
  std::sort(in_order.begin(), in_order.end(),
            [](const Failure* a, const Failure* b) { return a->order < b->order; });
  for (const Failure* f : in_order) {
    try {
      std::rethrow_exception(f->error);
    } catch (const CommAborted&) {
      continue;
    } catch (...) {
      return *f;
    }
  }
  return *in_order.front();
}

void FailureLog::rethrow_first() const {
  std::lock_guard lock(mutex_);
  if (failures_.empty()) return;
  const Failure& first = first_cause();
  try {
    std::rethrow_exception(first.error);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw WorkerError(first.rank, first.device, e.what());
  }
}

}  // namespace lockstep::detail
