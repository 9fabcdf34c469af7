#pragma once
// Where a training run's samples come from: the model's Input and Label values, by name, for any
// range of global sample indices. Sample g of a run is a deterministic function of (seed, g), so any
// rank can produce exactly the samples it handles (Merak's split data loader: a stage reads only
// the inputs its tasks consume) and every partitioning trains on the same data.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/tensor.h"

namespace partrain {
struct ExperimentConfig;  // io/config.h: only make_batch_source reads it (runtime/ sees no config)
}  // namespace partrain

namespace partrain::io {

/// Input/Label tensors by value name ("input_ids", "attention_mask", "mlm_labels", "images", ...),
/// each with the batch dimension first.
using NamedTensors = std::unordered_map<std::string, Tensor>;

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  /// Samples [first, first + count) of the run's sample stream (epoch = index / samples per epoch,
  /// shuffled per epoch with the run's seed). Throws partrain::Error on a negative range.
  virtual NamedTensors samples(std::int64_t first, std::int64_t count) const = 0;
  /// Samples in one epoch.
  virtual std::int64_t samples_per_epoch() const = 0;
  /// Tokens per sample (for tokens/s); 0 for images.
  virtual std::int64_t tokens_per_sample() const = 0;
  /// The file read, for messages.
  virtual const std::string& path() const = 0;
};

/// The source for config.model.type from config.data.path (or the default path under
/// `default_directory`): text.h5 for bert/gpt, pos.h5 for bert with [model] task = "classification"
/// (io/classification_dataset.h), fashion_mnist.h5 for resnet. Under [data] synthetic (resnet only;
/// benchmarks without a dataset, as Megatron-LM's --mock-data) no file: sample i is f32 [channels,
/// image_size, image_size] uniform in [-1, 1) and a label in [0, classes), each a function of
/// (train.seed, i, split) alone (Philox), so any rank makes any sample; an epoch is ImageNet's
/// 1,281,167 samples and path() is "synthetic". `heldout` selects the
/// held-out split (evaluation). Throws partrain::Error naming the file when it is missing (and says
/// to run data/prepare.sh) or does not match the model (vocabulary, image size, sequence length).
std::unique_ptr<BatchSource> make_batch_source(const ExperimentConfig& config, bool heldout,
                                               const std::string& default_directory = "data/prepared");

}  // namespace partrain::io
