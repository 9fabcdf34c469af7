#pragma once
// ResNet (torchvision names; ResNet v1.5: the stride of a bottleneck sits on its 3x3 conv) with a
// BiT-style width factor multiplying every channel width.
//   inputs: images [B, channels, image_size, image_size] f32
//   labels: labels [B] i64 (class index)
//   output: loss [] = mean cross-entropy
#include "graph/graph.h"
#include "io/config.h"

namespace partrain {

/// Builds the ResNet of config.depth: 18/34 basic blocks, 50/101/152 bottleneck blocks (expansion
/// 4); stem conv 7x7/2 + BatchNorm + ReLU + max-pool 3x3/2; four stages of base_width *
/// width_factor * {1, 2, 4, 8} channels; global average pool; fc. No convolution has a bias.
Graph build_resnet(const ModelConfig& config);

}  // namespace partrain
