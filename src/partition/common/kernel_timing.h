#pragma once
// Seconds of one task's GPU kernels for the analytic cost model (issue 25 item 3): GEMMs by their
// shapes (tile and wave quantization against the chip's multiprocessors, the roofline against
// memory bandwidth; NVIDIA, "Matrix Multiplication Background User's Guide", §2 and §3), attention
// as the kernels that run it, every other op by the bytes it moves. The few figures a device needs
// come from kernel-level data (its data sheet and a GEMM benchmark), never from end-to-end runs.
#include <cstdint>
#include <utility>

#include "graph/graph.h"

namespace partrain::partition {

/// A GPU's kernel figures. A default-constructed KernelModel is disabled: the analytic model then
/// prices every task at DeviceSpec::flops_per_second (the FLOP-only model).
struct KernelModel {
  double peak_flops = 0;         // dense FLOP/s of the GEMM units at the plan's precision
  double memory_bandwidth = 0;   // bytes/s of device memory
  int multiprocessors = 0;       // streaming multiprocessors: one GEMM output tile each per wave
  double gemm_efficiency = 1;    // share of peak_flops a large, well-shaped GEMM reaches, (0, 1]
  double memory_efficiency = 1;  // share of memory_bandwidth a streaming kernel reaches, (0, 1]
  double kernel_seconds = 0;     // fixed cost of each kernel (launch, ramp and tail)
  bool enabled() const { return peak_flops > 0 && memory_bandwidth > 0 && multiprocessors > 0; }
};

/// Seconds of `count` independent GEMMs (a batched GEMM) of [m, k] × [k, n] with operands of
/// `element_bytes` bytes, plus `extra_bytes` the kernel also moves (e.g. a gradient accumulated
/// into C: its read and write): the larger of
///  - math: the output cut into tiles (the fastest of cuBLAS's large tiles 256×128, 128×256 and
///    128×128), the tiles run in waves of one per multiprocessor, each wave as long as a full tile's
///    2·Tm·Tn·k FLOPs at peak_flops · gemm_efficiency / multiprocessors (tile and wave quantization,
///    the guide's §3.1–3.2);
///  - memory: (m·k + k·n + m·n) · count · element_bytes + extra_bytes at memory_bandwidth ·
///    memory_efficiency (the guide's §2: arithmetic intensity against the ops:byte ratio);
/// plus kernel_seconds. 0 for an empty GEMM. Requires kernels.enabled().
double gemm_seconds(const KernelModel& kernels, double m, double n, double k, double count, double element_bytes,
                    double extra_bytes = 0);

/// The math part of gemm_seconds alone (a GEMM fused into a kernel whose operands stay on chip).
double gemm_math_seconds(const KernelModel& kernels, double m, double n, double k, double count);

/// Seconds of a kernel that streams `bytes` through device memory: bytes / (memory_bandwidth ·
/// memory_efficiency) + kernel_seconds (0 for no bytes).
double memory_seconds(const KernelModel& kernels, double bytes);

/// Forward and backward seconds of task `task` of `graph` for one microbatch of `batch` samples
/// (the batch dimension set to `batch`; constant tasks have none), with activations of
/// `activation_bytes` bytes per element (2 in bf16 plans, 4 in fp32) and parameter gradients in f32:
///  - Gemm, MatMul: the forward GEMM; the backward's input-gradient and weight-gradient GEMMs by
///    their own shapes, the weight gradient accumulated into its f32 buffer (read and written);
///  - Attention [B, h, S, d] (the fused op: FlashAttention's way, the S × T scores stay on chip): the
///    batched GEMMs q kᵀ and P v (count B·h) by their math, only q, k, v and the output through
///    memory; the backward recomputes the scores (five GEMMs). The unfused form of a model built
///    without fused_attention (MatMul with the 1/√d scale as its alpha, Softmax, Dropout, MatMul, as
///    Megatron-LM 2021 runs it) is priced op by op, its scores through memory;
///  - Reshape and the tensor-parallel communication tasks: 0 (a view; their collectives are priced
///    apart, cost_model.h);
///  - every other op streams memory: forward its activation inputs and outputs, backward the
///    output gradients, the saved inputs and the input gradients (outputs + 2 × inputs); a Gather
///    (embedding lookup) moves the rows it reads, not the table.
/// Throws partrain::Error for a task id outside the graph or a disabled KernelModel.
std::pair<double, double> task_kernel_seconds(const Graph& graph, int task, std::int64_t batch,
                                              const KernelModel& kernels, double activation_bytes);

/// Seconds of one optimizer step over `parameter_bytes` of f32 parameters on a device with these
/// kernels: a memory-bound sweep reading and writing the parameters, gradients and state —
/// AdamW 7 passes (read parameter, gradient, two moments; write parameter, two moments), SGD with
/// momentum 5 — plus a bf16 copy of the parameters (half a pass) when `mixed_precision`.
double optimizer_kernel_seconds(const KernelModel& kernels, double parameter_bytes, const std::string& optimizer,
                                bool mixed_precision);

}  // namespace partrain::partition
