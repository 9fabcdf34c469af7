#include "io/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace partrain::io {

ProgressBar::ProgressBar(std::string label, bool force)
    : label_(std::move(label)), enabled_(force || isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  if (drawn_ && !finished_) std::fputc('\n', stderr);
}

void ProgressBar::draw(double fraction) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * kWidth);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% %.1fs", label_.c_str(), filled, "##############################",
               kWidth - filled, "", static_cast<int>(fraction * 100), seconds);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::update(double fraction) {
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(fraction);
}

void ProgressBar::finish() {
  if (!enabled_ || finished_) return;
  draw(1.0);
  std::fputc('\n', stderr);
  finished_ = true;
}

}  // namespace partrain::io
