// libFuzzer target: the prepared-data readers (data/prepare.sh's text.h5 and images .h5, HDF5 built
// from a recipe, fuzz/hdf5_recipe.h): both splits of each, and a few samples. Any input must end in
// a data set or a partrain::Error, never a crash, a silent huge allocation or another exception.
#include <cstdint>

#include "core/error.h"
#include "fuzz/hdf5_recipe.h"
#include "io/image_dataset.h"
#include "io/text_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::vector<std::string> datasets = {
      "/tokens",      "/sentence_offsets", "/document_offsets", "/split/train", "/split/heldout",
      "/train/images", "/train/labels",    "/test/images",      "/test/labels"};
  static const std::vector<std::string> attributes = {
      "format", "vocab_size", "pad_id", "unk_id", "bos_id",         "eos_id",           "cls_id",
      "sep_id", "mask_id",    "mean",   "std",    "tokenizer_type", "tokenizer_source"};
  // A small valid text file and image file in one (data/prepare.sh's layouts), so that recipes,
  // which replace its datasets and attributes, reach the checks past the first.
  static const auto valid_files = [](hid_t file) {
    using namespace partrain::fuzz::recipe_detail;
    number_attribute(file, "vocab_size", H5T_STD_I64LE, 16);
    int id = 0;
    for (const char* name : {"pad_id", "unk_id", "bos_id", "eos_id", "cls_id", "sep_id", "mask_id"})
      number_attribute(file, name, H5T_STD_I64LE, id++);
    fixed_dataset(file, "/tokens", H5T_STD_I32LE, {8}, {7, 8, 9, 10, 11, 12, 13, 14});
    fixed_dataset(file, "/sentence_offsets", H5T_STD_I64LE, {4}, {0, 2, 4, 8});
    fixed_dataset(file, "/document_offsets", H5T_STD_I64LE, {3}, {0, 4, 8});
    fixed_dataset(file, "/split/train", H5T_STD_I64LE, {1}, {0});
    fixed_dataset(file, "/split/heldout", H5T_STD_I64LE, {1}, {1});
    for (const char* split : {"/train", "/test"}) {
      fixed_dataset(file, std::string(split) + "/images", H5T_STD_U8LE, {2, 2, 2}, {0, 50, 100, 150, 200, 250, 1, 2});
      fixed_dataset(file, std::string(split) + "/labels", H5T_STD_U8LE, {2}, {0, 9});
    }
  };
  const std::string path = partrain::fuzz::hdf5_input(data, size, datasets, attributes, valid_files);
  for (const partrain::io::TextSplit split : {partrain::io::TextSplit::Train, partrain::io::TextSplit::HeldOut}) {
    try {
      const partrain::io::TextDataset text(path, split);
      if (text.gpt_sample_count(4) > 0) text.gpt_batch(4, 1, 0, {0});
      partrain::io::BertSampleOptions options;
      options.sequence_length = 8;
      if (text.bert_sample_count(options) > 0) text.bert_batch(options, 1, 0, {0});
    } catch (const partrain::Error&) {
    }
  }
  for (const partrain::io::ImageSplit split : {partrain::io::ImageSplit::Train, partrain::io::ImageSplit::Test}) {
    try {
      const partrain::io::ImageDataset images(path, split);
      images.batch(1, 0, {0});
    } catch (const partrain::Error&) {
    }
  }
  return 0;
}
