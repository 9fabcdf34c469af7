#pragma once
// Layer names of graph tasks and parameters: which layer ("encoder.layer.3", "h.11", "layer2.1",
// "embeddings", "head", ...) a Hugging Face / torchvision style name belongs to. Summaries and the
// layer-level planners group tasks by it; it lives with the graph so that plan/ and partition/ need
// not include models/.
#include <cstdint>
#include <string>
#include <string_view>

namespace partrain {

/// The layer a parameter or task belongs to, for summaries and layer-level grouping:
/// "embeddings", "encoder.layer.3", "pooler", "h.3", "ln_f", "stem", "layer1.0", "head", "loss".
std::string layer_of(const std::string& name);

/// The number right after `marker` at the start of `name` ("transformer.h.11.ln_1.weight" with
/// marker "transformer.h." -> 11), or -1 when `name` does not start with `marker` and a digit.
std::int64_t layer_index_after(const std::string& name, std::string_view marker);

}  // namespace partrain
