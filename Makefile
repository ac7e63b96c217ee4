# The two commands for a newcomer: `make demo` and `make test`.
# Both install what they need into .venv on a fresh machine.
PY ?= python3.11
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The native PNG core and its TF op and DALI operator: rebuilt when their sources change.
NATIVE := dali_loader/native
NATIVE_BUILD := $(NATIVE)/_build
NATIVE_LIBS := $(NATIVE_BUILD)/libdlpng.so $(NATIVE_BUILD)/dl_tf_png.so $(NATIVE_BUILD)/dl_dali_png.so
TF_VERSION ?= 2.21.0
DALI_VERSION ?= 2.4.0
# With an NVIDIA driver present, TF's CUDA wheels come along; otherwise the CPU build.
TF_PKG ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 'tensorflow[and-cuda]' || echo tensorflow)
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install test test-tf-floor test-fast lint fuse-lib demo gpu-check-png gpu-check-compact gpu-check-compact-core gpu-check-tf bench clean

install: $(STAMP) $(NATIVE_LIBS) $(NATIVE_BUILD)/.gpu-build-tried

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	# 1. TensorFlow first: the DALI TF plugin is compiled against it.
	$(VPY) -m pip install -q "$(TF_PKG)==$(TF_VERSION)" "nvidia-dali-cuda120==$(DALI_VERSION)"
	# 2. The plugin (an sdist, about a minute of g++), against the installed TF.
	$(VPY) -m pip install -q --no-build-isolation "nvidia-dali-tf-plugin-cuda120==$(DALI_VERSION)"
	# 3. The project, editable, with its test and benchmark extras and the fast PNG
	#    decoder (pywuffs: an sdist, about a minute of g++).
	$(VPY) -m pip install -q -e ".[test,bench,png]"
	touch $(STAMP)

# 4. The native core: PNG (Wuffs' C from the pywuffs sdist + png_core.cc) and the compact
#    cache entries (zstd's amalgamation from the zstandard sdist + entry_core.cc), ~30 s of g++.
$(NATIVE_BUILD)/libdlpng.so: $(STAMP) $(NATIVE)/png_core.cc $(NATIVE)/png_core.h $(NATIVE)/wuffs_impl.c $(NATIVE)/entry_core.cc $(NATIVE)/entry_core.h $(NATIVE)/build.py
	$(VPY) -m dali_loader.native.build
	touch $@

# 5. The core as a TF op, against the installed TF (about 15 s of g++).
$(NATIVE_BUILD)/dl_tf_png.so: $(NATIVE_BUILD)/libdlpng.so $(NATIVE)/tf_png_op.cc $(NATIVE)/entry_core.h $(NATIVE)/build_tf.py
	$(VPY) -m dali_loader.native.build_tf
	touch $@

# 6. The core as a DALI CPU operator (about 5 s of g++). DALI's headers include CUDA's:
#    their include folders come from three pinned NVIDIA wheels (pip download, kept
#    under _build/; nothing installed, no CUDA toolkit).
$(NATIVE_BUILD)/dl_dali_png.so: $(NATIVE_BUILD)/libdlpng.so $(NATIVE)/dali_png_op.cc $(NATIVE)/entry_core.h $(NATIVE)/build_dali.py
	$(VPY) -m dali_loader.native.build_dali
	touch $@

# 7. The compact entries' GPU decode (nvCOMP + a kernel) and its DALI GPU operator, where
#    nvcc and nvCOMP's headers are (about 20 s of nvcc); skipped, said once, where not, and
#    a failed compile is a warning (it is opt-in: install never fails over it).
#    Never run here (no GPU): entry_decoder="gpu" asks for it (docs/gpu_ready.md).
$(NATIVE_BUILD)/.gpu-build-tried: $(NATIVE_BUILD)/libdlpng.so $(NATIVE)/entry_gpu.cu $(NATIVE)/entry_gpu.h $(NATIVE)/dali_entry_gpu_op.cu $(NATIVE)/entry_core.h $(NATIVE)/build_gpu.py
	$(VPY) -m dali_loader.native.build_gpu --if-possible
	touch $@

test: install fuse-lib lint
	$(VPY) -m pytest -q -ra --durations=25
	$(MAKE) test-tf-floor

# The TF-path tests on the oldest TF pyproject.toml names (`tensorflow>=2.16`; issue 39), after
# the main suite on $(TF_VERSION). A venv of its own: TF's CPU wheel, the loader's dependencies
# (read from pyproject.toml) and pytest; no DALI (its tests skip or are deselected). The TF op
# is built against that TF into _build/tf-$(TF_FLOOR)/ (about 15 s of g++; the loader takes the
# build matching the running TF, decode/tf_png.py). Then the TF path's tests, the TF-path
# cases of test_iterations, and the GPU-ready cache's TF-path cases (the compact path runs
# on the same internals; FLOOR_DESELECT: the cases that compare with DALI's operator or run
# the prefetch tool, which need DALI). About 3 minutes (docs/development.md, "Older TensorFlow").
TF_FLOOR ?= 2.16.2
FLOOR_VENV := .venv-tf$(subst .,,$(basename $(TF_FLOOR)))
FLOOR_PY := $(FLOOR_VENV)/bin/python
FLOOR_OP := $(NATIVE_BUILD)/tf-$(TF_FLOOR)/dl_tf_png.so
FLOOR_TESTS := tests/test_tf_path.py tests/test_tf_internals.py tests/test_iterations.py \
	tests/test_gpu_ready.py
FLOOR_DESELECT := not dali and not entries_hold_keras_pixels and not shared_by_later

$(FLOOR_VENV)/.installed: pyproject.toml Makefile
	$(PY) -m venv $(FLOOR_VENV)
	$(FLOOR_PY) -m pip install -q --upgrade pip
	$(FLOOR_PY) -m pip install -q "tensorflow-cpu==$(TF_FLOOR)" "pytest>=8" "pytest-timeout>=2.3" \
		"pillow>=10" $$($(FLOOR_PY) -c "import tomllib; print(' '.join(\
		tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))")
	touch $@

$(FLOOR_OP): $(FLOOR_VENV)/.installed $(NATIVE_BUILD)/libdlpng.so $(NATIVE)/tf_png_op.cc $(NATIVE)/entry_core.h $(NATIVE)/build_tf.py
	$(FLOOR_PY) -m dali_loader.native.build_tf --per-version
	touch $@

test-tf-floor: $(FLOOR_OP)
	$(FLOOR_PY) -c 'import tensorflow as tf; assert tf.__version__ == "$(TF_FLOOR)", tf.__version__'
	$(FLOOR_PY) -m pytest -q -ra -p no:cacheprovider $(FLOOR_TESTS) -k "$(FLOOR_DESELECT)"

# ruff over the whole repository (pyproject.toml's [tool.ruff]: the rules, and why some are not
# selected), then mypy over the TF-free core (its [tool.mypy]: the files, and each exception
# with its reason); `make test` runs both first.
lint: $(STAMP)
	$(VPY) -m ruff check .
	$(VPY) -m mypy

# libfuse2 for tests/test_fuse.py's FUSE mount (fusepy needs it): installed when root and
# missing (CI runs as root in a fresh clone); otherwise those tests skip, saying so.
fuse-lib:
	@if [ -e /dev/fuse ] && ! ldconfig -p 2>/dev/null | grep -q 'libfuse\.so\.2' \
		&& [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q libfuse2 >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libfuse2 >/dev/null 2>&1) || \
		echo "libfuse2 could not be installed: the FUSE tests will skip"; fi

demo: install
	$(VPY) benchmarks/demo.py

# The seed pipeline, this loader (TF kernels; DALI on the CPU) and the decode-only bound, on
# 600 sample PNGs written into out/bench-data the first time (docs/benchmarks.md).
bench: install
	$(VPY) -m dali_loader.tools.cli bench out/bench-data --sample 600 --rounds 3 \
		--only seed loader-cpu loader-dali decode-bound --out out/bench

# The batched GPU PNG decoder's check (experimental/png_gpu_check/README.md; an experiment
# outside the package): prepares the nvCOMP wheels and the data here, then runs the check
# where a GPU and Python 3.12 are, or else prints the device tool's call.
gpu-check-png: install
	$(VPY) experimental/png_gpu_check/prepare.py
	@GPU_PY312='import sys, numpy, numba, cupy; sys.exit(sys.version_info[:2] != (3, 12))'; \
	if nvidia-smi -L >/dev/null 2>&1 && python3 -c "$$GPU_PY312" 2>/dev/null; then bash experimental/png_gpu_check/run_on_device.sh; \
	else echo "No GPU with Python 3.12, numba-cuda and CuPy here. The device tool's call (run):"; $(VPY) experimental/png_gpu_check/prepare.py --print-device-call; fi

# The compact entries' GPU decode check (device_checks/compact_gpu_check/README.md): the nvCOMP
# wheels of the PNG check, prepared here, and the core; then the device tool's call is printed.
gpu-check-compact: install
	$(VPY) experimental/png_gpu_check/prepare.py
	@echo 'run(command="bash device_checks/compact_gpu_check/run_on_device.sh", carry=["build/png_gpu_check", "dali_loader/native/_build/libdlpng.so"], timeout_s=330)'

# The loader's own GPU decode of compact entries, alone (no DALI on the device machine):
# libdlentry_gpu.so and nvCOMP's libnvcomp.so.5 to carry (device_checks/compact_gpu_check).
gpu-check-compact-core: install
	$(VPY) -m dali_loader.native.build_gpu
	mkdir -p build/entry_gpu_check
	cp $$($(VPY) -c 'import nvidia.libnvcomp, os; print(os.path.join(os.path.dirname(nvidia.libnvcomp.__file__), "lib64", "libnvcomp.so.5"))') build/entry_gpu_check/
	@echo 'run(command="bash device_checks/compact_gpu_check/run_on_device.sh --core", carry=["build/entry_gpu_check", "dali_loader/native/_build/libdlpng.so", "dali_loader/native/_build/libdlentry_gpu.so"], timeout_s=330)'

# The TF + DALI GPU check: GPU tests, local and gs:// benchmarks on the GPU path.
gpu-check-tf: install
	bash device_checks/gpu_check.sh

clean:
	rm -rf $(VENV) .venv-tf* build *.egg-info
