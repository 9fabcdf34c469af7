// The overlapped, bucketed gradient all-reduce (issue 18; PyTorch DDP's design) seen in a real run:
// gpt-tiny on 2 data-parallel replicas with 4 KiB buckets and a trace. On every rank and step, each
// bucket's all-reduce is its own span on the all-reduce track, at least two buckets start while the
// step's last backward computes (after it began, before it ended), and every bucket has ended when
// the AllReduce action (waiting for them, before the optimizer step) ends.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/partrain_runs.h"

namespace partrain {
namespace {

constexpr int kSteps = 3;

struct Span {
  std::string name;
  double start = 0, end = 0;
};

TEST(OverlappedAllReduce, BucketSpansStartDuringTheLastBackward) {
  const std::string directory = std::string(PARTRAIN_RUN_DIR) + "/overlap-" + std::to_string(::getpid());
  std::ostringstream arguments;
  arguments << "train " << PARTRAIN_SOURCE_DIR << "/configs/gpt-tiny.toml --set train.steps=" << kSteps
            << " --set train.global_batch=8 --set train.microbatches=2 --set parallel.planner=manual"
            << " --set parallel.stages=1 --set 'parallel.replicas=[2]' --set parallel.schedule=gpipe"
            << " --set parallel.recompute=none --set parallel.bucket_mb=0.004 --set profile.enabled=false"
            << " --set log.dir=" << directory << " --set log.trace=trace.json --set checkpoint.every=0"
            << " --set train.eval_every=0 --set data.path=" << PARTRAIN_DATA_DIR << "/text.h5";
  const testing::PartrainRun run = testing::run_partrain(2, arguments.str(), directory + ".log");
  ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;

  // Per (rank, step): the actions (track 0) and the bucket all-reduces (track 1), in trace order.
  std::map<std::pair<int, std::int64_t>, std::vector<Span>> actions, buckets;
  const nlohmann::json trace = nlohmann::json::parse(std::ifstream(directory + "/trace.json"));
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    if (event.value("ph", "") != "X") continue;
    const std::pair<int, std::int64_t> key{event.at("pid").get<int>(), event.at("args").at("step").get<std::int64_t>()};
    const Span span{event.at("name").get<std::string>(), event.at("ts").get<double>(),
                    event.at("ts").get<double>() + event.at("dur").get<double>()};
    (event.at("tid").get<int>() == 0 ? actions : buckets)[key].push_back(span);
    if (event.at("tid").get<int>() != 0) {
      EXPECT_EQ(event.at("tid").get<int>(), 1);
      EXPECT_EQ(event.at("cat").get<std::string>(), "communication");
    }
  }
  for (int rank = 0; rank < 2; ++rank) {
    for (std::int64_t step = 0; step < kSteps; ++step) {
      SCOPED_TRACE("rank " + std::to_string(rank) + " step " + std::to_string(step));
      const std::vector<Span>& own = actions[{rank, step}];
      const std::vector<Span>& reduces = buckets[{rank, step}];
      auto last_backward = std::find_if(own.rbegin(), own.rend(), [](const Span& span) { return span.name.starts_with("Backward"); });
      auto all_reduce = std::find_if(own.begin(), own.end(), [](const Span& span) { return span.name == "AllReduce"; });
      ASSERT_NE(last_backward, own.rend());
      ASSERT_NE(all_reduce, own.end());
      ASSERT_GE(reduces.size(), 4u) << "4 KiB buckets of gpt-tiny's gradients";
      int during_backward = 0;
      for (std::size_t b = 0; b < reduces.size(); ++b) {
        EXPECT_EQ(reduces[b].name, "AllReduce bucket " + std::to_string(b));
        if (b > 0) {
          EXPECT_GE(reduces[b].start, reduces[b - 1].start) << "buckets start in order";
        }
        EXPECT_GE(reduces[b].start, last_backward->start) << "bucket " << b << " starts in the last backward";
        EXPECT_LE(reduces[b].end, all_reduce->end + 1) << "bucket " << b << " is waited for before the step";
        if (reduces[b].start < last_backward->end) ++during_backward;
      }
      EXPECT_GE(during_backward, 2) << "bucket all-reduces overlap the last backward";
    }
  }
  std::filesystem::remove_all(directory);
}

}  // namespace
}  // namespace partrain
