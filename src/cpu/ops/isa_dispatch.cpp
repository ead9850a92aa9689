// The run-time choice of Note [Wide vectors for the CPU kernels] (isa_dispatch.hpp).
#include "cpu/ops/isa_dispatch.hpp"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>

namespace lockstep::cpu {
namespace {

std::vector<Isa> detect() {
  std::vector<Isa> isas{Isa::baseline};
#if defined(__x86_64__)
  __builtin_cpu_init();  // in case the first kernel runs from a static initialiser
  if (__builtin_cpu_supports("avx2")) isas.push_back(Isa::avx2);
  // What run_avx512's target string lets GCC use.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    isas.push_back(Isa::avx512);
#endif
  return isas;
}

const std::vector<Isa>& detected() {
  static const std::vector<Isa> isas = detect();
  return isas;
}

std::atomic<int> forced{-1};  // an Isa, or -1: the widest detected

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::baseline: return "baseline";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

Isa active_isa() {
  const int isa = forced.load(std::memory_order_relaxed);
  return isa < 0 ? detected().back() : static_cast<Isa>(isa);
}

std::vector<Isa> supported_isas() { return detected(); }

void force_isa(std::optional<Isa> isa) {
  const std::vector<Isa>& isas = detected();
  if (isa && std::find(isas.begin(), isas.end(), *isa) == isas.end())
    throw std::invalid_argument(std::string("force_isa: this CPU lacks ") + isa_name(*isa));
  forced.store(isa ? static_cast<int>(*isa) : -1, std::memory_order_relaxed);
}

}  // namespace lockstep::cpu
