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

import os
import shutil
import statistics
import sys
import tempfile

import harness


def make_tree(root: str, n: int) -> None:
    """`n` photo-like 500x375 PNGs in 4 class folders."""
    for i, png in enumerate(harness.photo_pngs(n, filters=(0, 1, 2, 3, 4))):
        path = os.path.join(root, f"class_{i % 4}", f"img_{i:04d}.png")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(png)


def child(kind: str, root: str, size: int, epochs: int) -> dict:
    import keras

    from tf_adapter import image_dataset_from_directory as ours

    kw = dict(image_size=(size, size), batch_size=32, seed=0, verbose=False)
    ds = (keras.utils.image_dataset_from_directory(root, **kw) if kind == "keras"
          else ours(root, **kw))

    cpu, faults, mem = [], [], []
    for _ in range(epochs):
        e = harness.epoch(ds)
        cpu.append(e.cpu_ms)
        faults.append(e.faults_per_image)
        mem.append(harness.rss_bytes() / 2**20)
    return {"cpu": cpu[1:], "faults": faults[1:], "rss": mem}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        harness.write_json(argv[5], child(argv[1], argv[2], int(argv[3]), int(argv[4])))
        return 0
    ap = harness.parser(__doc__, num_images=256, epochs=25)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args(argv)
    if args.epochs < 7:
        ap.error(f"--epochs must be at least 7 (RSS growth is from epoch 5). Received: {args.epochs}")
    harness.banner(__file__, argv)
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
            r = harness.run_child([os.path.abspath(__file__), "--child", kind, root,
                                   str(args.size), str(args.epochs)], env, base=base,
                                  quiet=True)
            print(f"{name:<14} {min(r['cpu']):15.3f} {statistics.median(r['cpu']):7.3f} "
                  f"{statistics.median(r['faults']):10.1f} {r['rss'][-1] - r['rss'][5]:13.1f}",
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
