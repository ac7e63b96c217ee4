// The native PNG core alone, without Python: CPU time per image, one thread, best of 7 rounds.
// Input: records as fuzz_driver.cc reads them (uint32 LE length + bytes), e.g. photos written
// by `benchmarks/bench_png_core.py --write-records PATH`. Build against the core's objects:
//   python -m dali_loader.native.build
//   g++ -O3 -Idali_loader/native benchmarks/bench_png_core_c.cc \
//       dali_loader/native/_build/obj/{wuffs,png_core}.o -o /tmp/bench_png_core_c
//   /tmp/bench_png_core_c photos.rec [label]
#include <stdio.h>
#include <time.h>

#include <vector>

#include "png_core.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s RECORDS [label]\n", argv[0]);
    return 2;
  }
  FILE* f = fopen(argv[1], "rb");
  if (f == nullptr) return 2;
  std::vector<std::vector<uint8_t>> files;
  unsigned char l[4];
  while (fread(l, 1, 4, f) == 4) {
    const uint32_t n = l[0] | l[1] << 8 | l[2] << 16 | static_cast<uint32_t>(l[3]) << 24;
    std::vector<uint8_t> d(n);
    if (fread(d.data(), 1, n, f) != n) return 2;
    files.push_back(std::move(d));
  }
  std::vector<uint8_t> out;
  double best = 1e9;
  for (int r = 0; r < 7; r++) {
    timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    for (auto& d : files) {
      dl_png_plan p;
      const char* why = nullptr;
      if (dl_png_plan_decode(d.data(), d.size(), 3, 0, &p, &why) != DL_PNG_OK) {
        printf("fallback: %s\n", why);
        return 1;
      }
      if (out.size() < dl_png_output_size(&p)) out.resize(dl_png_output_size(&p));
      if (dl_png_decode_into(d.data(), d.size(), &p, out.data(), out.size(), &why) != DL_PNG_OK) {
        printf("fallback: %s\n", why);
        return 1;
      }
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    const double ms = ((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6) / files.size();
    if (ms < best) best = ms;
  }
  printf("%s: %zu images, best of 7 rounds %.3f ms per image\n", argc > 2 ? argv[2] : "core",
         files.size(), best);
  return 0;
}
