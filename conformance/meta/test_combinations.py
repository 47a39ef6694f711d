"""The explicit examples of every claimed combination (`strategies.claimed_combinations`) hold each
claimed bit width with each claimed scale dtype and input dtype, whatever the claims."""

import dataclasses
import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance import strategies as cs
from reference import PNMixConfig
from reference.channels.config import KEY_BITS, VALUE_BITS
from reference.contract import Capabilities

BASE = cs.Case(PNMixConfig(group_size=8, residual_length=8, n_sink=1), 1, 2, 2, 8, torch.float16, 19, (6,), 60)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@st.composite
def claims(draw) -> Capabilities:
    pairs = [(h, lo) for h in KEY_BITS for lo in KEY_BITS if h >= lo]
    scales = draw(st.sampled_from([("input",), *[c for n in (1, 2, 3) for c in itertools.combinations(DTYPES, n)]]))
    return Capabilities(
        key_bits=frozenset(draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=12, unique=True))),
        value_bits=frozenset(draw(st.lists(st.sampled_from(VALUE_BITS), min_size=1, unique=True))),
        scale_dtypes=scales,
        dtypes=tuple(draw(st.lists(st.sampled_from(DTYPES), min_size=1, unique=True))),
    )


def required(caps: Capabilities) -> set[tuple]:
    """(role, width, scale dtype, input dtype) for every claimed width and dtype, computed directly."""
    out = set()
    for dtype in caps.dtypes:
        for scale in [dtype] if caps.scales_in_input_dtype else caps.scale_dtypes:
            out |= {("low", lo, scale, dtype) for _, lo in caps.key_bits}
            out |= {("high", hi, scale, dtype) for hi, _ in caps.key_bits}
            out |= {("value", b, scale, dtype) for b in caps.value_bits}
    return out


def covered(cases: list[cs.Case]) -> set[tuple]:
    out = set()
    for case in cases:
        cfg = case.config
        for role, width in (("low", cfg.b_low), ("high", cfg.b_high), ("value", cfg.value_bits)):
            out.add((role, width, cfg.scale_dtype, case.dtype))
    return out


@given(caps=claims())
def test_every_claimed_combination_is_an_explicit_example(caps):
    cases = cs.claimed_combinations(caps, BASE)
    assert required(caps) <= covered(cases), sorted(required(caps) - covered(cases), key=str)[:5]
    # and no more cases than the product of the dtypes with the widest list of widths
    scales = 1 if caps.scales_in_input_dtype else len(caps.scale_dtypes)
    widest = max(len({lo for _, lo in caps.key_bits}) + len({hi for hi, _ in caps.key_bits}), len(caps.value_bits))
    assert len(cases) <= len(caps.dtypes) * scales * widest


@given(caps=claims(), case=cs.cases())
def test_fitting_is_idempotent(caps, case):
    """A fitted case fits to itself (the combinations are fitted once, then fitted again by the property)."""
    try:
        once = case.fit(caps)
    except cs.DoesNotFit:
        return
    assert once.fit(caps) == once


def test_an_example_past_the_claimed_head_dims_is_refitted_at_smaller_groups():
    caps = dataclasses.replace(Capabilities(), head_dims=(16, 32))
    wide = cs.Case(PNMixConfig(value_group_size=128), 1, 1, 1, 128, torch.float16, 300, (), 0)
    fit = wide.fit(caps)
    assert fit.head_dim in (16, 32) and fit.config.group_size < 128
    assert fit.head_dim % fit.config.value_group(fit.head_dim) == 0
    fixed = dataclasses.replace(caps, group_sizes=(128,))  # claimed groups are never changed: nothing fits
    with pytest.raises(cs.DoesNotFit, match="no head_dim within its claims"):
        wide.fit(fixed)
