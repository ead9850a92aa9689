// The gradient reducer: buckets, and all-reduce overlapped with backward.
//
// Note [Buckets]
//   The gradient buffer is laid out in reverse order of the forward pass (see model.hpp), so
//   the layers backward finishes first sit at the front. A bucket is a contiguous run of whole
//   layers' gradients, cut in that order: the first bucket holds at most 1 MB, or the cap if
//   smaller (so the first all-reduce starts early, as in DDP), later ones at most trainer.bucket_cap_mb. A layer
//   larger than the cap gets a bucket of its own. Buckets are views into the gradient buffer:
//   nothing is copied in or out, and the 1/N scaling happens once, inside the all-reduce (avg).
//
//   When backward reports a layer's gradients final, its bucket's count of pending layers drops;
//   at zero the bucket's all-reduce starts at once (all_reduce_async), while backward goes on
//   with earlier layers. Buckets complete in the same order on every rank because backward runs
//   the layers in the same order, so every rank issues the same collectives in the same order.
//   With overlap off, every bucket starts after backward.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "lockstep/comm.hpp"
#include "lockstep/model.hpp"
#include "train/trace.hpp"

namespace lockstep::detail {

struct Bucket {
  std::size_t begin = 0;  // elements, into the gradient buffer
  std::size_t end = 0;
  std::vector<std::size_t> layers;  // indices into Model::layers(), in backward order
  std::size_t bytes() const noexcept { return (end - begin) * sizeof(float); }
};

// Cuts the model's parameters into buckets (see Note [Buckets]). Layers without parameters
// belong to no bucket.
std::vector<Bucket> plan_buckets(const Model& model, double cap_mb, double first_cap_mb = 1.0);

class Reducer {
 public:
  Reducer(const Model& model, Communicator& comm, float* grads, std::vector<Bucket> buckets,
          bool overlap, std::vector<TraceEvent>* comm_track);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }

  // Before each backward whose gradients are to be reduced.
  void reset();
  // The backward hook: layer `layer`'s parameter gradients are final.
  void layer_ready(std::size_t layer);
  // After backward: starts every bucket not started yet, in order.
  void launch_remaining();
  // Blocks until bucket i is reduced; returns the seconds spent blocked.
  double wait(std::size_t i);
  // Waits for all work in flight and ignores its errors: on the failure path, our buffers must
  // not be freed while a communication thread still uses them.
  void drain() noexcept;

  // Totals since construction, for the run summary.
  double comm_seconds() const noexcept { return comm_s_; }      // all-reduce durations
  double exposed_seconds() const noexcept { return exposed_s_; }  // caller blocked in wait()

 private:
  void launch(std::size_t i);

  Communicator& comm_;
  float* grads_;
  std::vector<Bucket> buckets_;
  bool overlap_;
  std::vector<TraceEvent>* comm_track_;
  std::vector<std::size_t> bucket_of_layer_;  // npos for layers without parameters
  std::vector<std::size_t> pending_;          // layers not yet ready, per bucket
  std::vector<std::unique_ptr<CommWork>> work_;
  std::size_t launched_ = 0;  // buckets [0, launched_) have started
  double comm_s_ = 0.0;
  double exposed_s_ = 0.0;
};

}  // namespace lockstep::detail
