// A Llama-family decoder's token embedding: positions come from the blocks' rotary embeddings,
// so there is no position table (GPT-2's Embedding, in gpt.cpp, has one).
//
// Invariants (as every layer): stateless; backward accumulates into parameter gradients (+=).
#include <memory>
#include <string>
#include <vector>

#include "lockstep/model.hpp"
#include "model/ops.hpp"

namespace lockstep {
namespace {

// Parameters: embed_tokens (V, C). in (B, T) token ids as floats, out (B, T * C) = rows of it.
class TokenEmbedding final : public Layer {
 public:
  TokenEmbedding(int vocab, int context, int channels) : v_(vocab), t_(context), c_(channels) {}

  std::string_view kind() const noexcept override { return "token_embedding"; }
  int in_features() const noexcept override { return t_; }
  int out_features() const noexcept override { return t_ * c_; }
  std::size_t param_count() const noexcept override { return std::size_t(v_) * std::size_t(c_); }
  std::vector<ParamTensor> param_tensors(const std::string& prefix) const override {
    return {{prefix + ".embed_tokens.weight", 0, {v_, c_}}};
  }
  // N(0, 0.02), transformers' initializer_range.
  void init_parameters(float* params, std::uint64_t& rng) const override {
    detail::fill_normal(params, param_count(), detail::kInitStd, rng);
  }

  // params null: a frozen table held in bf16 only, read from ws.params_bf16 (Note [Frozen
  // parameters] in lora.cpp); a trained one reads its fp32 master under bf16 too.
  void forward(Device& dev, const float* params, const float* in, float* out, int batch,
               const LayerWorkspace& ws) const override {
    if (!params) return dev.embedding_forward(in, ws.params_bf16, nullptr, out, batch, t_, c_, nullptr);
    dev.embedding_forward(in, params, nullptr, out, batch, t_, c_, nullptr);
  }
  // Token ids have no gradient: din is ignored. grads null (frozen): nothing to do.
  void backward(Device& dev, const float* /*params*/, float* grads, const float* in,
                const float* /*out*/, const float* dout, float* /*din*/, int batch,
                const LayerWorkspace& /*ws*/) const override {
    if (grads) dev.embedding_backward(in, dout, grads, nullptr, batch, t_, c_, nullptr);
  }
  // Note [KV cache]: the rows of the step's tokens.
  bool decodes() const noexcept override { return true; }
  void decode(Device& dev, const float* params, const float* in, float* out,
              const DecodeStep& step) const override {
    dev.embedding_forward(in, params, nullptr, out, 1, step.count, c_, nullptr);
  }

 private:
  int v_, t_, c_;
};

}  // namespace

std::unique_ptr<Layer> make_token_embedding(int vocab, int context, int channels) {
  return std::make_unique<TokenEmbedding>(vocab, context, channels);
}

}  // namespace lockstep
