// One run per directory (io/run_lock.h): a second lock on a held directory fails naming the holder,
// a lock released normally leaves no trace, and a lock whose holder died (a child process that
// exits without releasing it) is taken over and reported.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "io/run_lock.h"

namespace {

namespace fs = std::filesystem;
using namespace partrain;
using namespace partrain::io;

class RunLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() / ("partrain-run-lock-" + std::to_string(::getpid()));
    fs::remove_all(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }
  std::string run_directory() const { return (directory_ / "run").string(); }

  fs::path directory_;
};

TEST_F(RunLockTest, SecondLockFailsNamingTheHolder) {
  const RunLock first = RunLock::acquire(run_directory());  // creates the directory
  EXPECT_TRUE(fs::is_regular_file(run_directory() + "/.lock"));
  EXPECT_FALSE(first.took_over());
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  try {
    const RunLock second = RunLock::acquire(run_directory());  // another open file: flock refuses it
    FAIL() << "expected partrain::Error";
  } catch (const Error& error) {
    const std::string message = error.message();
    EXPECT_NE(message.find(run_directory() + " is in use by another run"), std::string::npos) << message;
    EXPECT_NE(message.find("pid " + std::to_string(::getpid())), std::string::npos) << message;
    EXPECT_NE(message.find("host " + std::string(host)), std::string::npos) << message;
    EXPECT_NE(message.find("started 20"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST_F(RunLockTest, ReleasedLockIsTakenCleanly) {
  { const RunLock first = RunLock::acquire(run_directory()); }
  EXPECT_EQ(fs::file_size(run_directory() + "/.lock"), 0u);  // a normal end empties the file
  const RunLock second = RunLock::acquire(run_directory());
  EXPECT_FALSE(second.took_over());
  RunLock moved = RunLock::acquire((directory_ / "other").string());
  moved = RunLock();  // move-assigning releases the lock it held
  EXPECT_NO_THROW(RunLock::acquire((directory_ / "other").string()));
}

TEST_F(RunLockTest, LockOfADeadHolderIsTakenOver) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // takes the lock and dies without releasing it (as under SIGKILL)
    try {
      new RunLock(RunLock::acquire(run_directory()));
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const RunLock lock = RunLock::acquire(run_directory());
  EXPECT_TRUE(lock.took_over());
  EXPECT_EQ(lock.previous_holder().pid, static_cast<long>(child));
  EXPECT_NE(lock.previous_holder().describe().find("pid " + std::to_string(child)), std::string::npos);
  std::ifstream file(run_directory() + "/.lock");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("pid=" + std::to_string(::getpid())), std::string::npos) << text;
}

TEST_F(RunLockTest, UncreatableDirectoryIsNamed) {
  fs::create_directories(directory_);
  std::ofstream(directory_ / "file") << "x";
  try {
    RunLock::acquire((directory_ / "file" / "run").string());
    FAIL() << "expected partrain::Error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find((directory_ / "file" / "run").string()), std::string::npos) << error.message();
  }
}

}  // namespace
