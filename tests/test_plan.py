"""`plan.resolve`: every combination the docs list, and every refusal, with no GPU.

The environment is injected (`Environment` of values): a machine with or
without GPUs, with or without the native decoders, the DALI TF plugin, a local,
network or remote source, with or without JPEGs. A fact a test does not give
raises when read, so these tests also pin which facts a combination reads.
"""

from __future__ import annotations

import re
import sys
import pathlib
import subprocess

import pytest

from dali_loader.plan import (
    RULES,
    BigPngs,
    Check,
    DaliInput,
    Device,
    Engine,
    EntryDecoder,
    Environment,
    Graph,
    Handoff,
    ItemReader,
    Options,
    Output,
    PngBinding,
    PngDecoder,
    PngWhere,
    ReadyForm,
    check,
    resolve,
)
from dali_loader.storage.source import SourceKind

LOCAL, FUSE, URL = SourceKind.LOCAL_DISK, SourceKind.NETWORK_FS, SourceKind.REMOTE
# The machines: every native decoder built, none built, and GPUs.
BUILT = dict(tf_png_op=True, dali_png_op=True, dali_entry_gpu_op=True, wuffs=True, png_core=True,
             dali_tf_plugin=True)
BARE = dict(tf_png_op=False, dali_png_op=False, dali_entry_gpu_op=False, wuffs=False,
            png_core=False, dali_tf_plugin=False)
CPU = dict(tf_gpus=0, dali_gpus=0, cores=4)
GPU = dict(tf_gpus=1, dali_gpus=2, cores=16)


def env(machine=CPU, built=BUILT, kind=LOCAL, jpegs=False, pngs=True, files=1000,
        **over) -> Environment:
    return Environment(**{**machine, **built, "source_kind": kind, "has_jpegs": jpegs,
                          "has_pngs": pngs, "files": files, **over})


def plan(env_=None, **options):
    return resolve(Options(**options), env_ if env_ is not None else env())


class Ctx:
    """What tf.distribute's InputContext holds."""

    def __init__(self, pipeline: int, pipelines: int):
        self.input_pipeline_id, self.num_input_pipelines = pipeline, pipelines


# -- what runs ------------------------------------------------------------------------

# (options, environment, expected fields): docs/options.md, docs/png_cpu.md, docs/architecture.md
RUNS = [
    # The CPU default: TF's kernels, the native core's TF op where built, else libpng.
    ({}, env(), dict(engine=Engine.TF_KERNELS, device=Device.CPU, item_reader=ItemReader.PATHS,
                     png_epoch=PngDecoder.WUFFS, png_where=PngWhere.TF_OP, handoff=None,
                     dali_input=None, cache_form=None, png_fill=None, graph=Graph.FUSED,
                     decode_calls=8, png_binding=None, big_pngs=None,
                     checks=(Check.PIXEL_LIMIT, Check.AUDIT, Check.CARDINALITY))),
    # The graph: fused unless its pads (to a whole last batch) are over a quarter of the
    # files: 1000 files in 32s (24 pads), 64 in 32s (none), 48 (16 pads), 100 (28 pads).
    (dict(batch_size=32), env(files=64), dict(graph=Graph.FUSED)),
    (dict(batch_size=32), env(files=48), dict(graph=Graph.PER_FILE)),
    (dict(batch_size=32), env(files=100), dict(graph=Graph.PER_FILE)),
    (dict(batch_size=32), env(files=0), dict(graph=Graph.PER_FILE)),
    (dict(batch_size=None), env(files=512), dict(graph=Graph.FUSED)),  # 32s of single images
    (dict(batch_size=256), env(files=512), dict(graph=Graph.FUSED)),  # issue 37's tiny cells
    (dict(batch_size=256), env(files=16), dict(graph=Graph.PER_FILE)),
    # Sharded: this pipeline's files (2 of 4 batches of 32 here, one of them the last).
    (dict(batch_size=32, input_context=Ctx(1, 2), seed=1), env(files=100),
     dict(graph=Graph.PER_FILE)),
    (dict(batch_size=32, input_context=Ctx(0, 2), seed=1), env(files=100),
     dict(graph=Graph.FUSED)),
    (dict(num_threads=3), env(), dict(decode_calls=3)),
    (dict(gpu_ready=True), env(), dict(graph=None, decode_calls=4,
                                       png_binding=PngBinding.NATIVE_CORE)),
    (dict(gpu_ready="raw"), env(built=dict(BUILT, png_core=False)),
     dict(png_binding=PngBinding.PYWUFFS)),
    ({}, env(built=BARE), dict(png_epoch=PngDecoder.LIBPNG, png_where=PngWhere.TF)),
    ({}, env(kind=FUSE), dict(item_reader=ItemReader.RAW_BYTES)),
    ({}, env(kind=URL), dict(item_reader=ItemReader.PINNED_OR_BYTES)),
    (dict(png_decoder="libpng"), env(), dict(png_epoch=PngDecoder.LIBPNG, png_where=PngWhere.TF)),
    (dict(png_decoder="wuffs"), env(), dict(png_epoch=PngDecoder.WUFFS, png_where=PngWhere.TF_OP)),
    (dict(decoder="tf"), env(), dict(engine=Engine.TF_KERNELS)),
    # No file named .png: no PNG decoder's branch in the graph (issue 29).
    ({}, env(jpegs=True, pngs=False), dict(png_epoch=PngDecoder.LIBPNG, png_where=PngWhere.TF)),
    (dict(png_decoder="wuffs"), env(jpegs=True, pngs=False), dict(png_where=PngWhere.TF)),
    (dict(decoder="dali"), env(jpegs=True, pngs=False), dict(png_where=PngWhere.DALI)),
    (dict(decoder="dali", png_decoder="wuffs"), env(pngs=False), dict(png_where=PngWhere.FEED)),
    # decoder="tf" forces TF's kernels: on a GPU machine too, on its CPU (docs/options.md).
    (dict(decoder="tf"), env(GPU), dict(engine=Engine.TF_KERNELS, device=Device.CPU,
                                        handoff=None, png_where=PngWhere.TF_OP)),
    (dict(device="cpu"), env(GPU), dict(engine=Engine.TF_KERNELS, device=Device.CPU)),
    (dict(on_error="skip"), env(), dict(checks=(Check.PIXEL_LIMIT, Check.AUDIT))),
    (dict(max_pixels=None), env(), dict(checks=(Check.AUDIT, Check.CARDINALITY))),
    # DALI on the CPU (decoder="dali"): the native DALI operator where built.
    (dict(decoder="dali"), env(), dict(
        engine=Engine.DALI, device=Device.CPU, item_reader=ItemReader.CHECKED_BYTES,
        dali_input=DaliInput.FILES, png_epoch=PngDecoder.WUFFS, png_where=PngWhere.DALI_OP,
        big_pngs=BigPngs.TF_BEFORE_DALI, graph=None, decode_calls=4, png_binding=None,
        handoff=Handoff.GENERATOR, checks=(Check.PIXEL_LIMIT, Check.BYTES, Check.CARDINALITY))),
    (dict(decoder="dali"), env(built=BARE), dict(png_epoch=PngDecoder.LIBPNG,
                                                 png_where=PngWhere.DALI)),
    (dict(decoder="dali"), env(jpegs=True), dict(png_where=PngWhere.DALI_OP)),  # CPU: op stays
    (dict(decoder="dali", png_decoder="libpng"), env(), dict(png_where=PngWhere.DALI)),
    (dict(decoder="dali", png_decoder="wuffs"), env(), dict(
        png_epoch=PngDecoder.WUFFS, png_where=PngWhere.FEED, dali_input=DaliInput.FILES_OR_RAW,
        item_reader=ItemReader.RAW_OR_CHECKED,
        checks=(Check.PIXEL_LIMIT, Check.BYTES, Check.FEED_DECODE, Check.CARDINALITY))),
    (dict(decoder="dali", handoff="plugin"), env(), dict(handoff=Handoff.PLUGIN)),
    (dict(decoder="dali", handoff="generator"), env(), dict(handoff=Handoff.GENERATOR)),
    # A GPU (TF and DALI both see one): DALI, the host-placed plugin.
    ({}, env(GPU), dict(engine=Engine.DALI, device=Device.GPU, handoff=Handoff.PLUGIN,
                        png_where=PngWhere.DALI_OP, dali_input=DaliInput.FILES,
                        big_pngs=BigPngs.DALI)),
    ({}, env(GPU, jpegs=True), dict(png_epoch=PngDecoder.LIBPNG, png_where=PngWhere.DALI)),
    (dict(png_decoder="wuffs"), env(GPU), dict(png_where=PngWhere.FEED,
                                               dali_input=DaliInput.FILES_OR_RAW,
                                               png_binding=PngBinding.NATIVE_CORE)),
    (dict(png_decoder="wuffs"), env(GPU, jpegs=True), dict(
        png_where=PngWhere.DALI, dali_input=DaliInput.FILES,
        item_reader=ItemReader.CHECKED_BYTES)),
    (dict(device="gpu"), env(GPU), dict(device=Device.GPU, device_id=0)),
    (dict(input_context=Ctx(3, 4), seed=1), env(GPU), dict(shard=(3, 4), device_id=1)),
    (dict(input_context=Ctx(3, 4), seed=1), env(), dict(shard=(3, 4), device_id=0)),
    (dict(on_error="skip"), env(GPU), dict(handoff=Handoff.GENERATOR)),
    (dict(on_error="skip", gpu_ready=True), env(GPU), dict(handoff=Handoff.PLUGIN)),
    (dict(batch_size=None), env(GPU), dict(handoff=Handoff.GENERATOR)),
    (dict(handoff="plugin-gpu"), env(GPU), dict(handoff=Handoff.PLUGIN_GPU)),
    ({}, env(GPU, dali_tf_plugin=False), dict(handoff=Handoff.GENERATOR)),
    # Only DALI sees a GPU (TF's CPU build): the CPU.
    ({}, env(dict(CPU, dali_gpus=1)), dict(engine=Engine.TF_KERNELS, device=Device.CPU)),
    ({}, env(dict(CPU, tf_gpus=1)), dict(engine=Engine.TF_KERNELS, device=Device.CPU)),
    # The GPU-ready cache: compact entries on every path (the native op decodes them),
    # raw ones when asked; fills by Wuffs: in the TF op on the TF path with compact
    # entries, on the feed's threads elsewhere.
    (dict(gpu_ready=True), env(), dict(
        engine=Engine.TF_KERNELS, cache_form=ReadyForm.COMPACT, item_reader=ItemReader.READY_PINNED,
        png_epoch=None, png_where=PngWhere.NONE, png_fill=PngDecoder.WUFFS,
        fill_where=PngWhere.TF_OP,
        checks=(Check.PIXEL_LIMIT, Check.FEED_DECODE, Check.CARDINALITY))),
    (dict(gpu_ready="compact"), env(), dict(cache_form=ReadyForm.COMPACT)),
    (dict(gpu_ready="raw"), env(), dict(cache_form=ReadyForm.RAW,
                                        item_reader=ItemReader.READY_PINNED,
                                        fill_where=PngWhere.FEED)),
    (dict(gpu_ready="raw"), env(built=BARE), dict(cache_form=ReadyForm.RAW,
                                                  png_fill=PngDecoder.LIBPNG)),
    (dict(gpu_ready=False), env(), dict(cache_form=None, png_fill=None, fill_where=None)),
    (dict(gpu_ready=True, png_decoder="libpng"), env(), dict(png_fill=PngDecoder.LIBPNG,
                                                             fill_where=PngWhere.FEED)),
    (dict(gpu_ready=True, decoder="dali"), env(), dict(
        item_reader=ItemReader.READY_BYTES, dali_input=DaliInput.READY_COMPACT,
        png_where=PngWhere.NONE, fill_where=PngWhere.FEED)),
    (dict(gpu_ready="raw", decoder="dali"), env(), dict(
        item_reader=ItemReader.READY_BYTES, dali_input=DaliInput.READY_RAW)),
    (dict(gpu_ready=True), env(GPU), dict(dali_input=DaliInput.READY_COMPACT,
                                          handoff=Handoff.PLUGIN,
                                          entry_decode=EntryDecoder.CPU)),
    # The compact entries' GPU decode: only when asked (never run in this project).
    (dict(gpu_ready=True, entry_decoder="gpu"), env(GPU), dict(
        entry_decode=EntryDecoder.GPU, dali_input=DaliInput.READY_COMPACT_GPU,
        item_reader=ItemReader.READY_BYTES, handoff=Handoff.PLUGIN)),
    (dict(gpu_ready=True, entry_decoder="cpu"), env(GPU), dict(
        entry_decode=EntryDecoder.CPU, dali_input=DaliInput.READY_COMPACT)),
    (dict(gpu_ready="raw", entry_decoder="cpu"), env(GPU), dict(entry_decode=None)),
    (dict(gpu_ready=True), env(), dict(entry_decode=EntryDecoder.CPU)),
    ({}, env(), dict(entry_decode=None)),
    # tf.data service: TF's kernels on its CPU workers, TF's libpng.
    (dict(service="grpc://localhost:5050"), env(GPU), dict(
        engine=Engine.SERVICE, device=Device.CPU, item_reader=ItemReader.WORKERS,
        png_epoch=PngDecoder.LIBPNG, png_where=PngWhere.TF, handoff=None,
        service_address=("localhost", 5050))),
    (dict(service="grpc://[::1]:1", png_decoder="libpng", decoder="tf", device="cpu"), env(),
     dict(engine=Engine.SERVICE, service_address=("::1", 1))),
    # Numpy batches (api.open_loader): DALI, TF not asked.
    (dict(output=Output.NUMPY), env(), dict(engine=Engine.DALI, handoff=None,
                                            checks=(Check.PIXEL_LIMIT, Check.BYTES))),
]


@pytest.mark.parametrize("options, environment, expected", RUNS,
                         ids=[f"{i}:{o}" for i, (o, _, _) in enumerate(RUNS)])
def test_what_runs(options, environment, expected):
    got = plan(environment, **options)
    assert {k: getattr(got, k) for k in expected} == expected
    assert set(got.why) >= {"engine", "device", "png_where", "item_reader", "checks"}


def test_a_missing_decoder_is_said_once_in_the_notes():
    assert any("TF op is not available" in n for n in plan(env(built=BARE)).notes)
    assert any("Wuffs" in n for n in plan(env(built=BARE), gpu_ready="raw").notes)
    assert any("plugin" in n for n in plan(env(GPU, dali_tf_plugin=False)).notes)
    assert plan().notes == ()


def test_the_why_names_the_deciding_option():
    p = plan(env(GPU, jpegs=True))
    assert "JPEGs" in p.why["png_where"] and "TF and DALI see a GPU" in p.why["device"]
    assert plan(device="cpu").why["device"] == 'device="cpu"'
    assert "not built" in plan(env(built=BARE)).why["png_where"]
    text = p.format()
    assert "engine" in text and "dali-op" not in text and "plugin" in text


# -- which facts a combination reads --------------------------------------------------


def test_the_cpu_default_probes_no_gpu_and_no_dali():
    """device="cpu": no GPU is probed; the TF path reads only the TF op and the source's
    kind and PNGs."""
    p = resolve(Options(device="cpu"), Environment(tf_png_op=True, source_kind=LOCAL,
                                                   has_pngs=True, files=9, cores=2))
    assert p.engine is Engine.TF_KERNELS and p.png_where is PngWhere.TF_OP


def test_device_none_asks_tf_first_and_dali_only_when_tf_sees_a_gpu():
    e = Environment(tf_gpus=0, tf_png_op=False, source_kind=LOCAL, has_pngs=True, files=9,
                    cores=2)  # no dali_gpus
    assert resolve(Options(), e).device is Device.CPU
    assert e.read() == {"tf_gpus": 0, "tf_png_op": False, "cores": 2, "source_kind": LOCAL,
                        "files": 9, "has_pngs": True}


def test_numpy_batches_never_ask_tensorflow():
    e = Environment(dali_gpus=0, dali_png_op=True, source_kind=LOCAL, has_jpegs=False,
                    has_pngs=True, files=9, cores=2)
    assert resolve(Options(output=Output.NUMPY), e).device is Device.CPU


def test_jpegs_are_only_looked_for_on_a_gpu():
    e = env()
    resolve(Options(decoder="dali"), e)
    assert "has_jpegs" not in e.read()


def test_service_probes_nothing_of_the_machine():
    e = Environment(source_kind=LOCAL)
    assert resolve(Options(service="grpc://h:1"), e).engine is Engine.SERVICE


def test_check_refuses_before_the_source_is_listed():
    """`check` reads no source fact: the refusals come before listing."""
    check(Options(decoder="dali", png_decoder="wuffs"), Environment(**CPU, **BUILT))
    with pytest.raises(ValueError, match="Received"):
        check(Options(decoder="tf", device="gpu"), Environment(**GPU, **BUILT))
    source = [r for r in RULES if r.source]  # the source's rules come last
    assert list(RULES[-len(source):]) == source


def test_an_unknown_fact_or_a_missing_one_is_an_error():
    with pytest.raises(TypeError, match="gpus"):
        Environment(gpus=1)
    with pytest.raises(LookupError, match="dali_gpus"):
        resolve(Options(device="gpu"), Environment(tf_gpus=1))


def test_a_fact_is_probed_once():
    calls = []
    e = Environment(tf_gpus=lambda: calls.append(1) or 0, tf_png_op=True, source_kind=LOCAL,
                    has_pngs=True, files=9, cores=2)
    resolve(Options(), e)
    resolve(Options(), e)
    assert calls == [1]
    assert e.with_source(FUSE, ()).tf_gpus == 0 and calls == [1]


# -- every refusal --------------------------------------------------------------------

# (options, environment, exception, what the message says)
REFUSALS = [
    (dict(on_error="ignore"), env(), ValueError, "on_error=ignore"),
    (dict(num_threads=0), env(), ValueError, "num_threads=0"),
    (dict(num_threads=True), env(), ValueError, "num_threads=True"),
    (dict(max_in_flight=0), env(), ValueError, "max_in_flight=0"),
    (dict(cache_max_bytes=0), env(), ValueError, "cache_max_bytes=0"),
    (dict(max_pixels=0), env(), ValueError, "max_pixels=0"),
    (dict(max_pixels=True), env(), ValueError, "max_pixels=True"),
    (dict(manifest="always"), env(), ValueError, "manifest='always'"),
    (dict(device="tpu"), env(), ValueError, "device=tpu"),
    (dict(decoder="pil"), env(), ValueError, "decoder=pil"),
    (dict(png_decoder="spng"), env(), ValueError, "png_decoder='spng'"),
    (dict(gpu_ready="jpeg"), env(), ValueError, "gpu_ready='jpeg'"),
    (dict(gpu_ready=1), env(), ValueError, "gpu_ready=1"),
    (dict(handoff="pipe"), env(), ValueError, "handoff='pipe'"),
    (dict(input_context=object()), env(), ValueError, "input_context=<object"),
    (dict(input_context=Ctx(2, 2)), env(), ValueError, "Invalid input pipeline 2 of 2"),
    (dict(input_context=Ctx(0, 2)), env(), ValueError, "seed=None, input_context="),
    (dict(service="localhost:5050"), env(), ValueError, "service='localhost:5050'"),
    (dict(service="grpc://h:0"), env(), ValueError, "service='grpc://h:0'"),
    (dict(service="grpc://h:1", decoder="dali"), env(), ValueError, "decoder='dali'"),
    (dict(service="grpc://h:1", device="gpu"), env(), ValueError, "device='gpu'"),
    (dict(service="grpc://h:1", handoff="generator"), env(), ValueError, "handoff='generator'"),
    (dict(service="grpc://h:1", gpu_ready=True), env(), ValueError, "gpu_ready=True"),
    (dict(service="grpc://h:1", input_context=Ctx(0, 1)), env(), ValueError, "input_context="),
    (dict(service="grpc://h:1", png_decoder="wuffs"), env(), ValueError, "png_decoder='wuffs'"),
    (dict(device="gpu"), env(), ValueError, "TensorFlow sees no GPU"),
    (dict(device="gpu"), env(dict(tf_gpus=1, dali_gpus=0)), ValueError, "DALI sees no CUDA GPU"),
    (dict(device="gpu", output=Output.NUMPY), env(dict(dali_gpus=0)), ValueError,
     "DALI sees no CUDA GPU"),
    (dict(decoder="tf", device="gpu"), env(GPU), ValueError, "decoder='tf', device='gpu'"),
    (dict(gpu_ready="tiff"), env(), ValueError, "Use gpu_ready=True. Received: gpu_ready='tiff'"),
    # The batched GPU PNG decoder left the package (issue 39; docs/png_gpu.md).
    (dict(png_decoder="gpu"), env(GPU), ValueError, "experimental/png_gpu"),
    (dict(png_decoder="wuffs"), env(built=BARE), ImportError, "build_tf"),
    (dict(png_decoder="wuffs", decoder="dali"), env(built=BARE), ImportError, "pywuffs"),
    (dict(png_decoder="wuffs", gpu_ready="raw"), env(built=BARE), ImportError, "pywuffs"),
    (dict(gpu_ready=True), env(built=BARE), ImportError, "native.build_tf"),
    (dict(gpu_ready=True, decoder="dali"), env(built=BARE), ImportError, "build_dali"),
    (dict(entry_decoder="nvcomp"), env(), ValueError, "entry_decoder='nvcomp'"),
    (dict(entry_decoder="gpu"), env(GPU), ValueError, "entry_decoder='gpu', gpu_ready=None"),
    (dict(entry_decoder="gpu", gpu_ready="raw"), env(GPU), ValueError, "gpu_ready='raw'"),
    (dict(entry_decoder="gpu", gpu_ready=True), env(), ValueError,
     "entry_decoder='gpu', device='cpu'"),
    (dict(entry_decoder="gpu", gpu_ready=True), env(GPU, dali_entry_gpu_op=False), ImportError,
     "build_gpu"),
    (dict(handoff="plugin", decoder="dali", batch_size=None), env(), ValueError,
     "handoff='plugin', batch_size=None"),
    (dict(handoff="plugin-gpu", decoder="dali"), env(), ValueError,
     "handoff='plugin-gpu', device='cpu'"),
    (dict(handoff="plugin"), env(), ValueError, "handoff='plugin', device='cpu', decoder=None"),
]


@pytest.mark.parametrize("options, environment, error, says", REFUSALS,
                         ids=[f"{i}:{o}" for i, (o, _, _, _) in enumerate(REFUSALS)])
def test_every_refusal_says_what_it_received(options, environment, error, says):
    with pytest.raises(error) as raised:
        plan(environment, **options)
    message = str(raised.value)
    assert "Received:" in message and says in message, message
    # ...and before the source is listed: the same refusal from `check`.
    facts = {k: v for k, v in environment._given.items() if k not in Environment.SOURCE_FACTS}
    with pytest.raises(error, match=re.escape(says)):
        check(Options(**options), Environment(**facts))


def test_every_rule_that_refuses_is_exercised():
    """Each rule whose function raises has a refusal above (found in its traceback)."""
    import inspect

    refusing = {r.decide.__code__ for r in RULES if "raise " in inspect.getsource(r.decide)}
    hit = set()
    for options, environment, error, _ in REFUSALS:
        with pytest.raises(error) as raised:
            resolve(Options(**options), environment)
        tb = raised.value.__traceback__
        while tb is not None:
            hit.add(tb.tb_frame.f_code)
            tb = tb.tb_next
    assert not refusing - hit, sorted(c.co_name for c in refusing - hit)


# -- the docs and the module --------------------------------------------------------

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_every_documented_option_is_an_option():
    table = (REPO / "docs" / "options.md").read_text().split("## The dataset's handle")[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    loader_options = {f for f in Options.__dataclass_fields__} - {
        "batch_size", "shuffle", "seed", "output"}
    assert documented - {"cache_dir"} == loader_options


def test_the_plan_module_imports_neither_tensorflow_nor_dali():
    code = ("import sys, dali_loader.plan as p, dali_loader.probes;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'nvidia', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert out.strip() == "[]"
