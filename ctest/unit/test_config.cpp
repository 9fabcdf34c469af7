// Experiment files: typed [model] reading, --set overrides, errors naming file, line and key, and
// every file in configs/ parsing and building.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/config.h"
#include "models/model.h"
#include "support/errors.h"

namespace partrain {
namespace {

const std::string kConfigs = std::string(PARTRAIN_SOURCE_DIR) + "/configs";

using testing::error_message;

ModelConfig read(const std::string& text, const std::vector<std::string>& overrides = {}) {
  const ConfigDocument document = ConfigDocument::parse(text, "configs/x.toml", overrides);
  document.check_sections(known_config_sections());
  return read_model_config(document);
}

TEST(Config, ReadsTypedModelKeysWithTypeDefaults) {
  const ModelConfig bert = read("[model]\ntype = \"bert\"\nlayers = 4\nhidden = 256\nheads = 4\ndropout = 0\nnsp = false\n");
  EXPECT_EQ(bert.type, "bert");
  EXPECT_EQ(bert.layers, 4);
  EXPECT_EQ(bert.hidden, 256);
  EXPECT_EQ(bert.intermediate_size(), 1024);
  EXPECT_EQ(bert.vocab, 30522);
  EXPECT_FALSE(bert.nsp);
  EXPECT_DOUBLE_EQ(bert.dropout, 0.0);
  EXPECT_DOUBLE_EQ(bert.layer_norm_epsilon(), 1e-12);
  const ModelConfig gpt = read("[model]\ntype = \"gpt\"\n");
  EXPECT_EQ(gpt.vocab, 50257);
  EXPECT_EQ(gpt.max_position, 1024);
  EXPECT_DOUBLE_EQ(gpt.layer_norm_epsilon(), 1e-5);
}

TEST(Config, OtherKnownSectionsAreAcceptedForNow) {
  EXPECT_NO_THROW(read("[model]\ntype = \"resnet\"\n[train]\nsteps = 10\n[parallel]\n[data]\n[log]\n[checkpoint]\n"));
}

TEST(Config, LogOpProfileIsOffByDefaultAndParses) {
  EXPECT_FALSE(read_log_config(ConfigDocument::parse("[log]\n", "configs/x.toml")).op_profile);
  EXPECT_TRUE(read_log_config(ConfigDocument::parse("[log]\nop_profile = true\n", "configs/x.toml")).op_profile);
  EXPECT_TRUE(read_log_config(ConfigDocument::parse("[log]\n", "configs/x.toml", std::vector<std::string>{"log.op_profile=true"}))
                  .op_profile);
  const std::string error = error_message(
      [] { read_log_config(ConfigDocument::parse("[log]\nop_profile = \"yes\"\n", "configs/x.toml")); });
  EXPECT_NE(error.find("configs/x.toml:2: [log] key 'op_profile'"), std::string::npos) << error;
}

TEST(Config, ReadsTrainAndParallelSections) {
  const ConfigDocument document = ConfigDocument::parse(
      "[model]\ntype = \"bert\"\n[train]\nsteps = 20\nglobal_batch = 16\noptimizer = \"sgd\"\nlr = 0.1\n"
      "[parallel]\nplanner = \"manual\"\ndevice_memory = \"8GiB\"\nstages = 3\nreplicas = [2, 1, 1]\n"
      "boundaries = [\"encoder.layer.0\", \"encoder.layer.1\"]\n",
      "configs/x.toml", std::vector<std::string>{"parallel.schedule=gpipe"});
  const TrainConfig train = read_train_config(document);
  EXPECT_EQ(train.steps, 20);
  EXPECT_EQ(train.global_batch, 16);
  EXPECT_EQ(train.optimizer, "sgd");
  EXPECT_DOUBLE_EQ(train.lr, 0.1);
  const ParallelConfig parallel = read_parallel_config(document);
  EXPECT_EQ(parallel.planner, "manual");
  EXPECT_DOUBLE_EQ(parallel.device_memory_bytes, 8.0 * (1ull << 30));
  EXPECT_EQ(parallel.schedule, "gpipe");
  EXPECT_EQ(parallel.replicas, (std::vector<std::int64_t>{2, 1, 1}));
  EXPECT_EQ(parallel.boundaries, (std::vector<std::string>{"encoder.layer.0", "encoder.layer.1"}));
}

TEST(Config, TrainAndParallelErrorsNameTheKey) {
  auto parallel_error = [](const std::string& text) {
    return error_message([&] { read_parallel_config(ConfigDocument::parse(text, "configs/x.toml")); });
  };
  EXPECT_EQ(parallel_error("[parallel]\ndevice_memory = \"8 parsecs\"\n").substr(0, 54),
            "configs/x.toml:2: [parallel] key 'device_memory' is no");
  EXPECT_EQ(parallel_error("[parallel]\nreplicas = [2, \"x\"]\n"),
            "configs/x.toml:2: [parallel] key 'replicas' must hold only integers, not a string");
  EXPECT_EQ(parallel_error("[parallel]\nstages = 3\nboundaries = [\"h.1\"]\n"),
            "configs/x.toml:3: [parallel] key 'boundaries' needs stages - 1 = 2 entries, not 1");
  EXPECT_EQ(parallel_error("[parallel]\nplanner = \"magic\"\n"),
            "configs/x.toml:2: [parallel] key 'planner' is 'magic'; expected one of rannc ideals dpl ip capslog merak "
            "uniform manual");
  const std::string train_error = error_message(
      [] { read_train_config(ConfigDocument::parse("[train]\nglobal_batch = 4\nmicrobatches = 8\n", "configs/x.toml")); });
  EXPECT_EQ(train_error, "configs/x.toml:3: [train] key 'microbatches' exceeds global_batch 4");
}

TEST(Config, Fp16LossScalingKeysAreCheckedNamingTheKey) {
  const TrainConfig defaults = read_train_config(ConfigDocument::parse("[train]\nprecision = \"fp16\"\n", "configs/x.toml"));
  EXPECT_EQ(defaults.precision, "fp16");
  EXPECT_EQ(defaults.initial_loss_scale, 65536.0);
  EXPECT_EQ(defaults.loss_scale_growth_factor, 2.0);
  EXPECT_EQ(defaults.loss_scale_backoff_factor, 0.5);
  EXPECT_EQ(defaults.loss_scale_growth_interval, 2000);
  EXPECT_EQ(defaults.min_loss_scale, 0.0);
  auto train_error = [](const std::string& line) {
    return error_message([&] { read_train_config(ConfigDocument::parse("[train]\n" + line + "\n", "configs/x.toml")); });
  };
  EXPECT_EQ(train_error("initial_loss_scale = -1.0"), "configs/x.toml:2: [train] key 'initial_loss_scale' must be positive and finite");
  EXPECT_EQ(train_error("loss_scale_growth_factor = 1.0"),
            "configs/x.toml:2: [train] key 'loss_scale_growth_factor' must be greater than 1");
  EXPECT_EQ(train_error("loss_scale_backoff_factor = 1.5"),
            "configs/x.toml:2: [train] key 'loss_scale_backoff_factor' must be in (0, 1)");
  EXPECT_EQ(train_error("loss_scale_backoff_factor = 0.0"),
            "configs/x.toml:2: [train] key 'loss_scale_backoff_factor' must be in (0, 1)");
  EXPECT_EQ(train_error("loss_scale_growth_interval = 0"),
            "configs/x.toml:2: [train] key 'loss_scale_growth_interval' must be at least 1");
  EXPECT_EQ(train_error("min_loss_scale = 1e6"), "configs/x.toml:2: [train] key 'min_loss_scale' must be in [0, initial_loss_scale]");
  EXPECT_EQ(train_error("precision = \"fp8\""),
            "configs/x.toml:2: [train] key 'precision' is 'fp8'; expected one of fp32 bf16 fp16");
}

TEST(Config, InterleavedScheduleKeys) {
  auto parallel_error = [](const std::string& text) {
    return error_message([&] { read_parallel_config(ConfigDocument::parse(text, "configs/x.toml")); });
  };
  const ParallelConfig parallel = read_parallel_config(ConfigDocument::parse(
      "[parallel]\nschedule = \"interleaved\"\nvirtual_stages = 2\nstages = 2\n"
      "boundaries = [\"h.0\", \"h.1\", \"ln_f\"]\n",
      "configs/x.toml"));
  EXPECT_EQ(parallel.schedule, "interleaved");
  EXPECT_EQ(parallel.virtual_stages, 2);
  EXPECT_EQ(parallel_error("[parallel]\nvirtual_stages = 2\n"),
            "configs/x.toml:2: [parallel] key 'virtual_stages' = 2 needs schedule = \"interleaved\" (Megatron's "
            "interleaved 1F1B), not \"1f1b\"");
  EXPECT_EQ(parallel_error("[parallel]\nschedule = \"interleaved\"\nvirtual_stages = -1\n"),
            "configs/x.toml:3: [parallel] key 'virtual_stages' must be at least 1 (model chunks per pipeline rank; 1: "
            "plain 1f1b), or \"auto\"");
  EXPECT_EQ(read_parallel_config(ConfigDocument::parse("[parallel]\nschedule = \"interleaved\"\nvirtual_stages = \"auto\"\n",
                                                       "configs/x.toml"))
                .virtual_stages,
            0);
  EXPECT_EQ(parallel_error("[parallel]\nvirtual_stages = \"auto\"\n"),
            "configs/x.toml:2: [parallel] key 'virtual_stages' = \"auto\" needs schedule = \"interleaved\", not \"1f1b\"");
  EXPECT_EQ(parallel_error("[parallel]\nschedule = \"interleaved\"\nvirtual_stages = 2\nstages = 2\nboundaries = [\"h.1\"]\n"),
            "configs/x.toml:5: [parallel] key 'boundaries' needs stages x virtual_stages - 1 = 3 entries (the first "
            "layers of model chunks 2..S·v), not 1");
  const std::string microbatches = error_message([] {
    // The whole-file reader checks across sections.
    const std::string path = std::filesystem::temp_directory_path() / "partrain-interleaved-config.toml";
    {
      std::ofstream out(path);
      out << "[model]\ntype = \"gpt\"\n[train]\nmicrobatches = 3\n[parallel]\nschedule = \"interleaved\"\n"
             "virtual_stages = 2\nstages = 2\n";
    }
    load_experiment(path, {});
  });
  EXPECT_NE(microbatches.find("[train] key 'microbatches' = 3 must be a multiple of [parallel] stages = 2"),
            std::string::npos)
      << microbatches;
}

TEST(Config, TensorParallelAndZeroMayBeLeftToThePlanner) {
  const auto parallel = [](const std::string& text) {
    return read_parallel_config(ConfigDocument::parse("[parallel]\n" + text, "configs/x.toml"));
  };
  EXPECT_EQ(parallel("").tensor_parallel, 1);  // defaults: no tensor parallelism, no ZeRO
  EXPECT_EQ(parallel("").zero, 0);
  EXPECT_EQ(parallel("tensor_parallel = \"auto\"\n").tensor_parallel, 0);
  EXPECT_EQ(parallel("tensor_parallel = 4\n").tensor_parallel, 4);
  EXPECT_EQ(parallel("zero = \"auto\"\n").zero, -1);
  EXPECT_EQ(parallel("zero = 1\n").zero, 1);
  const ParallelConfig devices = parallel("device_flops = 312e12\ndevice_efficiency = 0.5\nlink_latency = 1e-5\n");
  EXPECT_DOUBLE_EQ(devices.device_flops, 312e12);
  EXPECT_DOUBLE_EQ(devices.device_efficiency, 0.5);
  EXPECT_DOUBLE_EQ(devices.link_latency, 1e-5);
  const auto error = [&](const std::string& text) { return error_message([&] { parallel(text); }); };
  EXPECT_EQ(error("tensor_parallel = \"many\"\n"),
            "configs/x.toml:2: [parallel] key 'tensor_parallel' must be an integer or \"auto\", not \"many\"");
  EXPECT_NE(error("tensor_parallel = 16\n").find("key 'tensor_parallel' must be between 1 and devices_per_node (8)"),
            std::string::npos);
  EXPECT_NE(error("zero = 2\n").find("key 'zero' must be 0 or 1"), std::string::npos);
  // The integers that stand for "auto" inside partrain are not values a file may give (issue 30):
  // an undocumented value is an error naming the key, the value and the accepted values.
  EXPECT_EQ(error("tensor_parallel = 0\n"), "configs/x.toml:2: [parallel] key 'tensor_parallel' = 0 is not a value it "
                                          "accepts; accepted: 1..devices_per_node or \"auto\"");
  EXPECT_EQ(error("zero = -1\n"),
            "configs/x.toml:2: [parallel] key 'zero' = -1 is not a value it accepts; accepted: 0, 1 or \"auto\"");
  EXPECT_EQ(error("schedule = \"interleaved\"\nvirtual_stages = 0\n"),
            "configs/x.toml:3: [parallel] key 'virtual_stages' = 0 is not a value it accepts; accepted: an integer >= 1 "
            "or \"auto\"");
  EXPECT_EQ(error("recompute = \"full\"\n"),
            "configs/x.toml:2: [parallel] key 'recompute' is 'full'; expected one of auto none boundaries stage_aware "
            "layers selective");
  EXPECT_NE(error("device_efficiency = 1.5\n").find("key 'device_efficiency' must be in (0, 1]"), std::string::npos);
}

// [parallel] device_model: a preset's published figures become the device keys' defaults; keys in
// the file still win; an unknown model is an error naming the known ones.
TEST(Config, DeviceModelPresetsFillTheDeviceKeys) {
  const auto parallel = [](const std::string& text) {
    return read_parallel_config(ConfigDocument::parse("[parallel]\n" + text, "configs/x.toml"));
  };
  const ParallelConfig a100 = parallel("device_model = \"a100-80gb\"\n");
  EXPECT_EQ(a100.device_model, "a100-80gb");
  EXPECT_DOUBLE_EQ(a100.device_flops, 312e12);
  EXPECT_DOUBLE_EQ(a100.device_efficiency, 267.9 / 312);
  EXPECT_DOUBLE_EQ(a100.device_memory_bytes, 80.0 * (1ull << 30));
  EXPECT_EQ(a100.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(a100.link_bandwidth, 210e9);
  const ParallelConfig overridden = parallel("device_model = \"h100-sxm\"\nlink_bandwidth = 1e11\ndevice_memory = \"40GiB\"\n");
  EXPECT_DOUBLE_EQ(overridden.device_flops, 989e12);
  EXPECT_DOUBLE_EQ(overridden.link_bandwidth, 1e11);
  EXPECT_DOUBLE_EQ(overridden.device_memory_bytes, 40.0 * (1ull << 30));
  EXPECT_EQ(parallel("").device_model, "");
  // Without device_memory or a preset, a GPU run plans with its GPU's memory (app/plan_agreement.cpp).
  EXPECT_FALSE(parallel("").device_memory_given);
  EXPECT_TRUE(a100.device_memory_given);
  EXPECT_TRUE(parallel("device_memory = \"24GiB\"\n").device_memory_given);
  EXPECT_EQ(error_message([&] { parallel("device_model = \"v100\"\n"); }),
            "configs/x.toml:2: [parallel] key 'device_model' must be one of \"a100-80gb\", \"h100-sxm\", not \"v100\"");
}

TEST(Config, SequenceParallelNeedsTensorParallelismAndATransformer) {
  const auto parallel = [](const std::string& text) {
    return read_parallel_config(ConfigDocument::parse("[parallel]\n" + text, "configs/x.toml"));
  };
  EXPECT_FALSE(parallel("").sequence_parallel);  // default
  EXPECT_TRUE(parallel("tensor_parallel = 2\nsequence_parallel = true\n").sequence_parallel);
  EXPECT_TRUE(parallel("tensor_parallel = \"auto\"\nsequence_parallel = true\n").sequence_parallel);
  EXPECT_EQ(error_message([&] { parallel("sequence_parallel = true\n"); }),
            "configs/x.toml:2: [parallel] key 'sequence_parallel' = true needs tensor_parallel > 1 (or \"auto\"): it "
            "splits the sequence over the tensor-parallel group");
  const std::string resnet = error_message([] {
    const std::string path = std::filesystem::temp_directory_path() / "partrain-sequence-parallel-resnet.toml";
    {
      std::ofstream out(path);
      out << "[model]\ntype = \"resnet\"\n[parallel]\ntensor_parallel = 2\nsequence_parallel = true\n";
    }
    load_experiment(path, {});
  });
  EXPECT_NE(resnet.find("[parallel] key 'sequence_parallel' = true, but a resnet has no tensor-parallel layers"),
            std::string::npos)
      << resnet;
}

TEST(Config, SyntheticDataIsForImagesOnly) {
  const auto load = [](const std::string& type) {
    const std::string path = std::filesystem::temp_directory_path() / ("partrain-synthetic-" + type + ".toml");
    {
      std::ofstream out(path);
      out << "[model]\ntype = \"" << type << "\"\n[data]\nsynthetic = true\n";
    }
    return load_experiment(path, {});
  };
  EXPECT_TRUE(load("resnet").data.synthetic);
  const std::string gpt = error_message([&] { load("gpt"); });
  EXPECT_NE(gpt.find("[data] key 'synthetic' = true, but synthetic data is made for resnet only"), std::string::npos) << gpt;
}

TEST(Config, GradientBucketSizeIsPositiveMebibytes) {
  const auto parallel = [](const std::string& text) {
    return read_parallel_config(ConfigDocument::parse("[parallel]\n" + text, "configs/x.toml"));
  };
  EXPECT_DOUBLE_EQ(parallel("").bucket_mb, 25.0);  // PyTorch DDP's default bucket_cap_mb
  EXPECT_DOUBLE_EQ(parallel("bucket_mb = 0.5\n").bucket_mb, 0.5);
  EXPECT_DOUBLE_EQ(parallel("bucket_mb = 100\n").bucket_mb, 100.0);
  const auto error = [&](const std::string& text) { return error_message([&] { parallel(text); }); };
  for (const std::string bad : {"bucket_mb = 0\n", "bucket_mb = -2\n"})
    EXPECT_EQ(error(bad).find("configs/x.toml:2: [parallel] key 'bucket_mb' must be positive"), 0u) << error(bad);
  EXPECT_NE(error("bucket_mb = \"big\"\n").find("key 'bucket_mb'"), std::string::npos);
}

TEST(Config, ReplanningKeysDefaultAndAreChecked) {
  const auto profile = [](const std::string& text) {
    return read_profile_config(ConfigDocument::parse("[profile]\n" + text, "configs/x.toml"));
  };
  EXPECT_DOUBLE_EQ(profile("").replan_threshold, 0.15);
  EXPECT_EQ(profile("").replan_window, 3);
  EXPECT_DOUBLE_EQ(profile("replan_threshold = 0\n").replan_threshold, 0.0);  // off
  EXPECT_EQ(profile("replan_window = 5\n").replan_window, 5);
  const auto error = [&](const std::string& text) { return error_message([&] { profile(text); }); };
  EXPECT_EQ(error("replan_threshold = -0.1\n").find("configs/x.toml:2: [profile] key 'replan_threshold' must not be "
                                                     "negative"), 0u) << error("replan_threshold = -0.1\n");
  for (const std::string bad : {"replan_window = 0\n", "replan_window = -1\n"})
    EXPECT_EQ(error(bad).find("configs/x.toml:2: [profile] key 'replan_window' must be positive"), 0u) << error(bad);
}

TEST(Config, UnknownKeyNamesFileLineAndKey) {
  const std::string message = error_message([] { read("# comment\n[model]\ntype = \"bert\"\nhiden = 12\n"); });
  EXPECT_EQ(message, "configs/x.toml:4: [model] key 'hiden' is unknown");
}

TEST(Config, WrongTypeNamesFileLineAndKey) {
  const std::string message = error_message([] { read("[model]\ntype = \"bert\"\n\nlayers = \"twelve\"\n"); });
  EXPECT_NE(message.find("configs/x.toml:4: [model] key 'layers' must be an integer"), std::string::npos) << message;
  const std::string flag = error_message([] { read("[model]\ntype = \"bert\"\nnsp = 1\n"); });
  EXPECT_NE(flag.find("configs/x.toml:3: [model] key 'nsp' must be true or false"), std::string::npos) << flag;
}

TEST(Config, InvalidValuesAreErrors) {
  EXPECT_NE(error_message([] { read("[model]\ntype = \"bert\"\nhidden = 100\nheads = 12\n"); })
                .find("configs/x.toml:4: [model] key 'heads'"),
            std::string::npos);
  EXPECT_NE(error_message([] { read("[model]\ntype = \"resnet\"\ndepth = 42\n"); })
                .find("configs/x.toml:3: [model] key 'depth'"),
            std::string::npos);
  EXPECT_NE(error_message([] { read("[model]\ntype = \"transformer\"\n"); }).find("key 'type'"), std::string::npos);
  EXPECT_NE(error_message([] { read("[model]\nlayers = 2\n"); }).find("key 'type' is required"), std::string::npos);
  EXPECT_NE(error_message([] { read("[model]\ntype = \"bert\"\nseq_len = 1024\n"); }).find("key 'seq_len'"),
            std::string::npos);
}

TEST(Config, BertTaskIsPretrainingOrClassification) {
  EXPECT_EQ(read("[model]\ntype = \"bert\"\n").task, "pretraining");
  EXPECT_FALSE(read("[model]\ntype = \"bert\"\n").is_classifier());
  const ModelConfig classifier = read("[model]\ntype = \"bert\"\ntask = \"classification\"\nclasses = 4\n");
  EXPECT_TRUE(classifier.is_classifier());
  EXPECT_EQ(classifier.classes, 4);
  EXPECT_NE(error_message([] { read("[model]\ntype = \"bert\"\ntask = \"tagging\"\n"); })
                .find("[model] key 'task' is 'tagging'; expected one of pretraining classification"),
            std::string::npos);
  EXPECT_EQ(error_message([] { read("[model]\ntype = \"gpt\"\ntask = \"classification\"\nclasses = 4\n"); }),
            "configs/x.toml:3: [model] key 'task' = \"classification\" is BERT's sequence classification; a gpt has "
            "only \"pretraining\"");
  EXPECT_NE(error_message([] { read("[model]\ntype = \"bert\"\ntask = \"classification\"\nclasses = 1\n"); })
                .find("[model] key 'classes' must be at least 2 for classification, not 1"),
            std::string::npos);
}

TEST(Config, SpecialTokenIdsAreDeclaredOnlyWhenSet) {
  EXPECT_TRUE(read("[model]\ntype = \"bert\"\n").special_token_ids.empty());  // nothing declared: nothing checked
  const ModelConfig bert = read("[model]\ntype = \"bert\"\nmask_id = 103\ncls_id = 101\neos_id = -1\n", {"model.pad_id=0"});
  using Ids = std::vector<std::pair<std::string, std::int64_t>>;
  EXPECT_EQ(bert.special_token_ids, (Ids{{"pad_id", 0}, {"eos_id", -1}, {"cls_id", 101}, {"mask_id", 103}}));
  EXPECT_EQ(error_message([] { read("[model]\ntype = \"bert\"\ncls_id = -2\n"); }),
            "configs/x.toml:3: [model] key 'cls_id' must be a token id (or -1: the tokenizer has no such token), not -2");
  EXPECT_EQ(error_message([] { read("[model]\ntype = \"bert\"\nvocab = 100\nsep_id = 102\n"); }),
            "configs/x.toml:4: [model] key 'sep_id' 102 is outside the vocabulary (vocab = 100)");
  EXPECT_NE(error_message([] { read("[model]\ntype = \"bert\"\ncls_id = \"[CLS]\"\n"); })
                .find("[model] key 'cls_id' must be an integer"),
            std::string::npos);
}

TEST(Config, VocabDivisibleByIsAPositiveIntegerDefaulting128) {
  EXPECT_EQ(read("[model]\ntype = \"gpt\"\n").vocab_divisible_by, 128);  // Megatron-LM's default
  EXPECT_EQ(read("[model]\ntype = \"bert\"\nvocab_divisible_by = 8\n").vocab_divisible_by, 8);
  EXPECT_EQ(read("[model]\ntype = \"gpt\"\n", {"model.vocab_divisible_by=1"}).vocab_divisible_by, 1);
  for (const char* bad : {"0", "-128"}) {
    const std::string message =
        error_message([&] { read(std::string("[model]\ntype = \"gpt\"\nvocab_divisible_by = ") + bad + "\n"); });
    EXPECT_NE(message.find("configs/x.toml:3: [model] key 'vocab_divisible_by' must be positive, not " +
                           std::string(bad)),
              std::string::npos)
        << message;
  }
  const std::string text = error_message([] { read("[model]\ntype = \"gpt\"\nvocab_divisible_by = \"128\"\n"); });
  EXPECT_NE(text.find("configs/x.toml:3: [model] key 'vocab_divisible_by' must be an integer"), std::string::npos) << text;
  const std::string fraction = error_message([] { read("[model]\ntype = \"gpt\"\nvocab_divisible_by = 1.5\n"); });
  EXPECT_NE(fraction.find("[model] key 'vocab_divisible_by' must be an integer"), std::string::npos) << fraction;
}

TEST(Config, CheckpointOnErrorIsStopOrContinue) {
  const auto checkpoint = [](const std::string& text) {
    return read_checkpoint_config(ConfigDocument::parse(text, "configs/x.toml", {}));
  };
  EXPECT_EQ(checkpoint("[checkpoint]\nevery = 2\n").on_error, "stop");
  EXPECT_EQ(checkpoint("[checkpoint]\non_error = \"continue\"\n").on_error, "continue");
  const std::string message = error_message([&] { checkpoint("[checkpoint]\non_error = \"retry\"\n"); });
  EXPECT_NE(message.find("configs/x.toml:2: [checkpoint] key 'on_error'"), std::string::npos) << message;
  EXPECT_NE(message.find("continue"), std::string::npos) << message;
}

TEST(Config, UnknownSectionAndSyntaxErrorsNameTheLine) {
  EXPECT_EQ(error_message([] { read("[model]\ntype = \"bert\"\n[trian]\nsteps = 1\n"); }),
            "configs/x.toml:3: section [trian] is unknown");
  const std::string syntax = error_message([] { read("[model]\ntype = \"bert\n"); });
  EXPECT_TRUE(syntax.starts_with("configs/x.toml:2:")) << syntax;
  EXPECT_NE(error_message([] { read(""); }).find("[model] section is missing"), std::string::npos);
}

TEST(Config, OverridesParseTomlValuesAndBareStrings) {
  const ModelConfig config = read("[model]\ntype = \"bert\"\nlayers = 12\n",
                                  {"model.layers=3", "model.dropout=0.25", "model.nsp=false", "model.type=gpt",
                                   "model.hidden = 256", "model.heads=4"});
  EXPECT_EQ(config.layers, 3);
  EXPECT_DOUBLE_EQ(config.dropout, 0.25);
  EXPECT_FALSE(config.nsp);
  EXPECT_EQ(config.type, "gpt");  // bare string
  EXPECT_EQ(config.hidden, 256);
  EXPECT_EQ(config.heads, 4);
}

TEST(Config, OverrideErrorsNameTheOverride) {
  const std::string message = error_message([] { read("[model]\ntype = \"bert\"\n", {"model.layers=\"many\""}); });
  EXPECT_NE(message.find("--set model.layers=\"many\": [model] key 'layers' must be an integer"), std::string::npos)
      << message;
  EXPECT_NE(error_message([] { read("[model]\ntype = \"bert\"\n", {"model.hiden=3"}); })
                .find("--set model.hiden=3: [model] key 'hiden' is unknown"),
            std::string::npos);
  EXPECT_NE(error_message([] { read("[model]\ntype = \"bert\"\n", {"layers=3"}); }).find("expected section.key=value"),
            std::string::npos);
  // A section that only an override creates.
  EXPECT_NO_THROW(read("[model]\ntype = \"bert\"\n", {"train.steps=5"}));
}

TEST(Config, EveryConfigFileParsesAndBuilds) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kConfigs)) {
    if (entry.path().extension() != ".toml") continue;
    ++files;
    SCOPED_TRACE(entry.path().string());
    const ExperimentConfig config = load_experiment(entry.path().string());
    const Graph graph = build_model(config.model);  // graph only: no tensors are allocated
    EXPECT_GT(graph.parameter_count(), 0);
    EXPECT_EQ(graph.outputs().size(), 1u);
  }
  EXPECT_GE(files, 14);
}

TEST(Config, LoadNamesAMissingFile) {
  EXPECT_NE(error_message([] { load_experiment(kConfigs + "/no-such-file.toml"); }).find("cannot read"),
            std::string::npos);
}

}  // namespace
}  // namespace partrain
