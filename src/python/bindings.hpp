// Shared by the translation units of the Python module lockstep._lockstep (Note [Python module]
// in module.cpp).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "lockstep/checkpoint.hpp"
#include "lockstep/dataset.hpp"

namespace lockstep::python {

namespace nb = nanobind;

// A dataset as Python holds it: lockstep.InMemoryDataset, TokenDataset and the datasets
// load_dataset() makes all wrap one of these.
struct PyDataset {
  std::shared_ptr<const Dataset> data;
};

// `values` as a numpy array of `shape` that owns them (no copy).
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T> values, std::span<const std::size_t> shape) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.data(), owner);
}

template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T> values, std::initializer_list<std::size_t> shape) {
  return to_numpy(std::move(values), std::span<const std::size_t>(shape.begin(), shape.size()));
}

// Each tensor of `tensors` as a numpy array of its shape, copied out of `values` (a parameter
// buffer, or an optimiser state in its layout).
inline nb::dict tensors_to_numpy(std::span<const ParamTensor> tensors, std::span<const float> values) {
  nb::dict out;
  for (const ParamTensor& t : tensors) {
    std::size_t count = 1;
    std::vector<std::size_t> shape;
    for (const std::int64_t extent : t.shape) {
      shape.push_back(static_cast<std::size_t>(extent));
      count *= static_cast<std::size_t>(extent);
    }
    const std::span<const float> part = values.subspan(t.offset, count);
    out[nb::str(t.name.c_str())] = to_numpy(std::vector<float>(part.begin(), part.end()), shape);
  }
  return out;
}

// A loader's warnings, appended to `warnings`, to be raised as Python warnings once the lock is
// held again.
inline CheckpointManager::Warn collect(std::vector<std::string>& warnings) {
  return [&warnings](const std::string& w) { warnings.push_back(w); };
}

void bind_trainer(nb::module_& m);

}  // namespace lockstep::python
