// lockstep._lockstep._Trainer: the trainer, run with the interpreter's lock released.
//
// Note [Callbacks from workers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// run() releases the interpreter's lock for the whole run: the workers are C++ threads and never
// wait for Python, except while a user's callback runs. The trainer calls on_step, on_eval and
// on_checkpoint on global rank 0's thread (lockstep/trainer.hpp); the binding takes the lock
// there, calls the Python function with the metrics as a dict, and lets go. So a callback runs
// while the other workers go on with the step's collectives and wait for rank 0 at the barrier:
// a slow callback slows the run, it cannot corrupt it.
//
// A callback that raises does not throw into the worker (that would be a worker failure, with
// no checkpoint): the binding keeps the exception, asks the trainer to stop, as request_stop()
// does (the workers agree on a step, and write a checkpoint when trainer.checkpoint.dir is
// set), calls no more callbacks, and run() raises the kept exception once the workers are done.
//
// Signals: Python runs its signal handlers on the main thread only, between bytecodes, which a
// thread blocked in C++ never reaches. So when run() is called on the main thread, the trainer
// runs on a thread of its own and the main thread waits for it in slices of 100 ms, running the
// handlers (PyErr_CheckSignals) between them. A handler that raises (Ctrl-C's
// KeyboardInterrupt, in a terminal or a notebook) asks the trainer to stop, as SIGINT does in
// the CLI; run() raises that exception after the stop, with the checkpoint written. Further
// signals while stopping are run too, and what they raise is dropped: the stop is under way.
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "lockstep/checkpoint.hpp"
#include "lockstep/error.hpp"
#include "lockstep/trainer.hpp"

namespace lockstep::python {
namespace {

using namespace nb::literals;

nb::dict step_dict(const StepMetrics& m) {
  nb::dict d;
  d["step"] = m.step;
  d["total_steps"] = m.total_steps;
  d["epoch"] = m.epoch;
  d["loss"] = m.loss;
  d["accuracy"] = m.accuracy;
  d["lr"] = m.lr;
  d["grad_norm"] = m.grad_norm;
  d["samples_per_s"] = m.samples_per_s;
  d["tokens_per_s"] = m.tokens_per_s;
  d["mfu"] = m.mfu;
  d["elapsed_s"] = m.elapsed_s;
  d["comm_hidden_fraction"] = m.comm_hidden_fraction;
  d["data_wait_s"] = m.data_wait_s;
  return d;
}

nb::dict eval_dict(const EvalMetrics& m) {
  nb::dict d;
  d["step"] = m.step;
  d["loss"] = m.loss;
  d["accuracy"] = m.accuracy;
  d["samples"] = m.samples;
  return d;
}

// Emits each warning as a Python UserWarning (the caller holds the lock).
void warn_all(const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings)
    if (PyErr_WarnEx(PyExc_UserWarning, w.c_str(), 1) != 0) throw nb::python_error();
}

class PyTrainer {
 public:
  PyTrainer(Config config, std::optional<PyDataset> train, std::optional<PyDataset> eval) {
    nb::gil_scoped_release unlocked;  // the data loaded, the model initialised: Python goes on
    if (!train) {
      DataSplit split = load_dataset(config);
      train = PyDataset{std::move(split.train)};
      if (!eval) eval = PyDataset{std::move(split.eval)};
    }
    if (!eval) eval = PyDataset{nullptr};
    model_ = describe_model(config, *train->data);
    trainer_ = std::make_unique<Trainer>(std::move(config), train->data, eval->data);
    trainer_->on_step([this](const StepMetrics& m) { call(on_step_, [&] { return step_dict(m); }); });
    trainer_->on_eval([this](const EvalMetrics& m) { call(on_eval_, [&] { return eval_dict(m); }); });
    trainer_->on_checkpoint([this](std::int64_t step, const std::string& file) {
      call(on_checkpoint_, [&] {
        nb::dict d;
        d["step"] = step;
        d["weights_file"] = file;
        return d;
      });
    });
  }

  // Set before run(); read by the workers' threads during it (Note [Callbacks from workers]).
  void on_step(nb::object fn) { set_callback(on_step_, std::move(fn)); }
  void on_eval(nb::object fn) { set_callback(on_eval_, std::move(fn)); }
  void on_checkpoint(nb::object fn) { set_callback(on_checkpoint_, std::move(fn)); }

  void request_stop() noexcept { trainer_->request_stop(); }
  std::int64_t total_steps() const noexcept { return trainer_->total_steps(); }
  std::int64_t resumed_step() const noexcept { return trainer_->resumed_step(); }
  std::string memory_plan() const { return trainer_->memory_plan(); }
  const std::string& model() const noexcept { return model_; }

  // Continues from a checkpoint (a file, or the newest of a directory), as `lockstep train
  // --resume` does. Returns the step it resumes from.
  std::int64_t resume(const std::filesystem::path& path) {
    std::vector<std::string> warnings;
    {
      nb::gil_scoped_release unlocked;
      trainer_->resume_from(CheckpointManager::load(path, collect(warnings)));
    }
    warn_all(warnings);
    return trainer_->resumed_step();
  }

  // Starts from the weights at `path` (load_weights()), as `lockstep train --init-from` does;
  // with model.lora they are the frozen base.
  void init_from(const std::filesystem::path& path) {
    nb::gil_scoped_release unlocked;
    const Model& model = trainer_->model();
    trainer_->init_from(load_weights(
        path, model.frozen_count() > 0 ? model.frozen_tensors() : model.param_tensors()));
  }

  // The summary as --summary-json writes it.
  std::string run() {
    if (ran_) throw nb::value_error("Trainer.run(): a trainer runs once; make another");
    ran_ = true;
    const bool main_thread = on_main_thread();
    std::optional<Summary> summary;
    std::exception_ptr failure;
    {
      nb::gil_scoped_release unlocked;
      if (!main_thread) {
        try {
          summary = trainer_->run();
        } catch (...) {
          failure = std::current_exception();
        }
      } else {
        run_watching_signals(summary, failure);
      }
    }
    // Note [Callbacks from workers]: the callback's exception first (it stopped the run), then
    // a failure, then a signal's exception (the run stopped for it, cleanly).
    if (callback_error_) std::rethrow_exception(callback_error_);
    if (failure) std::rethrow_exception(failure);
    if (signal_error_) {
      signal_error_->restore();
      signal_error_.reset();
      throw nb::python_error();
    }
    return summary->to_json();
  }

  nb::dict parameters() const {
    const std::vector<float>& params = trainer_->final_parameters();
    if (params.empty()) throw nb::value_error("Trainer.parameters(): run() has not finished");
    return tensors_to_numpy(trainer_->model().param_tensors(), params);
  }

 private:
  void set_callback(nb::object& slot, nb::object fn) {
    if (!fn.is_none() && !PyCallable_Check(fn.ptr())) throw nb::type_error("expected a callable");
    // The workers read the slots without the lock (call()): they are fixed once run() starts.
    if (ran_) throw nb::value_error("set the callbacks before run()");
    slot = std::move(fn);
  }

  // On a worker's thread, with the metrics to hand over made by `args` (under the lock).
  template <typename MakeArgs>
  void call(const nb::object& fn, MakeArgs&& args) {
    if (!fn.is_valid() || fn.is_none()) return;  // fixed before run(): no lock needed to look
    nb::gil_scoped_acquire locked;
    if (callback_error_) return;
    try {
      fn(args());
    } catch (...) {
      callback_error_ = std::current_exception();
      trainer_->request_stop();
    }
  }

  static bool on_main_thread() {
    nb::module_ threading = nb::module_::import_("threading");
    return threading.attr("current_thread")().is(threading.attr("main_thread")());
  }

  // Note [Callbacks from workers]: the trainer on a thread of its own, the signal handlers here.
  // Called without the lock.
  void run_watching_signals(std::optional<Summary>& summary, std::exception_ptr& failure) {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::thread runner([&] {
      try {
        summary = trainer_->run();
      } catch (...) {
        failure = std::current_exception();
      }
      const std::lock_guard lock(mutex);
      done = true;
      cv.notify_one();
    });
    std::unique_lock lock(mutex);
    while (!cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return done; })) {
      lock.unlock();
      {
        nb::gil_scoped_acquire locked;
        if (PyErr_CheckSignals() != 0) {
          if (!signal_error_) {
            signal_error_.emplace();  // takes the raised exception
            trainer_->request_stop();
          } else {
            PyErr_Clear();
          }
        }
      }
      lock.lock();
    }
    lock.unlock();
    runner.join();
  }

  friend int traverse(PyObject* self, visitproc visit, void* arg);
  friend int clear(PyObject* self);

  std::unique_ptr<Trainer> trainer_;
  std::string model_;  // describe_model()
  nb::object on_step_, on_eval_, on_checkpoint_;
  std::exception_ptr callback_error_;           // written under the lock
  std::optional<nb::python_error> signal_error_;  // on the main thread only
  bool ran_ = false;
};

// The callbacks hold Python objects from C++, where the cycle collector cannot see them: a
// callback that refers to its trainer (a closure over it, a module's globals) would keep both
// alive for ever. tp_traverse shows the collector those references, and tp_clear drops them.
int traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;  // not yet constructed
  const PyTrainer* t = nb::inst_ptr<PyTrainer>(self);
  Py_VISIT(t->on_step_.ptr());
  Py_VISIT(t->on_eval_.ptr());
  Py_VISIT(t->on_checkpoint_.ptr());
  return 0;
}

int clear(PyObject* self) {
  PyTrainer* t = nb::inst_ptr<PyTrainer>(self);
  t->on_step_.reset();
  t->on_eval_.reset();
  t->on_checkpoint_.reset();
  return 0;
}

PyType_Slot trainer_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(traverse)},
                               {Py_tp_clear, reinterpret_cast<void*>(clear)},
                               {0, nullptr}};

}  // namespace

void bind_trainer(nb::module_& m) {
  nb::class_<PyTrainer>(m, "_Trainer", nb::type_slots(trainer_slots))
      .def(nb::init<Config, std::optional<PyDataset>, std::optional<PyDataset>>(), "config"_a,
           "train"_a.none(), "eval"_a.none())
      .def("on_step", &PyTrainer::on_step, "fn"_a.none())
      .def("on_eval", &PyTrainer::on_eval, "fn"_a.none())
      .def("on_checkpoint", &PyTrainer::on_checkpoint, "fn"_a.none())
      .def("request_stop", &PyTrainer::request_stop)
      .def_prop_ro("total_steps", &PyTrainer::total_steps)
      .def_prop_ro("resumed_step", &PyTrainer::resumed_step)
      .def_prop_ro("model", &PyTrainer::model)
      .def("memory_plan", &PyTrainer::memory_plan)
      .def("resume", &PyTrainer::resume, "path"_a)
      .def("init_from", &PyTrainer::init_from, "path"_a)
      .def("run", &PyTrainer::run)
      .def("parameters", &PyTrainer::parameters);
}

}  // namespace lockstep::python
