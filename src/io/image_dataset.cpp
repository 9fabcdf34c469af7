#include "io/image_dataset.h"

#include <algorithm>

#include "core/error.h"
#include "io/hdf5_file.h"
#include "io/text_dataset.h"

namespace partrain::io {

ImageDataset::ImageDataset(const std::string& path, ImageSplit split) : path_(path) {
  const Hdf5File file = Hdf5File::open_read(path);
  const std::string prefix = split == ImageSplit::Train ? "train" : "test";
  std::vector<std::int64_t> shape, label_shape;
  // Integer datasets only: HDF5 would convert floats (pixels in [0, 1], say) to uint8 silently.
  for (const std::string& dataset : {prefix + "/images", prefix + "/labels"}) {
    PARTRAIN_CHECK(file.has_dataset(dataset), "'" << path << "': no dataset /" << dataset
                                                   << " (not a data/prepare.sh image file?)");
    PARTRAIN_CHECK(file.dataset_is_integer(dataset), "'" << path << "': dataset /" << dataset << " stores "
                                                         << file.dataset_type_name(dataset)
                                                         << ", expected integers (uint8)");
  }
  pixels_ = file.read<std::uint8_t>(prefix + "/images", &shape);
  labels_ = file.read<std::uint8_t>(prefix + "/labels", &label_shape);
  PARTRAIN_CHECK(shape.size() == 3, "'" << path << "': /" << prefix << "/images has rank " << shape.size()
                                        << ", expected [N, height, width]");
  PARTRAIN_CHECK(label_shape.size() == 1 && label_shape[0] == shape[0],
                 "'" << path << "': /" << prefix << "/labels must be [" << shape[0] << "]");
  PARTRAIN_CHECK(shape[0] > 0 && shape[1] > 0 && shape[2] > 0,
                 "'" << path << "': dataset /" << prefix << "/images has shape [" << shape[0] << ", " << shape[1]
                     << ", " << shape[2] << "]: no images");
  count_ = shape[0];
  height_ = shape[1];
  width_ = shape[2];
  for (std::uint8_t label : labels_) max_label_ = std::max<std::int64_t>(max_label_, label);
  labels_dataset_ = "/" + prefix + "/labels";
}

std::int64_t ImageDataset::label(std::int64_t index) const {
  PARTRAIN_CHECK(index >= 0 && index < count_, "'" << path_ << "': image " << index << " outside [0, " << count_ << ")");
  return labels_[index];
}

ImageBatch ImageDataset::samples(const std::vector<std::int64_t>& indices) const {
  const std::int64_t batch = static_cast<std::int64_t>(indices.size());
  const std::int64_t pixels = height_ * width_;
  ImageBatch result;
  result.images = Tensor::empty({batch, 1, height_, width_}, DType::F32);
  result.labels = Tensor::empty({batch}, DType::I64);
  float* images = result.images.data<float>();
  std::int64_t* labels = result.labels.data<std::int64_t>();
  const float scale = 1.0f / (255.0f * kStd), shift = kMean / kStd;
  for (std::int64_t row = 0; row < batch; ++row) {
    const std::int64_t index = indices[row];
    labels[row] = label(index);
    const std::uint8_t* source = pixels_.data() + index * pixels;
    for (std::int64_t pixel = 0; pixel < pixels; ++pixel) images[row * pixels + pixel] = source[pixel] * scale - shift;
  }
  return result;
}

ImageBatch ImageDataset::batch(std::uint64_t seed, std::int64_t epoch, const std::vector<std::int64_t>& positions) const {
  if (order_.size() != static_cast<std::size_t>(count_) || seed != order_seed_ || epoch != order_epoch_) {
    order_ = shuffled_order(count_, seed, epoch);
    order_seed_ = seed;
    order_epoch_ = epoch;
  }
  std::vector<std::int64_t> indices;
  indices.reserve(positions.size());
  for (std::int64_t position : positions) {
    PARTRAIN_CHECK(position >= 0 && position < count_,
                   "'" << path_ << "': position " << position << " outside the epoch of " << count_);
    indices.push_back(order_[position]);
  }
  return samples(indices);
}

void write_image_dataset(const std::string& path, std::int64_t height, std::int64_t width,
                         const std::vector<std::uint8_t>& train_images, const std::vector<std::uint8_t>& train_labels,
                         const std::vector<std::uint8_t>& test_images, const std::vector<std::uint8_t>& test_labels) {
  Hdf5File file = Hdf5File::create(path);
  const std::int64_t train_count = static_cast<std::int64_t>(train_labels.size());
  const std::int64_t test_count = static_cast<std::int64_t>(test_labels.size());
  file.write<std::uint8_t>("train/images", {train_count, height, width}, train_images);
  file.write<std::uint8_t>("train/labels", {train_count}, train_labels);
  file.write<std::uint8_t>("test/images", {test_count, height, width}, test_images);
  file.write<std::uint8_t>("test/labels", {test_count}, test_labels);
  file.write_string_attribute("/", "format", "partrain-images-1");
  file.write_double_attribute("/", "mean", ImageDataset::kMean);
  file.write_double_attribute("/", "std", ImageDataset::kStd);
}

}  // namespace partrain::io
