// Starting a thread, with a failure to start it as an error that says which thread.
//
// std::thread's constructor throws std::system_error ("Resource temporarily unavailable") when
// the process is at its thread limit (ulimit -u) or has no memory for a stack. Whoever starts a
// thread must then make sure that no thread it started before is left joinable when it unwinds:
// a joinable std::thread's destructor calls std::terminate (Note [Bounded stop] in
// src/train/trainer.cpp does so for the workers).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

namespace lockstep::detail {

template <class F>
std::thread start_thread(std::string_view what, F&& f) {
  try {
    return std::thread(std::forward<F>(f));
  } catch (const std::system_error& e) {
    throw std::runtime_error(fmt::format(
        "cannot start {}: {} (the process may be at its thread limit, ulimit -u, or out of "
        "memory for a thread's stack)",
        what, e.code().message()));
  }
}

}  // namespace lockstep::detail
