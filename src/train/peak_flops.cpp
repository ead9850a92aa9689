// Data-sheet peak FLOP/s of GPUs, dense (without structured sparsity), for MFU.
#include <array>
#include <string_view>

#include "lockstep/device.hpp"

namespace lockstep {
namespace {

struct Peak {
  std::string_view name;  // a substring of the CUDA device name; the first match wins
  double fp32_tflops;     // CUDA cores, fp32 FMA
  double tf32_tflops;     // tensor cores, TF32 (the fp32 figure where there are none)
  double bf16_tflops;     // tensor cores, bf16 with fp32 accumulation; 0: not in the table
};

// More specific names first: "H100 PCIe" before "H100", "A100" before "A10".
// bf16 only where the data sheet gives a dense figure (V100 has no bf16 tensor cores).
constexpr std::array kPeaks{
    Peak{"H200", 67.0, 494.7, 989.4},    Peak{"H100 PCIe", 51.0, 378.0, 756.0},
    Peak{"H100", 67.0, 494.7, 989.4},    Peak{"A100", 19.5, 156.0, 312.0},
    Peak{"A10G", 31.2, 62.5, 0.0},       Peak{"A10", 31.2, 62.5, 125.0},
    Peak{"L40S", 91.6, 183.0, 362.05},   Peak{"L40", 90.5, 90.5, 181.05},
    Peak{"L4", 30.3, 60.0, 121.0},       Peak{"V100", 15.7, 15.7, 0.0},
    Peak{"RTX 4090", 82.6, 82.6, 0.0},   Peak{"RTX 3090", 35.6, 35.6, 0.0},
    Peak{"RTX A6000", 38.7, 77.4, 154.8},
};

}  // namespace

std::optional<double> peak_flops(std::string_view device_name, Precision precision) {
  for (const Peak& p : kPeaks) {
    if (device_name.find(p.name) == std::string_view::npos) continue;
    switch (precision) {
      case Precision::fp32: return 1e12 * p.fp32_tflops;
      case Precision::tf32: return 1e12 * p.tf32_tflops;
      case Precision::bf16:
        if (p.bf16_tflops > 0.0) return 1e12 * p.bf16_tflops;
        return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace lockstep
