"""The method registry: one record per method, selected by attribute, one rule for the nearest configuration."""

import dataclasses

import pytest

from reference import methods
from reference.channels.config import PNMixConfig
from reference.tokens.config import TokenPrecisionConfig


def test_every_method_is_one_record_of_a_known_design_with_known_tags():
    assert len(set(methods.REGISTRY)) == len(methods.REGISTRY)
    for name, m in methods.REGISTRY.items():
        assert m.name == name and m.design in methods.DESIGNS and m.tags <= set(methods.TAGS)


def test_a_method_config_is_its_designs_family_with_the_overrides_applied():
    for name, m in methods.REGISTRY.items():
        cls = PNMixConfig if m.precision == methods.CHANNELS else TokenPrecisionConfig
        assert isinstance(methods.config(name), cls), name
    assert methods.config("PN-Mix", group_size=64).group_size == 64
    assert methods.config("KIVI-2 +32 sinks").n_sink == 32 and methods.config("KIVI-2").n_sink == 0
    assert methods.config("TriAxialKV", group_size=64) == dataclasses.replace(
        methods.config("TriAxialKV"), group_size=64
    )


def test_an_unknown_name_or_tag_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"method must be one of \['FP16'.*got 'KIVI'"):
        methods.config("KIVI")
    with pytest.raises(ValueError, match="design must be one of"):
        methods.design("KIVI-2")
    with pytest.raises(ValueError, match="tag must be one of"):
        methods.names(tag="fast")


def test_selection_by_attribute():
    assert methods.names(tag="baseline") == (methods.FP16,)
    assert set(methods.names(precision=methods.TOKENS)) == set(methods.TOKEN_METHODS)
    assert methods.names(design="KIVI") == ("KIVI-2", "KIVI-2 +32 sinks", "KIVI-1")
    assert set(methods.names()) == set(methods.METHODS) | set(methods.TOKEN_METHODS)
    assert methods.NAMES == methods.names(precision=methods.CHANNELS)
    assert set(methods.designs(having="table14")) == {"KIVI", "PN-Mix"}
    for d in methods.designs(having="matched"):
        assert methods.DESIGNS[d].precision == methods.CHANNELS


def test_the_families_hold_their_designs_configurations():
    for config in methods.table14_kivi(64):
        assert config.b_high == config.b_low and config.residual_length == config.group_size
    pn = methods.table14_pnmix(64)
    assert all(c.b_high > c.b_low for c in pn) and len(pn) == 6 * 2 * 9  # b_H > b_L pairs, G, r
    assert all(c.n_sink == 32 for c in methods.matched_kivi("split"))
    assert {c.b_high - c.b_low for c in methods.matched_pnmix("split")} == {2}


def test_nearest_picks_the_closest_then_the_cheaper_then_the_first():
    family = ["a", "b", "c", "d"]
    bits = {"a": 3.0, "b": 2.0, "c": 2.5, "d": 2.0}.__getitem__
    assert methods.nearest(family, 2.1, bits) == ("b", 2.0)  # b and d tie: the first listed
    assert methods.nearest(family, 2.25, bits) == ("b", 2.0)  # 2.0 and 2.5 tie: the cheaper
    assert methods.nearest(family, 9.0, bits) == ("a", 3.0)
    with pytest.raises(ValueError, match="family must hold"):
        methods.nearest([], 2.0, bits)
