// Models: layers, their parameter layout, and a replica on one device.
//
//   lockstep::Model model = lockstep::Model::mlp({.inputs = 64, .hidden = {128}, .classes = 10,
//                                                 .activation = lockstep::Activation::relu});
//   std::vector<float> init = model.initial_parameters(/*seed=*/0);   // host, once
//   lockstep::Replica replica(device, model, /*max_batch=*/32);
//   replica.load_parameters(init);
//   const float* logits = replica.forward(x, batch);
//
// A Model is the architecture: stateless layers and where each parameter lives. It is shared,
// read-only, by every worker. A Replica is one worker's copy: one contiguous parameter buffer,
// one contiguous gradient buffer with the same layout, and the activations.
//
// Layout: layers are stored in REVERSE order of the forward pass (the last layer at offset 0),
// so the gradients backward produces first are contiguous at the front. The reducer buckets
// views of that buffer without copying.
//
// Backward accumulates into parameter gradients (+=) and overwrites activation gradients (=).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lockstep/config.hpp"
#include "lockstep/device.hpp"

namespace lockstep {

// A named tensor inside the parameter buffer, for checkpoints and export.
struct ParamTensor {
  std::string name;                  // "layers.0.weight", as in torch.nn.Sequential
  std::size_t offset = 0;            // in elements, into the parameter buffer
  std::vector<std::int64_t> shape;   // row-major
  std::size_t numel() const;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string_view kind() const noexcept = 0;
  virtual int in_features() const noexcept = 0;
  virtual int out_features() const noexcept = 0;
  virtual std::size_t param_count() const noexcept { return 0; }
  // This layer's tensors, with offsets relative to the layer's first parameter.
  virtual std::vector<ParamTensor> param_tensors(const std::string& /*prefix*/) const { return {}; }
  // Fills params[0..param_count()) on the host from rng draws (a 64-bit generator).
  virtual void init_parameters(float* /*params*/, std::uint64_t& /*rng_state*/) const {}

  // in (B, in_features), out (B, out_features)
  virtual void forward(Device& dev, const float* params, const float* in, float* out,
                       int batch) const = 0;
  // dout (B, out_features) -> din (B, in_features), overwritten; din may be null (first layer).
  // Parameter gradients are accumulated into grads (+=).
  virtual void backward(Device& dev, const float* params, float* grads, const float* in,
                        const float* out, const float* dout, float* din, int batch) const = 0;
};

// weight (out, in), bias (out); out = in * weight^T + bias. PyTorch's default init:
// U(-1/sqrt(in), 1/sqrt(in)) for both.
std::unique_ptr<Layer> make_linear(int in_features, int out_features);
std::unique_ptr<Layer> make_activation(Activation f, int features);

struct MlpSpec {
  int inputs = 0;
  std::vector<int> hidden;
  int classes = 0;
  Activation activation = Activation::relu;
};

class Model {
 public:
  explicit Model(std::vector<std::unique_ptr<Layer>> layers);
  static Model mlp(const MlpSpec& spec);

  const std::vector<std::unique_ptr<Layer>>& layers() const noexcept { return layers_; }
  // Offset of layer i's parameters in the parameter buffer (see Layout above).
  std::size_t param_offset(std::size_t layer) const { return offsets_.at(layer); }
  std::size_t param_count() const noexcept { return param_count_; }
  int inputs() const;
  int outputs() const;
  std::vector<ParamTensor> param_tensors() const;
  // Widest activation, for sizing buffers.
  int max_width() const;

  // The initial parameters, drawn on the host from `seed` alone: the same for any device count.
  std::vector<float> initial_parameters(std::uint64_t seed) const;

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::size_t> offsets_;
  std::size_t param_count_ = 0;
};

class Replica {
 public:
  Replica(Device& device, const Model& model, int max_batch);

  Device& device() noexcept { return *device_; }
  const Model& model() const noexcept { return *model_; }
  float* params() noexcept { return params_.data(); }
  float* grads() noexcept { return grads_.data(); }
  std::size_t param_count() const noexcept { return params_.size(); }

  void load_parameters(std::span<const float> host);
  std::vector<float> parameters() const;  // to host
  std::vector<float> gradients() const;   // to host
  void zero_grads();

  // x (B, inputs) on the device -> logits (B, outputs), owned by the replica.
  const float* forward(const float* x, int batch);
  // dlogits (B, outputs). After each layer's parameter gradients are final, calls
  // grads_ready(layer index) so a reducer can start on them; layers run last to first.
  void backward(const float* x, const float* dlogits, int batch,
                const std::function<void(std::size_t)>& grads_ready = {});

 private:
  Device* device_;
  const Model* model_;
  int max_batch_;
  DeviceArray<float> params_;
  DeviceArray<float> grads_;
  std::vector<DeviceArray<float>> acts_;  // acts_[i] = output of layer i
  DeviceArray<float> dbuf_[2];            // ping-pong activation gradients
};

}  // namespace lockstep
