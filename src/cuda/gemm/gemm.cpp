// The CUDA backend's GEMMs: C = op(A)·op(B) through cuBLASLt plans (descriptors and the
// heuristic's algorithm, made once per configuration and cached) with the BIAS epilogue where it
// applies, and cublasGemmEx where cuBLASLt is off or offers nothing.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "backend_impl.hpp"
#include "dpt/cuda_check.hpp"

namespace dpt::cuda_impl {
namespace {

// Largest power of two (<= 256) dividing the address; 256 for nullptr.
int ptr_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 1;
  while (al < 256 && (a % uintptr_t(al * 2)) == 0) al *= 2;
  return al;
}

}  // namespace

// C (m×n, column-major, ldc) = op(A)·op(B) + beta·C in the backend's precision; A is stored
// (m×k, or k×m when ta) with leading dimension lda, B (k×n, or n×k when tb) with ldb. A and B
// are bf16 with precision bf16 (see as_bf16), fp32 otherwise. With bias (m floats, set only
// with beta == 0) the GEMM may also add bias[i] to row i of C (cuBLASLt's BIAS epilogue, the
// sum rounded once in fp32 as the separate kernel does): returns true when it did, false when
// the caller must still add it.
bool CudaBackendImpl::gemm(bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B,
                           int ldb, float* C, int ldc, float beta, const float* bias) {
  if (m == 0 || n == 0) return false;
  const float alpha = 1.f;
  if (use_lt_ && k > 0) {
    // The bias epilogue only for a 16-byte-aligned bias (a misaligned one is added by the
    // kernel); the plain product is the fallback of the biased one.
    const bool with_bias = bias && beta == 0.f && ptr_alignment(bias) >= 16;
    for (int pass = with_bias ? 0 : 1; pass < 2; ++pass) {
      LtSpec sp = spec(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, beta);
      if (pass == 0) sp.epi = CUBLASLT_EPILOGUE_BIAS;
      if (lt_matmul(sp, A, B, C, beta, pass == 0 ? bias : nullptr)) return pass == 0;
    }
  }
  const cudaDataType_t ab = bf16() ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute =
      precision_ == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  DPT_CHECK_CUBLAS(cublasGemmEx(blas_.get(), ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, ab, lda, B,
                                ab, ldb, &beta, C, CUDA_R_32F, ldc, compute,
                                CUBLAS_GEMM_DEFAULT));
  return false;
}

// The spec of a plain product with fp32 C; operands in the precision's type.
CudaBackendImpl::LtSpec CudaBackendImpl::spec(bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B, int ldb,
                                              const void* C, int ldc, float beta, int d_type) const {
  const int esz = bf16() ? 2 : 4, dsz = d_type == CUDA_R_16BF ? 2 : 4;
  LtSpec sp;
  sp.ta = ta; sp.tb = tb; sp.m = m; sp.n = n; sp.k = k; sp.lda = lda; sp.ldb = ldb; sp.ldc = ldc;
  sp.beta_nonzero = beta != 0.f;
  sp.d_type = d_type;
  sp.alA = std::min(ptr_alignment(A), ptr_alignment(reinterpret_cast<const void*>(uintptr_t(lda) * esz)));
  sp.alB = std::min(ptr_alignment(B), ptr_alignment(reinterpret_cast<const void*>(uintptr_t(ldb) * esz)));
  sp.alC = std::min(ptr_alignment(C), ptr_alignment(reinterpret_cast<const void*>(uintptr_t(ldc) * dsz)));
  return sp;
}

// D = op(A)·op(B) (+ beta·D) through the plan of sp with its bias (for a bias epilogue);
// false, and nothing enqueued, when cuBLASLt offers no algorithm.
bool CudaBackendImpl::lt_matmul(const LtSpec& sp, const void* A, const void* B, void* D, float beta,
                                const void* bias) {
  const LtPlan& pl = lt_plan(sp, bias);
  if (!pl.ok) return false;
  if (bias)
    DPT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias));
  const float alpha = 1.f;
  DPT_CHECK_CUBLAS(cublasLtMatmul(lt_.get(), pl.op, &alpha, A, pl.a, B, pl.b, &beta, D, pl.c, D,
                                  pl.c, &pl.algo, workspace_.get(), kWorkspaceBytes,
                                  stream_.get()));
  return true;
}

// The cuBLASLt plan of one configuration with this bias (its alignment is part of the key),
// made on first use and cached (the eager warm-up step meets every configuration of the
// captured step, so capture only looks up). pl.ok: lt_matmul would run.
const LtPlan& CudaBackendImpl::lt_plan(LtSpec sp, const void* bias) {
  sp.alBias = bias ? ptr_alignment(bias) : 0;
  auto it = lt_plans_.find(sp);
  if (it != lt_plans_.end()) return *it->second;
  auto pl = std::make_unique<LtPlan>();
  make_lt_plan(*pl, sp, bias);
  return *lt_plans_.emplace(sp, std::move(pl)).first->second;
}

// Fills pl (pl.ok stays false when any step fails or no algorithm fits: the caller's fallback).
void CudaBackendImpl::make_lt_plan(LtPlan& pl, const LtSpec& sp, const void* bias) {
  const cudaDataType_t ab = bf16() ? CUDA_R_16BF : CUDA_R_32F;
  const auto dt = cudaDataType_t(sp.d_type);
  const cublasComputeType_t compute =
      precision_ == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t opa = sp.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = sp.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  auto good = [](cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS; };
  if (!good(cublasLtMatmulDescCreate(&pl.op, compute, CUDA_R_32F))) return;
  if (!good(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa)) ||
      !good(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb)))
    return;
  if (sp.epi != CUBLASLT_EPILOGUE_DEFAULT) {
    const auto epi = cublasLtEpilogue_t(sp.epi);
    const auto bt = cudaDataType_t(sp.bias_type);
    if (!good(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)))
      return;
    // The heuristic reads the pointer's value for its alignment.
    if (bias && (!good(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt)) ||
                 !good(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias))))
      return;
  }
  if (!good(cublasLtMatrixLayoutCreate(&pl.a, ab, sp.ta ? sp.k : sp.m, sp.ta ? sp.m : sp.k, sp.lda)) ||
      !good(cublasLtMatrixLayoutCreate(&pl.b, ab, sp.tb ? sp.n : sp.k, sp.tb ? sp.k : sp.n, sp.ldb)) ||
      !good(cublasLtMatrixLayoutCreate(&pl.c, dt, sp.m, sp.n, sp.ldc)))
    return;
  cublasLtMatmulPreference_t pref = nullptr;
  if (!good(cublasLtMatmulPreferenceCreate(&pref))) return;
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t a32 = uint32_t(sp.alA), b32 = uint32_t(sp.alB), c32 = uint32_t(sp.alC);
  bool set = good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
             good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof a32)) &&
             good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b32, sizeof b32)) &&
             good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c32, sizeof c32)) &&
             good(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c32, sizeof c32));
  cublasLtMatmulHeuristicResult_t res[kLtCandidates] = {};
  int found = 0;
  if (set && !good(cublasLtMatmulAlgoGetHeuristic(lt_.get(), pl.op, pl.a, pl.b, pl.c, pl.c, pref,
                                                  kLtCandidates, res, &found)))
    found = 0;
  cublasLtMatmulPreferenceDestroy(pref);
  // The requested candidate, else the best one that is there; each must fit the workspace.
  for (int i = std::min(lt_algo_index_, found - 1); i >= 0; --i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= kWorkspaceBytes) {
      pl.algo = res[i].algo;
      pl.ok = true;
      return;
    }
}

}  // namespace dpt::cuda_impl
