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
};

// More specific names first: "H100 PCIe" before "H100", "A100" before "A10".
constexpr std::array kPeaks{
    Peak{"H200", 67.0, 494.7},     Peak{"H100 PCIe", 51.0, 378.0}, Peak{"H100", 67.0, 494.7},
    Peak{"A100", 19.5, 156.0},     Peak{"A10G", 31.2, 62.5},
    Peak{"A10", 31.2, 62.5},       Peak{"L40S", 91.6, 183.0},      Peak{"L40", 90.5, 90.5},
    Peak{"L4", 30.3, 60.0},        Peak{"V100", 15.7, 15.7},       Peak{"RTX 4090", 82.6, 82.6},
    Peak{"RTX 3090", 35.6, 35.6},  Peak{"RTX A6000", 38.7, 77.4},
};

}  // namespace

std::optional<double> peak_flops(std::string_view device_name, Precision precision) {
  if (precision == Precision::bf16) return std::nullopt;
  for (const Peak& p : kPeaks)
    if (device_name.find(p.name) != std::string_view::npos)
      return 1e12 * (precision == Precision::tf32 ? p.tf32_tflops : p.fp32_tflops);
  return std::nullopt;
}

}  // namespace lockstep
