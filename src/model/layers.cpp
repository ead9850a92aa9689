// The layers: Linear and elementwise activations.
//
// Invariants: a layer is stateless and shared read-only by every replica; everything it touches
// is passed in. Shapes are (batch, features), row-major. Backward accumulates into parameter
// gradients (+=) and overwrites the input gradient (=), which is skipped when din is null.
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "common/random.hpp"
#include "lockstep/model.hpp"
#include "model/ops.hpp"

namespace lockstep {
namespace {

// Parameters: weight (out, in) row-major, then bias (out).
class Linear final : public Layer {
 public:
  Linear(int in_features, int out_features) : in_(in_features), out_(out_features) {}

  std::string_view kind() const noexcept override { return "linear"; }
  int in_features() const noexcept override { return in_; }
  int out_features() const noexcept override { return out_; }
  std::size_t param_count() const noexcept override { return weight_count() + out_; }

  std::vector<ParamTensor> param_tensors(const std::string& prefix) const override {
    return {{prefix + ".weight", 0, {out_, in_}}, {prefix + ".bias", weight_count(), {out_}}};
  }

  // U(-1/sqrt(in), 1/sqrt(in)) for every weight, then every bias, in storage order.
  void init_parameters(float* params, std::uint64_t& rng_state) const override {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    for (std::size_t i = 0; i < param_count(); ++i)
      params[i] = static_cast<float>((2.0 * detail::uniform01(rng_state) - 1.0) * bound);
  }

  // bf16 (Note [bf16 compute]): saved holds the input rounded to bf16 (B, in) for backward,
  // scratch dout rounded to bf16 (B, out).
  std::size_t workspace_size(int batch, Precision precision) const noexcept override {
    return precision == Precision::bf16 ? detail::bf16_floats(rows(batch) * in_) : 0;
  }
  std::size_t scratch_size(int batch, Precision precision) const noexcept override {
    return precision == Precision::bf16 ? detail::bf16_floats(rows(batch) * out_) : 0;
  }

  // out (B, out) = in (B, in) * W^T (in, out) + b
  void forward(Device& dev, const float* params, const float* in, float* out, int batch,
               const LayerWorkspace& ws) const override {
    const MatIn x = detail::as_input(dev, in, saved_bf16(ws), rows(batch) * in_);
    detail::linear_forward(dev, weights(params, ws), x, {out, nullptr}, nullptr, batch, in_, out_);
  }

  // dW (out, in) += dout^T (out, B) * in (B, in); db (out) += column sums of dout (B, out);
  // din (B, in) = dout (B, out) * W (out, in).
  void backward(Device& dev, const float* params, float* grads, const float* in,
                const float* /*out*/, const float* dout, float* din, int batch,
                const LayerWorkspace& ws) const override {
    const std::uint16_t* saved = saved_bf16(ws);
    const MatIn x = saved ? MatIn{nullptr, saved} : MatIn{in, nullptr};
    detail::linear_backward(dev, weights(params, ws), grads, grads + weight_count(), x, dout, din,
                            batch, in_, out_, reinterpret_cast<std::uint16_t*>(ws.scratch));
  }

 private:
  std::size_t weight_count() const noexcept { return static_cast<std::size_t>(out_) * in_; }
  static std::size_t rows(int batch) noexcept { return static_cast<std::size_t>(batch); }
  // The weight as the precision's matrix products read it, and the bias.
  detail::LinearParams weights(const float* params, const LayerWorkspace& ws) const noexcept {
    return detail::linear_params(params, ws, 0, weight_count());
  }
  // bf16: where the input is kept, rounded; null otherwise.
  static std::uint16_t* saved_bf16(const LayerWorkspace& ws) noexcept {
    return ws.precision == Precision::bf16 ? reinterpret_cast<std::uint16_t*>(ws.saved) : nullptr;
  }
  int in_;
  int out_;
};

// y = f(x), features wide; no parameters.
class ActivationLayer final : public Layer {
 public:
  ActivationLayer(Activation f, int features) : f_(f), features_(features) {}

  std::string_view kind() const noexcept override {
    switch (f_) {
      case Activation::relu: return "relu";
      case Activation::gelu: return "gelu";
      case Activation::tanh: return "tanh";
    }
    return "activation";
  }
  int in_features() const noexcept override { return features_; }
  int out_features() const noexcept override { return features_; }

  void forward(Device& dev, const float* /*params*/, const float* in, float* out, int batch,
               const LayerWorkspace& /*ws*/) const override {
    dev.activation_forward(f_, in, out, size(batch));
  }

  // din = dout * f'(in)
  void backward(Device& dev, const float* /*params*/, float* /*grads*/, const float* in,
                const float* /*out*/, const float* dout, float* din, int batch,
                const LayerWorkspace& /*ws*/) const override {
    if (din) dev.activation_backward(f_, in, dout, din, size(batch));
  }

 private:
  std::size_t size(int batch) const noexcept {
    return static_cast<std::size_t>(batch) * static_cast<std::size_t>(features_);
  }
  Activation f_;
  int features_;
};

}  // namespace

std::unique_ptr<Layer> make_linear(int in_features, int out_features) {
  if (in_features < 1 || out_features < 1)
    throw std::invalid_argument(fmt::format(
        "linear layer: features must be at least 1, got in={} out={}", in_features, out_features));
  return std::make_unique<Linear>(in_features, out_features);
}

std::unique_ptr<Layer> make_activation(Activation f, int features) {
  if (features < 1)
    throw std::invalid_argument(
        fmt::format("activation layer: features must be at least 1, got {}", features));
  return std::make_unique<ActivationLayer>(f, features);
}

}  // namespace lockstep
