#pragma once
// CUDA kernels of the tensor-parallel ops (kernels/cuda/tensor_parallel.cu; semantics:
// src/graph/ops/tensor_parallel.cpp; reference: kernels/cpu/tensor_parallel.cpp). They run on the
// rank's part of the tensors and reduce over KernelContext::tensor_parallel, as the CPU kernels do;
// f32 or bf16 storage, fp32 compute.
//
//   TensorParallelCopy (f)       forward: a device copy; backward: dx = dy all-reduced (summed).
//   TensorParallelAllReduce (g)  forward: y = x all-reduced (summed); backward: a device copy.
//                                Both sum with the group's all_reduce_deferrable, as on the CPU
//                                (sub-pipelined TMP). bf16 tensors are reduced as an f32 copy and
//                                rounded once (what the CPU backend's widening does), so the group
//                                only sees f32.
//   VocabParallelEmbedding       rows [r·V/t, (r+1)·V/t) of the vocabulary; other positions get
//                                zeros. An index outside [0, V) (V: vocab_size, without the
//                                vocabulary padding) throws partrain::Error with the CPU's message
//                                (checked on the device, then one host sync).
//                                Backward: fp32 atomics into the f32 gradient (or an f32 scratch
//                                rounded once to bf16): repeated indices add in a nondeterministic
//                                order, as in the CUDA Gather (fp32 rounding differences only).
//   VocabParallelCrossEntropy    over the rank's classes below vocab_size (the rest are vocabulary
//                                padding: no part in the softmax, zero gradient):
//                                row maxima and target logits (one warp or block per row), one Max
//                                all-reduce; sums of exponentials, one Sum all-reduce of the sums
//                                and target logits together (the CPU makes two; same values); then
//                                one block writes log_sum_exp and the mean loss in a fixed order
//                                (double). Labels are validated and counted first (one host sync),
//                                with the CPU's error message. Backward: dlogits =
//                                exp(z − log_sum_exp)·scale − scale·onehot, scale = dloss / count;
//                                no communication.
//   SequenceParallelAllGather,   sequence parallelism (Korthikanti et al. 2022 §4.2.2): the
//   ...ReduceScatter, ...Scatter, group's all_gather / reduce_scatter of f32 buffers (bf16 through an
//   ...Gather                    f32 copy, rounded once), rearranged between the group's
//                                rank-after-rank layout and the tensors' split dimension by
//                                cudaMemcpy2DAsync on the stream; the scatter's forward and the
//                                gather's backward (the rank's part) are one strided copy.
//
// Synchronisation: before every all-reduce, all-gather or reduce-scatter the kernel waits for the backend's stream (see
// reduce_over_group in the .cu for why); the group must have done its reduction, or queued it on
// the backend's stream, when all_reduce or all_reduce_deferrable returns
// (comm::CommunicatorTensorParallelGroup over the NCCL communicator queues on that stream; a
// host-staging group completes before returning).
//
// The family installs itself through register_cuda_tensor_parallel_kernels (kernels/cuda/cuda_backend.cuh).
#include "kernels/cuda/cuda_backend.cuh"
