#pragma once
// Measured costs for any task set from a few measurements (docs/planning.md §Cost models). Every layer
// group (plan_builder's layer_groups: embeddings, encoder.layer.i, ..., head, loss) is profiled at
// microbatch sizes 1, 2, 4, ...; a task set then costs Σ over the groups it touches of (its share of
// the group's FLOPs) × the group's measured forward / backward seconds at that batch size (linear
// interpolation between measured sizes, proportional outside them). Byte counts of parameters,
// stored activations and boundaries are exact from the graph, as in the analytic model; the working
// memory beyond them (peak_bytes − activation_bytes) is the largest measured allocator high-water
// mark of the layers the set touches, less their stored activations. This keeps
// profiling to (layers × batch sizes) measurements while planners may ask about any block range.
#include <cstdint>
#include <memory>
#include <vector>

#include "partition/common/cost_model.h"
#include "profile/profile_db.h"
#include "profile/profile_request.h"

namespace partrain::partition {

/// What to profile for the calibrated model: every layer group at batch 1, 2, 4, ... up to
/// `max_batch` (and `max_batch` itself when it is not a power of two).
std::vector<profile::ProfileRequest> calibration_requests(const Graph& graph, std::int64_t max_batch);

/// The calibrated model over `database` (which must outlive it, belong to `graph`, and hold each
/// layer group at one batch size at least). Throws partrain::Error naming the graph-hash mismatch or
/// the first layer group without measurements. `sub_pipelined_tmp`: Merak's overlap of the
/// tensor-parallel all-reduces (add_tensor_parallel_allreduces).
std::unique_ptr<CostModel> make_calibrated_cost_model(const Graph& graph, const profile::ProfileDB& database,
                                                      const DeviceSpec& device,
                                                      bool sub_pipelined_tmp = false);

}  // namespace partrain::partition
