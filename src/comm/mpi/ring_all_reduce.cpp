// Note [Ring all-reduce] is in ring_all_reduce.hpp.
#include "comm/mpi/ring_all_reduce.hpp"

#include <algorithm>
#include <cstring>

#include "lockstep/comm.hpp"

namespace lockstep::detail {
namespace {

constexpr int kTag = 18;

int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

RingAllReduce::RingAllReduce(float* data, std::size_t count, MPI_Comm comm, int rank, int size)
    : data_(data), comm_(comm), left_(mod(rank - 1, size)), right_(mod(rank + 1, size)) {
  std::fill(std::begin(requests_), std::end(requests_), MPI_REQUEST_NULL);
  std::fill(std::begin(slot_unit_), std::end(slot_unit_), -1);
  plan(count, rank, size);
  received_.assign(recvs_.size(), 0);
}

// The receives and sends of every step, chunk by chunk (Note [Ring all-reduce]). The segment a
// step sends is the one the step before received, so a send forwards the receive of the same
// chunk one step earlier.
void RingAllReduce::plan(std::size_t count, int rank, int size) {
  std::size_t previous_step = 0;  // index of the previous step's first receive
  for (int t = 0; t < 2 * (size - 1); ++t) {
    const bool reduce = t < size - 1;
    const int u = reduce ? t : t - (size - 1);
    const int received = reduce ? rank - t - 1 : rank - u, sent = reduce ? rank - t : rank + 1 - u;
    const ShardRange in = shard_range(count, size, mod(received, size));
    const ShardRange out = shard_range(count, size, mod(sent, size));
    const std::size_t first_recv = recvs_.size();
    for (std::size_t b = in.begin; b < in.end; b += kChunk)
      recvs_.push_back({b, static_cast<int>(std::min(kChunk, in.end - b)), reduce, -1});
    std::ptrdiff_t forwarded = static_cast<std::ptrdiff_t>(previous_step);
    for (std::size_t b = out.begin; b < out.end; b += kChunk)
      sends_.push_back({b, static_cast<int>(std::min(kChunk, out.end - b)), false,
                        t == 0 ? -1 : forwarded++});
    previous_step = first_recv;
  }
}

int RingAllReduce::advance(std::shared_ptr<Staging>& staging, bool& progressed) {
  if (!staging_) {
    staging_ = staging ? std::move(staging) : std::make_shared<Staging>();
    staging_->resize(2 * kSlots * kChunk);
  }
  progressed = false;
  for (int round = 0; round < 2 * kSlots; ++round) {  // then let the MPI thread serve others
    if (const int rc = post(); rc != MPI_SUCCESS) return rc;
    int completed = 0;
    int indices[2 * kSlots];
    const int rc = MPI_Testsome(2 * kSlots, requests_, &completed, indices, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return rc;
    if (completed == MPI_UNDEFINED || completed == 0) return MPI_SUCCESS;
    progressed = true;
    for (int i = 0; i < completed; ++i) complete(indices[i]);
    if (finished()) return MPI_SUCCESS;
  }
  return post();
}

// Posts the next receives and the next sends whose data is ready, in plan order, into free
// slots. Nothing new once abandoned.
int RingAllReduce::post() {
  std::lock_guard lock(user_);
  if (abandoned_) return MPI_SUCCESS;
  for (int slot = 0; slot < kSlots && next_recv_ < recvs_.size(); ++slot) {
    if (slot_unit_[slot] >= 0) continue;
    const Unit& u = recvs_[next_recv_];
    if (const int rc =
            MPI_Irecv(stage(slot), u.n, MPI_FLOAT, left_, kTag, comm_, &requests_[slot]);
        rc != MPI_SUCCESS)
      return rc;
    slot_unit_[slot] = static_cast<std::ptrdiff_t>(next_recv_++);
  }
  for (int slot = kSlots; slot < 2 * kSlots && next_send_ < sends_.size(); ++slot) {
    if (slot_unit_[slot] >= 0) continue;
    const Unit& u = sends_[next_send_];
    if (u.after >= 0 && !received_[static_cast<std::size_t>(u.after)]) break;
    std::memcpy(stage(slot), data_ + u.offset, static_cast<std::size_t>(u.n) * sizeof(float));
    if (const int rc =
            MPI_Isend(stage(slot), u.n, MPI_FLOAT, right_, kTag, comm_, &requests_[slot]);
        rc != MPI_SUCCESS)
      return rc;
    slot_unit_[slot] = static_cast<std::ptrdiff_t>(next_send_++);
  }
  return MPI_SUCCESS;
}

// A call of `slot` completed: a receive is summed into data (own + received) or copied there.
void RingAllReduce::complete(int slot) {
  const std::size_t unit = static_cast<std::size_t>(slot_unit_[slot]);
  slot_unit_[slot] = -1;
  if (slot >= kSlots) {
    ++sends_done_;
    return;
  }
  ++recvs_done_;
  std::lock_guard lock(user_);
  if (abandoned_) return;
  const Unit& u = recvs_[unit];
  float* dst = data_ + u.offset;
  const float* src = stage(slot);
  if (u.add) {
    for (int i = 0; i < u.n; ++i) dst[i] += src[i];
  } else {
    std::memcpy(dst, src, static_cast<std::size_t>(u.n) * sizeof(float));
  }
  received_[unit] = 1;
}

void RingAllReduce::abandon() noexcept {
  std::lock_guard lock(user_);
  abandoned_ = true;
}

}  // namespace lockstep::detail
