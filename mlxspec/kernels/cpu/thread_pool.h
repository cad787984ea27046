// A tiny persistent thread pool for kernels called ~200 times per forward pass.
//
// Work is split into chunks that the caller and any awake worker claim from one atomic counter.
// On a busy machine a descheduled worker then costs nothing: the caller does its chunks, and only
// waits for chunks a worker has actually started. Workers spin briefly after each job (the next
// matmul comes within microseconds during a forward pass), then sleep on a condition variable.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MLXSPEC_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define MLXSPEC_PAUSE() asm volatile("yield")
#else
#define MLXSPEC_PAUSE() ((void)0)
#endif

namespace mlxspec {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads) : n_(std::max(1, n_threads)) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~ThreadPool() {
    stop_.store(true);
    wake(gen_ + 1);
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  // Run f(i) for every chunk i in [0, chunks); returns when all are done. One job at a time.
  void run(int chunks, const std::function<void(int)>& f) {
    if (n_ == 1 || chunks <= 1 || chunks > kMaxChunks) {
      for (int i = 0; i < chunks; ++i) f(i);
      return;
    }
    std::lock_guard<std::mutex> one(job_mu_);
    job_.store(&f, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    uint64_t gen = ++gen_;
    // One word holds (generation, chunk count, next chunk): a worker can only claim a chunk of the
    // job it read, never pair an old job's claim with a new job's count (that ran a chunk twice
    // and let run() return while a worker still held its stack frame).
    claim_.store((gen << 32) | (uint64_t(chunks) << 16), std::memory_order_release);  // publishes job_
    wake(gen);
    work(gen);
    while (done_.load(std::memory_order_acquire) < chunks) MLXSPEC_PAUSE();
  }

 private:
  static constexpr int kMaxChunks = 0xffff;

  // Claim and run chunks of job `gen` until none is left (or a newer job replaced it).
  void work(uint64_t gen) {
    for (;;) {
      uint64_t c = claim_.load(std::memory_order_acquire);
      const uint64_t chunks = (c >> 16) & 0xffffu, next = c & 0xffffu;
      if ((c >> 32) != (gen & 0xffffffffu) || next >= chunks) return;
      if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) continue;
      (*job_.load(std::memory_order_relaxed))(int(next));  // valid: our claim holds the job open
      done_.fetch_add(1, std::memory_order_release);
    }
  }
  void wake(uint64_t gen) {
    wake_.store(gen);
    if (sleepers_.load() > 0) {
      { std::lock_guard<std::mutex> lk(mu_); }
      cv_.notify_all();
    }
  }
  void loop() {
    uint64_t seen = 0;
    while (!stop_.load()) {
      seen = wait_for_new(seen);
      if (!stop_.load()) work(seen);
    }
  }
  uint64_t wait_for_new(uint64_t seen) {
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
    for (int spins = 0;; ++spins) {
      uint64_t g = wake_.load(std::memory_order_acquire);
      if (g != seen) return g;
      if ((spins & 255) == 255 && std::chrono::steady_clock::now() > until) break;
      MLXSPEC_PAUSE();
    }
    std::unique_lock<std::mutex> lk(mu_);
    sleepers_.fetch_add(1);
    cv_.wait(lk, [&] { return wake_.load() != seen; });
    sleepers_.fetch_sub(1);
    return wake_.load(std::memory_order_acquire);
  }

  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_, job_mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> claim_{0}, wake_{0};  // claim_: (generation << 32) | (chunks << 16) | next chunk
  std::atomic<int> done_{0}, sleepers_{0};
  std::atomic<bool> stop_{false};
  std::atomic<const std::function<void(int)>*> job_{nullptr};
  uint64_t gen_ = 0;
};

}  // namespace mlxspec
