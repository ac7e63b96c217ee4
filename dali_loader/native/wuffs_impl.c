/* Wuffs' implementation for dali-loader's native core (build.py compiles this file,
 * not Wuffs' own, with WUFFS_IMPLEMENTATION), with its x86 CPU-feature probes asked
 * once per process.
 *
 * Why (issue 37): Wuffs picks its SIMD code paths at run time. Every probe
 * (`wuffs_base__cpu_arch__have_x86_sse42`, `_avx2`, `_bmi2`) executes CPUID, and the
 * probes run again for every decoder and hasher that is initialised: the PNG decoder,
 * its zlib, Deflate, CRC-32 and Adler-32 parts, and the CRC-32 hasher of png_core.cc's
 * chunk checks, so about a dozen CPUIDs per image. In a virtual machine CPUID is a trap
 * into the hypervisor: measured on this project's 2-core VM, the core took 0.126 ms per
 * 32x32 PNG with the probes on every decode (0.032 ms of it planning, two CRC-32
 * checks), about 2x TF's whole decode of the same file (benchmarks/bench_matrix.py,
 * docs/benchmarks.md "Small images"). A CPU's features do not change while a process
 * runs, so each answer is kept after the first probe.
 *
 * How: Wuffs' probe functions are renamed by a function-like macro that tells a
 * definition (`name(void)`) from a call (`name()`) by pasting its argument: the
 * definition becomes `dl_probe_x86_*(void)`, Wuffs' own code, unchanged; every call
 * becomes `dl_have_x86_*()`, which runs that probe once and keeps its answer. Nothing
 * of Wuffs' file is edited: a Wuffs whose probes are named otherwise fails to compile
 * here (build.py makes an implicit declaration and an unused function errors), never
 * silently probes on every call again.
 */

#include <stdbool.h>
#include <stdint.h>

static bool dl_have_x86_sse42(void);
static bool dl_have_x86_avx2(void);
static bool dl_have_x86_bmi2(void);

#define wuffs_base__cpu_arch__have_x86_sse42(v) DL_CPU_SSE42_##v
#define DL_CPU_SSE42_void dl_probe_x86_sse42(void)
#define DL_CPU_SSE42_ dl_have_x86_sse42()
#define wuffs_base__cpu_arch__have_x86_avx2(v) DL_CPU_AVX2_##v
#define DL_CPU_AVX2_void dl_probe_x86_avx2(void)
#define DL_CPU_AVX2_ dl_have_x86_avx2()
#define wuffs_base__cpu_arch__have_x86_bmi2(v) DL_CPU_BMI2_##v
#define DL_CPU_BMI2_void dl_probe_x86_bmi2(void)
#define DL_CPU_BMI2_ dl_have_x86_bmi2()

#include "wuffs-unsupported-snapshot.c"

/* The probes run so far (png_core.h's dl_png_get_counts). */
static uint64_t dl_probes_run = 0;

uint64_t dl_wuffs_cpu_probes(void) {
  return __atomic_load_n(&dl_probes_run, __ATOMIC_RELAXED);
}

/* -1: not probed yet; else the probe's answer. Threads that race on the first call
 * each probe and store the same answer. */
#define DL_CACHED_PROBE(name)                                         \
  static int dl_##name##_answer = -1;                                 \
  static bool dl_have_##name(void) {                                  \
    int v = __atomic_load_n(&dl_##name##_answer, __ATOMIC_RELAXED);   \
    if (v < 0) {                                                      \
      v = dl_probe_##name() ? 1 : 0;                                  \
      __atomic_add_fetch(&dl_probes_run, 1, __ATOMIC_RELAXED);        \
      __atomic_store_n(&dl_##name##_answer, v, __ATOMIC_RELAXED);     \
    }                                                                 \
    return v != 0;                                                    \
  }

DL_CACHED_PROBE(x86_sse42)
DL_CACHED_PROBE(x86_avx2)
DL_CACHED_PROBE(x86_bmi2)
