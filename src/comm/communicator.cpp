#include "comm/communicator.h"

#include <cstring>
#include <exception>
#include <iostream>

#include "core/error.h"

namespace partrain::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

// ---------------- Request ----------------

void Request::finish_quietly() noexcept {
  if (!impl_) return;
  if (std::uncaught_exceptions() > 0) {
    // Unwinding: the peer may never complete the operation. Abandon it, keeping its buffers alive.
    (void)impl_.release();
    return;
  }
  try {
    impl_->wait();
  } catch (const std::exception& error) {
    std::cerr << "partrain: error in an unfinished communication request destroyed without wait(): "
              << error.what() << std::endl;
  } catch (...) {
    std::cerr << "partrain: unknown error in an unfinished communication request" << std::endl;
  }
  impl_.reset();
}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    finish_quietly();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Request::~Request() { finish_quietly(); }

void Request::wait() {
  if (!impl_) return;
  // On failure the Impl is dropped too: a failed operation is finished.
  std::unique_ptr<Impl> impl = std::move(impl_);
  impl->wait();
}

bool Request::test() {
  if (!impl_) return true;
  bool complete = false;
  try {
    complete = impl_->test();
  } catch (...) {
    impl_.reset();
    throw;
  }
  if (complete) impl_.reset();
  return complete;
}

void wait_all(std::span<Request> requests) {
  std::exception_ptr first_error;
  for (Request& request : requests) {
    try {
      request.wait();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

// ---------------- Communicator ----------------

Communicator::~Communicator() = default;

void Communicator::all_reduce_coalesced(std::span<const Tensor> tensors, ReduceOp op) {
  if (tensors.empty()) return;
  const DType dtype = tensors.front().dtype();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    PARTRAIN_CHECK(tensor.defined(), "all_reduce_coalesced: tensor " << i << " is undefined");
    PARTRAIN_CHECK(tensor.device().is_cpu(), "all_reduce_coalesced: tensor " << i << " is on "
                                                 << tensor.device().to_string()
                                                 << "; the default implementation needs host tensors");
    PARTRAIN_CHECK(tensor.dtype() == dtype, "all_reduce_coalesced: tensor " << i << " has dtype "
                                                << dtype_name(tensor.dtype()) << ", tensor 0 has "
                                                << dtype_name(dtype));
    total += tensor.numel();
  }
  if (tensors.size() == 1) {
    all_reduce(tensors.front(), op);
    return;
  }
  Tensor flat = Tensor::empty({total}, dtype);
  char* cursor = static_cast<char*>(flat.raw_data());
  for (const Tensor& tensor : tensors) {
    if (tensor.nbytes()) std::memcpy(cursor, tensor.raw_data(), tensor.nbytes());
    cursor += tensor.nbytes();
  }
  all_reduce(flat, op);
  cursor = static_cast<char*>(flat.raw_data());
  for (const Tensor& tensor : tensors) {
    if (tensor.nbytes()) std::memcpy(tensor.raw_data(), cursor, tensor.nbytes());
    cursor += tensor.nbytes();
  }
}

void check_gather(const Tensor& whole, const Tensor& part, int ranks, const char* operation) {
  PARTRAIN_CHECK(whole.defined() && part.defined() && whole.dtype() == part.dtype(),
                 operation << ": needs defined tensors of one dtype");
  PARTRAIN_CHECK(whole.numel() == part.numel() * ranks, operation << ": " << whole.numel() << " elements are not "
                                                                  << ranks << " parts of " << part.numel());
}

void check_scatter_gather(const Tensor& whole, const Tensor& part, int ranks, const char* operation) {
  check_gather(whole, part, ranks, operation);
  PARTRAIN_CHECK(whole.dtype() == DType::F32, operation << ": needs f32 tensors");
}

bool is_own_slot(const Tensor& part, const Tensor& whole, int rank) {
  return part.raw_data() == static_cast<const char*>(whole.raw_data()) + static_cast<std::size_t>(rank) * part.nbytes();
}

int group_rank_of(const Communicator& communicator, int global_rank) {
  const std::span<const int> ranks = communicator.global_ranks();
  for (std::size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == global_rank) return static_cast<int>(i);
  return -1;
}

}  // namespace partrain::comm
