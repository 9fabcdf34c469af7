#pragma once
// Small statistics over measured samples (timings), shared by the profilers and the run reports.
#include <vector>

namespace partrain {

/// The median of `samples` (the mean of the two middle ones for an even count); 0 for none.
double median(std::vector<double> samples);

}  // namespace partrain
