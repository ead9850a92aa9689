// The bf16 all-reduce of communicators over host memory: widen, all_reduce in fp32, round once
// (see Communicator::all_reduce_bf16 in lockstep/comm.hpp, Note [bf16 gradient reduction] in
// src/train/reducer.hpp).
#include <vector>

#include "common/bf16.hpp"
#include "lockstep/comm.hpp"

namespace lockstep {

void Communicator::all_reduce_bf16(std::uint16_t* data, std::size_t count, ReduceOp op) {
  std::vector<float> wide(count);
  for (std::size_t i = 0; i < count; ++i) wide[i] = detail::bf16_to_float(data[i]);
  all_reduce(wide.data(), count, op);
  for (std::size_t i = 0; i < count; ++i) data[i] = detail::float_to_bf16(wide[i]);
}

std::unique_ptr<CommWork> Communicator::all_reduce_bf16_async(std::uint16_t* data,
                                                              std::size_t count, ReduceOp op) {
  return start([=, this] { all_reduce_bf16(data, count, op); });
}

}  // namespace lockstep
