// A Llama-family decoder's final RMSNorm, as a layer over flattened sequences (the blocks'
// own norms are inside them, fused with the residual adds).
//
// Invariants (as every layer): stateless; backward accumulates into parameter gradients (+=) and
// overwrites din (=).
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/model.hpp"

namespace lockstep {
namespace {

// Parameters: weight (C). in, out (B, T * C): y = x / sqrt(mean_c(x^2) + eps) * weight per
// position (Note [RMSNorm] in src/cpu/ops/layernorm.cpp).
class RmsNorm final : public Layer {
 public:
  RmsNorm(int context, int channels, double eps)
      : t_(context), c_(channels), eps_(static_cast<float>(eps)) {}

  std::string_view kind() const noexcept override { return "rmsnorm"; }
  int in_features() const noexcept override { return t_ * c_; }
  int out_features() const noexcept override { return t_ * c_; }
  std::size_t param_count() const noexcept override { return std::size_t(c_); }
  std::vector<ParamTensor> param_tensors(const std::string& prefix) const override {
    return {{prefix + ".weight", 0, {c_}}};
  }
  void init_parameters(float* params, std::uint64_t& /*rng*/) const override {
    std::fill(params, params + c_, 1.0f);
  }
  // rstd (N).
  std::size_t workspace_size(int batch, Precision /*precision*/) const noexcept override {
    return std::size_t(batch) * t_;
  }
  // (C): the weight's gradient when the weight is frozen (grads null), discarded; bf16, (C)
  // more: a frozen weight widened from its bf16 bits.
  std::size_t scratch_size(int /*batch*/, Precision precision) const noexcept override {
    return std::size_t(c_) * (precision == Precision::bf16 ? 2 : 1);
  }
  // Backward reads the input and rstd (Note [Head input] in src/model/model.cpp).
  bool backward_reads_output() const noexcept override { return false; }

  void forward(Device& dev, const float* params, const float* in, float* out, int batch,
               const LayerWorkspace& ws) const override {
    dev.residual_rmsnorm_forward(in, nullptr, nullptr, weight(dev, params, ws), out, ws.saved,
                                 batch * t_, c_, eps_);
  }
  void backward(Device& dev, const float* params, float* grads, const float* in,
                const float* /*out*/, const float* dout, float* din, int batch,
                const LayerWorkspace& ws) const override {
    if (!din) throw std::logic_error("rmsnorm: needs an input gradient (not a first layer)");
    dev.residual_rmsnorm_backward(in, weight(dev, params, ws), ws.saved, dout, nullptr, din,
                                  nullptr, grads ? grads : ws.scratch, batch * t_, c_);
  }
  // Note [KV cache]: rstd (count) in the scratch.
  bool decodes() const noexcept override { return true; }
  std::size_t decode_scratch_size(int count) const noexcept override {
    return std::size_t(count);
  }
  void decode(Device& dev, const float* params, const float* in, float* out,
              const DecodeStep& step) const override {
    dev.residual_rmsnorm_forward(in, nullptr, nullptr, params, out, step.scratch, step.count, c_,
                                 eps_);
  }

 private:
  // The fp32 weight: params, or with params null (frozen, held in bf16 only: Note [Frozen
  // parameters] in lora.cpp) its bf16 bits widened into the scratch after the sink.
  const float* weight(Device& dev, const float* params, const LayerWorkspace& ws) const {
    if (params) return params;
    if (!ws.params_bf16) throw std::logic_error("rmsnorm: no weight, fp32 or bf16");
    float* widened = ws.scratch + c_;
    dev.from_bf16(ws.params_bf16, widened, std::size_t(c_));
    return widened;
  }
  int t_, c_;
  float eps_;
};

}  // namespace

std::unique_ptr<Layer> make_rmsnorm(int context, int channels, double eps) {
  return std::make_unique<RmsNorm>(context, channels, eps);
}

}  // namespace lockstep
