// A rank's communication thread: runs the collectives a communicator was asked to start
// (Communicator::all_reduce_async and the other *_async calls) one after another, in the order
// they were submitted, while the worker goes on. Started on the first submit; the destructor finishes the queue and joins.
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
  CommThread() = default;
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Runs `collective` on the thread, after everything submitted before it.
  std::unique_ptr<CommWork> submit(std::function<void()> collective);

 private:
  struct Queued;
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Queued>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace lockstep::detail
