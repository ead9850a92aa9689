// The ProcessGroup of an MPI job (mpirun, srun): one process per node.
//
// Note [One MPI thread]
//   Every MPI call of the process is made by one thread of ours, which initialises MPI, serves
//   the callers, and finalises MPI: MPI_THREAD_FUNNELED is all we ask of the library. A caller
//   queues a request and waits; the MPI thread posts it as nonblocking calls (the data plane's
//   all-reduce as a ring of sends and receives, Note [Ring all-reduce] in ring_all_reduce.hpp;
//   the rest as nonblocking collectives, several chunks on the data plane, Note [Pipelined
//   collectives]) and polls them with MPI_Testsome until they complete. So nothing ever blocks
//   inside MPI: abort() wakes every waiting caller at once, and the worker threads of a failed
//   process always stop, even while a peer process never joins the collective they were in.
//   When every process runs on one node, the data plane's all-reduce makes no MPI call at all:
//   the caller runs it through a window of shared memory that the MPI thread allocated at
//   start-up (Note [Shared-memory all-reduce] in shared_window_all_reduce.hpp). Its waits end
//   at abort() too, and at any other process's: a process that aborts writes the window's
//   abort word, and a process that sees it there aborts its own group (in the collective, or
//   on the MPI thread while it polls), so its control-plane callers stop as well.
//   Each plane has its own communicator (a duplicate of MPI_COMM_WORLD): collectives are ordered
//   per communicator, and the MPI thread may post the two planes' requests interleaved
//   differently in different processes.
//   MPI never writes into the caller's memory: after an abort, a call still pending in MPI must
//   not write into memory the caller has freed. A collective's request owns its buffer: the
//   caller copies in before queueing and out after completion. The ring receives into staging
//   it owns, and only the MPI thread moves data between staging and the caller's buffer, which
//   an aborted caller takes back (RingAllReduce::abandon) before it leaves. The window's
//   all-reduce touches the caller's buffer on the caller's thread alone.
//
// Note [Pipelined collectives]
//   Open MPI's nonblocking collectives (libnbc) run a schedule of rounds that advances only
//   inside MPI calls on our thread, and one large MPI_Iallreduce is a long chain of them: it
//   reached half the blocking MPI_Allreduce's bandwidth at 16-64 MB (bench/RESULTS.md), and
//   cut into pipelined chunks, as the data plane's broadcast still is, 34-48% (the all-reduce is
//   a ring now). So the data plane cuts a buffer into chunks of kPipelineChunk elements and keeps
//   up to kInFlight of them posted: MPI_Testsome advances all of them at once, and a finished
//   chunk's slot takes the next. Every chunk is a separate collective on the data communicator,
//   posted in the same order in every process. The MPI thread polls without pause while calls
//   complete, yielding the core, and backs off to 50 us sleeps once nothing has moved for
//   kHotPolling.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "comm/mpi/ring_all_reduce.hpp"
#include "comm/mpi/shared_window_all_reduce.hpp"
#include "common/start_thread.hpp"
#include "lockstep/comm.hpp"

namespace lockstep {
namespace {

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(length));
}

// Launchers set these in every process they start: Open MPI's mpirun, PMIx (srun --mpi=pmix,
// prterun), PMI-1/2 (MPICH's hydra, srun --mpi=pmi2), MVAPICH.
bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                           "MV2_COMM_WORLD_SIZE"}) {
    const char* v = std::getenv(name);
    if (v && *v) return true;
  }
  return false;
}

class MpiProcesses final : public ProcessGroup {
 public:
  MpiProcesses() {
    thread_ = detail::start_thread("the MPI thread", [this] { main_loop(); });
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return started_; });
    if (!start_error_.empty()) {
      lock.unlock();
      thread_.join();
      throw std::runtime_error(start_error_);
    }
  }

  ~MpiProcesses() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    thread_.join();
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }

  void all_reduce(float* data, std::size_t count) override {
    if (window_) return run_window(data, count);  // Note [Shared-memory all-reduce]
    if (size_ > 1) return run_ring(data, count);  // Note [Ring all-reduce]
    run(Plane::data, data, count * sizeof(float), count,
        [this](Request& r, std::size_t offset, int n, MPI_Request* out) {
          return MPI_Iallreduce(MPI_IN_PLACE, r.floats() + offset, n, MPI_FLOAT, MPI_SUM, data_,
                                out);
        });
  }

  void broadcast(float* data, std::size_t count, int root) override {
    check_root(root);
    run(Plane::data, data, count * sizeof(float), count,
        [this, root](Request& r, std::size_t offset, int n, MPI_Request* out) {
          return MPI_Ibcast(r.floats() + offset, n, MPI_FLOAT, root, data_, out);
        });
  }

  void barrier() override {
    run(Plane::control, nullptr, 0, 0, [this](Request&, std::size_t, int, MPI_Request* out) {
      return MPI_Ibarrier(control_, out);
    });
  }

  void all_reduce(std::span<double> values) override {
    run(Plane::control, values.data(), values.size_bytes(), values.size(),
        [this](Request& r, std::size_t offset, int n, MPI_Request* out) {
          return MPI_Iallreduce(MPI_IN_PLACE, reinterpret_cast<double*>(r.buffer.data()) + offset,
                                n, MPI_DOUBLE, MPI_SUM, control_, out);
        });
  }

  std::vector<std::uint64_t> all_gather(std::span<const std::uint64_t> mine) override {
    const std::size_t n = mine.size();
    if (n > kWhole) throw std::length_error("all_gather: too many values");
    // In place: process r's values at r * n of the result. One call for the whole.
    std::vector<std::uint64_t> all(n * static_cast<std::size_t>(size_));
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(n * rank_));
    run(Plane::control, all.data(), all.size() * sizeof(std::uint64_t), 0,
        [this, n](Request& r, std::size_t, int, MPI_Request* out) {
          return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, r.buffer.data(),
                                static_cast<int>(n), MPI_UINT64_T, control_, out);
        });
    return all;
  }

  void broadcast_bytes(void* data, std::size_t bytes, int root) override {
    check_root(root);
    run(Plane::control, data, bytes, bytes,
        [this, root](Request& r, std::size_t offset, int n, MPI_Request* out) {
          return MPI_Ibcast(r.buffer.data() + offset, n, MPI_BYTE, root, control_, out);
        });
  }

  void abort() noexcept override {
    {
      std::lock_guard lock(mutex_);
      aborted_ = true;
    }
    if (window_) window_->abort();  // and every other process's data plane
    done_cv_.notify_all();
  }
  bool aborted() const noexcept override {
    if (window_aborted()) return true;
    std::lock_guard lock(mutex_);
    return aborted_;
  }

  void abort_job(int code) noexcept override {
    // Aborted by another process through the window: that one failed first and ends the job
    // with its own status and message; we do so only if it has not within a few seconds.
    if (window_ && window_->aborted_by_peer())
      std::this_thread::sleep_for(std::chrono::seconds(3));
    {
      std::lock_guard lock(mutex_);
      job_abort_code_ = code;
    }
    work_cv_.notify_all();
    // MPI_Abort ends this process too. Should the MPI thread be unable to call it, leave anyway:
    // the launcher then ends the others, seeing a process exit without MPI_Finalize.
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(code);
  }

 private:
  // MPI counts are ints: no call takes more than kWhole elements.
  static constexpr std::size_t kWhole = std::numeric_limits<int>::max();
  // Note [Pipelined collectives]: the data plane's calls, in chunks of 1 MiB of floats, at most
  // kInFlight of them posted at a time.
  static constexpr std::size_t kPipelineChunk = std::size_t{1} << 18;
  static constexpr std::size_t kInFlight = 4;
  // How long the MPI thread polls without pause after the last progress.
  static constexpr std::chrono::milliseconds kHotPolling{5};

  // Posts the call for elements [offset, offset + n) of the request's buffer into *out;
  // returns an MPI error code.
  struct Request;
  using PostChunk = std::function<int(Request&, std::size_t offset, int n, MPI_Request* out)>;

  struct Request {
    std::vector<unsigned char> buffer;
    PostChunk post;
    std::size_t count = 0;        // elements, cut into calls of `chunk`; 0: one call
    std::size_t chunk = kWhole;
    std::size_t posted = 0;       // elements handed to MPI so far
    bool started = false;         // the first call is posted
    std::vector<MPI_Request> in_flight;  // MPI_REQUEST_NULL where a slot is free
    std::shared_ptr<detail::RingAllReduce> ring;  // instead of the above: Note [Ring all-reduce]
    bool done = false;
    std::string error;
    float* floats() { return reinterpret_cast<float*>(buffer.data()); }
    bool all_posted() const { return started && posted >= count; }
  };

  void check_root(int root) const {
    if (root < 0 || root >= size_) throw std::invalid_argument("broadcast: root out of range");
  }

  enum class Plane { data, control };

  // Copies `bytes` of `data` into a request of `count` elements (cut into chunks on the data
  // plane, Note [Pipelined collectives]), has the MPI thread run it, and copies the result
  // back. Throws CommAborted when aborted before it completes.
  void run(Plane plane, void* data, std::size_t bytes, std::size_t count, PostChunk post) {
    auto request = std::make_shared<Request>();
    const std::size_t chunk = plane == Plane::data ? kPipelineChunk : kWhole;
    request->buffer.resize(bytes);
    if (bytes) std::memcpy(request->buffer.data(), data, bytes);
    request->post = std::move(post);
    request->count = count;
    request->chunk = chunk;
    request->in_flight.assign(count > request->chunk ? kInFlight : 1, MPI_REQUEST_NULL);
    if (!serve(request)) throw CommAborted();
    if (bytes) std::memcpy(data, request->buffer.data(), bytes);
  }

  // all_reduce over the caller's buffer (Note [Ring all-reduce]). Aborted, the caller abandons
  // the ring before it leaves, so nothing touches data after the throw.
  void run_ring(float* data, std::size_t count) {
    auto request = std::make_shared<Request>();
    request->ring = std::make_shared<detail::RingAllReduce>(data, count, data_, rank_, size_);
    if (!serve(request)) {
      request->ring->abandon();
      throw CommAborted();
    }
  }

  // all_reduce through the window, on this thread. Another process's abort aborts this whole
  // group, as a local one would (Note [Shared-memory all-reduce]).
  void run_window(float* data, std::size_t count) {
    try {
      window_->all_reduce(data, count);
    } catch (const CommAborted&) {
      abort();
      throw;
    }
  }

  bool window_aborted() const noexcept { return window_ && window_->aborted(); }
  // On the MPI thread: another process aborted through the window, so this group aborts too
  // and the control plane's callers stop waiting.
  void notice_window_abort() {
    if (window_aborted() && !std::exchange(window_abort_seen_, true)) abort();
  }

  // Queues `request` for the MPI thread and waits for it. Returns false when aborted before it
  // completed; throws its error.
  bool serve(const std::shared_ptr<Request>& request) {
    {
      std::unique_lock lock(mutex_);
      if (aborted_) throw CommAborted();
      queue_.push_back(request);
      work_cv_.notify_one();
      done_cv_.wait(lock, [&] { return request->done || aborted_; });
      if (!request->done) return false;
    }
    if (!request->error.empty()) throw std::runtime_error(request->error);
    return true;
  }

  // On the MPI thread: posts the next chunks into the free slots. Returns an MPI error code.
  static int refill(Request& r) {
    if (r.ring) return MPI_SUCCESS;  // posts its own calls in advance()
    for (MPI_Request& slot : r.in_flight) {
      if (r.all_posted()) break;
      if (slot != MPI_REQUEST_NULL) continue;
      const std::size_t n = std::min(r.chunk, r.count - r.posted);
      if (const int rc = r.post(r, r.posted, static_cast<int>(n), &slot); rc != MPI_SUCCESS)
        return rc;
      r.posted += n;
      r.started = true;
    }
    return MPI_SUCCESS;
  }

  // On the MPI thread: tests the calls in flight and posts more. Returns whether the request
  // progressed; sets `finished` once every call has completed (or failed: then `error`).
  bool advance(Request& r, bool& finished, std::string& error) {
    if (r.ring) return advance_ring(r.ring, finished, error);
    int completed = 0;
    std::vector<int> indices(r.in_flight.size());
    int rc = MPI_Testsome(static_cast<int>(r.in_flight.size()), r.in_flight.data(), &completed,
                          indices.data(), MPI_STATUSES_IGNORE);
    if (rc == MPI_SUCCESS && completed != 0) rc = refill(r);  // MPI_UNDEFINED: none in flight
    finished = rc != MPI_SUCCESS || (completed == MPI_UNDEFINED && r.all_posted());
    if (rc != MPI_SUCCESS) error = "MPI: " + mpi_error(rc);
    return finished || completed != 0;
  }

  // advance() for a ring. Its staging goes to the next ring once it finished cleanly; a failed
  // ring may still have calls pending in MPI, so it stays alive (with its staging) until exit.
  bool advance_ring(const std::shared_ptr<detail::RingAllReduce>& ring, bool& finished,
                    std::string& error) {
    bool progressed = false;
    const int rc = ring->advance(ring_staging_, progressed);
    finished = rc != MPI_SUCCESS || ring->finished();
    if (rc != MPI_SUCCESS) {
      error = "MPI: " + mpi_error(rc);
      failed_rings_.push_back(ring);
    } else if (finished) {
      ring_staging_ = ring->release_staging();
    }
    return finished || progressed;
  }

  // The MPI thread: Note [One MPI thread].
  void main_loop() {
    std::string error = start_mpi();
    {
      std::lock_guard lock(mutex_);
      started_ = true;
      start_error_ = error;
    }
    done_cv_.notify_all();
    if (!error.empty()) return;

    std::vector<std::shared_ptr<Request>> active;
    auto last_progress = std::chrono::steady_clock::now();
    for (;;) {
      std::deque<std::shared_ptr<Request>> fresh;
      int abort_code = -1;
      {
        std::unique_lock lock(mutex_);
        work_cv_.wait(lock, [&] {
          return stopping_ || job_abort_code_ >= 0 || !queue_.empty() || !active.empty();
        });
        fresh.swap(queue_);
        abort_code = job_abort_code_;
        // Requests a local abort left pending may never complete: stop polling them at exit.
        if (stopping_ && (active.empty() || aborted_) && fresh.empty()) break;
      }
      if (abort_code >= 0) MPI_Abort(MPI_COMM_WORLD, abort_code);
      notice_window_abort();
      bool progressed = !fresh.empty();
      for (auto& r : fresh) {
        if (const int rc = refill(*r); rc != MPI_SUCCESS) finish(*r, "MPI: " + mpi_error(rc));
        else active.push_back(std::move(r));
      }
      for (auto it = active.begin(); it != active.end();) {
        bool finished = false;
        std::string error;
        progressed |= advance(**it, finished, error);
        if (finished) {
          finish(**it, std::move(error));
          it = active.erase(it);
        } else {
          ++it;
        }
      }
      // Open MPI's nonblocking collectives move only inside MPI calls: poll hot while they
      // move, yielding the core to any runnable worker, and back off once nothing has
      // progressed for kHotPolling (a peer that is late, or gone).
      const auto now = std::chrono::steady_clock::now();
      if (progressed) last_progress = now;
      else if (now - last_progress > kHotPolling)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else std::this_thread::yield();
    }
    bool clean = false;
    {
      std::lock_guard lock(mutex_);
      clean = !aborted_ && !window_aborted();
    }
    // After a local abort a collective may still be pending; MPI_Finalize could wait for it
    // for ever. Leave without it: the launcher then ends the job.
    if (clean) {
      if (window_) window_->free_window();
      MPI_Comm_free(&data_);
      MPI_Comm_free(&control_);
      MPI_Finalize();
    }
  }

  void finish(Request& r, std::string error) {
    {
      std::lock_guard lock(mutex_);
      r.done = true;
      r.error = std::move(error);
    }
    done_cv_.notify_all();
  }

  // On the MPI thread. Returns an error message, or empty.
  std::string start_mpi() {
    int provided = 0;
    if (const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
        rc != MPI_SUCCESS)
      return "MPI_Init_thread failed: " + mpi_error(rc);
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      return fmt::format("the MPI library provides thread level {}, lockstep needs "
                         "MPI_THREAD_FUNNELED ({})", provided, MPI_THREAD_FUNNELED);
    }
    // Errors come back as codes, for messages, instead of MPI's default abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_dup(MPI_COMM_WORLD, &data_);
    MPI_Comm_dup(MPI_COMM_WORLD, &control_);
    window_ = detail::SharedWindowAllReduce::create(MPI_COMM_WORLD);
    return {};
  }

  int rank_ = 0, size_ = 1;
  MPI_Comm data_ = MPI_COMM_NULL, control_ = MPI_COMM_NULL;  // Note [One MPI thread]

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;  // the MPI thread waits for requests
  std::condition_variable done_cv_;  // callers wait for theirs
  std::deque<std::shared_ptr<Request>> queue_;
  bool started_ = false, stopping_ = false, aborted_ = false;
  std::string start_error_;
  int job_abort_code_ = -1;
  // The data plane's all-reduce when every process is on this node; set before the
  // constructor returns.
  std::unique_ptr<detail::SharedWindowAllReduce> window_;
  bool window_abort_seen_ = false;  // the MPI thread's
  std::shared_ptr<detail::RingAllReduce::Staging> ring_staging_;  // the MPI thread's
  std::vector<std::shared_ptr<detail::RingAllReduce>> failed_rings_;  // likewise
  std::thread thread_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_mpi_processes() {
  if (!launched_by_mpi()) return nullptr;
  return std::make_shared<MpiProcesses>();
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<std::size_t>(length));
  return version.substr(0, version.find_first_of(",\r\n"));  // "Open MPI v4.1.4"
}

}  // namespace lockstep
