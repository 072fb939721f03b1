// bench-lt-epilogues: the GEMMs of one Linear layer through cuBLASLt, plain and with the
// epilogues an MLP step can fuse (bias, ReLU, ReLU bit mask, ReLU gradient, bias gradient), each
// with every algorithm cuBLASLt's heuristic offers, timed with CUDA events. It shows what each
// epilogue costs against the plain product, and which candidate is fastest. It also checks the
// fused backward's results against the plain product masked and summed on the host:
// DRELU_BGRAD's output (dz = (W·dZ) ⊙ [z > 0]) and its bias gradient (Σ over the batch of dz).
//
//   ./build/bench/bench-lt-epilogues --precision bf16 --m 4096 --n 4096 --k 4096
//
// One JSON object per line: {"gemm", "epilogue", "d_type", "candidate", "ms", "tflops"}, then
// {"check", ...} lines. m: the layer's output width (forward) or input width (input gradient),
// n: the batch, k: the other width.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_bench.hpp"

namespace {

#define CKB(x)                                                                                \
  do {                                                                                        \
    cublasStatus_t s_ = (x);                                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                        \
      std::fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__, int(s_));         \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

struct Args {
  int m = 4096, n = 4096, k = 4096, candidates = 8, reps = 20;
  std::string precision = "bf16";
};

using bench::Dev;
using bench::download;
using bench::upload;

std::vector<float> random(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    x = (float(s >> 40) / float(1 << 24) * 2.f - 1.f) * scale;
  }
  return v;
}

struct Gemm {
  const char* name;
  bool ta, tb;
  int m, n, k, lda, ldb;
};

struct Epi {
  const char* name;
  cublasLtEpilogue_t epi;
  bool d16;  // D (and bias / bias gradient) in bf16
};

class Lt {
 public:
  Lt(bool bf16, bool tf32) : bf16_(bf16), tf32_(tf32) {
    CKB(cublasLtCreate(&h_));
    CK(cudaMalloc(&ws_, kWs));
    CK(cudaStreamCreate(&s_));
    CK(cudaEventCreate(&e0_));
    CK(cudaEventCreate(&e1_));
  }
  ~Lt() {
    cudaFree(ws_);
    cublasLtDestroy(h_);
  }

  // Runs (timed == false) or times every candidate of g with epilogue e; returns per-candidate
  // ms (empty: no algorithm). cand < 0: all; else that one only, run once.
  std::vector<double> go(const Gemm& g, const Epi& e, const void* A, const void* B, void* D,
                         void* bias, void* aux, int candidates, int reps, int only = -1) {
    const cudaDataType_t ab = bf16_ ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t dt = e.d16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatmulDesc_t op;
    CKB(cublasLtMatmulDescCreate(&op, tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e.epi, sizeof e.epi));
    if (bias) {
      CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof dt));
      CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    if (aux) {
      const int64_t ld = (g.m + 127) / 128 * 128;
      CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
      CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    cublasLtMatrixLayout_t la, lb, lc;
    CKB(cublasLtMatrixLayoutCreate(&la, ab, g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda));
    CKB(cublasLtMatrixLayoutCreate(&lb, ab, g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb));
    CKB(cublasLtMatrixLayoutCreate(&lc, dt, g.m, g.n, g.m));
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWs;
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    std::vector<cublasLtMatmulHeuristicResult_t> res(size_t(std::max(1, candidates)));
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(h_, op, la, lb, lc, lc, pref, candidates, res.data(), &found) !=
        CUBLAS_STATUS_SUCCESS)
      found = 0;
    std::vector<double> ms;
    const float one = 1.f, zero = 0.f;
    for (int c = 0; c < found; ++c) {
      if (only >= 0 && c != only) continue;
      auto run = [&] {
        return cublasLtMatmul(h_, op, &one, A, la, B, lb, &zero, D, lc, D, lc, &res[size_t(c)].algo,
                              ws_, kWs, s_);
      };
      if (run() != CUBLAS_STATUS_SUCCESS) {
        ms.push_back(-1);
        continue;
      }
      if (only >= 0) {
        CK(cudaStreamSynchronize(s_));
        ms.push_back(0);
        continue;
      }
      for (int w = 0; w < 3; ++w) run();
      CK(cudaEventRecord(e0_, s_));
      for (int r = 0; r < reps; ++r) run();
      CK(cudaEventRecord(e1_, s_));
      CK(cudaEventSynchronize(e1_));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0_, e1_));
      ms.push_back(double(t) / reps);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    return ms;
  }

 private:
  static constexpr size_t kWs = size_t(32) << 20;
  bool bf16_, tf32_;
  cublasLtHandle_t h_;
  void* ws_ = nullptr;
  cudaStream_t s_;
  cudaEvent_t e0_, e1_;
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--m") a.m = std::stoi(v);
    else if (k == "--n") a.n = std::stoi(v);
    else if (k == "--k") a.k = std::stoi(v);
    else if (k == "--precision") a.precision = v;
    else if (k == "--candidates") a.candidates = std::stoi(v);
    else if (k == "--reps") a.reps = std::stoi(v);
    else {
      std::fprintf(stderr, "bench-lt-epilogues: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "bench-lt-epilogues: no CUDA device visible\n");
    return 2;
  }
  const bool bf16 = a.precision == "bf16", tf32 = a.precision == "tf32";
  const size_t esz = bf16 ? 2 : 4;
  const int M = a.m, N = a.n, K = a.k;
  Lt lt(bf16, tf32);
  // Forward: D (M×N) = Wᵀ·X with W stored (K×M) (the row-major (out,in) weight), X (K×N).
  // Input gradient: D (M×N) = W·dZ with W (M×K), dZ (K×N). Weight gradient: D (M×K) = X·dZᵀ.
  Dev w(size_t(M) * K * esz), x(size_t(K) * N * esz), dz(size_t(K) * N * esz);
  Dev d(size_t(M) * N * 4), d2(size_t(M) * N * 4), bias(size_t(M) * 4), bgrad(size_t(M) * 4);
  Dev mask(size_t((M + 127) / 128 * 128) / 8 * N);
  const std::vector<float> hw = random(size_t(M) * K, 1, 1.f / std::sqrt(float(K)));
  const std::vector<float> hx = random(size_t(K) * N, 2, 1.f), hdz = random(size_t(K) * N, 3, 1.f);
  const std::vector<float> hb = random(size_t(M), 4, 0.5f);
  upload(w, hw, bf16);
  upload(x, hx, bf16);
  upload(dz, hdz, bf16);
  const Gemm fwd{"forward", true, false, M, N, K, K, K};
  const Gemm dgrad{"input_gradient", false, false, M, N, K, M, K};
  const Gemm wgrad{"weight_gradient", false, true, M, K, N, M, K};  // D (M×K) = Xm·dZᵀ
  const double flop = 2.0 * M * N * K;
  auto report = [&](const Gemm& g, const Epi& e, const std::vector<double>& ms) {
    if (ms.empty()) {
      std::printf("{\"gemm\": \"%s\", \"epilogue\": \"%s\", \"d_type\": \"%s\", \"candidates\": 0}\n",
                  g.name, e.name, e.d16 ? "bf16" : "fp32");
      return;
    }
    for (size_t c = 0; c < ms.size(); ++c)
      std::printf("{\"gemm\": \"%s\", \"epilogue\": \"%s\", \"d_type\": \"%s\", \"candidate\": %zu, "
                  "\"ms\": %.4f, \"tflops\": %.1f}\n",
                  g.name, e.name, e.d16 ? "bf16" : "fp32", c, ms[c], ms[c] > 0 ? flop / ms[c] / 1e9 : 0.0);
  };
  auto set_bias = [&](bool d16) { upload(bias, hb, d16); };
  std::vector<Epi> fwd_epis = {{"bias", CUBLASLT_EPILOGUE_BIAS, false},
                               {"relu_bias", CUBLASLT_EPILOGUE_RELU_BIAS, false},
                               {"relu_aux_bias", CUBLASLT_EPILOGUE_RELU_AUX_BIAS, false}};
  std::vector<Epi> bwd_epis = {{"default", CUBLASLT_EPILOGUE_DEFAULT, false},
                               {"drelu", CUBLASLT_EPILOGUE_DRELU, false},
                               {"drelu_bgrad", CUBLASLT_EPILOGUE_DRELU_BGRAD, false}};
  if (bf16) {
    for (size_t i = 0, n0 = fwd_epis.size(); i < n0; ++i) fwd_epis.push_back({fwd_epis[i].name, fwd_epis[i].epi, true});
    for (size_t i = 0, n0 = bwd_epis.size(); i < n0; ++i) bwd_epis.push_back({bwd_epis[i].name, bwd_epis[i].epi, true});
  }
  for (const Epi& e : fwd_epis) {
    set_bias(e.d16);
    const bool aux = e.epi == CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
    report(fwd, e, lt.go(fwd, e, w.p, x.p, d.p, bias.p, aux ? mask.p : nullptr, a.candidates, a.reps));
  }
  for (const Epi& e : bwd_epis) {
    const bool aux = e.epi != CUBLASLT_EPILOGUE_DEFAULT, bg = e.epi == CUBLASLT_EPILOGUE_DRELU_BGRAD;
    report(dgrad, e, lt.go(dgrad, e, w.p, dz.p, d.p, bg ? bgrad.p : nullptr, aux ? mask.p : nullptr,
                           a.candidates, a.reps));
  }
  {  // the weight gradient's A is a layer input of M features: (M×N)
    Dev xm(size_t(M) * N * esz), dw(size_t(M) * K * 4);
    upload(xm, random(size_t(M) * N, 7, 1.f), bf16);
    const Epi plain{"default", CUBLASLT_EPILOGUE_DEFAULT, false};
    report(wgrad, plain, lt.go(wgrad, plain, xm.p, dz.p, dw.p, nullptr, nullptr, a.candidates, a.reps));
  }

  // ---- the fused backward against the host ----
  // A mask from a forward product of the input gradient's shape: z = Wᵀ·X2 + b (M×N) with
  // X2 (M×N) random, W2 (M×M) — the plain fp32-output BIAS product gives z, RELU_AUX_BIAS the
  // mask. Then DRELU_BGRAD over that mask against the plain input gradient masked on the host.
  {
    Dev w2(size_t(M) * M * esz), x2(size_t(M) * N * esz);
    upload(w2, random(size_t(M) * M, 5, 1.f / std::sqrt(float(M))), bf16);
    upload(x2, random(size_t(M) * N, 6, 1.f), bf16);
    const Gemm f2{"forward", true, false, M, N, M, M, M};
    for (bool d16 : bf16 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      set_bias(false);
      const Epi plain_f{"bias", CUBLASLT_EPILOGUE_BIAS, false};
      if (lt.go(f2, plain_f, w2.p, x2.p, d2.p, bias.p, nullptr, 1, 1, 0).empty()) continue;
      const std::vector<float> z = download(d2, size_t(M) * N, false);
      set_bias(d16);
      const Epi fe{"relu_aux_bias", CUBLASLT_EPILOGUE_RELU_AUX_BIAS, d16};
      if (lt.go(f2, fe, w2.p, x2.p, d2.p, bias.p, mask.p, 1, 1, 0).empty()) continue;
      const Epi pd{"default", CUBLASLT_EPILOGUE_DEFAULT, false};
      lt.go(dgrad, pd, w.p, dz.p, d.p, nullptr, nullptr, 1, 1, 0);
      const std::vector<float> g = download(d, size_t(M) * N, false);
      const Epi fb{"drelu_bgrad", CUBLASLT_EPILOGUE_DRELU_BGRAD, d16};
      const std::vector<double> ran = lt.go(dgrad, fb, w.p, dz.p, d.p, bgrad.p, mask.p, 1, 1, 0);
      if (ran.empty() || ran[0] < 0) continue;
      const std::vector<float> dzf = download(d, size_t(M) * N, d16);
      const std::vector<float> bgf = download(bgrad, size_t(M), d16);
      // Where the host's mask (z > 0 in fp32; z from the fp32-output product, which may round
      // differently from the fused one only for |z| at the last bits) disagrees, count it apart.
      double err = 0, ref = 0, berr = 0, bref = 0, bref_unmasked_err = 0;
      size_t flips = 0;
      std::vector<double> col(size_t(M), 0.0), col_unmasked(size_t(M), 0.0);
      for (int j = 0; j < N; ++j)
        for (int i = 0; i < M; ++i) {
          const size_t e = size_t(j) * M + i;
          const double want = z[e] > 0.f ? g[e] : 0.0;
          col[size_t(i)] += want;
          col_unmasked[size_t(i)] += g[e];
          if ((dzf[e] != 0.f) != (want != 0.0) && std::fabs(z[e]) < 1e-2f) { ++flips; continue; }
          err += (dzf[e] - want) * (dzf[e] - want);
          ref += want * want;
        }
      for (int i = 0; i < M; ++i) {
        berr += (bgf[size_t(i)] - col[size_t(i)]) * (bgf[size_t(i)] - col[size_t(i)]);
        bref += col[size_t(i)] * col[size_t(i)];
        bref_unmasked_err += (bgf[size_t(i)] - col_unmasked[size_t(i)]) * (bgf[size_t(i)] - col_unmasked[size_t(i)]);
      }
      std::printf("{\"check\": \"drelu_bgrad\", \"precision\": \"%s\", \"d_type\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
                  "\"dz_rel_err\": %.3g, \"mask_flips_near_zero\": %zu, \"bgrad_rel_err\": %.3g, "
                  "\"bgrad_rel_err_if_unmasked\": %.3g}\n",
                  a.precision.c_str(), d16 ? "bf16" : "fp32", M, N, K, std::sqrt(err / std::max(ref, 1e-30)), flips,
                  std::sqrt(berr / std::max(bref, 1e-30)), std::sqrt(bref_unmasked_err / std::max(bref, 1e-30)));
    }
  }
  return 0;
}
