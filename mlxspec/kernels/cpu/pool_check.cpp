// Standalone stress check of thread_pool.h (tests/kernels/test_isa_paths.py): many short jobs
// back to back with changing chunk counts, as a forward pass issues them. Every chunk must run
// exactly once, and never after run() returned (the job's counters live on the caller's stack).
//
//   g++ -O2 -std=c++17 -pthread pool_check.cpp && ./a.out   -> "jobs=... errors=0"
#include <atomic>
#include <cstdio>
#include <vector>

#include "thread_pool.h"

int main(int argc, char** argv) {
  const int jobs = argc > 1 ? std::atoi(argv[1]) : 200000;
  mlxspec::ThreadPool pool(std::max(2u, std::thread::hardware_concurrency()));
  std::atomic<long> errors{0};
  for (int j = 0; j < jobs; ++j) {
    const int chunks = 2 + (j * 7) % 11;  // 2..12 chunks, changing every job
    std::vector<std::atomic<int>> runs(chunks);
    std::atomic<bool> open{true};
    pool.run(chunks, [&](int i) {
      if (!open.load() || i < 0 || i >= chunks) ++errors;  // a chunk after return, or of another job
      else runs[i].fetch_add(1);
    });
    open.store(false);
    for (auto& r : runs)
      if (r.load() != 1) ++errors;
  }
  std::printf("jobs=%d errors=%ld\n", jobs, errors.load());
  return errors.load() ? 1 : 0;
}
