// A worker's micro-batches as device graphs (trainer.cuda_graphs).
//
// Note [Step graphs]
//   A GPT-2 step launches over a thousand kernels, each costing its host a few microseconds; once
//   the kernels are fast, that enqueue is the step's floor. So each micro-batch's forward and
//   backward (the loss with one of them: with backward where the LM head fuses it, Note
//   [Chunked classifier] in src/model/lm_head.cpp) are captured once as device graphs (Note
//   [Device graphs] in lockstep/device.hpp) and replayed with a launch each, every step after.
//   - Only the replica's kernels are captured. The collectives, the optimiser, the step record's
//     copy, snapshots and every wait stay launched by the host as before. So overlap, ZeRO-1,
//     both CUDA communicators and the failure path are unchanged, every rank may capture or not
//     on its own without a collective going unmatched, and what changes per step (the learning
//     rate, the optimiser's step count, the clip factor) never has to live in device memory.
//   - Backward is cut where the reducer starts a bucket: one graph per segment. A replay
//     launches segment i, then reports its layers to the step (WorkerLoop::grads_ready), whose
//     reducer then starts the bucket's collective, just as the eager backward's callback does at
//     that point. The cuts are found during the capture on a dry copy of the reducer's state
//     (Reducer::dry_layer_ready).
//   - What differs between micro-batches is the key of a program: the batch's two staged
//     buffers (StagedBatches alternates two), the step record the loss is written to (steps use
//     two), the batch size, and whether backward reports its layers (the last micro-batch).
//     Steady state has at most four programs per part, found by the run's second and third
//     steps; a short last batch makes its own.
//   - A key runs eagerly the first time it is seen, and is captured the next: a new shape (a
//     short last batch) builds its cuDNN graphs and grows the device's workspaces on its first
//     run, which a capture would refuse (an allocation), so it does that outside one.
//   - A capture runs nothing; the part it recorded is then launched at once, so a capture step
//     computes exactly what an eager one does. Every step computes the same bits whether its
//     parts are captured, replayed or eager (the test device of tests/train/test_step_graphs.cpp
//     shows it on the CPU, freezing every op's arguments as CUDA does).
//   - A capture that an op refuses (a host sync, an allocation) is dropped and that part runs
//     eagerly. Before any capture succeeded, graphs are then off for the rest of the run (an op
//     that never captures); once some did, only that key stays eager, the others keep their
//     graphs, and the summary counts it and says why (issue 40). A graph whose memory the
//     device replaced (a workspace grown by an eval) is captured again.
//   - The run's first step runs eagerly: it sizes the workspaces. `on` captures from the
//     second step. `auto` times the wall time of steps 2 to 1 + W eagerly (W = kTimedSteps),
//     captures in the next two, times W steps with graphs, and keeps them only when the median
//     step was faster. The ranks agree on the choice with one host all-reduce of their medians,
//     at the same step everywhere, every rank taking part even where a capture was refused
//     (then without a graph median). A run too short to time both stays eager.
//   - Devices without graphs (the CPU, whose ops run as they are called) run eagerly, and the
//     summary says so. Graphs stopped during a run, and auto's choice, are also said on stderr
//     as it happens (worker 0).
//   - A trace's forward and backward spans of a replayed part time its launch, not its
//     kernels, and its per-layer spans come together after each segment.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "lockstep/config.hpp"
#include "lockstep/device.hpp"
#include "lockstep/trainer.hpp"

namespace lockstep {
class Communicator;
}

namespace lockstep::detail {

class StepGraphs {
 public:
  // Steps timed each way by auto.
  static constexpr std::int64_t kTimedSteps = 5;
  // Programs kept at once: more distinct micro-batches than this run eagerly.
  static constexpr std::size_t kMaxPrograms = 16;

  enum class Part { forward, backward };
  // What a part's kernels depend on that may differ between micro-batches (Note [Step graphs]).
  struct Key {
    Part part = Part::forward;
    const void* input = nullptr;   // the staged batch's features (token ids)
    const void* labels = nullptr;  // its labels
    const void* record = nullptr;  // the step record the loss goes to
    int batch = 0;
    bool reports_layers = false;  // backward of the last micro-batch
    auto operator<=>(const Key&) const = default;
  };
  using Layer = std::function<void(std::size_t layer)>;

  // `first_step`: the run's first step; `total_steps`: its last. `speaks`: this worker says on
  // stderr when graphs stop during the run, and what auto chose (one worker of the job).
  StepGraphs(Device& device, GraphMode mode, std::int64_t first_step, std::int64_t total_steps,
             bool speaks = false);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // At each step's start, `now_s` on the host's steady clock: auto's timing, and at its end
  // the ranks' choice (one host all-reduce over `comm`, at the same step on every rank).
  void begin_step(std::int64_t step, double now_s, Communicator& comm);

  // Runs one part. enqueue(report) queues its ops, calling report(layer) once each layer's
  // gradients are final (a backward; report is null when on_layer is). on_layer: what the step
  // does then (null: nothing). cut(layer): whether on_layer(layer) starts work outside the
  // device's queue (a collective), so that a graph must end after that layer; asked only while
  // capturing, in backward's order.
  void run(const Key& key, const std::function<void(const Layer& report)>& enqueue,
           const Layer& on_layer, const std::function<bool(std::size_t layer)>& cut);

  // Whether parts run as graphs from this step (captured or replayed).
  bool active() const noexcept { return active_; }
  // For the summary: what happened so far.
  Summary::Graphs summary() const;

 private:
  struct Segment {
    std::unique_ptr<DeviceGraph> graph;  // null: no op before the cut
    std::vector<std::size_t> layers;     // reported after it, in order
  };
  using Program = std::vector<Segment>;

  // False when an op refused the capture (dropped: nothing ran); then `why` says which.
  bool capture(const std::function<void(const Layer&)>& enqueue, bool reports,
               const std::function<bool(std::size_t)>& cut, Program& program, std::string& why);
  void launch(const Program& program, const Layer& on_layer);
  void turn_off(std::string why);

  Device& device_;
  GraphMode mode_;
  std::int64_t first_step_;
  bool speaks_;
  std::int64_t step_ = 0;  // the step begun last
  std::string why_not_;  // empty while graphs may be used
  bool active_ = false;
  // auto, on a device with graphs, in a run long enough: this rank takes part in the choice.
  // The same on every rank, set before step 1, so that the choice's all-reduce is matched.
  bool times_ = false;
  std::map<Key, Program> programs_;
  std::set<Key> seen_;     // run at least once (eagerly, or captured)
  std::set<Key> refused_;  // their capture refused: eager from then on
  std::string refusal_;    // the first refusal's reason, while graphs stay on
  std::uint64_t captured_ = 0, launched_ = 0, eager_ = 0;
  // auto: the wall time of each step timed each way, and the agreed medians.
  double last_begin_s_ = -1.0;
  std::vector<double> eager_s_, graph_s_;
  double eager_median_s_ = 0.0, graph_median_s_ = 0.0;
};

}  // namespace lockstep::detail
