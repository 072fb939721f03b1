// DPT_SIMD: the CPU backend's loops are the step's other cost beside the GEMMs; each is
// compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time, so one binary runs
// everywhere and vectorises where it can.
#pragma once
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DPT_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DPT_SIMD
#endif
