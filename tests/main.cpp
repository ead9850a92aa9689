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
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "skip.hpp"

namespace lockstep::test {
namespace {

std::atomic<bool> skipped{false};
std::atomic<int> cases_run{0};
std::mutex current_case_mutex;
std::string current_case;  // the name of the case running, for the skip log

// Counts the cases that ran, and remembers the name of the one running.
struct CaseCounter : doctest::IReporter {
  explicit CaseCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& data) override {
    ++cases_run;
    const std::lock_guard lock(current_case_mutex);
    current_case = data.m_name;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
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

int main(int argc, char** argv) {
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
