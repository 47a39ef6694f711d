"""The cache-layout plan: every token in exactly one place, plans compose, the table is the storage."""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference import (
    COMPONENTS,
    SELECTIONS,
    CacheLayout,
    PNMixConfig,
    ReferenceCache,
    StorageReport,
    measure,
    methods,
    storage_model,
    token_layout,
)
from reference.equations import packing


@st.composite
def configs(draw) -> PNMixConfig:
    group = draw(st.sampled_from([8, 16]))
    selection = draw(st.sampled_from(sorted(SELECTIONS)))
    b_low = draw(st.sampled_from([1, 2]))
    b_high = b_low if selection == "none" else draw(st.sampled_from([b_low, 3, 4]))
    return PNMixConfig(
        b_high=b_high,
        b_low=b_low,
        ratio=draw(st.sampled_from([0.0, 0.25, 0.5])),
        group_size=group,
        residual_length=group * draw(st.integers(1, 3)),
        n_sink=draw(st.integers(0, 20)),
        value_bits=draw(st.sampled_from([2, 4, 16])),
        selection=selection,
        value_residual=draw(st.sampled_from(["shared", "sliding"])),
    )


splits = st.lists(st.integers(0, 70), min_size=1, max_size=8)


def _place(layout: CacheLayout, parts: list[int]) -> tuple[dict[int, tuple[str, str]], list]:
    """Carry out the plans of appending `parts` tokens in turn; where each position's key and value went."""
    keys: dict[int, str] = {}
    values: dict[int, str] = {}
    length, residual, value_residual, plans = 0, [], [], []
    for n in parts:
        plan = layout.plan(length, n)
        plans.append(plan)
        new = list(range(length, length + n))
        for pos in new[: plan.to_sink]:
            keys[pos] = values[pos] = "sink"
        queue, value_queue = residual + new[plan.to_sink :], value_residual + new[plan.to_sink :]
        assert list(plan.flushed_positions()) == queue[: plan.flush]
        for pos in queue[: plan.flush]:
            keys[pos] = "quantized"
        for pos in value_queue[: plan.value_flush]:
            values[pos] = "quantized"
        residual, value_residual = queue[plan.flush :], value_queue[plan.value_flush :]
        length += n
    for pos in residual:
        keys[pos] = "residual"
    for pos in value_residual:
        values[pos] = "residual"
    return {pos: (keys[pos], values[pos]) for pos in keys}, plans


@given(configs(), splits)
def test_every_token_is_in_exactly_one_place(config, parts):
    layout = CacheLayout(config, 1, 1, 16)
    where, plans = _place(layout, parts)
    length = sum(parts)
    assert sorted(where) == list(range(length))
    t = token_layout(config, length)
    for side, n_q, n_res in ((0, t.n_quantized, t.n_residual), (1, t.n_value_quantized, t.n_value_residual)):
        placed = [where[p][side] for p in range(length)]
        assert placed == ["sink"] * t.n_sink + ["quantized"] * n_q + ["residual"] * n_res
    window = min(length - t.n_sink, config.residual_length)
    assert t.n_value_residual == (window if config.value_residual == "sliding" else t.n_residual)
    for plan in plans:
        assert plan.after == token_layout(config, plan.after.length)
        assert plan.flush % config.residual_length == 0
        if config.value_residual == "shared":
            assert plan.value_flush == plan.flush


@given(configs(), splits)
def test_the_plan_of_any_split_equals_the_plan_of_one_append(config, parts):
    layout = CacheLayout(config, 1, 1, 16)
    whole = layout.plan(parts[0], sum(parts[1:]))
    split = _place(layout, parts)[1][1:]
    if split:
        assert split[-1].after == whole.after
        assert sum(p.to_sink for p in split) == whole.to_sink
        flushed = [pos for p in split for pos in p.flushed_positions()]
        assert flushed == list(whole.flushed_positions())
        sinks = [pos for p in split for pos in p.sink_positions()]
        assert sinks == list(whole.sink_positions())


def test_the_table_has_one_component_per_storage_field():
    for name in sorted(SELECTIONS):
        cfg = methods.kivi(2) if name == "none" else PNMixConfig(selection=name)
        names = [c.name for c in CacheLayout(cfg, 1, 1, 128).components]
        assert tuple(names) == COMPONENTS == tuple(f.name for f in dataclasses.fields(StorageReport))


@given(configs(), st.integers(0, 200), st.sampled_from([None, 0, 37]))
def test_allocated_tensors_have_the_bytes_of_the_storage_model(config, length, extra):
    capacity = None if extra is None else length + extra + 1
    layout = CacheLayout(config, 2, 3, 16, torch.bfloat16, capacity)
    tensors = layout.allocate("cpu", length)
    assert measure(tensors) == storage_model(config, 2, 3, 16, length, torch.bfloat16, capacity=capacity)


@pytest.mark.parametrize("name", sorted(SELECTIONS))
def test_the_reference_cache_holds_exactly_the_table_shapes(name):
    cfg = (
        methods.kivi(2, group_size=8)
        if name == "none"
        else PNMixConfig(selection=name, group_size=8, residual_length=16, n_sink=3)
    )
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 45, 16, generator=gen)
    cache = ReferenceCache.from_prefill(q, k[:, :2], v[:, :2], cfg)
    layout = cache.cache_layout
    for c in layout.components:
        assert tuple(cache._t[c.name].shape) == layout.shape(c, layout.tokens(45)), c.name


def test_plan_refuses_to_pass_the_capacity_before_any_change():
    layout = CacheLayout(PNMixConfig(), 1, 1, 16, capacity=40)
    assert layout.plan(30, 10).after.length == 40
    with pytest.raises(ValueError, match="past its capacity max_cache_len=40"):
        layout.plan(30, 11)
    with pytest.raises(ValueError, match="n_new must be a non-negative int"):
        layout.plan(3, -1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch": 0}, "batch must be a positive int"),
        ({"kv_heads": 1.5}, "kv_heads must be a positive int"),
        ({"head_dim": 15}, "head_dim must be even"),
        ({"dtype": torch.int8}, "dtype must be a floating torch.dtype"),
        ({"capacity": 0}, r"capacity \(max_cache_len\) must be a positive int"),
    ],
)
def test_bad_layout_arguments_are_named(kwargs, message):
    args = {"config": PNMixConfig(), "batch": 1, "kv_heads": 1, "head_dim": 16, **kwargs}
    with pytest.raises((ValueError, TypeError), match=message):
        CacheLayout(**args)


def test_high_plane_columns_golden_and_inverse_of_the_salient_index():
    mask = torch.tensor([[True, False, True, True, False, False]])
    assert packing.high_plane_columns(mask).tolist() == [[0, -1, 1, 2, -1, -1]]
    gen = torch.Generator().manual_seed(3)
    masks = torch.rand(4, 5, 12, generator=gen).argsort(-1) < 5
    columns = packing.high_plane_columns(masks)
    index = packing.salient_channel_index(masks)
    assert torch.equal(columns.gather(-1, index), torch.arange(5, dtype=torch.int32).expand(4, 5, 5))
    assert bool((columns[~masks] == -1).all())


def test_uniform_selection_needs_equal_bits():
    with pytest.raises(ValueError, match="selection 'none'"):
        PNMixConfig(selection="none", b_high=3, b_low=1)
