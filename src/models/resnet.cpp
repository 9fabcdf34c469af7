#include "models/resnet.h"

#include <array>

#include "core/error.h"
#include "models/layers.h"

namespace partrain {

namespace {

using Ints = std::vector<std::int64_t>;

// Conv2d without bias, weight [out, in, kernel, kernel], named "<name>.weight"; task "<name>".
int convolution(Graph& graph, const std::string& name, int x, std::int64_t in, std::int64_t out, std::int64_t kernel,
                std::int64_t stride, std::int64_t padding) {
  const int weight = graph.add_parameter(name + ".weight", {out, in, kernel, kernel});
  return graph.add(OpType::Conv2d, name, {x, weight}, {{"stride", Ints{stride, stride}}, {"padding", Ints{padding, padding}}});
}

// BatchNorm2d with weight, bias (Params) and running_mean, running_var (Buffers).
int batch_norm(Graph& graph, const std::string& name, int x, std::int64_t channels) {
  const int weight = graph.add_parameter(name + ".weight", {channels});
  const int bias = graph.add_parameter(name + ".bias", {channels});
  const int mean = graph.add_buffer(name + ".running_mean", {channels});
  const int variance = graph.add_buffer(name + ".running_var", {channels});
  return graph.add(OpType::BatchNorm2d, name, {x, weight, bias, mean, variance}, {{"eps", 1e-5}, {"momentum", 0.1}});
}

int relu(Graph& graph, const std::string& name, int x) { return graph.add(OpType::Relu, name, {x}); }

// torchvision BasicBlock (expansion 1) or Bottleneck (expansion 4, stride on conv2).
int residual_block(Graph& graph, const std::string& prefix, int x, std::int64_t in, std::int64_t width,
                   std::int64_t stride, bool bottleneck) {
  const std::int64_t out = bottleneck ? 4 * width : width;
  int y;
  if (bottleneck) {
    y = convolution(graph, prefix + ".conv1", x, in, width, 1, 1, 0);
    y = relu(graph, prefix + ".relu1", batch_norm(graph, prefix + ".bn1", y, width));
    y = convolution(graph, prefix + ".conv2", y, width, width, 3, stride, 1);
    y = relu(graph, prefix + ".relu2", batch_norm(graph, prefix + ".bn2", y, width));
    y = convolution(graph, prefix + ".conv3", y, width, out, 1, 1, 0);
    y = batch_norm(graph, prefix + ".bn3", y, out);
  } else {
    y = convolution(graph, prefix + ".conv1", x, in, width, 3, stride, 1);
    y = relu(graph, prefix + ".relu1", batch_norm(graph, prefix + ".bn1", y, width));
    y = convolution(graph, prefix + ".conv2", y, width, width, 3, 1, 1);
    y = batch_norm(graph, prefix + ".bn2", y, width);
  }
  int shortcut = x;
  if (stride != 1 || in != out) {
    shortcut = convolution(graph, prefix + ".downsample.0", x, in, out, 1, stride, 0);
    shortcut = batch_norm(graph, prefix + ".downsample.1", shortcut, out);
  }
  y = graph.add(OpType::Add, prefix + ".residual", {y, shortcut});
  return relu(graph, prefix + ".relu", y);
}

}  // namespace

Graph build_resnet(const ModelConfig& config) {
  std::array<int, 4> blocks{};
  bool bottleneck = true;
  switch (config.depth) {
    case 18: blocks = {2, 2, 2, 2}; bottleneck = false; break;
    case 34: blocks = {3, 4, 6, 3}; bottleneck = false; break;
    case 50: blocks = {3, 4, 6, 3}; break;
    case 101: blocks = {3, 4, 23, 3}; break;
    case 152: blocks = {3, 8, 36, 3}; break;
    default: PARTRAIN_FAIL("ResNet depth " << config.depth << " is not one of 18, 34, 50, 101, 152");
  }
  Graph graph;
  const int images = graph.add_input("images", {kBatch, config.channels, config.image_size, config.image_size});
  const int labels = graph.add_label("labels", {kBatch}, DType::I64);

  const std::int64_t base = config.base_width * config.width_factor;
  int x = convolution(graph, "conv1", images, config.channels, base, 7, 2, 3);
  x = relu(graph, "relu", batch_norm(graph, "bn1", x, base));
  x = graph.add(OpType::MaxPool2d, "maxpool", {x}, {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}});

  std::int64_t channels = base;
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t width = base << stage;
    for (int index = 0; index < blocks[static_cast<std::size_t>(stage)]; ++index) {
      const std::string prefix = "layer" + std::to_string(stage + 1) + "." + std::to_string(index);
      const std::int64_t stride = (stage > 0 && index == 0) ? 2 : 1;
      x = residual_block(graph, prefix, x, channels, width, stride, bottleneck);
      channels = bottleneck ? 4 * width : width;
    }
  }
  x = graph.add(OpType::GlobalAvgPool, "avgpool", {x});
  const int logits = layers::linear(graph, "fc", x, channels, config.classes);
  graph.mark_output(layers::cross_entropy(graph, "loss", logits, labels));
  return graph;
}

}  // namespace partrain
