#include "train/trace.hpp"

#include <cstdio>
#include <fstream>

#include <fmt/format.h>

#if LOCKSTEP_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

#include "common/nvtx_range.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {

// ---- Note [NVTX ranges] -------------------------------------------------------------------------

#if LOCKSTEP_HAVE_NVTX
void nvtx_push(const char* name) noexcept { nvtxRangePushA(name); }
void nvtx_push(const char* prefix, std::size_t index) noexcept {
  char name[96];
  std::snprintf(name, sizeof name, "%s%zu", prefix, index);
  nvtxRangePushA(name);
}
void nvtx_pop() noexcept { nvtxRangePop(); }
#else
void nvtx_push(const char*) noexcept {}
void nvtx_push(const char*, std::size_t) noexcept {}
void nvtx_pop() noexcept {}
#endif

// ---- The trace ----------------------------------------------------------------------------------

double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Trace::Trace(int workers, bool enabled)
    : workers_(workers), enabled_(enabled), tracks_(enabled ? 2 * workers : 0) {}

void Trace::write_json(const std::filesystem::path& file, double origin_s) const {
  std::ofstream out(file, std::ios::trunc);
  if (!out) throw InputError(fmt::format("trainer.trace: cannot write '{}'", file.string()));
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto emit = [&](const std::string& event) {
    out << (first ? "  " : ",\n  ") << event;
    first = false;
  };
  for (int t = 0; t < static_cast<int>(tracks_.size()); ++t) {
    const bool comm = t >= workers_;
    const int rank = comm ? t - workers_ : t;
    // Name the track, and keep each worker next to its communication thread.
    emit(fmt::format(R"({{"ph": "M", "pid": 0, "tid": {}, "name": "thread_name", "args": {{"name": "{} {}"}}}})",
                     t, comm ? "comm" : "worker", rank));
    emit(fmt::format(R"({{"ph": "M", "pid": 0, "tid": {}, "name": "thread_sort_index", "args": {{"sort_index": {}}}}})",
                     t, 2 * rank + (comm ? 1 : 0)));
    for (const TraceEvent& e : tracks_[t]) {
      emit(fmt::format(R"({{"ph": "X", "pid": 0, "tid": {}, "name": "{}", "ts": {:.3f}, "dur": {:.3f}, "args": {{{}}}}})",
                       t, e.name, (e.begin_s - origin_s) * 1e6, (e.end_s - e.begin_s) * 1e6,
                       e.args));
    }
  }
  out << "\n]}\n";
  if (!out) throw std::runtime_error(fmt::format("trainer.trace: writing '{}' failed", file.string()));
}

}  // namespace lockstep::detail
