// Two processes training as one job without MPI, for tests only: the way to run NCCL with two
// real ranks on a machine with one GPU (issue 31), and, on the CPU backend, the check that the
// multi-process path of the trainer is the same with another ProcessGroup than MPI's.
//
//   lockstep_two_process_run CONFIG [--set KEY=VALUE]... [--summary-json FILE]
//
// The launcher forks two processes, each of which trains CONFIG on its own trainer.devices as
// rank 0 or 1 of a ProcessGroup over two socket pairs (SocketProcesses below), as two
// processes under mpirun would. Each gets its own NCCL_HOSTID ("lockstep-two-process-R", unless
// the environment sets one): NCCL refuses two ranks on one GPU only when they report the same
// host, so two processes with devices [0] make a real 2-rank NCCL communicator on one GPU, over
// its socket transport (shared/GPU.md has the environment it needs). Process 0 prints the
// summary and writes --summary-json. The launcher ends as mpirun does: when a process fails, the
// other is killed, and the job's exit status is the failed one's (1 run-time failure, 2 bad
// input); 0 when both succeed.
//
// Note [Socket process group]
//   One socket pair per plane: the data plane (float all-reduce and broadcast, called by local
//   worker 0's communication thread) and the control plane (the rest, called by its worker
//   thread). Within a plane every process makes the same calls in the same order, so each call
//   is one exchange; across planes the calls interleave differently in each process, hence two
//   pairs. An all-reduce is rank 1 sending its values, rank 0 adding them to its own in rank order
//   and sending the sums back: both end with the same bits. abort() shuts the sockets, which
//   ends this process's waits and, as an end of file, the other's.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"

namespace {

using namespace lockstep;

class SocketProcesses final : public ProcessGroup {
 public:
  SocketProcesses(int rank, int data, int control) : rank_(rank), data_(data), control_(control) {}
  ~SocketProcesses() override {
    ::close(data_);
    ::close(control_);
  }
  SocketProcesses(const SocketProcesses&) = delete;
  SocketProcesses& operator=(const SocketProcesses&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return 2; }

  void all_reduce(float* data, std::size_t count) override {
    sum_in_rank_order(data_, std::span(data, count));
  }
  void broadcast(float* data, std::size_t count, int root) override {
    from_root(data_, data, count * sizeof(float), root);
  }
  void barrier() override {
    char byte = 0;
    exchange(control_, &byte, 1, &byte, 1);
  }
  void all_reduce(std::span<double> values) override { sum_in_rank_order(control_, values); }
  std::vector<std::uint64_t> all_gather(std::span<const std::uint64_t> mine) override {
    const std::size_t n = mine.size(), bytes = n * sizeof(std::uint64_t);
    std::vector<std::uint64_t> all(2 * n);
    std::copy(mine.begin(), mine.end(), all.begin() + rank_ * n);
    // Rank 1 sends its values; rank 0 answers with the whole list.
    if (rank_ == 1) {
      send(control_, mine.data(), bytes);
      receive(control_, all.data(), 2 * bytes);
    } else {
      receive(control_, all.data() + n, bytes);
      send(control_, all.data(), 2 * bytes);
    }
    return all;
  }
  void broadcast_bytes(void* data, std::size_t bytes, int root) override {
    from_root(control_, data, bytes, root);
  }

  void abort() noexcept override {
    aborted_ = true;
    ::shutdown(data_, SHUT_RDWR);
    ::shutdown(control_, SHUT_RDWR);
  }
  bool aborted() const noexcept override { return aborted_; }
  // The launcher kills the other process when this one exits with a failure (as mpirun does).
  void abort_job(int code) noexcept override {
    std::fflush(nullptr);
    std::_Exit(code);
  }

 private:
  template <class T>
  void sum_in_rank_order(int fd, std::span<T> values) {
    const std::size_t bytes = values.size_bytes();
    if (rank_ == 1) return exchange(fd, values.data(), bytes, values.data(), bytes);
    std::vector<T> theirs(values.size());
    receive(fd, theirs.data(), bytes);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = values[i] + theirs[i];
    send(fd, values.data(), bytes);
  }
  void from_root(int fd, void* data, std::size_t bytes, int root) {
    if (rank_ == root) send(fd, data, bytes);
    else receive(fd, data, bytes);
  }
  // One exchange: rank 1 sends `out`, then receives into `in`; rank 0 receives, then sends.
  void exchange(int fd, const void* out, std::size_t out_bytes, void* in, std::size_t in_bytes) {
    if (rank_ == 1) {
      send(fd, out, out_bytes);
      receive(fd, in, in_bytes);
    } else {
      receive(fd, in, in_bytes);
      send(fd, out, out_bytes);
    }
  }
  void send(int fd, const void* data, std::size_t bytes) {
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
      if (n <= 0) fail();
      p += n;
      bytes -= static_cast<std::size_t>(n);
    }
  }
  void receive(int fd, void* data, std::size_t bytes) {
    auto* p = static_cast<char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::recv(fd, p, bytes, 0);
      if (n <= 0) fail();  // the other process aborted, or ended
      p += n;
      bytes -= static_cast<std::size_t>(n);
    }
  }
  [[noreturn]] void fail() {
    abort();
    throw CommAborted();
  }

  const int rank_;
  const int data_, control_;
  std::atomic<bool> aborted_{false};
};

struct Args {
  std::string config;
  std::vector<std::string> overrides;
  std::string summary_json;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--set" && i + 1 < argc) a.overrides.emplace_back(argv[++i]);
    else if (arg == "--summary-json" && i + 1 < argc) a.summary_json = argv[++i];
    else if (!arg.starts_with("-") && a.config.empty()) a.config = arg;
    else throw InputError(fmt::format("unexpected argument '{}'; usage: lockstep_two_process_run "
                                      "CONFIG [--set KEY=VALUE]... [--summary-json FILE]", arg));
  }
  if (a.config.empty()) throw InputError("expected a CONFIG file");
  return a;
}

// One process of the job: trains, then exits (never returns).
[[noreturn]] void run_process(const Args& args, int rank, int data, int control) {
  (void)setenv("NCCL_HOSTID", fmt::format("lockstep-two-process-{}", rank).c_str(), 0);
  auto processes = std::make_shared<SocketProcesses>(rank, data, control);
  int code = 0;
  try {
    const Config cfg = load_config(args.config, args.overrides);
    const DataSplit split = load_dataset(cfg);
    Trainer trainer(cfg, split.train, split.eval, processes);
    const Summary s = trainer.run();
    if (rank == 0) {
      fmt::print("two processes: {} steps, final train loss {:.6f}, param_hash {:016x}, replicas "
                 "identical: {}\n", s.steps, s.final_train_loss, s.param_hash,
                 s.replicas_identical);
      if (!args.summary_json.empty()) std::ofstream(args.summary_json) << s.to_json();
    }
    code = s.replicas_identical ? 0 : 1;
  } catch (const InputError& e) {
    fmt::print(stderr, "process {}: error: {}\n", rank, e.what());
    code = 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "process {}: failed: {}\n", rank, e.what());
    code = 1;
  }
  if (code != 0) processes->abort_job(code);
  std::fflush(nullptr);
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const InputError& e) {
    fmt::print(stderr, "lockstep_two_process_run: {}\n", e.what());
    return 2;
  }
  int data[2], control[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, data) != 0 ||
      ::socketpair(AF_UNIX, SOCK_STREAM, 0, control) != 0) {
    std::perror("lockstep_two_process_run: socketpair");
    return 1;
  }
  std::fflush(nullptr);
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = ::fork();
    if (pids[rank] < 0) {
      std::perror("lockstep_two_process_run: fork");
      if (rank == 1) ::kill(pids[0], SIGKILL);
      return 1;
    }
    if (pids[rank] == 0) {
      ::close(data[1 - rank]);
      ::close(control[1 - rank]);
      run_process(args, rank, data[rank], control[rank]);
    }
  }
  for (int fd : {data[0], data[1], control[0], control[1]}) ::close(fd);
  // As mpirun: the first process to fail ends the other; the job's status is its status. The
  // other gets kGraceSeconds to end on its own first: a failure in one process aborts the
  // sockets, so the process that failed first in fact is often the second to exit, and killing
  // it at once would lose the message that says what happened.
  constexpr double kGraceSeconds = 5.0;
  int job = 0, running = 2;
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::wait(&status);
    if (pid < 0) break;
    --running;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const int rank = pid == pids[0] ? 0 : 1;
    if (code != 0 && job == 0) {
      job = code;
      if (running > 0) {
        const auto since = std::chrono::steady_clock::now();
        int other = 0;
        pid_t ended = 0;
        while ((ended = ::waitpid(pids[1 - rank], &other, WNOHANG)) == 0 &&
               std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count() <
                   kGraceSeconds)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (ended == pids[1 - rank]) {
          --running;
        } else {
          fmt::print(stderr,
                     "lockstep_two_process_run: process {} exited with {}: ending process {}\n",
                     rank, code, 1 - rank);
          ::kill(pids[1 - rank], SIGKILL);
        }
      }
    }
  }
  return job;
}
