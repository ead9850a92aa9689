// The host-side rules of cuDNN's fused attention (cudnn_attention.hpp): layouts, graph keys,
// refusals. No cuDNN here, so they build and are tested without it.
#include <fmt/format.h>

#include "cuda/cudnn_attention.hpp"

namespace lockstep::cuda {

AttentionLayout attention_layout(const AttentionShape& s) {
  const std::int64_t b = s.batch, t = s.T, h = s.heads, d = s.head_size, c = h * d;
  // Row r = (sequence, position) of qkv is 3C wide: head h of q starts at column h D.
  const auto in_qkv = [&](int which) {
    return TensorLayout{{b, h, t, d}, {t * 3 * c, d, 3 * c, 1}, which * c};
  };
  return {.q = in_qkv(0),
          .k = in_qkv(1),
          .v = in_qkv(2),
          .o = {{b, h, t, d}, {t * c, d, c, 1}, 0},
          .stats = {{b, h, t, 1}, {h * t, t, 1, 1}, 0}};
}

AttentionKey attention_key(const AttentionShape& s, bool backward) {
  return {s.batch, s.T, s.heads, s.head_size, backward};
}

std::string cudnn_attention_refusal(Precision precision, int head_size, long cudnn_version) {
  if (precision != Precision::bf16)
    return fmt::format("cuDNN's fused attention takes half-precision inputs, and "
                       "trainer.precision is {} (bf16 runs it)",
                       to_string(precision));
  if (cudnn_version < kMinCudnnVersion) {
    // cudnnGetVersion: major 10000 + minor 100 + patch from cuDNN 9, major 1000 + ... before.
    const long unit = cudnn_version >= 90000 ? 10000 : 1000;
    return fmt::format("the cuDNN loaded is {}.{}.{}, older than {}.{} which fused attention "
                       "needs",
                       cudnn_version / unit, cudnn_version % unit / 100, cudnn_version % 100,
                       kMinCudnnVersion / 10000, kMinCudnnVersion / 100 % 100);
  }
  // cuDNN's SDPA kernels load heads in 16-byte vectors and hold at most 256 channels of one.
  if (head_size % 8 != 0)
    return fmt::format("cuDNN's fused attention needs a head size that is a multiple of 8, "
                       "and it is {}",
                       head_size);
  if (head_size > 256)
    return fmt::format("cuDNN's fused attention takes head sizes up to 256, and it is {}",
                       head_size);
  return {};
}

}  // namespace lockstep::cuda
