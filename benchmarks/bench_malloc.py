"""Page faults and CPU per image of the CPU default, with and without the loader's
malloc setting (dali_loader.malloc.keep_read_buffers), beside Keras.

TF's `from_generator` fixes glibc's thresholds at 128 KB; TF's ReadFile then maps and
unmaps a 1 MiB buffer for every file. Each loader runs in a fresh process over the same
photo-like 500x375 PNGs for several epochs: CPU ms per image (best and median of the
epochs after the first), page faults per image (median), and RSS growth from epoch 5 to
the last. "before" is the loader with `MALLOC_MMAP_THRESHOLD_=131072` in its
environment: a threshold the user set wins, so the loader leaves glibc as TF set it.

    .venv/bin/python benchmarks/bench_malloc.py                 # 256 images, 25 epochs
    .venv/bin/python benchmarks/bench_malloc.py --epochs 8      # a quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def make_tree(root: str, n: int) -> None:
    import numpy as np

    from dali_loader.testing.pngs import encode_png, photo

    rng = np.random.default_rng(0)
    for i in range(n):
        path = os.path.join(root, f"class_{i % 4}", f"img_{i:04d}.png")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(encode_png(photo(rng, 375, 500)))


def child(kind: str, root: str, size: int, epochs: int) -> dict:
    import keras

    from tf_adapter import image_dataset_from_directory as ours

    kw = dict(image_size=(size, size), batch_size=32, seed=0, verbose=False)
    ds = (keras.utils.image_dataset_from_directory(root, **kw) if kind == "keras"
          else ours(root, **kw))

    def rss() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    cpu, faults, mem = [], [], []
    for _ in range(epochs):
        t, f = os.times(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        n = sum(int(x.shape[0]) for x, _ in ds)
        u = os.times()
        cpu.append(1e3 * (u.user + u.system - t.user - t.system) / n)
        faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f) / n)
        mem.append(rss())
    return {"cpu": cpu[1:], "faults": faults[1:], "rss": mem}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print("RESULT", json.dumps(child(argv[1], argv[2], int(argv[3]), int(argv[4]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-images", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=25)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args(argv)
    if args.epochs < 7:
        ap.error(f"--epochs must be at least 7 (RSS growth is from epoch 5). Received: {args.epochs}")
    print("$", " ".join([os.path.relpath(sys.executable, ROOT), os.path.relpath(__file__, ROOT)] + argv))
    print(f"cores: {len(os.sched_getaffinity(0))}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    root = tempfile.mkdtemp(prefix="dali-malloc-")
    try:
        make_tree(root, args.num_images)
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
        runs = (("keras", "keras", {}), ("ours, before", "ours", {"MALLOC_MMAP_THRESHOLD_": "131072"}),
                ("ours", "ours", {}))
        print(f"{args.num_images} photo-like 500x375 PNGs to {args.size}x{args.size}, batch 32, "
              f"{args.epochs} epochs, a fresh process each")
        print(f"{'loader':<14} {'CPU ms/img best':>15} {'median':>7} {'faults/img':>10} {'RSS growth MB':>13}")
        for name, kind, env in runs:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, root,
                                  str(args.size), str(args.epochs)], capture_output=True, text=True,
                                 check=True, cwd=ROOT, env={**base, **env})
            r = json.loads(next(ln for ln in out.stdout.splitlines()
                                if ln.startswith("RESULT"))[len("RESULT "):])
            print(f"{name:<14} {min(r['cpu']):15.3f} {statistics.median(r['cpu']):7.3f} "
                  f"{statistics.median(r['faults']):10.1f} {r['rss'][-1] - r['rss'][5]:13.1f}",
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
