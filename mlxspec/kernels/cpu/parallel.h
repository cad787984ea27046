// The parallel drivers shared by the primitives (ext.cpp defines them): one thread pool per process,
// the quantized matmul split over columns, attention split over kv heads and row chunks.
// Splitting never changes an output's arithmetic (the kernels' exactness rule), only who computes it.
#pragma once

#include "qmm_kernel.h"
#include "qmm_q8_kernel.h"
#include "sdpa_kernel.h"
#include "thread_pool.h"

namespace mlxspec {

ThreadPool& pool();

// y (M, N) fp32 = the problem's matmul; tiny problems run inline.
void run_qmm(Isa isa, const QmmProblem& p, float* y);

// Several matmuls over the same rows (q/k/v, gate/up) in one pool job: y[i] (M, N_i) fp32.
void run_qmm_many(Isa isa, const QmmProblem* problems, float* const* y, int count);

// p.out (B, H, M, Dv) fp32 = attention of the problem.
void run_sdpa(Isa isa, const SdpaProblem& p);

}  // namespace mlxspec
