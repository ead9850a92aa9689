// The host-side rules of cuDNN's fused attention (cudnn_attention.hpp): layouts, graph keys,
// refusals. No cuDNN here, so they build and are tested without it.
#include <fmt/format.h>

#include "cuda/cudnn_attention.hpp"

#include <cstdlib>
#include <string_view>

#include "lockstep/error.hpp"

namespace lockstep::cuda {

AttentionLayout attention_layout(const AttentionShape& s) {
  const std::int64_t b = s.batch, t = s.T, h = s.heads, d = s.head_size, c = h * d;
  const std::int64_t kv = kv_heads_of(s), width = qkv_width(s);
  // Row r = (sequence, position) of qkv is (H + 2 Hkv) D wide: head h of q starts at column
  // h D, head g of k at H D + g D, of v at (H + Hkv) D + g D. cuDNN maps query head h to kv
  // head h / (H / Hkv) itself, from the heads' dims.
  const auto in_qkv = [&](std::int64_t heads, std::int64_t column) {
    return TensorLayout{{b, heads, t, d}, {t * width, d, width, 1}, column};
  };
  return {.q = in_qkv(h, 0),
          .k = in_qkv(kv, c),
          .v = in_qkv(kv, c + kv * d),
          .o = {{b, h, t, d}, {t * c, d, c, 1}, 0},
          .stats = {{b, h, t, 1}, {h * t, t, 1, 1}, 0},
          .bias = {{b, 1, t, t}, {t * t, t * t, t, 1}, 0}};
}

std::size_t packed_bias_bytes(const AttentionShape& s) {
  if (!s.positions) return 0;
  const std::size_t bytes = 2 * std::size_t(s.batch) * std::size_t(s.T) * std::size_t(s.T);
  return (bytes + 255) / 256 * 256;
}

AttentionKey attention_key(const AttentionShape& s, bool backward, bool deterministic) {
  const bool forward_or_deterministic = !backward || deterministic;
  return {s.batch,   s.T,     s.heads,  s.head_size, kv_heads_of(s),
          backward, forward_or_deterministic, s.positions != nullptr};
}

std::string cudnn_version_text(long version) {
  // cudnnGetVersion: major 10000 + minor 100 + patch from cuDNN 9, major 1000 + ... before.
  const long unit = version >= 90000 ? 10000 : 1000;
  return fmt::format("{}.{}.{}", version / unit, version % unit / 100, version % 100);
}

std::string cudnn_attention_refusal(Precision precision, int head_size, int T,
                                    long cudnn_version) {
  if (precision != Precision::bf16)
    return fmt::format("cuDNN's fused attention takes half-precision inputs, and "
                       "trainer.precision is {} (bf16 runs it)",
                       to_string(precision));
  if (cudnn_version < kMinCudnnVersion)
    return fmt::format("the cuDNN loaded is {}, older than {}.{} which fused attention needs",
                       cudnn_version_text(cudnn_version), kMinCudnnVersion / 10000,
                       kMinCudnnVersion / 100 % 100);
  // cuDNN's SDPA kernels load heads in 16-byte vectors and hold at most 256 channels of one.
  if (head_size % 8 != 0)
    return fmt::format("cuDNN's fused attention needs a head size that is a multiple of 8, "
                       "and it is {}",
                       head_size);
  if (head_size > 256)
    return fmt::format("cuDNN's fused attention takes head sizes up to 256, and it is {}",
                       head_size);
  // The frontend's sdpa_backward refuses one query and one key ("s_q = s_kv = 1 is not
  // supported", cudnn-frontend 1.32, node/scaled_dot_product_flash_attention.h).
  if (T == 1)
    return "cuDNN's fused attention backward does not take sequences of one position (s_q = "
           "s_kv = 1), and T is 1";
  return {};
}

bool cudnn_backward_deterministic_from_env() {
  const char* env = std::getenv("LOCKSTEP_CUDNN_BACKWARD");
  const std::string_view asked = env ? env : "deterministic";
  if (asked == "deterministic") return true;
  if (asked == "nondeterministic") return false;
  throw InputError(fmt::format(
      "LOCKSTEP_CUDNN_BACKWARD: expected deterministic or nondeterministic, got '{}'", asked));
}

}  // namespace lockstep::cuda
