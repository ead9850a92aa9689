// P "processes" inside one test process, for the multi-process code paths without MPI: a
// ProcessGroup over a shared-memory group of P ranks. Each fake process is driven by its own
// threads, as a real one would be. abort() or abort_job() in one ends the waits of all, as the
// launcher ending the job would.
#pragma once

#include <memory>
#include <vector>

#include "lockstep/comm.hpp"

namespace lockstep::test {

class LoopbackProcesses final : public ProcessGroup {
 public:
  explicit LoopbackProcesses(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}

  int rank() const noexcept override { return comm_->rank(); }
  int size() const noexcept override { return comm_->size(); }
  void all_reduce(float* data, std::size_t count) override {
    comm_->all_reduce(data, count, ReduceOp::sum);
  }
  void broadcast(float* data, std::size_t count, int root) override {
    comm_->broadcast(data, count, root);
  }
  void barrier() override { comm_->barrier(); }
  void all_reduce(std::span<double> values) override { comm_->all_reduce_host(values); }
  std::vector<std::uint64_t> all_gather(std::span<const std::uint64_t> mine) override {
    const std::size_t n = mine.size();
    std::vector<std::uint64_t> all(n * static_cast<std::size_t>(size()));
    for (std::size_t i = 0; i < n; ++i) {
      const std::vector<std::uint64_t> column = comm_->all_gather_host(mine[i]);
      for (std::size_t p = 0; p < column.size(); ++p) all[p * n + i] = column[p];
    }
    return all;
  }
  void broadcast_bytes(void* data, std::size_t bytes, int root) override {
    auto* b = static_cast<unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>(comm_->all_gather_host(b[i])[root]);
  }
  void abort() noexcept override { comm_->abort(); }
  bool aborted() const noexcept override { return comm_->aborted(); }
  void abort_job(int) noexcept override { comm_->abort(); }

 private:
  std::unique_ptr<Communicator> comm_;
};

inline std::vector<std::shared_ptr<ProcessGroup>> make_loopback_processes(int processes) {
  std::vector<std::shared_ptr<ProcessGroup>> out;
  for (auto& comm : make_shared_memory_group(processes))
    out.push_back(std::make_shared<LoopbackProcesses>(std::move(comm)));
  return out;
}

}  // namespace lockstep::test
