#include "cpu/thread_pool.h"

#include <algorithm>

namespace mladcp::cpu {

// Before blocking on a condition variable, a thread polls the state it waits for this many times,
// yielding the core between polls (about a millisecond in all). Back-to-back calls (a decode per
// layer) then find the workers awake, and the caller sees the last worker finish without a futex
// wake-up in between; a process that is left idle still ends up blocked.
constexpr int kSpinChecks = 2000;

ThreadPool& ThreadPool::instance() {
  static ThreadPool pool(std::max(1, int(std::thread::hardware_concurrency())));
  return pool;
}

ThreadPool::ThreadPool(int num_threads) {
  for (int slot = 1; slot < num_threads; ++slot) workers_.emplace_back([this, slot] { worker_loop(slot); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_items(int slot) {
  for (int item = next_.fetch_add(1, std::memory_order_relaxed); item < num_items_;
       item = next_.fetch_add(1, std::memory_order_relaxed))
    (*fn_)(item, slot);
}

void ThreadPool::worker_loop(int slot) {
  unsigned long seen = 0;
  for (;;) {
    for (int spin = 0; spin < kSpinChecks && generation_seen_.load(std::memory_order_acquire) == seen; ++spin)
      std::this_thread::yield();
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (slot > active_workers_) continue;  // not needed for this job
    }
    run_items(slot);
    std::lock_guard<std::mutex> lock(mu_);
    if (--running_ == 0) done_.notify_one();
  }
}

void ThreadPool::parallel_for(int num_items, int max_threads, const std::function<void(int, int)>& fn) {
  if (num_items <= 0) return;
  std::lock_guard<std::mutex> call(call_mu_);
  int threads = max_threads > 0 ? std::min(max_threads, size()) : size();
  threads = std::min(threads, num_items);
  if (threads <= 1) {
    for (int i = 0; i < num_items; ++i) fn(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    num_items_ = num_items;
    next_.store(0, std::memory_order_relaxed);
    active_workers_ = threads - 1;
    running_ = threads - 1;
    ++generation_;
    generation_seen_.store(generation_, std::memory_order_release);
  }
  wake_.notify_all();
  run_items(0);
  for (int spin = 0; spin < kSpinChecks && running_.load(std::memory_order_acquire) != 0; ++spin)
    std::this_thread::yield();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return running_.load(std::memory_order_acquire) == 0; });
  fn_ = nullptr;
}

}  // namespace mladcp::cpu
