// For a test case that cannot run here: say which kind of reason and why, and let CTest report it
// as skipped rather than passed.
//
//   if (!backend) return test::skip(test::Skip::gpu, "no usable GPU");
//
// The kind decides whether scripts/test.sh accepts the skip: see Note [Skip kinds].
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <string_view>

namespace lockstep::test {

// Note [Skip kinds]
// scripts/test.sh sets LOCKSTEP_SKIP_LOG; every skip appends "kind<TAB>case<TAB>why" there, and
// the script prints them all at the end of the run. It fails the run for a skip of a kind that
// must not happen on the machine it prepared (it installs every package the suite uses):
//   gpu       accepted: needs a GPU (or a second one) this machine does not have.
//   root      accepted: the contract does not hold for root by design, and no way to drop to
//             another user exists here (no setpriv).
//   platform  accepted: the CPU or the kernel lacks the feature the case is about (vectors wider
//             than the baseline's, per-thread time slices).
//   setup     accepted: how this build or run was set up makes the case meaningless (a sanitizer
//             build, the README outside the plain build, LOCKSTEP_CPU_GEMM=openblas); not the
//             set-up of scripts/test.sh, which builds the plain build and sets none of these.
//   missing   refused: a program or package that scripts/test.sh installs is missing, or the
//             environment the case needs could not be made.
//   unbuilt   refused: a part of lockstep that this machine can build was not built: the CUDA
//             backend where the configure found the CUDA toolkit (nvcc), cuDNN's fused attention
//             under LOCKSTEP_REQUIRE_CUDNN_ATTENTION. Without the toolkit the CUDA cases skip as
//             gpu. See Note [CUDA toolkit, backend not built] in the top-level CMakeLists.txt.
enum class Skip { gpu, root, platform, setup, missing, unbuilt };

constexpr std::string_view skip_kind_name(Skip kind) {
  switch (kind) {
    case Skip::gpu: return "gpu";
    case Skip::root: return "root";
    case Skip::platform: return "platform";
    case Skip::setup: return "setup";
    case Skip::missing: return "missing";
    case Skip::unbuilt: return "unbuilt";
  }
  return "?";
}

// Marks the running case as skipped and logs it; tests/main.cpp reads the mark once the run is
// over. See Note [Skipped cases].
void mark_skipped(Skip kind, const std::string& why);

// Prints "skipping (KIND): WHY" and marks the case as skipped. The caller returns right after.
inline void skip(Skip kind, const std::string& why) {
  MESSAGE("skipping (" << skip_kind_name(kind) << "): " << why);
  mark_skipped(kind, why);
}

}  // namespace lockstep::test
