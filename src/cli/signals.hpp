// SIGINT and SIGTERM sent to one handler while a scope lives (train's and tokenize's).
#pragma once

#include <csignal>

namespace lockstep::cli {

// Installs `handler` for SIGINT and SIGTERM; the destructor puts the previous handlers back.
// No SA_RESTART: a blocking read returns EINTR, and the command looks at what the handler set.
class SignalHandlers {
 public:
  explicit SignalHandlers(void (*handler)(int));
  ~SignalHandlers();
  SignalHandlers(const SignalHandlers&) = delete;
  SignalHandlers& operator=(const SignalHandlers&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

}  // namespace lockstep::cli
