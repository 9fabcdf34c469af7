#pragma once
// The `uniform` planner: the Megatron-LM / DeepSpeed baseline that splits the repeated layers
// (encoder.layer.i, h.i, ResNet blocks layerK.i) into S stages of equal layer counts, plus helpers
// of its split (is_repeated_layer, uniform_stage_ranges). The reference microbatch count of the
// layer-level planners capslog and merak is in common/microbatches.h.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "partition/common/cost_model.h"
#include "plan/plan.h"
#include "partition/common/plan_builder.h"
#include "partition/common/planner_options.h"

namespace partrain::partition {

/// True for the name of a repeated block: a dotted name whose last component is a number
/// ("encoder.layer.3", "h.11", "layer2.1"); false for "embeddings", "stem", "head", "loss", ….
bool is_repeated_layer(const std::string& layer_name);

/// The uniform split of `groups` (pipeline order) into `stages` stages, as [first, last) group
/// ranges: the R repeated groups (is_repeated_layer) are dealt out in equal counts, the first R % S
/// stages one more; groups before the first repeated one (embeddings, stem) go to the first stage,
/// groups after the last (pooler, ln_f, head, loss) to the last, and a non-repeated group between
/// repeated ones stays with the repeated group before it. A model without repeated groups has all
/// its groups dealt out this way. Throws partrain::Error when stages < 1 or stages > R.
std::vector<std::pair<std::size_t, std::size_t>> uniform_stage_ranges(const std::vector<LayerGroup>& groups, int stages);

/// The `uniform` planner (Megatron-LM / DeepSpeed baseline): stages from uniform_stage_ranges over
/// layer_groups. S = options.stages; when 0, S = the world size (one device per stage)
/// capped at the number of repeated layers and lowered to a divisor of the world size, so a
/// 2-layer model on 4 devices gets 2 stages of 2 replicas. Replicas per stage equal_replicas;
/// microbatches, predictions and the memory check by plan_from_stages. Throws partrain::Error for
/// more stages than repeated layers, a stage count that does not divide the world size, or a plan
/// that does not fit the device memory. Interleaved schedule with options.virtual_stages = v: S·v
/// model chunks from uniform_stage_ranges (each needs a repeated layer; S auto ≤ layers / v), chunk
/// c on pipeline stage c mod S; with options.virtual_stages = 0 every v from 1 to layers / S is
/// planned and the fastest predicted plan that fits is returned (S chosen first as for v = 1).
Plan plan_uniform(const Graph& graph, const CostModel& cost, const PlannerOptions& options);

}  // namespace partrain::partition
