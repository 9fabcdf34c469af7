// libFuzzer target: the prepared-data readers (data/prepare.sh's text.h5 and images .h5, HDF5 from
// the input bytes): both splits of each, and a few samples. Any input must end in a data set or a
// partrain::Error, never a crash, a silent huge allocation or another exception.
#include <cstdint>

#include "core/error.h"
#include "fuzz/fuzz_input_file.h"
#include "io/image_dataset.h"
#include "io/text_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = partrain::fuzz::write_input(data, size, "h5");
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
