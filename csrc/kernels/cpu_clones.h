// NNTILE_CPU_CLONES: the CPU kernels' loops compiled for several x86 levels.
#pragma once

// A CPU kernel compiled for AVX-512 and AVX2 (x86-64-v4, -v3) beside the baseline, the best picked at load time
// (GCC's function multiversioning). `flatten` inlines every call inside it into each clone: target_clones alone
// clones only the function it marks, so loops in helpers it calls (AdamW's templated loops) were compiled once, for
// the baseline (SSE2), and every clone ran that (tests/test_build.py checks the clones' vector width now).
// setup.py's -ffp-contract=off keeps every clone from fusing a multiply-add that the others round twice: the same
// bits on every processor. (GCC contracts C++ by default even under -std=c++20: the x86-64-v3 clone, picked on an
// AVX2-only machine, gave AdamW bits other than torch's.) Defining NNTILE_CPU_CLONES empty (-DNNTILE_CPU_CLONES=)
// builds the baseline alone (benchmarks/cpu_adamw.py compares the two).
#ifndef NNTILE_CPU_CLONES
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define NNTILE_CPU_CLONES __attribute__((flatten, target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NNTILE_CPU_CLONES
#endif
#endif
