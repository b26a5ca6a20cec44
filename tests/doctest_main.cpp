// The single main() for every doctest executable of the suite, and a listener that keeps the
// counts honest. doctest alone counts a case as passed when it did not fail, so a case that
// returned early (no GPU, no dataset) or forgot to check anything would read as a pass. Here:
//  - a case that ran DDP_SKIP_IF (tests/skip.h) is counted as skipped, and its reason printed;
//  - a case that passed without running a single assertion is a failure, named in the output,
//    and the executable exits with status 1.
// After doctest's own summary, main() prints the corrected one, which scripts/summarize_tests.py
// reads:
//   [ddplab] test cases: 40 | 37 passed | 0 failed | 3 skipped
// Unlike doctest's line, it does not count the cases left out by --test-case as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <iostream>
#include <string>

#include "skip.h"

namespace {

struct Counts {
  int passed = 0;
  int failed = 0;
  int skipped = 0;
};

Counts counts;
std::ostream* out = &std::cout;  // doctest's output stream (--out=FILE changes it)

// The running case: its name, and whether DDP_SKIP_IF ended it.
std::string current_case;
bool current_skipped = false;

// Sees every case end and sorts it into passed, failed or skipped.
class HonestCounts : public doctest::IReporter {
 public:
  explicit HonestCounts(const doctest::ContextOptions& options) { out = options.cout; }

  void test_case_start(const doctest::TestCaseData& tc) override {
    current_case = tc.m_name;
    current_skipped = false;
  }

  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    if (!stats.testCaseSuccess) {
      ++counts.failed;  // doctest has already said why
    } else if (current_skipped) {
      ++counts.skipped;
    } else if (stats.numAssertsCurrentTest == 0) {
      ++counts.failed;
      *out << "[ddplab] FAILED: test case '" << current_case
           << "' passed without running a single assertion; check something, or end it with "
              "DDP_SKIP_IF (tests/skip.h) when it cannot run here\n";
    } else {
      ++counts.passed;
    }
  }

  // Called for the cases a --test-case filter leaves out too; only a skip decorator is a skip.
  void test_case_skipped(const doctest::TestCaseData& tc) override {
    if (tc.m_skip) {
      ++counts.skipped;
      *out << "[ddplab] skipped: " << tc.m_name << ": doctest::skip decorator\n";
    }
  }

  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
};

REGISTER_LISTENER("ddplab_honest_counts", 1, HonestCounts);

}  // namespace

void ddplab::testing::skip_test_case(const std::string& reason) {
  current_skipped = true;
  *out << "[ddplab] skipped: " << current_case << ": " << reason << "\n";
}

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (context.shouldExit()) return status;  // --help, --list-test-cases, ...
  *out << "[ddplab] test cases: " << counts.passed + counts.failed + counts.skipped << " | "
       << counts.passed << " passed | " << counts.failed << " failed | " << counts.skipped
       << " skipped" << std::endl;
  return status != 0 || counts.failed > 0 ? 1 : 0;
}
