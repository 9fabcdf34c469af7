// libFuzzer target: the HDF5 checkpoint reader (summary and full read with checksums), on files
// built from a recipe (fuzz/hdf5_recipe.h). Any input must end in a checkpoint or a partrain::Error,
// never a crash or another exception.
#include <cstdint>

#include "core/error.h"
#include "fuzz/hdf5_recipe.h"
#include "io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::vector<std::string> datasets = {"/model/weight", "/model/layer/bias", "/optim/weight/exp_avg",
                                                    "/optim/weight/exp_avg_sq", "/optim/layer/bias/exp_avg"};
  static const std::vector<std::string> attributes = {
      "format_version", "step",      "consumed_samples", "data_cursor", "seed",
      "lr_step",        "optimizer", "config_toml",      "plan_json",   "loss_scale", "loss_scale_good_steps"};
  // The attributes every checkpoint holds (io/checkpoint.cpp write_info), so that recipes reach the datasets.
  static const auto checkpoint_attributes = [](hid_t file) {
    using namespace partrain::fuzz::recipe_detail;
    for (const char* name : {"format_version", "step", "consumed_samples", "data_cursor", "lr_step"})
      number_attribute(file, name, H5T_STD_I64LE, 1);
    number_attribute(file, "seed", H5T_STD_U64LE, 7);
    string_attribute(file, "optimizer", "adamw");
    string_attribute(file, "config_toml", "");
    string_attribute(file, "plan_json", "");
  };
  const std::string path = partrain::fuzz::hdf5_input(data, size, datasets, attributes, checkpoint_attributes);
  try {
    partrain::io::read_checkpoint(path);
  } catch (const partrain::Error&) {
  }
  return 0;
}
