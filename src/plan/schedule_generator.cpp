// The schedule IR's actions and the generators of gpipe, 1f1b, scp, zb_h1 and interleaved action lists
// (plan/schedule.h).
#include <algorithm>
#include <functional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "plan/schedule.h"
#include "plan/schedule_topology.h"
#include "plan/zero_bubble_v.h"

namespace partrain {

// ---------------- actions ----------------

const char* action_kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return "Forward";
    case ActionKind::Backward: return "Backward";
    case ActionKind::Recompute: return "Recompute";
    case ActionKind::BackwardInput: return "BackwardInput";
    case ActionKind::BackwardWeight: return "BackwardWeight";
    case ActionKind::SendActivation: return "SendActivation";
    case ActionKind::ReceiveActivation: return "ReceiveActivation";
    case ActionKind::SendGradient: return "SendGradient";
    case ActionKind::ReceiveGradient: return "ReceiveGradient";
    case ActionKind::AllReduce: return "AllReduce";
    case ActionKind::Step: return "Step";
  }
  return "?";
}

Action Action::forward(int microbatch, std::int64_t begin, std::int64_t end, bool activations_recomputed) {
  Action action;
  action.kind = ActionKind::Forward;
  action.microbatch = microbatch;
  action.sample_begin = begin;
  action.sample_end = end;
  action.activations_recomputed = activations_recomputed;
  return action;
}

Action Action::backward(int microbatch, std::int64_t begin, std::int64_t end) {
  Action action = forward(microbatch, begin, end, false);
  action.kind = ActionKind::Backward;
  return action;
}

Action Action::recompute(int microbatch, std::int64_t begin, std::int64_t end) {
  Action action = forward(microbatch, begin, end, false);
  action.kind = ActionKind::Recompute;
  return action;
}

Action Action::backward_input(int microbatch, std::int64_t begin, std::int64_t end) {
  Action action = forward(microbatch, begin, end, false);
  action.kind = ActionKind::BackwardInput;
  return action;
}

Action Action::backward_weight(int microbatch, std::int64_t begin, std::int64_t end) {
  Action action = forward(microbatch, begin, end, false);
  action.kind = ActionKind::BackwardWeight;
  return action;
}

Action Action::transfer(ActionKind kind, int microbatch, int peer, std::int64_t begin, std::int64_t end) {
  Action action = forward(microbatch, begin, end, false);
  action.kind = kind;
  action.peer = peer;
  PARTRAIN_CHECK(action.is_send() || action.is_receive(),
                 "Action::transfer: " << action_kind_name(kind) << " is not a send or receive");
  return action;
}

Action Action::all_reduce(std::vector<int> group) {
  Action action;
  action.kind = ActionKind::AllReduce;
  action.group = std::move(group);
  return action;
}

Action Action::step() { return Action{}; }

bool Action::is_compute() const {
  return kind == ActionKind::Forward || kind == ActionKind::Backward || kind == ActionKind::Recompute ||
         kind == ActionKind::BackwardInput || kind == ActionKind::BackwardWeight;
}
bool Action::produces_input_gradients() const {
  return kind == ActionKind::Backward || kind == ActionKind::BackwardInput;
}
bool Action::is_send() const { return kind == ActionKind::SendActivation || kind == ActionKind::SendGradient; }
bool Action::is_receive() const {
  return kind == ActionKind::ReceiveActivation || kind == ActionKind::ReceiveGradient;
}

std::string Action::to_string() const {
  std::ostringstream out;
  out << action_kind_name(kind);
  if (kind == ActionKind::Step) return out.str();
  if (kind == ActionKind::AllReduce) {
    out << "(ranks ";
    for (std::size_t k = 0; k < group.size(); ++k) out << (k ? "," : "") << group[k];
    out << ")";
    return out.str();
  }
  out << "(mb " << microbatch;
  if (chunk != 0) out << ", chunk " << chunk;
  if (is_send()) out << ", to " << peer;
  if (is_receive()) out << ", from " << peer;
  out << ", samples [" << sample_begin << "," << sample_end << ")";
  if (kind == ActionKind::Forward && activations_recomputed) out << ", recomputed";
  out << ")";
  return out.str();
}

// ---------------- generation ----------------

namespace {

std::vector<Action> generate_rank(const Plan& plan, int rank) {
  const Placement place = plan.placement_of(rank);
  const int S = static_cast<int>(plan.stages.size());
  const int M = plan.microbatches;
  const int s = place.stage;
  // Plain variables, not a structured binding: the lambdas below capture them (clang < 16 cannot).
  const std::pair<std::int64_t, std::int64_t> samples = plan.replica_samples(s, place.replica);
  const std::int64_t begin = samples.first, end = samples.second;
  const std::vector<Link> previous = links_to(plan, place, s - 1, begin, end);
  const std::vector<Link> next = links_to(plan, place, s + 1, begin, end);
  const ScheduleKind kind = plan.schedule;
  const bool scp = kind == ScheduleKind::ShiftedCriticalPath;
  const bool zero_bubble = kind == ScheduleKind::ZeroBubbleH1;
  const bool recompute =
      recomputes_before_backward(plan.stages[s].recompute) && !(scp && s == S - 1);

  std::vector<Action> list;
  auto emit_forward = [&](int mb) {
    for (const Link& link : previous)
      list.push_back(Action::transfer(ActionKind::ReceiveActivation, mb, link.rank, link.begin, link.end));
    list.push_back(Action::forward(mb, begin, end, recompute));
    for (const Link& link : next)
      list.push_back(Action::transfer(ActionKind::SendActivation, mb, link.rank, link.begin, link.end));
  };
  auto emit_backward = [&](int mb) {
    if (recompute && scp) list.push_back(Action::recompute(mb, begin, end));
    for (const Link& link : next)
      list.push_back(Action::transfer(ActionKind::ReceiveGradient, mb, link.rank, link.begin, link.end));
    if (recompute && !scp) list.push_back(Action::recompute(mb, begin, end));
    list.push_back(zero_bubble ? Action::backward_input(mb, begin, end) : Action::backward(mb, begin, end));
    for (const Link& link : previous)
      list.push_back(Action::transfer(ActionKind::SendGradient, mb, link.rank, link.begin, link.end));
  };

  if (kind == ScheduleKind::GPipe) {
    for (int mb = 0; mb < M; ++mb) emit_forward(mb);
    for (int mb = M - 1; mb >= 0; --mb) emit_backward(mb);
  } else {
    // zb_h1 runs 1F1B's forwards; W(k − s) follows B(k) (ZB-H1's delay of s microbatches on stage s).
    const int warmup = zero_bubble ? std::min(S - s, M) - 1 : microbatches_in_flight(kind, s, S, M, recompute) - 1;
    int weights = 0;  // BackwardWeight actions emitted, in microbatch order
    auto emit_weight_up_to = [&](int last) {
      for (; zero_bubble && weights <= last && weights < M; ++weights) list.push_back(Action::backward_weight(weights, begin, end));
    };
    for (int mb = 0; mb < warmup; ++mb) emit_forward(mb);
    for (int k = 0; k < M - warmup; ++k) {
      emit_forward(warmup + k);
      emit_backward(k);
      emit_weight_up_to(k - s);
    }
    for (int mb = M - warmup; mb < M; ++mb) {
      emit_backward(mb);
      emit_weight_up_to(mb - s);
    }
    emit_weight_up_to(M - 1);
  }

  std::vector<int> group = stage_group(plan, s, place.tensor_rank);
  if (group.size() > 1) list.push_back(Action::all_reduce(std::move(group)));
  list.push_back(Action::step());
  return list;
}

std::vector<Action> generate_interleaved_rank(const Plan& plan, int rank) {
  const Placement place = plan.placement_of(rank);
  ChunkListWriter writer(plan, rank);
  for (const Action& action :
       interleaved_compute_order(plan.pipeline_stages(), plan.virtual_stages, plan.microbatches, place.stage)) {
    if (action.kind == ActionKind::Forward) writer.forward(action.chunk, action.microbatch);
    else writer.backward(action.chunk, action.microbatch, false);
  }
  return writer.finish();
}

}  // namespace

// Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving, Narayanan et al.
// SC'21 §2.2): step i of the M·v forward (or backward) steps runs microbatch
// (i / (S·v))·S + i mod S on local chunk (i mod S·v) / S (backward: v-1 minus that), so S microbatches
// pass through one chunk before the next chunk starts and the bubble shrinks by v.
std::vector<Action> interleaved_compute_order(int stages, int virtual_stages, int microbatches, int stage) {
  const int S = stages, v = virtual_stages, M = microbatches, s = stage;
  PARTRAIN_CHECK(S >= 1 && v >= 1 && M >= 1 && s >= 0 && s < S,
                 "interleaved_compute_order: stage " << s << " of " << S << ", " << v << " chunks, " << M << " microbatches");
  auto chunk_of = [&](int i, bool forward) {
    const int k = i % (S * v) / S;
    return forward ? k : v - 1 - k;
  };
  auto microbatch_of = [&](int i) { return i / (S * v) * S + i % S; };
  auto compute = [&](ActionKind kind, int i) {
    Action action = kind == ActionKind::Forward ? Action::forward(microbatch_of(i), 0, 0, false)
                                                : Action::backward(microbatch_of(i), 0, 0);
    action.chunk = chunk_of(i, kind == ActionKind::Forward);
    return action;
  };
  std::vector<Action> order;
  const int total = M * v;
  const int warmup = M == S ? total : std::min(total, (S - s - 1) * 2 + (v - 1) * S);
  for (int i = 0; i < warmup; ++i) order.push_back(compute(ActionKind::Forward, i));
  for (int i = 0; i < total - warmup; ++i) {
    order.push_back(compute(ActionKind::Forward, warmup + i));
    order.push_back(compute(ActionKind::Backward, i));
  }
  for (int i = total - warmup; i < total; ++i) order.push_back(compute(ActionKind::Backward, i));
  return order;
}

Schedule generate_schedule(const Plan& plan) {
  check_plan_shape(plan);
  if (plan.schedule == ScheduleKind::ZeroBubbleV) return generate_zero_bubble_v(plan);
  Schedule schedule(plan.world_size);
  const bool interleaved = plan.schedule == ScheduleKind::Interleaved && plan.virtual_stages > 1;
  for (int rank = 0; rank < plan.world_size; ++rank)
    schedule[rank] = interleaved ? generate_interleaved_rank(plan, rank) : generate_rank(plan, rank);
  return schedule;
}

int microbatches_in_flight(ScheduleKind kind, int stage, int stages, int microbatches, bool recompute) {
  PARTRAIN_CHECK(stage >= 0 && stage < stages, "stage " << stage << " outside [0, " << stages << ")");
  if (kind == ScheduleKind::GPipe) return microbatches;
  // scp (Merak §6.1): a recomputing stage before the last runs one forward more ahead.
  if (kind == ScheduleKind::ZeroBubbleH1 || kind == ScheduleKind::ZeroBubbleV) return std::min(stages, microbatches);
  const int ahead = kind == ScheduleKind::ShiftedCriticalPath && recompute && stage < stages - 1 ? 1 : 0;
  return std::min(stages - stage + ahead, microbatches);
}

int peak_in_flight(const std::vector<Action>& actions) {
  int in_flight = 0, peak = 0;
  for (const Action& action : actions) {
    if (action.kind == ActionKind::Forward) peak = std::max(peak, ++in_flight);
    if (action.kind == ActionKind::Backward || action.kind == ActionKind::BackwardWeight) --in_flight;
  }
  return peak;
}

std::vector<InFlightState> in_flight_states(const std::vector<Action>& actions, int chunks) {
  std::vector<int> in_flight(static_cast<std::size_t>(std::max(0, chunks)), 0);
  std::set<std::pair<int, std::vector<int>>> seen;  // (computing chunk, counts)
  for (const Action& action : actions) {
    if (!action.is_compute()) continue;
    PARTRAIN_CHECK(action.chunk >= 0 && action.chunk < chunks,
                   "in_flight_states: " << action.to_string() << " is on chunk " << action.chunk << " of " << chunks);
    if (action.kind == ActionKind::Forward) ++in_flight[action.chunk];
    seen.insert({action.chunk, in_flight});
    if (action.kind == ActionKind::Backward || action.kind == ActionKind::BackwardWeight) --in_flight[action.chunk];
  }
  // Keep the states no other state of the same computing chunk holds at least as much as, per chunk.
  std::vector<InFlightState> states;
  for (const auto& state : seen) {  // not a structured binding: clang 14 cannot capture one in a lambda
    const bool dominated = std::any_of(seen.begin(), seen.end(), [&](const auto& other) {
      return other.first == state.first && other.second != state.second &&
             std::equal(state.second.begin(), state.second.end(), other.second.begin(), std::less_equal<int>());
    });
    if (!dominated) states.push_back({state.second, state.first});
  }
  return states;
}

double peak_activation_bytes(std::span<const InFlightState> states, std::span<const double> microbatch_bytes,
                             std::span<const double> working_bytes) {
  double peak = 0;
  for (const InFlightState& state : states) {
    PARTRAIN_CHECK(state.in_flight.size() <= microbatch_bytes.size() &&
                       static_cast<std::size_t>(state.computing) < working_bytes.size(),
                   "peak_activation_bytes: a state of " << state.in_flight.size() << " chunks, figures for "
                                                        << std::min(microbatch_bytes.size(), working_bytes.size()));
    double held = working_bytes[state.computing];
    for (std::size_t c = 0; c < state.in_flight.size(); ++c) held += state.in_flight[c] * microbatch_bytes[c];
    peak = std::max(peak, held);
  }
  return peak;
}

double peak_activation_bytes(const std::vector<Action>& actions, std::span<const double> microbatch_bytes,
                             std::span<const double> working_bytes) {
  int chunks = 0;
  for (const Action& action : actions)
    if (action.is_compute()) chunks = std::max(chunks, action.chunk + 1);
  PARTRAIN_CHECK(static_cast<std::size_t>(chunks) <= std::min(microbatch_bytes.size(), working_bytes.size()),
                 "peak_activation_bytes: the list has chunks up to " << chunks - 1 << ", figures for "
                                                                     << std::min(microbatch_bytes.size(), working_bytes.size()));
  return peak_activation_bytes(in_flight_states(actions, chunks), microbatch_bytes, working_bytes);
}

}  // namespace partrain
