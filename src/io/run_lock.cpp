#include "io/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "core/error.h"

namespace partrain::io {
namespace {

// The whole (small) lock file read through `descriptor`, from its start.
std::string read_all(int descriptor) {
  std::string text;
  char buffer[512];
  ::lseek(descriptor, 0, SEEK_SET);
  for (ssize_t count; (count = ::read(descriptor, buffer, sizeof buffer)) > 0;) text.append(buffer, count);
  return text;
}

// "host=H\npid=P\nstarted=T\n" -> holder (missing keys stay empty / 0).
RunLockHolder parse_holder(const std::string& text) {
  RunLockHolder holder;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const std::size_t equals = line.find('=');
    if (equals == std::string::npos) continue;
    const std::string key = line.substr(0, equals), value = line.substr(equals + 1);
    if (key == "host") holder.host = value;
    if (key == "pid") holder.pid = std::strtol(value.c_str(), nullptr, 10);
    if (key == "started") holder.started = value;
  }
  return holder;
}

RunLockHolder this_process() {
  RunLockHolder holder;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  holder.host = host;
  holder.pid = static_cast<long>(::getpid());
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char started[32];
  std::strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S", &local);
  holder.started = started;
  return holder;
}

}  // namespace

std::string RunLockHolder::describe() const {
  std::ostringstream text;
  text << "host " << (host.empty() ? "?" : host) << ", pid " << pid << ", started "
       << (started.empty() ? "?" : started);
  return text.str();
}

RunLock RunLock::acquire(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  PARTRAIN_CHECK(!error, "cannot create the directory " << directory << ": " << error.message());
  RunLock lock;
  lock.path_ = (std::filesystem::path(directory) / ".lock").string();
  lock.descriptor_ = ::open(lock.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  PARTRAIN_CHECK(lock.descriptor_ >= 0, "cannot open the lock file " << lock.path_ << ": " << std::strerror(errno));
  if (::flock(lock.descriptor_, LOCK_EX | LOCK_NB) != 0) {
    const int reason = errno;
    const std::string text = read_all(lock.descriptor_);
    PARTRAIN_CHECK(reason == EWOULDBLOCK, "cannot lock " << lock.path_ << ": " << std::strerror(reason));
    PARTRAIN_FAIL(directory << " is in use by another run (" << parse_holder(text).describe() << "; lock file "
                            << lock.path_ << "): give this run another log.dir or checkpoint.dir, or wait for it");
  }
  const std::string previous = read_all(lock.descriptor_);
  if (!previous.empty()) {  // a run that ended normally leaves the file empty: its holder was killed
    lock.took_over_ = true;
    lock.previous_ = parse_holder(previous);
  }
  const RunLockHolder holder = this_process();
  const std::string record =
      "host=" + holder.host + "\npid=" + std::to_string(holder.pid) + "\nstarted=" + holder.started + "\n";
  const bool written = ::ftruncate(lock.descriptor_, 0) == 0 && ::pwrite(lock.descriptor_, record.data(), record.size(),
                                                                         0) == static_cast<ssize_t>(record.size());
  PARTRAIN_CHECK(written, "cannot write the lock file " << lock.path_ << ": " << std::strerror(errno));
  return lock;
}

RunLock::~RunLock() { release(); }

RunLock::RunLock(RunLock&& other) noexcept
    : path_(std::move(other.path_)),
      descriptor_(other.descriptor_),
      took_over_(other.took_over_),
      previous_(std::move(other.previous_)) {
  other.descriptor_ = -1;
}

RunLock& RunLock::operator=(RunLock&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    descriptor_ = other.descriptor_;
    took_over_ = other.took_over_;
    previous_ = std::move(other.previous_);
    other.descriptor_ = -1;
  }
  return *this;
}

void RunLock::release() {
  if (descriptor_ < 0) return;
  // Emptied while still held: the next run sees a clean end, not a lock left by a killed run.
  (void)::ftruncate(descriptor_, 0);
  ::close(descriptor_);  // drops the flock
  descriptor_ = -1;
}

}  // namespace partrain::io
