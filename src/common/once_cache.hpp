// Values built once per key and shared by every thread of the process, as cuDNN's attention
// plans are (Note [cuDNN plan cache] in src/cuda/cudnn_attention.cpp):
//
//   OnceCache<Key, Plan> cache;
//   std::shared_ptr<const Plan> p = cache.get(key, [&] { return build(key); });
//
// The first thread to ask for a key builds it, outside the lock: threads asking for other keys
// build theirs at the same time, and threads asking for the same key wait for that one build. A
// build that throws is kept like a value: every later ask rethrows it without building again.
#pragma once

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>

namespace lockstep::detail {

template <class Key, class Value>
class OnceCache {
 public:
  std::shared_ptr<const Value> get(const Key& key, const std::function<Value()>& build) {
    std::promise<std::shared_ptr<const Value>> promise;
    std::shared_future<std::shared_ptr<const Value>> value;
    bool builds = false;
    {
      const std::lock_guard lock(mutex_);
      const auto [it, inserted] = values_.try_emplace(key);
      if (inserted) it->second = promise.get_future().share();
      value = it->second;
      builds = inserted;
    }
    if (builds) {
      try {
        promise.set_value(std::make_shared<const Value>(build()));
      } catch (...) {
        promise.set_exception(std::current_exception());
      }
    }
    return value.get();
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::shared_future<std::shared_ptr<const Value>>> values_;
};

}  // namespace lockstep::detail
