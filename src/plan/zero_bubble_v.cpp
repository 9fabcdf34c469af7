#include "plan/zero_bubble_v.h"

#include <algorithm>
#include <array>
#include <deque>
#include <tuple>

#include "core/error.h"
#include "plan/schedule_topology.h"

namespace partrain {
namespace {

enum class Pass { Forward, Input, Weight };

struct Placed {
  Pass pass;
  int chunk;  // local: 0 is chunk s, 1 is chunk 2S − 1 − s
  int microbatch;
};

// Per model chunk: F, B (with a recomputation the B runs first) and W seconds of one microbatch.
struct ChunkCosts {
  std::vector<double> forward, input, weight;
};

ChunkCosts chunk_costs(const Plan& plan) {
  ChunkCosts costs;
  const bool predicted = std::all_of(plan.stages.begin(), plan.stages.end(),
                                     [](const PlanStage& stage) { return stage.forward_seconds > 0 && stage.backward_seconds > 0; });
  for (const PlanStage& stage : plan.stages) {
    if (!predicted) {
      costs.forward.push_back(1);
      costs.input.push_back(1);
      costs.weight.push_back(1);
      continue;
    }
    const double weight = std::clamp(stage.weight_gradient_seconds, 0.0, stage.backward_seconds);
    costs.forward.push_back(stage.forward_seconds);
    costs.input.push_back(stage.backward_seconds - weight);
    costs.weight.push_back(weight);
  }
  return costs;
}

// The greedy list scheduler over the S pipeline stages; returns each stage's passes in order.
std::vector<std::vector<Placed>> order_passes(const Plan& plan) {
  const int S = plan.pipeline_stages(), M = plan.microbatches, C = 2 * S;
  const ChunkCosts costs = chunk_costs(plan);
  auto chunk_of = [&](int stage, int local) { return local == 0 ? stage : C - 1 - stage; };
  std::vector<std::vector<double>> forward_end(C, std::vector<double>(M, -1)), input_end = forward_end;
  std::vector<double> clock(S, 0);
  std::vector<std::array<int, 2>> next_forward(S, {0, 0}), next_input(S, {0, 0});
  std::vector<std::deque<std::pair<int, int>>> waiting_weight(S);  // (local chunk, microbatch) after its B
  std::vector<int> held(S, 0);                                        // chunk-microbatches before their W
  std::vector<std::vector<Placed>> order(S);
  int limit = 2 * S, placed = 0;
  const int total = 3 * C * M;
  while (placed < total) {
    // (start, priority, stage, pass, local chunk, microbatch) of the pass to place next. Priorities
    // on a tie: F of chunk 2S − 1 − s, F of chunk s, B of chunk s, B of chunk 2S − 1 − s, W.
    std::tuple<double, int, int, Pass, int, int> best{0, -1, -1, Pass::Weight, 0, 0};
    bool found = false;
    auto consider = [&](double start, int priority, int stage, Pass pass, int local, int microbatch) {
      const auto candidate = std::make_tuple(start, priority, stage, pass, local, microbatch);
      if (!found || std::tie(start, priority, stage) < std::tie(std::get<0>(best), std::get<1>(best), std::get<2>(best))) {
        best = candidate;
        found = true;
      }
    };
    for (int s = 0; s < S; ++s) {
      for (int local = 0; local < 2; ++local) {
        const int c = chunk_of(s, local);
        if (const int mb = next_input[s][local]; mb < M) {
          const double ready = c == C - 1 ? forward_end[c][mb] : input_end[c + 1][mb];
          if (ready >= 0) consider(std::max(clock[s], ready), 2 + local, s, Pass::Input, local, mb);
        }
        if (const int mb = next_forward[s][local]; mb < M && held[s] < limit) {
          const double ready = c == 0 ? 0.0 : forward_end[c - 1][mb];
          if (ready >= 0) consider(std::max(clock[s], ready), 1 - local, s, Pass::Forward, local, mb);
        }
      }
      if (!waiting_weight[s].empty())
        consider(clock[s], 4, s, Pass::Weight, waiting_weight[s].front().first, waiting_weight[s].front().second);
    }
    if (!found) {  // every stage waits for memory a W would free only after passes it cannot start
      PARTRAIN_CHECK(limit < 2 * S + C * M, "zb_v: the greedy scheduler cannot place every pass (S = " << S << ", M = " << M << ")");
      ++limit;
      continue;
    }
    const auto [start, priority, s, pass, local, mb] = best;
    const int c = chunk_of(s, local);
    switch (pass) {
      case Pass::Forward:
        clock[s] = start + costs.forward[c];
        forward_end[c][mb] = clock[s];
        ++next_forward[s][local];
        ++held[s];
        break;
      case Pass::Input:
        clock[s] = start + costs.input[c];
        input_end[c][mb] = clock[s];
        ++next_input[s][local];
        waiting_weight[s].emplace_back(local, mb);
        break;
      case Pass::Weight:
        clock[s] = start + costs.weight[c];
        waiting_weight[s].pop_front();
        --held[s];
        break;
    }
    order[s].push_back({pass, local, mb});
    ++placed;
  }
  return order;
}

std::vector<Action> rank_list(const Plan& plan, int rank, const std::vector<Placed>& passes) {
  ChunkListWriter writer(plan, rank);
  for (const Placed& p : passes) {
    switch (p.pass) {
      case Pass::Forward: writer.forward(p.chunk, p.microbatch); break;
      case Pass::Input: writer.backward(p.chunk, p.microbatch, true); break;
      case Pass::Weight: writer.backward_weight(p.chunk, p.microbatch); break;
    }
  }
  return writer.finish();
}

}  // namespace

Schedule generate_zero_bubble_v(const Plan& plan) {
  PARTRAIN_CHECK(plan.schedule == ScheduleKind::ZeroBubbleV && plan.virtual_stages == 2,
                 "zb_v: the plan must have schedule zb_v and virtual_stages = 2");
  const std::vector<std::vector<Placed>> order = order_passes(plan);
  Schedule schedule(plan.world_size);
  for (int rank = 0; rank < plan.world_size; ++rank) schedule[rank] = rank_list(plan, rank, order[plan.placement_of(rank).stage]);
  return schedule;
}

}  // namespace partrain
