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

void FailureLog::rethrow_first(std::string_view why) const {
  std::lock_guard lock(mutex_);
  if (failures_.empty()) return;
  const Failure& first = first_cause();
  try {
    std::rethrow_exception(first.error);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw WorkerError(first.rank, first.device, std::string(e.what()) + std::string(why));
  }
}

namespace {

template <class Error>
bool is(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

// Called with mutex_ held.
std::vector<const FailureLog::Failure*> FailureLog::lost() const {
  std::vector<const Failure*> lost;
  for (const Failure& f : failures_)
    if (is<DeviceLost>(f.error)) lost.push_back(&f);
  std::sort(lost.begin(), lost.end(),
            [](const Failure* a, const Failure* b) { return a->order < b->order; });
  return lost;
}

std::vector<int> FailureLog::lost_ranks() const {
  std::lock_guard lock(mutex_);
  std::vector<int> ranks;
  for (const Failure* f : lost()) ranks.push_back(f->rank);
  return ranks;
}

std::vector<std::string> FailureLog::losses() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const Failure* f : lost()) {
    try {
      std::rethrow_exception(f->error);
    } catch (const std::exception& e) {
      out.emplace_back(WorkerError(f->rank, f->device, e.what()).what());
    }
  }
  return out;
}

bool FailureLog::only_losses() const {
  std::lock_guard lock(mutex_);
  return std::all_of(failures_.begin(), failures_.end(),
                     [](const Failure& f) { return is<DeviceLost>(f.error) || is<CommAborted>(f.error); });
}

void FailureLog::clear() {
  std::lock_guard lock(mutex_);
  failures_.clear();
}

}  // namespace lockstep::detail
