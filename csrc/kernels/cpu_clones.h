// NNTILE_CPU_CLONES: the CPU kernels' loops compiled for several x86 levels.
#pragma once

// A CPU kernel loop compiled for AVX-512 and AVX2 (x86-64-v4, -v3) beside the baseline, the best picked at load
// time (GCC's function multiversioning). setup.py's -ffp-contract=off keeps every clone from fusing a multiply-add
// that the others round twice: the same bits on every processor. (GCC contracts C++ by default even under
// -std=c++20: the x86-64-v3 clone, picked on an AVX2-only machine, gave AdamW bits other than torch's.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define NNTILE_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NNTILE_CPU_CLONES
#endif
