#pragma once
// CAPSlog: memory-centric partitioning for pipeline parallelism (Dreuning, Bal, van Nieuwpoort,
// "CAPSlog: Scalable Memory-Centric Partitioning for Pipeline Parallelism", PDP 2024; successor of
// their mCAP, Euro-Par 2022). A model is a sequence of L layers placed contiguously on G pipeline
// devices. CAPSlog predicts each device's peak memory from two per-layer figures and picks the layer
// boundaries that minimise the largest per-device peak:
//   M_i(l)  bytes of layer l that do not depend on the schedule (parameters, gradients, optimizer
//           state),
//   M_a(l)  bytes layer l adds per microbatch in flight (activations kept until its backward),
//   M_p(layers P, m) = Σ_{l∈P} M_i(l) + m · Σ_{l∈P} M_a(l)   for a device holding P with m
//           microbatches in flight (1F1B: device g of G holds m = G − g; GPipe: m = M on all).
// Algorithm 1 generates "profiling partitionings" (trimmed profiling runs: only the listed devices
// need to be instantiated and measured) from whose per-device peaks every layer's M_i and M_a are
// solved; Algorithm 2 binary-searches the memory budget with a fill-first placement as the test,
// O((L + G) log M) for a budget range M.
//
// The paper's text was not available to us; the sequences follow the shapes it names
// ([1, …, 1, L−G+1], [Z, 1, …, 1, R] and two-layer sequences), the rest is our reading and is stated
// at each function. Sizes are in bytes.
#include <cstdint>
#include <vector>

#include "graph/graph.h"
#include "partition/cost_model.h"
#include "plan/plan.h"
#include "partition/planner.h"

namespace partrain::partition {

/// Per-layer memory figures, in bytes, indexed by layer (pipeline order).
struct CapslogLayerMemory {
  std::vector<double> isolated;    // M_i(l): independent of the microbatches in flight
  std::vector<double> activation;  // M_a(l): per microbatch in flight
  std::size_t size() const { return isolated.size(); }
};

/// One profiling partitioning: how many consecutive layers each of the G devices holds (Σ = L, each
/// ≥ 1) and the devices whose peak memory the run must record (ascending); the other devices only
/// give the measured ones their pipeline position and can be trimmed away.
struct CapslogProfilingRun {
  std::vector<int> layers_per_device;
  std::vector<int> measured_devices;
};

/// Microbatches in flight per device of a G-device 1F1B pipeline: {G, G−1, …, 1}. Throws
/// partrain::Error for devices < 1.
std::vector<int> capslog_in_flight_1f1b(int devices);

/// CAPSlog Algorithm 1 (our reading): the profiling partitionings for L layers on G devices. For
/// G ≥ 2 and L > G:
///   [1, …, 1, L−G+1]                Z = 1: devices 0..G−2 hold layers 0..G−2 alone (all measured),
///   [Z, 1, …, 1, L−Z−G+2]           Z = 2..L−G: device 1 holds layer Z alone (m = G−1) and device
///                                   G−2 holds layer Z+G−3 alone (m = 2); both measured,
///   [L−G+1, 1, …, 1]                Z = L−G+1: devices 1..G−1 hold the last G−1 layers alone,
///   [2, 1, …, 1, L−G]               two-layer: device 0 holds layers {0, 1} (m = G),
///   [L−G, 1, …, 1, 2]               two-layer: device G−1 holds layers {L−2, L−1} (m = 1).
/// With G ≤ 3 the single-layer devices cannot give two in-flight counts, so every [Z, 1, …, R] run
/// also measures device 0 (the prefix [0, Z), m = G) and device G−1 (the suffix, m = 1), whose
/// differences between consecutive Z give each layer at m = G and m = 1. L = G gives the single
/// partitioning [1, …, 1]. Together the runs let capslog_solve_memory determine
/// M_i and M_a of every layer that can sit at two pipeline positions (every layer but the first and
/// the last, which are always on device 0 and G−1). Duplicated runs are listed once.
/// Throws partrain::Error for G < 2 (one device holds the whole model: there is nothing to split and
/// its memory is a single measurement) or L < G.
std::vector<CapslogProfilingRun> capslog_profiling_runs(int layers, int devices);

/// Solves per-layer M_i and M_a from the measured peaks of profiling runs (CAPSlog's extraction of
/// per-layer statistics): `peaks[r][g]` is the peak bytes of device g in run r (G entries; entries
/// of devices not in runs[r].measured_devices are ignored and may be NaN). `in_flight[g]` is the
/// microbatches in flight on device g (capslog_in_flight_1f1b for 1F1B). Every measured device gives
/// one equation M_p(its layers, in_flight[g]) = peak; the system is solved by least squares
/// (Householder QR), so repeated or redundant measurements are averaged out and exact measurements
/// are reproduced exactly. A layer whose every measurement and every possible position in a G-device
/// contiguous split share one in-flight count m* (always the first and the last layer under 1F1B;
/// every layer under GPipe) cannot have M_i and M_a told apart, and no G-device plan needs it to:
/// its whole memory at m* is reported as M_i, with M_a = 0 (so M_p at m* is exact). Throws
/// partrain::Error for G < 2, mismatched sizes or bad runs (a count < 1, a sum ≠ L, a measured device
/// outside 0..G−1, a non-finite measured peak) and, naming the layer, when the measurements do not
/// determine a layer's figures.
CapslogLayerMemory capslog_solve_memory(int layers, const std::vector<CapslogProfilingRun>& runs,
                                        const std::vector<std::vector<double>>& peaks,
                                        const std::vector<int>& in_flight);

/// M_p: the predicted peak bytes of a device holding layers [first, last) with `in_flight`
/// microbatches in flight: Σ M_i + in_flight · Σ M_a. Throws partrain::Error for a bad range.
double capslog_predict_memory(const CapslogLayerMemory& memory, int first, int last, int in_flight);

/// Predicted peak bytes of every device for a split given as layer counts per device.
std::vector<double> capslog_device_memory(const CapslogLayerMemory& memory, const std::vector<int>& layers_per_device,
                                          const std::vector<int>& in_flight);

/// CAPSlog's fill-first placement under a per-device budget (bytes): each device is filled with as
/// many of the remaining layers as fit before the next device is used, keeping at least one layer
/// for each device still to fill. Devices are filled from the last pipeline stage (fewest
/// microbatches in flight) back to the first, taking layers from the end of the model: with
/// in-flight counts non-increasing along the pipeline this makes the placement succeed for every
/// budget at which some contiguous split fits (a layer moved to a later device never costs more),
/// which filling from the first device does not (a layer pushed forward onto a device with more
/// microbatches in flight can overflow it). Returns the layer counts per device (each ≥ 1, Σ = L),
/// or an empty vector when the layers do not fit. Throws partrain::Error for L < G, in-flight counts
/// that are not ≥ 1 and non-increasing, or negative or non-finite M_i / M_a.
std::vector<int> capslog_fill_first(const CapslogLayerMemory& memory, const std::vector<int>& in_flight, double budget);

/// What the recommender chose.
struct CapslogPartition {
  std::vector<int> layers_per_device;         // consecutive layer counts, Σ = L
  std::vector<double> device_memory_bytes;    // M_p of each device
  double max_memory_bytes = 0;                // the largest of them: the minimal possible maximum
  int budget_steps = 0;                       // fill-first placements tried by the binary search
};

/// CAPSlog Algorithm 2: binary search over the per-device memory budget, with capslog_fill_first as
/// the feasibility test, for the contiguous split of the L layers over G = in_flight.size() devices
/// that minimises the largest predicted device memory. The budget is searched over the ordered bit
/// patterns of non-negative doubles between 0 and M_p(all layers, in_flight[0]) (≤ 64 steps), so the
/// result is the exact minimum of the maximum (equal to brute force over all C(L−1, G−1) splits);
/// O((L + G) log M). Throws partrain::Error as capslog_fill_first.
CapslogPartition capslog_recommend(const CapslogLayerMemory& memory, const std::vector<int>& in_flight);

/// The `capslog` planner: the model's layers (layer_groups in pipeline order, see
/// layer_groups) as CAPSlog layers with, per layer, M_i = parameter bytes ×
/// model_state_factor and M_a = activation bytes of CostModel::measure(layer, per-replica
/// microbatch) — the measured-profile path (capslog_profiling_runs → runtime → capslog_solve_memory)
/// replaces this once the runtime profiles trimmed runs. With activation recomputation on (our
/// extension; CAPSlog has no such term) M_i also holds the layer's activations (one microbatch at a
/// time) and M_a only its boundary inputs. Stage count: options.stages, or the
/// smallest S dividing the world size whose plan fits the device memory; replicas equal_replicas;
/// in-flight counts per stage_memory_policy at options.microbatches (or a reference count: the
/// smallest power of two ≥ S that splits the batch); stages from capslog_recommend; the rest by
/// plan_from_stages. Throws partrain::Error when no stage count fits (with plan_from_stages' message
/// naming the memory needed) or for a model with fewer layers than options.stages.
Plan plan_capslog(const Graph& graph, const CostModel& cost, const PlannerOptions& options);

}  // namespace partrain::partition
