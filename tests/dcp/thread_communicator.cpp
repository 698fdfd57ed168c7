#include "dcp/thread_communicator.h"

#include <chrono>
#include <cstring>

#include "mladcp/device_memory.h"

namespace mladcp::test {

enum class OpKind { kAllGather, kReduceScatter, kAllToAll };

struct Op {
  OpKind kind;
  const void* send;
  void* recv;
  size_t size;  // bytes (all_gather, all_to_all per rank) or floats per rank (reduce-scatter)
};

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter_sum_f32";
    case OpKind::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

class ThreadGroup {
 public:
  explicit ThreadGroup(int world) : world_(world), posted_(size_t(world)) {}
  int world() const { return world_; }

  // Meets every rank, or fails at the deadline (kTimeout, and the group breaks) or when another rank
  // broke the group (kRemoteError).
  Status barrier(int rank, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) return Status(StatusCode::kRemoteError, "thread group broken: " + broken_reason_);
    const int64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return Status::Ok();
    }
    if (!cv_.wait_until(lock, deadline, [&] { return generation_ != gen || broken_; })) {
      broken_ = true;
      broken_reason_ = "rank " + std::to_string(rank) + " timed out waiting for its peers";
      cv_.notify_all();
      return Status(StatusCode::kTimeout, "thread group rank " + std::to_string(rank) +
                                              ": peers did not arrive before the deadline (stalled or gone)");
    }
    if (generation_ == gen) return Status(StatusCode::kRemoteError, "thread group broken: " + broken_reason_);
    return Status::Ok();
  }

  void post(int rank, const Op& op) {
    std::lock_guard<std::mutex> lock(mu_);
    posted_[size_t(rank)] = op;
  }
  Op posted(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    return posted_[size_t(rank)];
  }
  void break_group(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) {
      broken_ = true;
      broken_reason_ = why;
    }
    cv_.notify_all();
  }

 private:
  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
  std::vector<Op> posted_;
};

namespace {

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> g, int rank, Device memory)
      : group_(std::move(g)), rank_(rank), memory_(memory) {}
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world(); }
  Device memory() const override { return memory_; }
  std::string name() const override { return memory_ == Device::kHost ? "threads" : "threads-device"; }

  Status all_gather(const void* send, void* recv, size_t bytes) override {
    return queue({OpKind::kAllGather, send, recv, bytes});
  }
  Status reduce_scatter_sum_f32(const float* send, float* recv, size_t count) override {
    return queue({OpKind::kReduceScatter, send, recv, count});
  }
  Status all_to_all(const void* send, void* recv, size_t bytes_per_rank) override {
    return queue({OpKind::kAllToAll, send, recv, bytes_per_rank});
  }
  Status group_start() override { return health(); }
  Status group_end() override { return health(); }

  Status wait(std::chrono::milliseconds deadline) override {
    MLADCP_RETURN_IF_ERROR(health());
    const auto end = std::chrono::steady_clock::now() + deadline;
    const int W = group_->world();
    for (const Op& op : queued_) {
      // Device buffers: this rank's kernels must have written its send buffer before peers read it.
      if (memory_ != Device::kHost)
        if (Status s = device_synchronize(); !s.ok()) return fail(s);
      group_->post(rank_, op);
      if (Status s = group_->barrier(rank_, end); !s.ok()) return fail(s);
      for (int peer = 0; peer < W; ++peer) {
        const Op other = group_->posted(peer);
        if (other.kind != op.kind || other.size != op.size) {
          group_->break_group("ranks issued different operations");
          return fail(Status(StatusCode::kCommError, std::string("rank ") + std::to_string(rank_) + " issued " +
                                                         op_name(op.kind) + " but rank " + std::to_string(peer) +
                                                         " issued " + op_name(other.kind) + " (or another size)"));
        }
      }
      if (Status s = execute(op); !s.ok()) {
        group_->break_group("rank " + std::to_string(rank_) + ": " + s.message());
        return fail(s);
      }
      if (Status s = group_->barrier(rank_, end); !s.ok()) return fail(s);
    }
    queued_.clear();
    return Status::Ok();
  }

  void abort(const std::string& reason) override {
    if (aborted_) return;
    aborted_ = true;
    reason_ = reason;
    queued_.clear();
    group_->break_group("rank " + std::to_string(rank_) + " aborted: " + reason);
  }
  Status health() const override {
    if (!aborted_) return Status::Ok();
    return Status(StatusCode::kUnavailable, "thread communicator aborted (" + reason_ + "); it is unusable");
  }

 private:
  Status queue(const Op& op) {
    MLADCP_RETURN_IF_ERROR(health());
    if (op.size > 0) queued_.push_back(op);
    return Status::Ok();
  }
  Status fail(Status s) {
    abort(s.message());
    return s;
  }
  Status copy(void* dst, const void* src, size_t bytes) const {
    if (memory_ == Device::kHost) {
      std::memcpy(dst, src, bytes);
      return Status::Ok();
    }
    return copy_device_to_device(dst, src, bytes);  // synchronous (legacy stream)
  }
  Status execute(const Op& op) {
    const int W = group_->world();
    switch (op.kind) {
      case OpKind::kAllGather:
        for (int peer = 0; peer < W; ++peer)
          MLADCP_RETURN_IF_ERROR(
              copy(static_cast<char*>(op.recv) + size_t(peer) * op.size, group_->posted(peer).send, op.size));
        break;
      case OpKind::kAllToAll:
        for (int peer = 0; peer < W; ++peer)
          MLADCP_RETURN_IF_ERROR(copy(static_cast<char*>(op.recv) + size_t(peer) * op.size,
                                      static_cast<const char*>(group_->posted(peer).send) + size_t(rank_) * op.size,
                                      op.size));
        break;
      case OpKind::kReduceScatter: {
        std::vector<float> sum(op.size, 0.0f), in(memory_ == Device::kHost ? 0 : op.size);
        for (int peer = 0; peer < W; ++peer) {
          const float* src = static_cast<const float*>(group_->posted(peer).send) + size_t(rank_) * op.size;
          if (memory_ != Device::kHost) {
            MLADCP_RETURN_IF_ERROR(copy_device_to_host(in.data(), src, op.size * sizeof(float)));
            src = in.data();
          }
          for (size_t i = 0; i < op.size; ++i) sum[i] += src[i];
        }
        if (memory_ == Device::kHost)
          std::memcpy(op.recv, sum.data(), op.size * sizeof(float));
        else
          MLADCP_RETURN_IF_ERROR(copy_host_to_device(op.recv, sum.data(), op.size * sizeof(float)));
        break;
      }
    }
    if (memory_ != Device::kHost) MLADCP_RETURN_IF_ERROR(device_synchronize());
    return Status::Ok();
  }

  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  Device memory_;
  std::vector<Op> queued_;
  bool aborted_ = false;
  std::string reason_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int world, Device memory) {
  auto group = std::make_shared<ThreadGroup>(world);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world; ++r) comms.push_back(std::make_unique<ThreadCommunicator>(group, r, memory));
  return comms;
}

}  // namespace mladcp::test
