#pragma once
// Fashion-MNIST in the fashion_mnist.h5 layout written by data/prepare_images.py (and
// write_image_dataset): /{train,test}/images uint8 [N,28,28], /{train,test}/labels uint8 [N].
// Batches are deterministic functions of (seed, epoch, position), so any rank can produce any batch.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace partrain::io {

/// Which half of the file a dataset reads.
enum class ImageSplit { Train, Test };

/// A batch of normalised images and their class labels, on the host.
struct ImageBatch {
  Tensor images;  ///< f32 [B, 1, H, W]: (pixel / 255 - mean) / std
  Tensor labels;  ///< i64 [B], class index in [0, 10)
};

class ImageDataset {
 public:
  /// Fashion-MNIST pixel statistics (of the training set).
  static constexpr float kMean = 0.2860f, kStd = 0.3530f;

  /// Reads one split of an images .h5 file into memory. Throws partrain::Error naming the file and
  /// dataset when missing or malformed (images or labels not integers, images not [N,H,W] with
  /// N > 0, label count mismatch).
  ImageDataset(const std::string& path, ImageSplit split);

  std::int64_t size() const { return count_; }
  std::int64_t height() const { return height_; }
  std::int64_t width() const { return width_; }
  /// Raw label of sample `index` (unshuffled).
  std::int64_t label(std::int64_t index) const;
  /// The largest label of the split (readers check it against [model] classes before training).
  std::int64_t max_label() const { return max_label_; }
  /// The labels' dataset ("/train/labels"), for messages.
  const std::string& labels_dataset() const { return labels_dataset_; }

  /// Samples by index (unshuffled). Throws on an index outside [0, size()).
  ImageBatch samples(const std::vector<std::int64_t>& indices) const;
  /// Samples at `positions` of epoch `epoch`'s shuffled order (shuffled_order(size(), seed, epoch)).
  ImageBatch batch(std::uint64_t seed, std::int64_t epoch, const std::vector<std::int64_t>& positions) const;

 private:
  std::string path_;
  std::int64_t count_ = 0, height_ = 0, width_ = 0;
  std::int64_t max_label_ = 0;
  std::string labels_dataset_;
  std::vector<std::uint8_t> pixels_;
  std::vector<std::uint8_t> labels_;
  mutable std::vector<std::int64_t> order_;  // cache of the last epoch's order (not thread-safe)
  mutable std::uint64_t order_seed_ = 0;
  mutable std::int64_t order_epoch_ = -1;
};

/// Writes an images .h5 in the layout above (test fixtures; data/prepare_images.py is the production
/// writer). Images are uint8 [N, height, width] row-major.
void write_image_dataset(const std::string& path, std::int64_t height, std::int64_t width,
                         const std::vector<std::uint8_t>& train_images, const std::vector<std::uint8_t>& train_labels,
                         const std::vector<std::uint8_t>& test_images, const std::vector<std::uint8_t>& test_labels);

}  // namespace partrain::io
