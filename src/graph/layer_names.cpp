// Layer names of tasks and parameters. See layer_names.h.
#include "graph/layer_names.h"

#include <cctype>

namespace partrain {

namespace {

// The first `count` dot-separated components of `name`.
std::string first_components(const std::string& name, int count) {
  std::size_t position = 0;
  for (int i = 0; i < count; ++i) {
    position = name.find('.', position);
    if (position == std::string::npos) return name;
    if (i + 1 < count) ++position;
  }
  return name.substr(0, position);
}

}  // namespace

std::int64_t layer_index_after(const std::string& name, std::string_view marker) {
  if (!name.starts_with(marker)) return -1;
  std::int64_t value = 0;
  std::size_t position = marker.size();
  if (position >= name.size() || !std::isdigit(static_cast<unsigned char>(name[position]))) return -1;
  while (position < name.size() && std::isdigit(static_cast<unsigned char>(name[position])))
    value = value * 10 + (name[position++] - '0');
  return value;
}

std::string layer_of(const std::string& name) {
  std::string rest = name;
  if (rest.starts_with("cls.") || rest.starts_with("fc") || rest == "lm_head") return "head";
  if (rest == "loss" || rest == "avgpool") return rest == "loss" ? "loss" : "head";
  if (rest.starts_with("bert.")) rest = rest.substr(5);
  if (rest.starts_with("transformer.")) rest = rest.substr(12);
  if (rest.starts_with("embeddings") || rest.starts_with("wte") || rest.starts_with("wpe") ||
      rest.starts_with("position_ids") || rest.starts_with("drop"))
    return "embeddings";
  if (rest.starts_with("encoder.layer.")) return first_components(rest, 3);
  if (layer_index_after(rest, "h.") >= 0) return first_components(rest, 2);
  if (rest.starts_with("layer") && layer_index_after(rest, "layer") >= 0) return first_components(rest, 2);
  if (rest.starts_with("conv1") || rest.starts_with("bn1") || rest == "relu" || rest == "maxpool") return "stem";
  return first_components(rest, 1);
}

}  // namespace partrain
