// A small persistent thread pool for the host backend: parallel_for over independent work items.
// Items are claimed dynamically, so which thread runs an item varies, but each item's result
// depends only on the item: outputs are the same bits whatever the thread count.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mladcp::cpu {

class ThreadPool {
 public:
  // The process-wide pool, sized to the hardware concurrency (started on first use).
  static ThreadPool& instance();

  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }  // workers plus the calling thread

  // Runs fn(item, thread_slot) for item in [0, num_items) on up to max_threads threads (0: all),
  // the caller included; thread_slot in [0, max_threads) identifies per-thread scratch. Returns when
  // every item is done. Calls from several threads are serialized.
  void parallel_for(int num_items, int max_threads, const std::function<void(int, int)>& fn);

 private:
  void worker_loop(int slot);
  void run_items(int slot);

  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one parallel_for at a time
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int, int)>* fn_ = nullptr;
  int num_items_ = 0;
  int active_workers_ = 0;       // workers taking part in the current job
  std::atomic<int> running_{0};  // workers not yet finished with the current job
  unsigned long generation_ = 0;
  bool stop_ = false;
  std::atomic<int> next_{0};
  std::atomic<unsigned long> generation_seen_{0};  // generation_, readable without the lock
};

}  // namespace mladcp::cpu
