// The doctest runner for lockstep_tests and lockstep_mpi_tests.
//
// Note [Skipped cases]
// CTest runs each doctest case alone (doctest_discover_tests), and counts a test as skipped when
// it exits with SKIP_RETURN_CODE, 77. doctest itself has no "skipped" outcome: a case that
// cannot run here calls test::skip (tests/skip.hpp), which only sets a flag, and returns. When
// the run held exactly one case, nothing failed and that case skipped, the binary exits with 77;
// a run of several cases (the binary run by hand) exits as doctest says, 0 when nothing failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>

#include "skip.hpp"

namespace lockstep::test {
namespace {

std::atomic<bool> skipped{false};
std::atomic<int> cases_run{0};

// Counts the cases that ran.
struct CaseCounter : doctest::IReporter {
  explicit CaseCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++cases_run; }
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

}  // namespace

void mark_skipped() noexcept { skipped = true; }

}  // namespace lockstep::test

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;  // --help, --list-test-cases and the like
  constexpr int kExitSkipped = 77;          // CTest's SKIP_RETURN_CODE
  if (result == 0 && lockstep::test::skipped && lockstep::test::cases_run == 1) return kExitSkipped;
  return result;
}
