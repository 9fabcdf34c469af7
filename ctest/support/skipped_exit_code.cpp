// Linked into every end-to-end test program (ctest/CMakeLists.txt, partrain_end_to_end_test): a
// program whose tests all passed or skipped, at least one skipped, exits with 77, which CTest reads
// as "skipped" (SKIP_RETURN_CODE 77 on every test of this folder). Without it GoogleTest exits 0 and
// a case that could not run its check reads as a pass. A failure still exits 1.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

namespace {

class SkippedExitCode : public ::testing::EmptyTestEventListener {
  void OnTestProgramEnd(const ::testing::UnitTest& unit_test) override {
    if (!unit_test.Passed() || unit_test.skipped_test_count() == 0) return;
    std::printf("%d test(s) skipped: exit code 77 (CTest: skipped)\n", unit_test.skipped_test_count());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(77);  // not exit(): GoogleTest's objects are still on the stack
  }
};

// Registered before main (gtest_main) runs; the UnitTest singleton is a function-local static.
const bool registered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SkippedExitCode);
  return true;
}();

}  // namespace
