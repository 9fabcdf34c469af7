#include "io/batch_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace partrain::io {

BatchFile::BatchFile(const std::string& path, const std::vector<BatchField>& fields) : path_(path) {
  const Hdf5File file = Hdf5File::open_read(path);
  PARTRAIN_CHECK(file.has_group("batch"), path << ": not a batch file (no /batch group)");
  for (const BatchField& field : fields) {
    const std::string dataset = "batch/" + field.name;
    PARTRAIN_CHECK(file.has_dataset(dataset), path << ": no dataset /" << dataset << " (the model reads "
                                                   << field.name << " " << shape_string(field.sample_shape)
                                                   << " per sample)");
    std::vector<std::int64_t> shape = file.dataset_shape(dataset);
    const Shape sample_shape(shape.begin() + (shape.empty() ? 0 : 1), shape.end());
    PARTRAIN_CHECK(!shape.empty() && sample_shape == field.sample_shape,
                   path << ": dataset /" << dataset << " has shape " << shape_string(Shape(shape.begin(), shape.end()))
                        << ", the model needs [N" << (field.sample_shape.empty() ? "" : ", ")
                        << shape_string(field.sample_shape).substr(1));
    PARTRAIN_CHECK(tensors_.empty() || shape[0] == rows_, path << ": dataset /" << dataset << " has " << shape[0]
                                                                << " rows, the others " << rows_);
    rows_ = shape[0];
    // HDF5 converts between classes silently (float32 token ids truncated to integers): refuse it.
    const bool integer_field = field.dtype == DType::I64;
    PARTRAIN_CHECK(integer_field ? file.dataset_is_integer(dataset) : file.dataset_is_float(dataset),
                   path << ": dataset /" << dataset << " stores " << file.dataset_type_name(dataset) << ", the model reads "
                        << field.name << " as " << (integer_field ? "integers (write it as int64)" : "floats (write it as float32)"));
    const std::int64_t row_size = numel(field.sample_shape);
    Tensor tensor;
    if (integer_field) {
      const std::vector<std::int64_t> values = file.read<std::int64_t>(dataset);
      if (field.upper_bound) {
        for (std::size_t i = 0; i < values.size(); ++i) {
          const std::int64_t value = values[i];
          if ((value >= 0 && value < *field.upper_bound) || (field.ignore_value && value == *field.ignore_value)) continue;
          PARTRAIN_FAIL(path << ": dataset /" << dataset << " row " << static_cast<std::int64_t>(i) / std::max<std::int64_t>(row_size, 1)
                             << " holds " << value << ", outside [0, " << *field.upper_bound << ")"
                             << (field.ignore_value ? " and not the ignored label " + std::to_string(*field.ignore_value) : std::string())
                             << (field.bound_source.empty() ? "" : " (" + field.bound_source + ")"));
        }
      }
      tensor = Tensor::empty(Shape(shape.begin(), shape.end()), DType::I64);  // after the read checked the size
      if (!values.empty()) std::memcpy(tensor.raw_data(), values.data(), values.size() * sizeof(std::int64_t));
    } else {
      const std::vector<float> values = file.read<float>(dataset);
      for (std::size_t i = 0; i < values.size(); ++i)
        PARTRAIN_CHECK(std::isfinite(values[i]), path << ": dataset /" << dataset << " row "
                                                      << static_cast<std::int64_t>(i) / std::max<std::int64_t>(row_size, 1)
                                                      << " holds " << values[i] << " (not a finite number)");
      tensor = Tensor::empty(Shape(shape.begin(), shape.end()), DType::F32);
      if (!values.empty()) std::memcpy(tensor.raw_data(), values.data(), values.size() * sizeof(float));
    }
    if (field.name == "input_ids" && !field.sample_shape.empty()) tokens_per_sample_ = field.sample_shape.back();
    tensors_[field.name] = std::move(tensor);
  }
  PARTRAIN_CHECK(rows_ > 0, path << ": the batch file holds no samples");
}

NamedTensors BatchFile::samples(std::int64_t first, std::int64_t count) const {
  PARTRAIN_CHECK(first >= 0 && count >= 0 && first + count <= rows_,
                 path_ << ": samples [" << first << ", " << first + count << ") asked for, but the batch file holds "
                       << rows_);
  NamedTensors result;
  for (const auto& [name, tensor] : tensors_) result[name] = tensor.slice_rows(first, first + count).clone();
  return result;
}

bool is_batch_file(const std::string& path) { return Hdf5File::open_read(path).has_group("batch"); }

void write_batches(Hdf5File& file, const NamedTensors& tensors) {
  for (const auto& [name, tensor] : tensors) {
    if (tensor.dtype() == DType::I64) {
      const std::int64_t* begin = tensor.data<std::int64_t>();
      file.write("batch/" + name, tensor.shape(), std::vector<std::int64_t>(begin, begin + tensor.numel()));
    } else {
      file.write("batch/" + name, tensor.shape(), tensor.to_float_vector());
    }
  }
}

}  // namespace partrain::io
