// Kernel loops compiled for the baseline and for wider vectors, one chosen at run time
// (Note [Wide vectors for the CPU kernels]):
//
//   for_range(n, vectorized([=](std::size_t i0, std::size_t i1) {
//     for (std::size_t i = i0; i < i1; ++i) y[i] = f(x[i]);
//   }));
//
// Note [Wide vectors for the CPU kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The library is compiled for baseline x86-64, so GCC vectorises the kernels' loops with SSE2's
// 4-float vectors. vectorized(fn) instantiates the call of fn three times: as compiled, and in
// functions with target("avx2") and target("avx512f,...") whose gnu::flatten inlines fn and
// everything it calls, so that the vectoriser sees the loops in a function of that target and
// uses 8 and 16 floats (GCC inlines a function of the default target into a wider one, never
// the reverse; without flatten it may leave fn a call, compiled for SSE2). active_isa() picks the
// widest the CPU has, once per process (__builtin_cpu_supports); the choice costs a call per
// block of the arena. Note [Wide vectors for the sums] in src/comm/shared_memory_comm.cpp does
// the same for the all-reduce's sums.
//
// Every variant computes the same values:
//  - No fused multiply-add. The target strings leave out "fma", but AVX-512F has FMA
//    instructions of its own; src/cpu is compiled with -ffp-contract=off, so GCC fuses nothing,
//    and no kernel calls std::fma.
//  - Without -ffast-math the vectoriser keeps every floating-point reduction in source order
//    (the double sums of LayerNorm and the losses stay scalar) and only widens what each element
//    computes on its own, with the same IEEE operations.
//  - bf16 results round through common/bf16.hpp's integer rounding, vectorised as integer
//    operations. AVX512_BF16's vcvtneps2bf16 is not used: it flushes subnormal inputs to zero
//    and keeps a NaN's sign and payload, where float_to_bf16 rounds subnormals and writes
//    0x7FC0 for every NaN (over all 2^32 floats on a Zen 5 the two differ on exactly those).
//  - A NaN stays a NaN, but its sign and payload may differ: when both operands of an x86
//    operation are NaN, the result is the first one, and the vectoriser may put a commutative
//    operation's operands in another order. No result depends on a NaN's payload (the CUDA
//    kernels make their own NaNs; bf16 stores every NaN as 0x7FC0).
// tests/cpu/test_wide_vectors.cpp runs each kernel under every ISA the CPU supports and compares
// the outputs with the baseline's; letting FMA in makes it fail.
#pragma once

#include <optional>
#include <vector>

namespace lockstep::cpu {

enum class Isa { baseline, avx2, avx512 };

const char* isa_name(Isa isa);
// The ISA the kernels run: the widest this CPU supports, unless force_isa chose another.
Isa active_isa();
// Every ISA this CPU supports, the baseline first.
std::vector<Isa> supported_isas();
// For tests: run the kernels as compiled for `isa` (one of supported_isas(), else
// std::invalid_argument), or again for the widest (std::nullopt). Process-wide: call it while no
// kernel runs.
void force_isa(std::optional<Isa> isa);

namespace isa_detail {

template <class Fn, class... Args>
[[gnu::flatten]] inline auto run_baseline(const Fn& fn, Args... args) {
  return fn(args...);
}

#if defined(__x86_64__)
template <class Fn, class... Args>
[[gnu::target("avx2"), gnu::flatten]] inline auto run_avx2(const Fn& fn, Args... args) {
  return fn(args...);
}

template <class Fn, class... Args>
[[gnu::target("avx512f,avx512bw,avx512dq,avx512vl"), gnu::flatten]]
inline auto run_avx512(const Fn& fn, Args... args) {
  return fn(args...);
}
#endif

}  // namespace isa_detail

// fn, called through the variant of active_isa(). fn's arguments are taken by value (indices,
// pointers), as for_range and for_blocks pass them.
template <class Fn>
auto vectorized(Fn fn) {
  return [fn](auto... args) {
#if defined(__x86_64__)
    switch (active_isa()) {
      case Isa::avx512:
        return isa_detail::run_avx512(fn, args...);
      case Isa::avx2:
        return isa_detail::run_avx2(fn, args...);
      case Isa::baseline:
        break;
    }
#endif
    return isa_detail::run_baseline(fn, args...);
  };
}

}  // namespace lockstep::cpu
