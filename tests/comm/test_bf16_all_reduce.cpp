// Communicator::all_reduce_bf16 over the CPU's shared-memory group: bf16 values summed in fp32,
// rounded to bf16 once (Note [bf16 gradient reduction] in src/train/reducer.hpp). Closed forms.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "closed_form.hpp"
#include "common/bf16.hpp"

using lockstep::detail::bf16_to_float;
using lockstep::detail::float_to_bf16;

TEST_CASE("all_reduce_bf16: sums in fp32 and rounds the result once, to nearest even") {
  // Every input is a bf16. 2 ranks, avg of 1 and 1 + 2^-7: 1 + 2^-8, half way between the bf16
  // neighbours 1 and 1 + 2^-7, so the tie goes to the even one, 1. 3 ranks, sum: 256 + 1 + 1 =
  // 258 is a bf16, but only a wider sum finds it (in bf16, 256 + 1 rounds back to 256); and
  // 1 + 1.0078125 + 0 = 2.0078125 is half way between 2 and 2.015625: even, 2.
  const std::vector<std::vector<float>> input{{1.0f, 256.0f, 3.0f}, {1.0078125f, 1.0f, -1.0f},
                                              {0.0f, 1.0f, 0.0f}};
  lockstep::test::on_group(2, [&](int rank, lockstep::Communicator& comm) {
    std::vector<std::uint16_t> x{float_to_bf16(input[rank][0])};
    comm.all_reduce_bf16(x.data(), x.size(), lockstep::ReduceOp::avg);
    CHECK(x[0] == float_to_bf16(1.0f));
  });
  lockstep::test::on_group(3, [&](int rank, lockstep::Communicator& comm) {
    std::vector<std::uint16_t> x;
    for (float v : input[rank]) x.push_back(float_to_bf16(v));
    comm.all_reduce_bf16_async(x.data(), x.size(), lockstep::ReduceOp::sum)->wait();
    CHECK(bf16_to_float(x[0]) == 2.0f);
    CHECK(bf16_to_float(x[1]) == 258.0f);
    CHECK(bf16_to_float(x[2]) == 2.0f);
  });
}
