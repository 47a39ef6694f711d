"""Implementations timed beside the built-in methods (`--impl`): which points a plug-in's claims
cover, the configuration and code each result names, its caches inside the model
(`PNMixHFCache(impl=)`), and the suites run end to end at the tiny scale with a third party's
plug-in (`reports/tests/thirdparty.py`)."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.efficiency import harness, plugins
from benchmarks.efficiency.architectures import tiny_architecture
from benchmarks.efficiency.workloads import SCALES, fig6_memory, fig6c_throughput, fig7_latency, kernel_decode
from reference import PNMixConfig
from reference.contract import Capabilities, variant
from reference.contract.implementation import make as make_reference
from reference.methods import METHODS, kivi_preset
from reference.records import code_files, implementation_targets
from reference.tokens.config import TokenPrecisionConfig

ROOT = Path(__file__).resolve().parents[2]
THIRD_PARTY = "reports.tests.thirdparty"
ARCH = tiny_architecture()
#: The tiny kernel point: a 40-token prompt, then one append of 260 tokens.
TINY_POINT = {"device": "cpu", "dtype": torch.float16, "head_dim": 64, "sizes": (40, 260)}


# -- which points a plug-in's claims cover --------------------------------------------------------


def test_a_plugin_that_claims_the_point_runs_it_whatever_its_conformance_bounds():
    # max_tokens and max_head_dim bound the shapes the conformance suite draws, not what runs here
    caps = Capabilities(max_tokens=8, max_head_dim=4)
    assert plugins.unclaimed(caps, PNMixConfig(), **TINY_POINT) == []


@pytest.mark.parametrize(
    "claims, missing",
    [
        ({"devices": ("cuda",)}, "device cpu"),
        ({"dtypes": (torch.bfloat16,)}, "dtype float16"),
        ({"head_dims": (128,)}, "head_dim 64"),
        ({"group_sizes": (32, 64)}, "group size 128"),
        ({"key_bits": frozenset({(2, 2)})}, "key bits (b_high, b_low) = (3, 1)"),
        ({"value_bits": frozenset({4, 16})}, "value bits 2"),
        ({"scale_dtypes": (torch.float32,)}, "scale dtype float16"),
        ({"pair_layouts": ("adjacent",)}, "pair layout 'split'"),
        ({"sinks": False}, "sinks (n_sink 32)"),
        ({"token_multiple": 8}, "prefill/append sizes [260] (token_multiple 8)"),
        ({"channel_precision": False, "token_precision": frozenset({"channels"})}, "per-token precision caches"),
    ],
)
def test_each_claim_a_point_needs_is_named_when_missing(claims, missing):
    found = plugins.unclaimed(Capabilities(**claims), PNMixConfig(), **TINY_POINT)
    assert len(found) == 1 and missing in found[0], found


def test_scales_in_the_input_dtype_run_any_configured_scale_dtype():
    caps = Capabilities(scale_dtypes=("input",))
    assert plugins.unclaimed(caps, PNMixConfig(scale_dtype=torch.float32), **TINY_POINT) == []


def test_a_plugin_runs_pnmix_configuration_mapped_by_its_preset_and_claimed_residual():
    base = METHODS[plugins.BASE_METHOD]()
    plain = plugins.Plugin("a", make_reference(), "a")
    claims = {"preset": kivi_preset, "residual": "sliding_values"}
    kivi = plugins.Plugin("b", variant(make_reference(), "b", Capabilities(**claims)), "b")
    shared = plugins.Plugin("c", variant(make_reference(), "c", Capabilities(preset=kivi_preset)), "c")
    assert plain.config == base
    assert kivi.config == kivi_preset(base) and kivi.config.value_residual == "sliding"
    # the preset's sliding value window, held as the residual the implementation claims
    assert shared.config == dataclasses.replace(kivi_preset(base), value_residual="shared")


def test_the_implementations_named_are_those_of_impl_else_of_the_environment():
    env = {"PNMIX_IMPL": "x, y,,x"}
    assert plugins.requested(["a", "b", "a"], env) == ["a", "b"]
    assert plugins.requested([], env) == ["x", "y"]
    assert plugins.requested([], {}) == []


def test_every_method_a_suite_runs_names_the_code_that_runs_it():
    from conformance import loader

    benchmarked = {
        w.method
        for f in (fig6_memory, fig6c_throughput, fig7_latency, kernel_decode)
        for s in SCALES.values()
        for w in f(s)
    }
    assert benchmarked <= set(plugins.BUILTIN_IMPLEMENTATIONS) == set(METHODS)
    registered = loader.builtins()
    for method, name in plugins.BUILTIN_IMPLEMENTATIONS.items():
        assert (name in registered) == (method != harness.FP16), (method, name)
    assert plugins.describe(harness.FP16, None)["implementation"] == plugins.FP16_IMPLEMENTATION


def test_the_code_of_a_point_is_the_implementations_and_the_harness():
    suite = "benchmarks.suites.test_kernels"
    harness_code = (*plugins.HARNESS_MODULES, suite)
    assert plugins.code_targets("FP16", suite, kernel=True, plugin=None) == harness_code
    assert plugins.code_targets("PN-Mix", suite, kernel=True, plugin=None) == ("pnmix.kernels", *harness_code)
    model_level = plugins.code_targets("Kitty", suite, kernel=False, plugin=None)
    assert model_level == (*implementation_targets("pnmix.protocol"), *harness_code)
    third = plugins.load([f"{THIRD_PARTY}:make"])[f"{THIRD_PARTY}:make"]
    kernel, model = (plugins.code_targets(third.name, suite, kernel=k, plugin=third) for k in (True, False))
    files = {p.name for p in code_files(*kernel)}
    # its own module, and the module of the class it builds on
    assert {"thirdparty.py", "template.py", "harness.py", "test_kernels.py"} <= files
    assert "pnmix.hf" in model and "pnmix.hf" not in kernel


def test_a_plugin_is_described_by_its_name_version_and_origin():
    name = f"{THIRD_PARTY}:make"
    described = plugins.describe(name, plugins.load([name])[name])
    assert described == {
        "implementation": "thirdparty-kivi",  # its own name, as its conformance results name it
        "implementation_version": "0.1.0",
        "implementation_origin": name,
        "implementation_given": name,
    }
    triton = plugins.describe("PN-Mix", None)
    assert triton["implementation"] == "triton" and triton["implementation_origin"].startswith("triton = pnmix.")


def test_a_name_that_does_not_load_is_the_loaders_error():
    with pytest.raises(ValueError, match="unknown implementation 'no-such-impl'"):
        plugins.load(["no-such-impl"])


# -- a plug-in's caches inside the model -------------------------------------------------------

SMALL = PNMixConfig(group_size=8, residual_length=8, n_sink=4)


@pytest.fixture(scope="module")
def model():
    return harness.build_model(ARCH, torch.device("cpu"), harness.MODEL_DTYPE)


def greedy(model, cache, steps: int = 12) -> torch.Tensor:
    from pnmix.hf import cache_argument

    ids = torch.randint(0, ARCH.vocab, (1, 30), generator=torch.Generator().manual_seed(3))
    out = []
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(input_ids=ids, use_cache=True, **{cache_argument(model): cache}).logits[:, -1]
            out.append(logits.float())
            ids = logits.argmax(-1, keepdim=True)
    return torch.stack(out)


def test_an_implementations_caches_run_the_model_through_the_protocol(model):
    from pnmix.hf import IMPL_BACKEND, PNMixHFCache

    model.set_attn_implementation(harness.pnmix_attention())
    spec = PNMixHFCache(model.config, SMALL, backend="reference")
    through = PNMixHFCache(model.config, SMALL, impl=make_reference())
    # the same cache code, reached by create/prefill/append/attend alone: the same logits, bit for bit
    assert torch.equal(greedy(model, spec), greedy(model, through))
    assert {layer.backend for layer in through.layers} == {IMPL_BACKEND}
    assert through.get_seq_length() == 30 + 11 and through.layers[0].cache.length == 41


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_cache_len": 64}, "max_cache_len cannot be used with impl='reference': no preallocation"),
        ({"check_finite": False}, "check_finite=False cannot be used with impl='reference'"),
        ({"backend": "triton"}, "backend='triton' cannot be used with impl='reference'"),
        ({"config": TokenPrecisionConfig()}, "a TokenPrecisionConfig cannot be used with impl='reference'"),
    ],
)
def test_what_needs_more_than_the_protocol_is_refused_naming_it(model, kwargs, message):
    from pnmix.hf import PNMixHFCache

    kwargs = {"config": SMALL, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        PNMixHFCache(model.config, impl=make_reference(), **kwargs)
    with pytest.raises(TypeError, match="impl must be an implementation with create"):
        PNMixHFCache(model.config, SMALL, impl=object())


def test_protocol_attention_refuses_another_scaling_or_softcapping():
    from pnmix.hf import _check_protocol_attention

    impl = make_reference()
    _check_protocol_attention(impl, 64, 64**-0.5, None)
    with pytest.raises(ValueError, match=r"scaling=0\.1: attend"):
        _check_protocol_attention(impl, 64, 0.1, None)
    with pytest.raises(ValueError, match=r"softcap=30\.0"):
        _check_protocol_attention(impl, 64, 64**-0.5, 30.0)


class Faulty:
    """The reference implementation whose caches raise in `attend` or `append` when told to; with
    optional=False they have the required protocol alone (no checkpoints, no stepwise attention)."""

    name, fail = "faulty", None
    OPTIONAL = ("checkpoint", "roll_back", "release", "attend_stepwise")

    def __init__(self, optional: bool = False) -> None:
        self.optional = optional

    def create(self, config):
        cache, owner = make_reference().create(config), self

        class Cache:
            def __getattr__(self, item):
                if item == owner.fail:
                    raise RuntimeError(f"injected failure in {item}")
                if item in owner.OPTIONAL and not owner.optional:
                    raise AttributeError(item)
                return getattr(cache, item)

        return Cache()


def test_a_failed_forward_that_stored_tokens_stops_the_cache_until_reset(model):
    from pnmix.hf import PNMixHFCache

    model.set_attn_implementation(harness.pnmix_attention())
    impl = Faulty()
    cache = PNMixHFCache(model.config, SMALL, impl=impl)
    greedy(model, cache, steps=2)
    impl.fail = "append"  # fails before storing anything: the forward is rolled back
    with pytest.raises(RuntimeError, match="injected failure in append"):
        greedy(model, cache, steps=1)
    impl.fail = None
    greedy(model, cache, steps=1)  # the cache goes on
    impl.fail = "attend"  # the first layer stored its token, then its attention failed
    with pytest.raises(RuntimeError, match="injected failure in attend"):
        greedy(model, cache, steps=1)
    impl.fail = None
    with pytest.raises(RuntimeError, match=r"its caches have no checkpoints .* to roll it back: call reset\(\)"):
        greedy(model, cache, steps=1)
    cache.reset()
    assert greedy(model, cache, steps=2).isfinite().all()


def test_a_failed_forward_is_rolled_back_where_the_caches_have_checkpoints(model):
    from pnmix.hf import PNMixHFCache

    model.set_attn_implementation(harness.pnmix_attention())
    impl = Faulty(optional=True)
    cache = PNMixHFCache(model.config, SMALL, impl=impl)
    greedy(model, cache, steps=2)
    held = cache.get_seq_length()
    impl.fail = "attend"  # the first layer stored its token, then its attention failed: rolled back
    with pytest.raises(RuntimeError, match="injected failure in attend"):
        greedy(model, cache, steps=1)
    assert cache.get_seq_length() == held and {layer.cache.length for layer in cache.layers} == {held}
    impl.fail = None
    assert greedy(model, cache, steps=1).isfinite().all()  # no reset needed


# -- the suites, end to end at the tiny scale ---------------------------------------------------

SUITES = (
    "benchmarks/suites/test_kernels.py::test_decode_attention_bandwidth",
    "benchmarks/suites/test_fig7_latency.py",
    "benchmarks/suites/test_fig6c_throughput.py",
)


def run_suites(*args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pytest", *SUITES, "--bench-scale", "tiny", "-p", "no:cacheprovider", "-q", "-rs"]
    return subprocess.run([*argv, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_a_plugin_is_timed_beside_the_builtins_and_skipped_where_it_claims_less(tmp_path):
    make, cuda, bf16 = (f"{THIRD_PARTY}:{f}" for f in ("make", "make_cuda_only", "make_bfloat16_only"))
    out = tmp_path / "bench.json"
    proc = run_suites("--impl", make, "--impl", cuda, "--impl", bf16, "--benchmark-json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    infos = [b["extra_info"] for b in json.loads(out.read_text())["benchmarks"]]
    by = {(i["suite"], i["method"]): i for i in infos if i.get("step", 10) == 10}
    # rows name a plug-in by its own name, as its conformance results do; the import path is what was given
    names = {make: "thirdparty-kivi", cuda: "thirdparty-kivi-cuda", bf16: "thirdparty-kivi-bf16"}
    for suite in ("kernel", "fig7-latency", "fig6c-throughput"):
        mine, pnmix = by[suite, names[make]], by[suite, "PN-Mix"]
        coordinates = ("device", "model", "batch", "prompt", "context", "generation", "samples")
        assert all(mine.get(k) == pnmix.get(k) for k in coordinates)  # the same workload, beside PN-Mix
        assert mine["implementation"] == names[make] and mine["implementation_version"] == "0.1.0"
        assert mine["implementation_given"] == make and mine["implementation_origin"] == make
        assert pnmix["implementation"] == "triton"
        # which kernel decoded the Triton cache: the spec's order, the Triton kernel, off a GPU; a plug-in: its own
        assert pnmix["code_order"] == "spec" and mine["code_order"] is None
        assert any(f.endswith("reports/tests/thirdparty.py") for f in mine["code"]["files"])
        assert mine["code"]["digest"] != pnmix["code"]["digest"]
        # PN-Mix's configuration by its KIVI preset: uniform keys at PN-Mix's low bits
        assert mine["method_config"] == harness.config_record(plugins.load([make])[make].config)
        assert mine["method_config"]["b_high"] == mine["method_config"]["b_low"] == pnmix["method_config"]["b_low"]
        assert mine["check_finite"] is None
        assert by[suite, "FP16"]["implementation"] == plugins.FP16_IMPLEMENTATION
    kernel, bf16_name = by["kernel", names[make]], names[bf16]
    assert kernel["bytes_from"] == "the cache's storage()" and kernel["gbps"] > 0
    assert by["fig7-latency", names[make]]["step_ms"] > 0 and by["fig6c-throughput", names[make]]["tokens_per_s"] > 0
    # bfloat16 only: the model's points run (its dtype), the kernel point (float16) skips
    assert ("kernel", bf16_name) not in by and ("fig7-latency", bf16_name) in by
    assert all(i["method"] not in (cuda, names[cuda]) and i["implementation"] != make for i in infos)
    reasons = re.findall(r"SKIPPED \[(\d+)\] \S+ (\S+) does not claim what this point needs: (.*)", proc.stdout)
    # cuda only: every tiny point (one kernel, two Fig. 7, one Fig. 6c) skips on the CPU
    assert sorted(reasons) == [("1", bf16, "dtype float16"), ("4", cuda, "device cpu")], proc.stdout[-3000:]


@pytest.mark.slow
def test_an_implementation_that_does_not_load_stops_the_run_before_any_benchmark():
    proc = run_suites("--impl", f"{THIRD_PARTY}:no_such_factory")
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    assert errors == [
        f"ERROR: '{THIRD_PARTY}' has no attribute 'no_such_factory' (implementation '{THIRD_PARTY}:no_such_factory')"
    ], proc.stderr
    assert "passed" not in proc.stdout and "benchmark" not in proc.stdout.lower()
