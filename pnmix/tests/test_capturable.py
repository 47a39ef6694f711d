"""`PNMixCache(capturable=True)`: a one-token decode step launches the same device work with the
same arguments whatever the length, a residual page's completion included (predicated on the
device counts), so one captured step replays across page completions. On the CPU the step's
launches and aten ops are recorded (`pnmix.tests.counting`) and compared step by step, and the
run is compared bit for bit with eager decoding; the CUDA test captures and replays it."""

from __future__ import annotations

import pytest
import torch

from pnmix import PNMixCache, _runtime
from pnmix.tests.counting import counting
from reference import PNMixConfig
from reference.methods import METHODS

pytestmark = pytest.mark.interpreter if _runtime.INTERPRETED else pytest.mark.gpu
DEV = _runtime.kernel_device()
N = 8
CONFIGS = {
    "PN-Mix": PNMixConfig(group_size=N, residual_length=N, n_sink=3),
    "KIVI-2 shared": METHODS["KIVI-2"](group_size=N, residual_length=N, n_sink=3, value_residual="shared"),
}
PROMPT, CAPACITY = 13, 3 + 5 * N  # (3 sinks, one page, 2 residual); room for four more pages
STEPS = 3 * N + 2  # three page completions, at steps 5, 13 and 21


def data(seed, t, heads=2):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, t, 16, generator=gen) * 2).half().to(DEV)


def prefilled(config, **kwargs):
    return PNMixCache.from_prefill(
        data(0, PROMPT, 4),
        data(1, PROMPT),
        data(2, PROMPT),
        config,
        max_cache_len=CAPACITY,
        check_finite=False,
        **kwargs,
    )


def step_inputs(i):
    return data(100 + i, 1), data(200 + i, 1), data(300 + i, 1, heads=4)


def held_storages(cache, *inputs) -> dict[int, str]:
    """Storage address -> name of everything that lives across steps (what a graph bakes in)."""
    held = {"counts": cache._counts, "bits": cache._page.bits, "index": cache._page.index, "delta": cache._page.delta}
    held |= {name: r.data for name, r in cache._rows.items()} | dict(cache._fixed)
    held |= {f"scratch {name}": t for name, t in cache._page.scratch.items()}
    held |= {f"input {i}": t for i, t in enumerate(inputs)}
    return {t.untyped_storage().data_ptr(): name for name, t in held.items()}


def named(entry, held: dict[int, str]):
    """A recorded launch or op with held tensors named and the step's temporaries anonymous."""
    if isinstance(entry, tuple) and entry[:1] == ("tensor",):
        return ("tensor", held.get(entry[1], "temporary"), *entry[2:])
    if isinstance(entry, tuple):
        return tuple(named(e, held) for e in entry)
    return entry


@pytest.mark.parametrize("method", list(CONFIGS))
def test_every_step_launches_the_same_work_and_decodes_like_eager_appends(monkeypatch, method):
    config = CONFIGS[method]
    eager, static = prefilled(config), prefilled(config, capturable=True)
    static_k, static_v, static_q = step_inputs(0)
    held = held_storages(static, static_k, static_v, static_q)
    sequences, completed = [], 0
    for i in range(STEPS):
        k, v, q = step_inputs(i)
        eager.append(k, v)
        expected = eager.attend(q)
        static_k.copy_(k), static_v.copy_(v), static_q.copy_(q)
        before = static.layout.n_quantized
        with counting(monkeypatch) as step:
            static.append(static_k, static_v)
            out = static.attend(static_q)
        completed += static.layout.n_quantized > before
        assert not step.syncs, step.syncs
        sequences.append([named(entry, held) for entry in step.sequence])
        assert torch.equal(out, expected), f"step {i}"
        assert static.layout == eager.layout and torch.equal(static._counts, eager._counts), f"step {i}"
    assert completed == 3
    kernels = [entry[0] for entry in sequences[0]]
    print(f"{method}: {len(kernels)} launches and ops a step: {kernels}")
    assert {"_append_rows_kernel", "_group_params_kernel", "_encode_pack_kernel", "_split_kernel"} <= set(kernels)
    for i, sequence in enumerate(sequences):
        assert sequence == sequences[0], f"step {i} launched other work or arguments than step 0"
    for name, tensor in eager.packed().items():
        assert torch.equal(static.packed()[name], tensor), name
    for mine, theirs in zip(static.dequantize(), eager.dequantize(), strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("method", list(CONFIGS))
def test_replays_that_leave_the_host_behind_are_caught_up_by_sync_length(method):
    # What a CUDA-graph replay does, on any device: the step's device work runs again and the host
    # learns nothing, here by putting its mirrors back after each eager step.
    config = CONFIGS[method]
    eager, replayed = prefilled(config), prefilled(config, capturable=True)
    static_k, static_v, static_q = step_inputs(0)
    host = (replayed.length, {name: r.used for name, r in replayed._rows.items()})
    for i in range(2 * N):  # two page completions
        k, v, q = step_inputs(i)
        eager.append(k, v)
        expected = eager.attend(q)
        static_k.copy_(k), static_v.copy_(v), static_q.copy_(q)
        replayed.append(static_k, static_v)
        out = replayed.attend(static_q)
        replayed.length = host[0]
        for name, used in host[1].items():
            replayed._rows[name].used = used
        assert torch.equal(out, expected), f"replay {i}"
    assert replayed.length == PROMPT
    assert replayed.sync_length() == eager.length == PROMPT + 2 * N
    assert replayed.layout == eager.layout
    for name, tensor in eager.packed().items():
        assert torch.equal(replayed.packed()[name], tensor), name
    assert replayed.storage() == eager.storage()
    full = prefilled(config, capturable=True)
    for i in range(CAPACITY - PROMPT):
        full.append(*step_inputs(i)[:2])
    with pytest.raises(ValueError, match="past its capacity"):
        full.append(*step_inputs(0)[:2])
    full._counts[2] += 1  # as if a captured step were replayed once more
    with pytest.raises(RuntimeError, match="replayed past the capacity"):
        full.sync_length()


def test_capturable_needs_a_preallocated_cache_and_a_device_side_page():
    with pytest.raises(ValueError, match="capturable=True needs max_cache_len"):
        PNMixCache(CONFIGS["PN-Mix"], capturable=True)
    with pytest.raises(TypeError, match="capturable must be a bool"):
        PNMixCache(CONFIGS["PN-Mix"], max_cache_len=64, capturable=1)
    for name in ("Kitty", "KIVI-2"):  # per-page selection on the host; a sliding value window
        with pytest.raises(ValueError, match="selection fixed at prefill"):
            PNMixCache(METHODS[name](), max_cache_len=64, capturable=True)


@pytest.mark.skipif(_runtime.INTERPRETED, reason="CUDA graphs need CUDA and compiled kernels (no TRITON_INTERPRET)")
@pytest.mark.parametrize("check_finite", [True, False])
@pytest.mark.parametrize("method", list(CONFIGS))
def test_one_captured_step_replays_across_page_completions(method, check_finite):
    config = CONFIGS[method]
    eager = prefilled(config)
    graphed = PNMixCache.from_prefill(
        data(0, PROMPT, 4),
        data(1, PROMPT),
        data(2, PROMPT),
        config,
        max_cache_len=CAPACITY,
        check_finite=check_finite,
        capturable=True,
    )
    static_k, static_v, static_q = step_inputs(0)
    eager.append(static_k, static_v)
    eager.attend(static_q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles the kernels), one real step
        graphed.append(static_k, static_v)
        graphed.attend(static_q)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed.append(static_k, static_v)
        static_out = graphed.attend(static_q)
    assert graphed.sync_length() == PROMPT + 1 == eager.length  # capture ran no kernel
    for i in range(1, STEPS):
        k, v, q = step_inputs(i)
        eager.append(k, v)
        expected = eager.attend(q)
        static_k.copy_(k), static_v.copy_(v), static_q.copy_(q)
        graph.replay()
        assert torch.equal(static_out, expected), f"replay {i}"
    assert graphed.sync_length() == eager.length == PROMPT + STEPS
    for name, tensor in eager.packed().items():
        assert torch.equal(graphed.packed()[name], tensor), name


@torch.no_grad()
def test_the_hf_cache_generates_the_same_tokens_and_bytes_when_capturable(tiny_qwen3):
    from pnmix.hf import PNMixHFCache, cache_argument

    config, model = CONFIGS["PN-Mix"], tiny_qwen3
    ids = torch.randint(0, 512, (1, PROMPT), generator=torch.Generator().manual_seed(0)).to(DEV)
    caches, outputs = {}, {}
    for capturable in (False, True):
        caches[capturable] = PNMixHFCache(
            model.config, config, backend="triton", max_cache_len=CAPACITY, capturable=capturable
        )
        outputs[capturable] = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=2 * N + 1,
            min_new_tokens=2 * N + 1,
            do_sample=False,
            **{cache_argument(model): caches[capturable]},
        )
    assert torch.equal(outputs[True], outputs[False])
    for eager, static in zip(caches[False].layers, caches[True].layers, strict=True):
        assert static.cache.capturable and static.cache.layout == eager.cache.layout
        assert static.cache.layout.n_quantized == 3 * N  # two pages completed while generating
        for name, tensor in eager.cache.packed().items():
            assert torch.equal(static.cache.packed()[name], tensor), name
    with pytest.raises(ValueError, match="capturable needs backend='triton'"):
        PNMixHFCache(model.config, config, backend="reference", capturable=True)
    with pytest.raises(ValueError, match="capturable=True needs max_cache_len"):
        PNMixHFCache(model.config, config, backend="triton", capturable=True)
    with pytest.raises(ValueError, match="selection fixed at prefill"):
        PNMixHFCache(model.config, METHODS["Kitty"](), backend="triton", max_cache_len=64, capturable=True)
