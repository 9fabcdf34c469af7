#pragma once
// Pipeline schedules as data (docs/parallelism.md §Pipeline schedules), the schedule IR of the plan
// layer. A generator (schedule_generator.cpp) turns a Plan (its stages, replicas, pipeline replicas,
// microbatch count, schedule kind and recompute policies) into one list of actions per rank; the
// executor runs a rank's list, the checker (schedule_checker.h) runs all lists together to prove them
// deadlock-free and complete, and the timeline simulator (schedule_simulator.h) runs them with
// per-stage costs to predict the step time and the bubble fraction.
//
// Communication semantics the lists are written for: sends are non-blocking (buffered: posting one
// never waits for the receiver), receives block until the matching send was posted, and AllReduce is
// a collective that completes once every member of its group has reached it. Messages match by
// (sender, receiver, kind, microbatch, receiving model chunk); the sample range must agree.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace partrain {

/// What one action of a rank's list does.
enum class ActionKind {
  Forward,            // forward pass of the rank's samples of a microbatch
  Backward,           // backward pass of a microbatch (accumulates parameter gradients)
  BackwardInput,      // zero-bubble B: the input-gradient half of a backward (what the previous stage waits for)
  BackwardWeight,     // zero-bubble W: the weight-gradient half, after its BackwardInput (deferrable)
  Recompute,          // re-run the forward of a microbatch from its kept boundary inputs
  SendActivation,     // send stage outputs (samples [begin, end)) to a rank of the next stage
  ReceiveActivation,  // receive stage inputs (samples [begin, end)) from a rank of the previous stage
  SendGradient,       // send input gradients (samples [begin, end)) to a rank of the previous stage
  ReceiveGradient,    // receive output gradients (samples [begin, end)) from a rank of the next stage
  AllReduce,          // sum the stage's parameter gradients over its data-parallel group
  Step,               // optimizer step (the executor also does the global-norm clipping here)
};

/// "Forward", "Backward", "Recompute", "SendActivation", ... (the enumerator's name).
const char* action_kind_name(ActionKind kind);

/// One entry of a rank's schedule. Sample ranges are offsets inside the microbatch of the rank's
/// pipeline replica, [0, Plan::microbatch_size()).
struct Action {
  ActionKind kind = ActionKind::Step;
  int microbatch = -1;           // -1 for AllReduce and Step
  int peer = -1;                 // the other rank of a send or receive; -1 otherwise
  /// Interleaved schedule: which of the rank's model chunks (virtual stages) the action belongs to,
  /// [0, Plan::virtual_stages); model chunk chunk · S + the rank's stage. 0 for the other schedules.
  int chunk = 0;
  std::int64_t sample_begin = 0; // send/receive: the samples that move; compute: the rank's samples
  std::int64_t sample_end = 0;
  /// Forward only: true when the forward keeps just its boundary inputs (the stage's inputs) and a
  /// Recompute of the same microbatch rebuilds the activations before its Backward (to_string
  /// shows it as ", recomputed").
  bool activations_recomputed = false;
  /// AllReduce only: the ranks of the group, ascending (the stage's replicas in every pipeline replica,
  /// this rank included).
  std::vector<int> group;

  /// Compute actions on the rank's samples [begin, end) of a microbatch.
  static Action forward(int microbatch, std::int64_t begin, std::int64_t end, bool activations_recomputed);
  static Action backward(int microbatch, std::int64_t begin, std::int64_t end);
  static Action recompute(int microbatch, std::int64_t begin, std::int64_t end);
  static Action backward_input(int microbatch, std::int64_t begin, std::int64_t end);
  static Action backward_weight(int microbatch, std::int64_t begin, std::int64_t end);
  /// A send or receive kind with its peer rank and sample range; throws partrain::Error for another kind.
  static Action transfer(ActionKind kind, int microbatch, int peer, std::int64_t begin, std::int64_t end);
  /// The gradient all-reduce over `group` (ranks, ascending) and the optimizer step.
  static Action all_reduce(std::vector<int> group);
  static Action step();

  bool is_compute() const;  // Forward, Backward, BackwardInput, BackwardWeight or Recompute
  /// Backward or BackwardInput: the action after which the input gradients can be sent.
  bool produces_input_gradients() const;
  bool is_send() const;     // SendActivation or SendGradient
  bool is_receive() const;  // ReceiveActivation or ReceiveGradient

  /// Readable form, e.g. "ReceiveActivation(mb 3, from 2, samples [0,4))", "Forward(mb 3, recomputed)",
  /// "Forward(mb 3, chunk 1, samples [0,4))" (the chunk shown when not 0),
  /// "AllReduce(ranks 1,5)", "Step".
  std::string to_string() const;
  bool operator==(const Action& other) const = default;
};

/// One list of actions per rank, indexed by rank.
using Schedule = std::vector<std::vector<Action>>;

/// Builds every rank's list for plan.schedule:
///  * gpipe: all forwards (microbatch 0..M-1), then all backwards in reverse order (RaNNC);
///  * 1f1b: PipeDream-flush — stage s runs min(S-s-1, M) warm-up forwards, then alternates one
///    forward and one backward, then the remaining backwards;
///  * scp: Merak's shifted critical path on top of 1F1B order — the last stage never recomputes (its
///    backward follows its forward directly), and the other recomputing stages run Recompute(mb)
///    before ReceiveGradient(mb), so the recomputation overlaps the wait for the gradient instead of
///    lying on the critical path (Merak's RecomputeRecvGrad / pre-checkpoint forward); and every
///    recomputing stage but the last runs one forward more ahead (Merak §6.1: "bring one forward
///    pass computation of the second to last stage ahead and fill it into the bubble"; the stages
///    before it too, so that its extra input is there), which moves the critical path to stage
///    S − 2: with uniform stages, forward T, recomputation T, backward 2T, a step takes
///    (4M + 3(S − 2))T instead of 1F1B's 4(M + S − 1)T.
///  * interleaved (Megatron-LM's interleaved 1F1B, Narayanan et al. SC'21 §2.2): each rank runs v
///    model chunks; the M·v (microbatch, chunk) forward steps go in groups of S microbatches through
///    chunk 0, then chunk 1, ... (backwards through the chunks in reverse); stage s runs
///    min((S-s-1)·2 + (v-1)·S, M·v) warm-up forward steps (all of them when M = S), then alternates
///    one forward and one backward step, then the remaining backward steps. The last chunk of stage
///    S-1 sends to the next chunk on stage 0. With v = 1 it is 1f1b. Needs M a multiple of S.
///  * zb_h1 (Qi et al. 2024 §2.1, ZB-H1): 1F1B's forwards and warm-up, each Backward split into a
///    BackwardInput (B) in 1F1B's place and a BackwardWeight (W) that stage s delays by s
///    microbatches: W(k − s) follows B(k) in the steady state, the rest run during the cool-down and
///    after it, where 1F1B idles. Every stage then holds min(S, M) microbatches between Forward
///    and BackwardWeight, as 1F1B's first stage does; with equal stage costs and F = B = W the step
///    takes (3M + S − 1)·F against 1F1B's 3(M + S − 1)·F: a third of its bubble.
///  * zb_v: two model chunks per rank in a V (plan/zero_bubble_v.h).
/// Every stage whose policy is StageBoundaries or StageAware gets Recompute(mb) right before
/// Backward(mb) (scp: before its gradient receives) and Forward(mb).activations_recomputed set; which layers a
/// StageAware stage really recomputes is the executor's business. Receives are placed right before
/// the compute that needs them, sends right after the compute that produces them. With unequal
/// replica counts each replica handles plan.replica_samples(stage, replica) of every microbatch and
/// exchanges exactly the intersecting sample ranges with the replicas of the neighbouring stages of
/// its own pipeline replica. Each list ends with AllReduce (when the stage's data-parallel group has
/// more than one rank) and Step.
/// Throws partrain::Error when the plan has no stages, a non-positive replica or microbatch count,
/// world_size ≠ pipeline replicas × devices, or a microbatch smaller than a stage's replica count.
Schedule generate_schedule(const Plan& plan);

/// Microbatches whose activations stage `stage` of `stages` holds at its peak under `kind`: those
/// between their Forward and the end of their backward. GPipe M; 1F1B min(S − s, M); scp one more on
/// a recomputing stage before the last (min(S − s + 1, M)); zb_h1 min(S, M) on every stage (its
/// deferred weight-gradient halves keep what they read). Throws partrain::Error for a stage outside [0, S).
int microbatches_in_flight(ScheduleKind kind, int stage, int stages, int microbatches, bool recompute);

/// Largest number of microbatches whose Forward has run and whose Backward (or BackwardWeight) has
/// not, along the list (activation memory held at once; 1F1B: min(S-s, M) on stage s).
int peak_in_flight(const std::vector<Action>& actions);
/// Megatron-LM's interleaved 1F1B compute order on pipeline stage `stage` of `stages`, each rank
/// holding `virtual_stages` model chunks, over `microbatches` (a multiple of `stages`): the Forward
/// and Backward actions (microbatch, local chunk; no sample ranges) in the order generate_schedule
/// emits them for that stage's ranks. Throws partrain::Error for a stage outside [0, stages) or a
/// non-positive count.
std::vector<Action> interleaved_compute_order(int stages, int virtual_stages, int microbatches, int stage);

/// One moment of a rank's list, at a compute action: how many microbatches of each of its chunks
/// are between their Forward and the end of their backward, and which chunk computes.
struct InFlightState {
  std::vector<int> in_flight;  // per local chunk (Action::chunk)
  int computing = 0;
};
/// The states of `actions` (a rank's list over `chunks` local chunks) at its compute actions, less
/// those another state with the same computing chunk holds at least as much of in every chunk: the
/// peak for any per-chunk byte figures is reached at one of them. Throws partrain::Error for an
/// action on a chunk outside [0, chunks).
std::vector<InFlightState> in_flight_states(const std::vector<Action>& actions, int chunks);
/// Largest activation bytes held at once over `states`: the stored bytes of every (chunk,
/// microbatch) in flight, per chunk `microbatch_bytes[chunk]`, plus `working_bytes[chunk]` of the
/// chunk computing. Throws partrain::Error when the figures cover fewer chunks than the states.
double peak_activation_bytes(std::span<const InFlightState> states, std::span<const double> microbatch_bytes,
                             std::span<const double> working_bytes);
/// peak_activation_bytes over the in_flight_states of a rank's list. Throws partrain::Error when the
/// figures cover fewer chunks than the list uses.
double peak_activation_bytes(const std::vector<Action>& actions, std::span<const double> microbatch_bytes,
                             std::span<const double> working_bytes);
}  // namespace partrain
