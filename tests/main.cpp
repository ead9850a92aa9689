// The doctest runner for lockstep_tests and lockstep_mpi_tests.
//
// Note [Skipped cases]
// CTest runs each doctest case alone (doctest_discover_tests), and counts a test as skipped when
// it exits with SKIP_RETURN_CODE, 77. doctest itself has no "skipped" outcome: a case that
// cannot run here calls test::skip (tests/skip.hpp), which only sets a flag (and logs the skip:
// Note [Skip kinds]), and returns. When the run held exactly one case, nothing failed and that
// case skipped, the binary exits with 77; a run of several cases (the binary run by hand) exits
// as doctest says, 0 when nothing failed.
//
// Note [One case per CTest test]
// doctest_discover_tests makes one CTest test per name that --list-test-cases prints, and runs
// it as --test-case=NAME. CMake splits that name at each ';' (a list separator), so a name with
// one became two CTest tests that matched no case, ran nothing and passed. Two guards: a run
// whose filters matched no case fails (exit 1, below), and the case "test names: ..." fails on
// a name CMake would split.
//
// Note [Time limits]
// Every CTest test has a time limit (TIMEOUT): a hang must fail its test, not eat CI's 90
// minutes and every stage after it. tests/time_limits.cmake gives each case its limit (a
// default, more for the cases measured slow, all scaled for a sanitizer build). CTest 3.25 kills
// a test past its TIMEOUT with SIGKILL and stops reading its output first, so a killed test
// cannot say where it was. Each case therefore also gets LOCKSTEP_CASE_TIMEOUT, its limit, and
// CTest's TIMEOUT is a grace period more (lockstep_grace_seconds): the runner's watchdog thread,
// finding a case still running at its limit, prints the case, its subcases and the stack of
// every thread to stderr, and ends the process with exit 124 (timeout(1)'s code). The case
// "harness: the watchdog names ..." below hangs on purpose, in a child, to show it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_runner.hpp"
#include "skip.hpp"

namespace lockstep::test {
namespace {

std::atomic<bool> skipped{false};
std::atomic<int> cases_run{0};
std::mutex current_case_mutex;
// Never destroyed: a child forked while the watchdog waits, calling exit(), would wait forever in
// its destructor for a waiter it does not have.
std::condition_variable& case_changed = *new std::condition_variable;
// The case running (for the skip log and the watchdog), its subcases from the outermost, when
// it started, and a count of starts and ends (odd while a case runs) that the watchdog reads.
std::string current_case;
std::vector<std::string> current_subcases;
std::chrono::steady_clock::time_point case_started;
unsigned case_serial = 0;

// Counts the cases that ran, and remembers the one running and where in it.
struct CaseCounter : doctest::IReporter {
  explicit CaseCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& data) override {
    ++cases_run;
    {
      const std::lock_guard lock(current_case_mutex);
      current_case = data.m_name;
      current_subcases.clear();
      case_started = std::chrono::steady_clock::now();
      ++case_serial;
    }
    case_changed.notify_all();
  }
  void test_case_reenter(const doctest::TestCaseData&) override {
    const std::lock_guard lock(current_case_mutex);
    current_subcases.clear();
  }
  void test_case_end(const doctest::CurrentTestCaseStats&) override {
    {
      const std::lock_guard lock(current_case_mutex);
      ++case_serial;
    }
    case_changed.notify_all();
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature& s) override {
    const std::lock_guard lock(current_case_mutex);
    current_subcases.emplace_back(s.m_name.c_str());
  }
  void subcase_end() override {
    const std::lock_guard lock(current_case_mutex);
    if (!current_subcases.empty()) current_subcases.pop_back();
  }
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("lockstep_case_counter", 1, CaseCounter);

// Appends one line to $LOCKSTEP_SKIP_LOG (set by scripts/test.sh), in one write so that the
// cases CTest runs side by side do not interleave their lines.
void log_skip(Skip kind, const std::string& why) {
  const char* path = std::getenv("LOCKSTEP_SKIP_LOG");
  if (path == nullptr || *path == '\0') return;
  std::string line;
  {
    const std::lock_guard lock(current_case_mutex);
    line = std::string(skip_kind_name(kind)) + '\t' + current_case + '\t' + why;
  }
  for (char& c : line)
    if (c == '\n') c = ' ';  // one line per skip
  line += '\n';
  const int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "cannot open LOCKSTEP_SKIP_LOG %s\n", path);
    return;
  }
  const ssize_t wrote = ::write(fd, line.data(), line.size());
  if (wrote != static_cast<ssize_t>(line.size()))
    std::fprintf(stderr, "cannot write LOCKSTEP_SKIP_LOG %s\n", path);
  ::close(fd);
}

// ---- The watchdog (Note [Time limits]) ----------------------------------------------------------

constexpr int kExitTimedOut = 124;
// The signal that asks a thread for its stack; glibc keeps SIGRTMIN's first values to itself.
const int kStackSignal = SIGRTMIN + 2;
std::atomic<bool> stack_written{false};

// Writes the interrupted thread's stack to stderr; backtrace_symbols_fd writes without
// allocating (and shows this program's functions as offsets).
void write_own_stack(int) {
  const int saved_errno = errno;
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  stack_written = true;
  errno = saved_errno;
}

// Each thread of the process but the caller, in turn: its name, then its stack.
void write_stacks() {
  void* warm_up[1];
  ::backtrace(warm_up, 1);  // loads libgcc's unwinder here, not inside a handler
  struct sigaction action {};
  action.sa_handler = write_own_stack;
  action.sa_flags = SA_RESTART;
  sigaction(kStackSignal, &action, nullptr);
  const pid_t self = static_cast<pid_t>(::syscall(SYS_gettid));
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    const pid_t tid = static_cast<pid_t>(std::stol(entry.path().filename().string()));
    if (tid == self) continue;
    char name[64] = "?";
    if (FILE* f = std::fopen((entry.path() / "comm").c_str(), "r")) {
      if (std::fgets(name, sizeof name, f)) name[std::strcspn(name, "\n")] = '\0';
      std::fclose(f);
    }
    std::fprintf(stderr, "thread %d (%s):\n", int(tid), name);
    std::fflush(stderr);
    stack_written = false;
    if (::syscall(SYS_tgkill, ::getpid(), tid, kStackSignal) != 0) continue;
    // A thread busy outside any call may answer late under TSan, which delays signals.
    for (int i = 0; i < 100 && !stack_written; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!stack_written) std::fprintf(stderr, "  (no answer)\n");
  }
}

// Until `stop`: when a case is still running `limit` after it started, says which and where,
// writes every thread's stack and ends the process.
bool stop_watching = false;
void watch(std::chrono::duration<double> limit) {
  std::unique_lock lock(current_case_mutex);
  while (!stop_watching) {
    const unsigned serial = case_serial;
    const auto moved_on = [&] { return stop_watching || case_serial != serial; };
    if (serial % 2 == 0) {  // no case running: none started yet, or the last one ended
      case_changed.wait(lock, moved_on);
      continue;
    }
    const auto deadline =
        case_started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(limit);
    if (case_changed.wait_until(lock, deadline, moved_on)) continue;
    std::string where;
    for (const std::string& s : current_subcases) where += "\n  in subcase \"" + s + "\"";
    std::fprintf(stderr,
                 "\nlockstep_tests: the case \"%s\" has run past its time limit of %.0f s "
                 "(LOCKSTEP_CASE_TIMEOUT, Note [Time limits] in tests/main.cpp)%s\n"
                 "the stacks of its threads (addr2line -Cfpie PROGRAM +OFFSET names a frame):\n",
                 current_case.c_str(), limit.count(), where.c_str());
    std::fflush(stderr);
    lock.unlock();
    write_stacks();
    std::_Exit(kExitTimedOut);
  }
}

// The watchdog thread while LOCKSTEP_CASE_TIMEOUT (seconds) is set, as CTest sets it.
class Watchdog {
 public:
  Watchdog() {
    const char* value = std::getenv("LOCKSTEP_CASE_TIMEOUT");
    if (value == nullptr || *value == '\0') return;
    char* end = nullptr;
    const double seconds = std::strtod(value, &end);
    if (*end != '\0' || !(seconds > 0)) {
      std::fprintf(stderr, "LOCKSTEP_CASE_TIMEOUT=%s: expected a number of seconds above 0\n",
                   value);
      std::exit(2);
    }
    thread_ = std::thread(watch, std::chrono::duration<double>(seconds));
  }
  ~Watchdog() {
    if (!thread_.joinable()) return;
    {
      const std::lock_guard lock(current_case_mutex);
      stop_watching = true;
    }
    case_changed.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::thread thread_;
};

}  // namespace

void mark_skipped(Skip kind, const std::string& why) {
  skipped = true;
  log_skip(kind, why);
}

}  // namespace lockstep::test

// Note [One case per CTest test]: the rule that keeps each name one CTest test.
TEST_CASE("test names: none holds a character that splits it into several CTest tests") {
  for (const doctest::detail::TestCase& tc : doctest::detail::getRegisteredTests()) {
    const std::string name = tc.m_name, file = tc.m_file.c_str();
    CAPTURE(name);
    CAPTURE(file);
    CHECK(name.find(';') == std::string::npos);
  }
}

// Run by CTest, this case runs itself again with LOCKSTEP_TEST_HANG set, where it hangs in a
// subcase: the watchdog must end that run with 124 and name the case and the subcase.
constexpr const char* kWatchdogCase =
    "harness: the watchdog names a case past its time limit and its subcase";
TEST_CASE(kWatchdogCase) {
  if (std::getenv("LOCKSTEP_TEST_HANG") != nullptr) {
    SUBCASE("the subcase that hangs") std::this_thread::sleep_for(std::chrono::hours(1));
    return;
  }
  // The whole run bounded too: without the watchdog the child would sleep for an hour.
  const lockstep::test::CliResult r = lockstep::test::run_command(
      "LOCKSTEP_TEST_HANG=1 LOCKSTEP_CASE_TIMEOUT=1 timeout -s KILL 120 '" +
      std::filesystem::read_symlink("/proc/self/exe").string() + "' '--test-case=" +
      kWatchdogCase + "'");
  const std::string& output = r.output;
  INFO(output);
  CHECK(r.code == lockstep::test::kExitTimedOut);
  CHECK(output.find(std::string("the case \"") + kWatchdogCase +
                    "\" has run past its time limit of 1 s") != std::string::npos);
  CHECK(output.find("in subcase \"the subcase that hangs\"") != std::string::npos);
  CHECK(output.find("names a frame):\nthread ") != std::string::npos);
}

int main(int argc, char** argv) {
  const lockstep::test::Watchdog watchdog;
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;  // --help, --list-test-cases and the like
  if (lockstep::test::cases_run == 0) {
    std::fprintf(stderr, "no test case matched the filters: Note [One case per CTest test]\n");
    return 1;
  }
  constexpr int kExitSkipped = 77;  // CTest's SKIP_RETURN_CODE
  if (result == 0 && lockstep::test::skipped && lockstep::test::cases_run == 1) return kExitSkipped;
  return result;
}
