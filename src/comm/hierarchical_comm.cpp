// A communicator group spanning processes: the shared-memory group of this process's workers,
// joined across processes by a ProcessGroup (MPI).
//
// Note [Hierarchical all-reduce]
//   P processes of L workers; worker l of process p is global rank p * L + l. all_reduce:
//     1. the local group all-reduces (sum): every worker of the process holds the process's sum;
//     2. local worker 0 all-reduces that across processes (sum, then x 1/(P L) for avg);
//     3. the local group broadcasts local worker 0's buffer.
//   Every worker ends with the bits of its local worker 0, which are the same in every process
//   (ProcessGroup::all_reduce's contract), so replicas stay bit-identical across processes. The
//   sum is (a0 + a1) + (a2 + a3) for 2 x 2 where one process of 4 computes a0 + a1 + a2 + a3:
//   equal up to rounding, not bitwise.
//   reduce_scatter is the whole all_reduce (every shard then holds its reduction, with the
//   all-reduce's bits); all_gather broadcasts each rank's shard from that rank in turn. Both
//   are correct for any shards and move more than a ring would: the ProcessGroup has no
//   reduce-scatter or all-gather of floats yet.
//   One thread per process talks to the other processes: local worker 0's (its communication
//   thread for the data plane, its worker thread for the control plane). Host collectives go the
//   same way: local, then across processes by local worker 0, then shared within the process
//   through memory of the process (a control-plane barrier on each side of the copy).
#include <algorithm>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_thread.hpp"
#include "lockstep/comm.hpp"

namespace lockstep {
namespace {

// What the workers of one process share.
struct Process {
  std::shared_ptr<ProcessGroup> processes;
  int local_size = 0;
  std::vector<double> reduced;          // all_reduce_host's result, written by local worker 0
  std::vector<std::uint64_t> gathered;  // all_gather_host's result, likewise
};

class HierarchicalCommunicator final : public Communicator {
 public:
  HierarchicalCommunicator(std::unique_ptr<Communicator> local, std::shared_ptr<Process> process)
      : local_(std::move(local)), process_(std::move(process)) {}

  int rank() const noexcept override {
    return process_->processes->rank() * process_->local_size + local_->rank();
  }
  int size() const noexcept override {
    return process_->processes->size() * process_->local_size;
  }

  std::string describe() const override {
    return fmt::format("{} within each process, the process group across {} processes",
                       local_->describe(), process_->processes->size());
  }

  void bind(const DeviceQueue& queue) override { local_->bind(queue); }

  void all_reduce(float* data, std::size_t count, ReduceOp op) override {
    local_->all_reduce(data, count, ReduceOp::sum);
    if (leader()) {
      process_->processes->all_reduce(data, count);
      if (op == ReduceOp::avg) {
        const float inv = 1.0f / static_cast<float>(size());
        for (std::size_t i = 0; i < count; ++i) data[i] *= inv;
      }
    }
    local_->broadcast(data, count, 0);
  }

  void reduce_scatter(float* data, std::size_t count, std::size_t /*grain*/,
                      ReduceOp op) override {
    all_reduce(data, count, op);
  }

  void all_gather(float* data, std::size_t count, std::size_t grain) override {
    for (int root = 0; root < size(); ++root) {
      const ShardRange s = shard_range(count, size(), root, grain);
      if (s.size() > 0) broadcast(data + s.begin, s.size(), root);
    }
  }

  void broadcast(float* data, std::size_t count, int root) override {
    if (root < 0 || root >= size()) throw std::invalid_argument("broadcast: root out of range");
    const int L = process_->local_size;
    local_->broadcast(data, count, root % L);  // in root's process, worker 0 now holds it
    if (leader()) process_->processes->broadcast(data, count, root / L);
    local_->broadcast(data, count, 0);
  }

  void barrier() override {
    local_->barrier();
    if (leader()) process_->processes->barrier();
    local_->barrier();
  }

  void all_reduce_host(std::span<double> values) override {
    local_->all_reduce_host(values);
    Process& p = *process_;
    if (leader()) {
      p.processes->all_reduce(values);
      p.reduced.assign(values.begin(), values.end());
    }
    local_->barrier();
    if (!leader()) std::copy(p.reduced.begin(), p.reduced.end(), values.begin());
    local_->barrier();
  }

  std::vector<std::uint64_t> all_gather_host(std::uint64_t value) override {
    const std::vector<std::uint64_t> mine = local_->all_gather_host(value);
    Process& p = *process_;
    if (leader()) p.gathered = p.processes->all_gather(mine);
    local_->barrier();
    std::vector<std::uint64_t> all = p.gathered;
    local_->barrier();
    return all;
  }

  void abort() noexcept override {
    local_->abort();
    process_->processes->abort();
  }
  bool aborted() const noexcept override {
    return local_->aborted() || process_->processes->aborted();
  }

 protected:
  std::unique_ptr<CommWork> start(std::function<void()> collective) override {
    return thread_.submit(std::move(collective));
  }

 private:
  bool leader() const noexcept { return local_->rank() == 0; }

  std::unique_ptr<Communicator> local_;
  std::shared_ptr<Process> process_;
  detail::CommThread thread_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_hierarchical_group(
    std::vector<std::unique_ptr<Communicator>> local, std::shared_ptr<ProcessGroup> processes) {
  if (local.empty()) throw std::invalid_argument("make_hierarchical_group: no local workers");
  if (!processes) throw std::invalid_argument("make_hierarchical_group: no process group");
  auto process = std::make_shared<Process>();
  process->processes = std::move(processes);
  process->local_size = static_cast<int>(local.size());
  std::vector<std::unique_ptr<Communicator>> group;
  group.reserve(local.size());
  for (auto& comm : local)
    group.push_back(std::make_unique<HierarchicalCommunicator>(std::move(comm), process));
  return group;
}

}  // namespace lockstep
