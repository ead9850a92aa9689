// Note [One writer per checkpoint directory]: a second writer is refused naming the holder's
// pid; readers of a directory that a live run rotates never fail spuriously.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "checkpoint_fixtures.hpp"
#include "io/dir_lock.hpp"

namespace fs = std::filesystem;
using namespace lockstep;
using namespace lockstep::test;

TEST_CASE("DirLock: a second writer is refused naming the holder's pid, and the lock ends with it") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "ckpt";  // made by the lock
  {
    const detail::DirLock first(dir);
    const std::string why = input_error_of([&] { detail::DirLock second(dir); });
    CHECK(why.starts_with(dir.string() + ": checkpoint directory in use by another run (pid " +
                          std::to_string(::getpid()) + ", holding " +
                          (dir / ".lock").string() + ")"));
  }
  const detail::DirLock again(dir);  // released with the first
}

TEST_CASE("checkpoint: a reader of a directory that a live run rotates never fails") {
  TempDir tmp;
  const Model model = small_model();
  CheckpointManager writer(tmp.path() / "ckpt", 1);  // keep_last 1: every save removes the last
  writer.save(make_checkpoint(model, 1));
  std::atomic<bool> done{false};
  std::thread saving([&] {
    for (std::int64_t step = 2; step <= 60; ++step) writer.save(make_checkpoint(model, step));
    done = true;
  });
  const CheckpointManager reader(tmp.path() / "ckpt", 0);
  int reads = 0, failures = 0;
  std::string first_failure;
  while (!done) {
    try {
      CHECK(reader.load_latest().has_value());
      ++reads;
    } catch (const InputError& e) {
      if (failures++ == 0) first_failure = e.what();
    }
  }
  saving.join();
  CHECK_MESSAGE(failures == 0, first_failure);
  CHECK(reads > 0);
}
