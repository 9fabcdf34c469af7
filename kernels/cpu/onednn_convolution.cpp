// Conv2d through oneDNN's convolution primitives (kernels/cpu/onednn_convolution.h). Tensors stay
// NCHW / OIHW; each primitive works in the blocked layouts oneDNN picks for this CPU (format "any"),
// with reorders in and out around it. The primitives of a shape are built once and cached; their
// scratchpads and reorder buffers come from the caching allocator (counted in peak memory, and no
// allocation inside oneDNN's kernels).
#include "kernels/cpu/onednn_convolution.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

#if PARTRAIN_HAVE_ONEDNN
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"
#endif

namespace partrain::cpu {

namespace {
using kernels::ConvGeometry;

// PARTRAIN_CPU_CONVOLUTION=im2col selects the im2col + sgemm kernels (to compare, or to rule oneDNN
// out); unset or "onednn" allows oneDNN. Anything else is a user error, named.
bool onednn_requested() {
  static const bool requested = [] {
    const char* value = std::getenv("PARTRAIN_CPU_CONVOLUTION");
    if (value == nullptr || std::strcmp(value, "onednn") == 0 || value[0] == '\0') return true;
    PARTRAIN_CHECK(std::strcmp(value, "im2col") == 0,
                   "PARTRAIN_CPU_CONVOLUTION=" << value << ": expected 'onednn' or 'im2col'");
    return false;
  }();
  return requested;
}

// oneDNN's direct JIT convolutions beat im2col + sgemm from AVX2 with FMA on (measured:
// validation/perf/README.md); below that the im2col path stays.
bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
}  // namespace

#if PARTRAIN_HAVE_ONEDNN
namespace {
using dnnl::memory;
using Tag = memory::format_tag;
using DataType = memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine instance(dnnl::engine::kind::cpu, 0);
  return instance;
}

// The primitives of one Conv2d shape (forward training, data gradient, weight gradient).
struct ConvolutionPrimitives {
  memory::desc plain_src, plain_weights, plain_bias, plain_dst;
  dnnl::convolution_forward::primitive_desc forward_pd;
  dnnl::convolution_backward_data::primitive_desc data_pd;
  dnnl::convolution_backward_weights::primitive_desc weights_pd;
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  bool direct[3] = {};  // per ConvolutionPass: oneDNN chose a direct kernel, not a GEMM-based one
};

// A direct convolution kernel, not oneDNN's im2col + sgemm ("gemm:jit", "gemm:ref", ...).
bool is_direct(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).find("gemm") == std::string::npos;
}

using Key = std::array<std::int64_t, 17>;

Key key_of(const ConvGeometry& g, bool has_bias) {
  return {g.batch,    g.channels, g.height,   g.width,      g.out_channels, g.out_height,
          g.out_width, g.kernel_h, g.kernel_w, g.stride_h,   g.stride_w,     g.pad_h,
          g.pad_w,    g.dilation_h, g.dilation_w, g.groups, has_bias ? 1 : 0};
}

// Right/bottom padding that makes oneDNN's output size equal ours (floor division, as PyTorch).
std::int64_t trailing_pad(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride,
                          std::int64_t dilation, std::int64_t pad) {
  return (out - 1) * stride + (kernel - 1) * dilation + 1 - in - pad;
}

// Builds the three primitives of `g`; throws dnnl::error when oneDNN rejects the shape.
std::unique_ptr<ConvolutionPrimitives> build(const ConvGeometry& g, bool has_bias) {
  auto p = std::make_unique<ConvolutionPrimitives>();
  const memory::dims src{g.batch, g.channels, g.height, g.width};
  const memory::dims weights{g.out_channels, g.channels, g.kernel_h, g.kernel_w};
  const memory::dims dst{g.batch, g.out_channels, g.out_height, g.out_width};
  const memory::dims bias{g.out_channels};
  const memory::dims strides{g.stride_h, g.stride_w}, dilations{g.dilation_h - 1, g.dilation_w - 1};
  const memory::dims pad_l{g.pad_h, g.pad_w};
  const memory::dims pad_r{trailing_pad(g.height, g.out_height, g.kernel_h, g.stride_h, g.dilation_h, g.pad_h),
                           trailing_pad(g.width, g.out_width, g.kernel_w, g.stride_w, g.dilation_w, g.pad_w)};
  p->plain_src = memory::desc(src, DataType::f32, Tag::nchw);
  p->plain_weights = memory::desc(weights, DataType::f32, Tag::oihw);
  p->plain_bias = memory::desc(bias, DataType::f32, Tag::x);
  p->plain_dst = memory::desc(dst, DataType::f32, Tag::nchw);
  const memory::desc any_src(src, DataType::f32, Tag::any), any_weights(weights, DataType::f32, Tag::any);
  const memory::desc any_dst(dst, DataType::f32, Tag::any);
  const memory::desc bias_md = has_bias ? p->plain_bias : memory::desc();
  dnnl::primitive_attr attributes;
  attributes.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto algorithm = dnnl::algorithm::convolution_direct;
  p->forward_pd = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algorithm, any_src, any_weights, bias_md,
                                      any_dst, strides, dilations, pad_l, pad_r),
      attributes, engine());
  p->data_pd = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(algorithm, any_src, any_weights, any_dst, strides, dilations, pad_l,
                                            pad_r),
      attributes, engine(), p->forward_pd);
  p->weights_pd = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(algorithm, any_src, any_weights, bias_md, any_dst, strides, dilations,
                                               pad_l, pad_r),
      attributes, engine(), p->forward_pd);
  p->forward = dnnl::convolution_forward(p->forward_pd);
  p->backward_data = dnnl::convolution_backward_data(p->data_pd);
  p->backward_weights = dnnl::convolution_backward_weights(p->weights_pd);
  p->direct[0] = is_direct(p->forward_pd);
  p->direct[1] = is_direct(p->data_pd);
  p->direct[2] = is_direct(p->weights_pd);
  return p;
}

// The cached primitives of `g` (null when oneDNN rejected the shape). Entries live for the process.
const ConvolutionPrimitives* cached_primitives(const ConvGeometry& g, bool has_bias) {
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<ConvolutionPrimitives>> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const Key key = key_of(g, has_bias);
  auto found = cache.find(key);
  if (found == cache.end()) {
    std::unique_ptr<ConvolutionPrimitives> built;
    try {
      built = build(g, has_bias);
    } catch (const dnnl::error&) {
      built = nullptr;  // unsupported shape: the im2col path serves it
    }
    found = cache.emplace(key, std::move(built)).first;
  }
  return found->second.get();
}

const ConvolutionPrimitives& primitives(const ConvGeometry& g, bool has_bias) {
  const ConvolutionPrimitives* p = cached_primitives(g, has_bias);
  PARTRAIN_CHECK(p != nullptr, "oneDNN convolution called for a shape it rejected (a caller's bug)");
  return *p;
}

// One primitive call: its stream, and the buffers (reordered tensors, scratchpad) it allocated.
class Call {
 public:
  Call() : stream_(engine()) {}

  // Memory of `desc` from the caching allocator.
  memory buffer(const memory::desc& desc) {
    const auto floats = static_cast<std::int64_t>((desc.get_size() + sizeof(float) - 1) / sizeof(float));
    buffers_.push_back(Tensor::empty({std::max<std::int64_t>(floats, 1)}));
    return memory(desc, engine(), buffers_.back().data<float>());
  }

  // `data` (in layout `plain`) as memory of layout `wanted`: itself, or a reordered copy.
  memory input(const memory::desc& plain, const memory::desc& wanted, const float* data) {
    memory user(plain, engine(), const_cast<float*>(data));
    if (plain == wanted) return user;
    memory copy = buffer(wanted);
    dnnl::reorder(user, copy).execute(stream_, user, copy);
    return copy;
  }

  // Memory of layout `wanted` for an output that ends in `data` (layout `plain`); finish() copies it.
  memory output(const memory::desc& plain, const memory::desc& wanted, float* data) {
    memory user(plain, engine(), data);
    if (plain == wanted) return user;
    memory staged = buffer(wanted);
    pending_.push_back({staged, user});
    return staged;
  }

  void run(const dnnl::primitive& primitive, const memory::desc& scratchpad,
           std::unordered_map<int, memory> arguments) {
    arguments.insert({DNNL_ARG_SCRATCHPAD, buffer(scratchpad)});
    try {
      primitive.execute(stream_, arguments);
      for (auto& [staged, user] : pending_) dnnl::reorder(staged, user).execute(stream_, staged, user);
      stream_.wait();
    } catch (const dnnl::error& error) {
      PARTRAIN_FAIL("oneDNN convolution failed: " << error.what() << " (status " << error.status << ")");
    }
  }

 private:
  dnnl::stream stream_;
  std::vector<Tensor> buffers_;
  std::vector<std::pair<memory, memory>> pending_;
};
}  // namespace

bool onednn_convolution_built() { return true; }

bool onednn_convolution_available(const ConvGeometry& g, bool has_bias, ConvolutionPass pass) {
  // Strided convolutions lose to im2col + sgemm here (AMD EPYC, AVX2: e.g. 3 x 3 stride 2 on 2 x 2
  // maps 7.3 against 3.4 ms forward), as do 1 x 1 output maps; stride-1 3 x 3 on 2 x 2 to 7 x 7 maps
  // win by 1.5 to 2.2 times (validation/perf/README.md, "oneDNN convolutions").
  if (g.stride_h != 1 || g.stride_w != 1 || g.out_height * g.out_width < 4) return false;
  if (g.groups != 1 || g.batch == 0 || !onednn_requested() || !cpu_has_avx2()) return false;
  const ConvolutionPrimitives* p = cached_primitives(g, has_bias);
  return p != nullptr && p->direct[static_cast<int>(pass)];
}

void onednn_convolution_forward(const ConvGeometry& g, const float* x, const float* weight, const float* bias,
                                float* y) {
  const ConvolutionPrimitives& p = primitives(g, bias != nullptr);
  const auto& pd = p.forward_pd;
  Call call;
  std::unordered_map<int, memory> arguments{
      {DNNL_ARG_SRC, call.input(p.plain_src, pd.src_desc(), x)},
      {DNNL_ARG_WEIGHTS, call.input(p.plain_weights, pd.weights_desc(), weight)},
      {DNNL_ARG_DST, call.output(p.plain_dst, pd.dst_desc(), y)}};
  if (bias) arguments.insert({DNNL_ARG_BIAS, call.input(p.plain_bias, pd.bias_desc(), bias)});
  call.run(p.forward, pd.scratchpad_desc(), std::move(arguments));
}

void onednn_convolution_backward_data(const ConvGeometry& g, const float* weight, const float* dy, float* dx) {
  const ConvolutionPrimitives& p = primitives(g, false);
  const auto& pd = p.data_pd;
  Call call;
  call.run(p.backward_data, pd.scratchpad_desc(),
           {{DNNL_ARG_DIFF_DST, call.input(p.plain_dst, pd.diff_dst_desc(), dy)},
            {DNNL_ARG_WEIGHTS, call.input(p.plain_weights, pd.weights_desc(), weight)},
            {DNNL_ARG_DIFF_SRC, call.output(p.plain_src, pd.diff_src_desc(), dx)}});
}

void onednn_convolution_backward_weights(const ConvGeometry& g, const float* x, const float* dy, float* dweight,
                                         float* dbias) {
  const ConvolutionPrimitives& p = primitives(g, dbias != nullptr);
  const auto& pd = p.weights_pd;
  Call call;
  std::unordered_map<int, memory> arguments{
      {DNNL_ARG_SRC, call.input(p.plain_src, pd.src_desc(), x)},
      {DNNL_ARG_DIFF_DST, call.input(p.plain_dst, pd.diff_dst_desc(), dy)},
      {DNNL_ARG_DIFF_WEIGHTS, call.output(p.plain_weights, pd.diff_weights_desc(), dweight)}};
  if (dbias) arguments.insert({DNNL_ARG_DIFF_BIAS, call.output(p.plain_bias, pd.diff_bias_desc(), dbias)});
  call.run(p.backward_weights, pd.scratchpad_desc(), std::move(arguments));
}

#else  // built without oneDNN: Conv2d keeps the im2col path

bool onednn_convolution_built() { return false; }

bool onednn_convolution_available(const ConvGeometry&, bool, ConvolutionPass) {
  (void)cpu_has_avx2;
  (void)onednn_requested;
  return false;
}
void onednn_convolution_forward(const ConvGeometry&, const float*, const float*, const float*, float*) {
  PARTRAIN_FAIL("partrain was built without oneDNN");
}
void onednn_convolution_backward_data(const ConvGeometry&, const float*, const float*, float*) {
  PARTRAIN_FAIL("partrain was built without oneDNN");
}
void onednn_convolution_backward_weights(const ConvGeometry&, const float*, const float*, float*, float*) {
  PARTRAIN_FAIL("partrain was built without oneDNN");
}
#endif

}  // namespace partrain::cpu
