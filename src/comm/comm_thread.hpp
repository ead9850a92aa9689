// A rank's communication thread: runs the all-reduces a communicator was asked to start
// (Communicator::all_reduce_async) one after another, in the order they were submitted, while
// the worker goes on. Started on the first submit; the destructor finishes the queue and joins.
// The owner declares it as its last member, so the thread stops before anything it uses goes.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "lockstep/comm.hpp"

namespace lockstep::detail {

class CommThread {
 public:
  using AllReduce = std::function<void(float* data, std::size_t count, ReduceOp op)>;
  explicit CommThread(AllReduce all_reduce) : all_reduce_(std::move(all_reduce)) {}
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  std::unique_ptr<CommWork> submit(float* data, std::size_t count, ReduceOp op);

 private:
  struct Queued;
  void loop();

  AllReduce all_reduce_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Queued>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace lockstep::detail
