// libFuzzer target: the batch-file reader of `partrain eval --data` (HDF5 built from a recipe,
// fuzz/hdf5_recipe.h), with GPT's and BERT's fields and the bounds eval sets. Any input must end in
// a batch source or a partrain::Error, never a crash, a silent huge allocation or another exception.
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "fuzz/hdf5_recipe.h"
#include "io/batch_file.h"

namespace {

partrain::io::BatchField field(const char* name, partrain::Shape shape, partrain::DType dtype, std::int64_t bound,
                               bool ignored) {
  partrain::io::BatchField result;
  result.name = name;
  result.sample_shape = std::move(shape);
  result.dtype = dtype;
  if (bound > 0) result.upper_bound = bound;
  if (ignored) result.ignore_value = -100;
  return result;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using partrain::DType;
  static const std::vector<partrain::io::BatchField> gpt = {field("input_ids", {4}, DType::I64, 13, false),
                                                            field("labels", {4}, DType::I64, 13, true)};
  static const std::vector<partrain::io::BatchField> bert = {
      field("input_ids", {4}, DType::I64, 16, false), field("token_type_ids", {4}, DType::I64, 2, false),
      field("attention_mask", {1, 1, 4}, DType::F32, 0, false), field("mlm_labels", {4}, DType::I64, 16, true),
      field("nsp_labels", {}, DType::I64, 2, true)};
  static const std::vector<std::string> datasets = {"/batch/input_ids",      "/batch/labels",
                                                    "/batch/token_type_ids", "/batch/attention_mask",
                                                    "/batch/mlm_labels",     "/batch/nsp_labels"};
  const std::string path = partrain::fuzz::hdf5_input(data, size, datasets, {"format"});
  for (const auto* fields : {&gpt, &bert}) {
    try {
      if (!partrain::io::is_batch_file(path)) return 0;
      const partrain::io::BatchFile file(path, *fields);
      file.samples(0, file.samples_per_epoch());
    } catch (const partrain::Error&) {
    }
  }
  return 0;
}
