#pragma once
// A one-line progress bar on stderr for long searches (planning) and profiling, drawn only when
// stderr is a terminal or when forced; otherwise it prints nothing, so logs stay clean.
#include <chrono>
#include <string>

namespace partrain::io {

class ProgressBar {
 public:
  /// `label` is printed before the bar. Drawing is on when stderr is a terminal (or `force`).
  explicit ProgressBar(std::string label, bool force = false);
  ~ProgressBar();  // finishes the line if anything was drawn
  /// Sets the fraction done (0..1); redraws at most 10 times a second.
  void update(double fraction);
  /// Draws 100% and ends the line.
  void finish();

 private:
  std::string label_;
  bool enabled_ = false;
  bool drawn_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  void draw(double fraction);
};

}  // namespace partrain::io
