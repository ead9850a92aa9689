// lockstep._lockstep: the C++ half of the Python module `lockstep` (the other half is
// src/python/lockstep/__init__.py, which is the interface users see).
//
// Note [Python module]
// ~~~~~~~~~~~~~~~~~~~~
// The binding is thin on purpose: the trainer, its workers and their data stay C++ threads, and
// Python is entered only to call a user's callback. This module exposes the library's own types
// (a config, a dataset, a trainer, a checkpoint) with underscored names; __init__.py builds the
// Pythonic interface on them (keyword arguments, dataclasses, numpy conversions). Errors keep
// the library's classes and messages: InputError, its ConfigError, and WorkerError with the
// failed worker's rank and device.
//
// Datasets borrow numpy arrays (Note [Borrowed samples] in lockstep/dataset.hpp): the dataset
// holds a reference to the array, and a worker reads its rows in place. The array's last
// reference can be dropped on a worker's thread when a run ends; nanobind's ndarray takes the
// interpreter's lock for that itself.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/config.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"
#include "lockstep/generate.hpp"
#include "lockstep/version.hpp"

namespace lockstep::python {
namespace {

using namespace nb::literals;

// ---- errors ---------------------------------------------------------------------------------

// lockstep.WorkerError: kept alive by the module's attribute for as long as the module lives.
PyObject* g_worker_error = nullptr;

void bind_errors(nb::module_& m) {
  // nanobind tries the translators of later registrations first: the most derived go last.
  nb::exception<Error> error(m, "Error", PyExc_RuntimeError);
  nb::exception<InputError> input(m, "InputError", error);
  nb::exception<ConfigError> config(m, "ConfigError", input);
  g_worker_error = PyErr_NewExceptionWithDoc(
      "lockstep._lockstep.WorkerError",
      "A failure inside one worker of a run: .rank is its global rank, .device its device.",
      error.ptr(), nullptr);
  m.attr("WorkerError") = nb::steal(g_worker_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const WorkerError& e) {
      nb::object exc = nb::handle(g_worker_error)(e.what());
      exc.attr("rank") = e.rank();
      exc.attr("device") = e.device();
      PyErr_SetObject(g_worker_error, exc.ptr());
    }
  });
}

// ---- config ---------------------------------------------------------------------------------

// A plain YAML scalar as Python reads it: None, a bool, an int, a float, else the text. A quoted
// one (tag "!") stays text.
nb::object scalar_to_python(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return nb::str(text.c_str(), text.size());
  if (text == "null" || text == "~" || text.empty()) return nb::none();
  if (text == "true") return nb::bool_(true);
  if (text == "false") return nb::bool_(false);
  const char* end = text.data() + text.size();
  long long i = 0;
  if (auto [ptr, ec] = std::from_chars(text.data(), end, i); ec == std::errc{} && ptr == end)
    return nb::int_(i);
  double d = 0.0;
  if (auto [ptr, ec] = std::from_chars(text.data(), end, d); ec == std::errc{} && ptr == end)
    return nb::float_(d);
  return nb::str(text.c_str(), text.size());
}

nb::object yaml_to_python(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nb::dict out;
      for (const auto& kv : node) out[nb::str(kv.first.Scalar().c_str())] = yaml_to_python(kv.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      nb::list out;
      for (const auto& item : node) out.append(yaml_to_python(item));
      return out;
    }
    case YAML::NodeType::Scalar: return scalar_to_python(node);
    default: return nb::none();
  }
}

void bind_config(nb::module_& m) {
  nb::class_<Config>(m, "_Config")
      .def("to_yaml", [](const Config& c) { return to_yaml(c); })
      .def("to_dict", [](const Config& c) { return yaml_to_python(YAML::Load(to_yaml(c))); },
           "Every key and value, as nested dicts (what to_yaml() writes, read back).")
      .def("values", [](const Config& c) { return config_values(c); })
      .def("hash", [](const Config& c) { return config_hash(c); });
  m.def(
      "_load_config",
      [](const std::filesystem::path& file, const std::vector<std::string>& overrides) {
        return load_config(file, overrides);
      },
      "file"_a, "overrides"_a);
  m.def(
      "_parse_config",
      [](std::string_view yaml, std::string_view source, const std::vector<std::string>& overrides) {
        return parse_config(yaml, source, overrides);
      },
      "yaml"_a, "source"_a, "overrides"_a);
}

// ---- datasets -------------------------------------------------------------------------------

template <typename T>
using Column = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Matrix = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// A borrowed token stream: the array's reference is the dataset's owner.
template <typename T>
PyDataset borrowed_tokens(const Column<T>& tokens, int context, int vocab_size) {
  auto owner = std::make_shared<const Column<T>>(tokens);
  return {std::make_shared<const TokenDataset>(std::span<const T>(tokens.data(), tokens.size()),
                                               std::move(owner), context, vocab_size)};
}

void bind_datasets(nb::module_& m) {
  nb::class_<PyDataset>(m, "_Dataset")
      .def_prop_ro("size", [](const PyDataset& d) { return d.data->size(); })
      .def_prop_ro("features", [](const PyDataset& d) { return d.data->features(); })
      .def_prop_ro("targets", [](const PyDataset& d) { return d.data->targets(); })
      .def_prop_ro("classes", [](const PyDataset& d) { return d.data->classes(); })
      .def(
          "sample",
          [](const PyDataset& d, std::size_t i) {
            if (i >= d.data->size())
              throw nb::index_error(("sample " + std::to_string(i) + " of " +
                                     std::to_string(d.data->size())).c_str());
            std::vector<float> x(static_cast<std::size_t>(d.data->features()));
            std::vector<std::int32_t> y(static_cast<std::size_t>(d.data->targets()));
            d.data->get(i, x.data(), y.data());
            const std::size_t nx = x.size(), ny = y.size();
            return std::make_pair(to_numpy(std::move(x), {nx}), to_numpy(std::move(y), {ny}));
          },
          "index"_a, "Sample i as the trainer reads it: (features, targets).");

  m.def(
      "_in_memory",
      [](const Matrix& x, const Column<std::int32_t>& y, int classes) {
        auto owner = std::make_shared<const std::pair<Matrix, Column<std::int32_t>>>(x, y);
        const auto features = static_cast<int>(x.shape(1));
        return PyDataset{std::make_shared<const InMemoryDataset>(
            std::span<const float>(x.data(), x.size()),
            std::span<const std::int32_t>(y.data(), y.size()), features, classes,
            std::move(owner))};
      },
      "x"_a.noconvert(), "y"_a.noconvert(), "classes"_a);
  m.def("_tokens", &borrowed_tokens<std::uint16_t>, "tokens"_a.noconvert(), "context"_a,
        "vocab_size"_a);
  m.def("_tokens", &borrowed_tokens<std::uint32_t>, "tokens"_a.noconvert(), "context"_a,
        "vocab_size"_a);
  m.def(
      "_load_dataset",
      [](const Config& config) {
        DataSplit split;
        {
          nb::gil_scoped_release unlocked;  // files of any size: other Python threads go on
          split = load_dataset(config);
        }
        return std::make_pair(PyDataset{std::move(split.train)}, PyDataset{std::move(split.eval)});
      },
      "config"_a);
}

// ---- checkpoints ----------------------------------------------------------------------------

void bind_checkpoints(nb::module_& m) {
  m.def(
      "_load_checkpoint",
      [](const std::filesystem::path& path) {
        std::vector<std::string> warnings;
        std::optional<Checkpoint> loaded;
        {
          nb::gil_scoped_release unlocked;
          loaded = CheckpointManager::load(path, collect(warnings));
        }
        const Checkpoint& ckpt = *loaded;
        nb::dict out;
        out["parameters"] = tensors_to_numpy(ckpt.tensors, ckpt.params);
        nb::dict state;
        for (const StateVector& v : ckpt.optimizer_state)
          state[nb::str(v.name.c_str())] = tensors_to_numpy(ckpt.tensors, v.values);
        out["optimizer_state"] = state;
        nb::dict metadata;
        for (const auto& [k, v] : ckpt.metadata) metadata[nb::str(k.c_str())] = nb::str(v.c_str());
        out["metadata"] = metadata;
        out["step"] = ckpt.state.step;
        out["epoch"] = ckpt.state.epoch;
        out["samples"] = ckpt.state.samples;
        out["workers"] = ckpt.state.workers;
        out["config"] = ckpt.state.config;
        out["weights_file"] = ckpt.weights_file.string();
        out["warnings"] = warnings;
        return out;
      },
      "path"_a);
}

// "auto", "cpu" or "cuda": trainer.backend's spellings.
// cuda without a usable GPU is refused in Python's spelling (Note [A fix in the spelling used]
// in src/cli/command_args.hpp), with the driver's state as lockstep.devices() says it.
BackendKind backend_option(std::string_view name) {
  const std::optional<BackendKind> kind = backend_kind(name);
  if (!kind) throw InputError("backend: expected auto, cpu or cuda, got '" + std::string(name) + "'");
  if (*kind == BackendKind::cuda) {
    const CudaSupport cuda = cuda_support();
    if (!cuda.built || cuda.gpus == 0)
      throw InputError("backend='cuda': no usable GPU (" +
                       (cuda.built ? cuda.summary.substr(0, cuda.summary.find("; "))
                                   : std::string("this build of lockstep has no CUDA backend")) +
                       "): pass backend='cpu', or backend='auto' (a GPU when there is one, else "
                       "the CPU)");
  }
  return *kind;
}

void bind_generation(nb::module_& m) {
  m.def(
      "_sample",
      [](SampleRequest request, const std::string& backend, nb::object on_token) {
        request.backend = backend_option(backend);
        std::vector<std::string> warnings;
        request.warn = collect(warnings);
        TokenCallback callback;
        if (!on_token.is_none())
          callback = [&](int token, std::string_view piece) {
            nb::gil_scoped_acquire locked;
            on_token(token, nb::bytes(piece.data(), piece.size()));
          };
        SampleResult r;
        {
          nb::gil_scoped_release unlocked;  // the model runs on its device; Python waits
          r = sample(request, callback);
        }
        nb::dict out;
        out["prompt_tokens"] = r.prompt_tokens;
        out["tokens"] = r.tokens;
        out["prompt_text"] = nb::bytes(r.prompt_text.data(), r.prompt_text.size());
        out["text"] = nb::bytes(r.text.data(), r.text.size());
        out["text_model"] = r.text_model;
        out["stopped"] = r.stopped;
        out["warnings"] = warnings;
        return out;
      },
      "request"_a, "backend"_a, "on_token"_a.none());
  nb::class_<SampleRequest>(m, "_SampleRequest")
      .def(nb::init<>())
      .def_rw("checkpoint", &SampleRequest::checkpoint)
      .def_rw("prompt", &SampleRequest::prompt)
      .def_prop_rw(
          "tokens", [](const SampleRequest& r) { return r.options.tokens; },
          [](SampleRequest& r, int v) { r.options.tokens = v; })
      .def_prop_rw(
          "temperature", [](const SampleRequest& r) { return r.options.temperature; },
          [](SampleRequest& r, double v) { r.options.temperature = v; })
      .def_prop_rw(
          "top_k", [](const SampleRequest& r) { return r.options.top_k; },
          [](SampleRequest& r, int v) { r.options.top_k = v; })
      .def_prop_rw(
          "seed", [](const SampleRequest& r) { return r.options.seed; },
          [](SampleRequest& r, std::uint64_t v) { r.options.seed = v; })
      .def_rw("tokenizer", &SampleRequest::tokenizer)
      .def_rw("stop_at", &SampleRequest::stop_at)
      .def_rw("kv_cache", &SampleRequest::kv_cache)
      .def_rw("allow_special", &SampleRequest::allow_special);

  m.def(
      "_export",
      [](const std::filesystem::path& checkpoint, const std::filesystem::path& out,
         const std::string& format, const std::string& dtype,
         const std::filesystem::path& tokenizer, const std::string& max_shard_size) {
        std::vector<std::string> warnings;
        ExportRequest request{.checkpoint = checkpoint, .out = out, .format = format,
                              .dtype = dtype, .max_shard_size = max_shard_size,
                              .tokenizer = tokenizer, .warn = collect(warnings)};
        ExportResult r;
        {
          nb::gil_scoped_release unlocked;
          r = export_checkpoint(request);
        }
        nb::dict d;
        d["tensors"] = r.tensors;
        d["parameters"] = r.parameters;
        d["step"] = r.step;
        d["warnings"] = warnings;
        return d;
      },
      "checkpoint"_a, "out"_a, "format"_a, "dtype"_a, "tokenizer"_a, "max_shard_size"_a);
}

}  // namespace

}  // namespace lockstep::python

NB_MODULE(_lockstep, m) {
  using namespace lockstep::python;
  m.doc() = "The C++ half of lockstep's Python module (see lockstep/__init__.py).";
  m.attr("__version__") = lockstep::kVersion;
  bind_errors(m);
  bind_config(m);
  bind_datasets(m);
  bind_checkpoints(m);
  bind_generation(m);
  bind_trainer(m);
}
