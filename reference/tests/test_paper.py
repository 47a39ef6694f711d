"""The quoted numbers agree with each other as the paper states them (a typo in one shows here)."""

import pytest

from reference import paper
from reference.methods import METHODS


def test_the_ratios_the_paper_states_follow_from_its_numbers():
    tps = paper.FIG6C_TOKENS_PER_S
    fp16_b, pnmix_b = paper.FIG6B_MAX_BATCH["FP16"][0], paper.FIG6B_MAX_BATCH["PN-Mix"][0]
    assert tps["PN-Mix", pnmix_b] / tps["FP16", fp16_b] == pytest.approx(paper.FIG6C_MAX_RATIO, abs=0.005)
    assert pnmix_b / fp16_b == paper.FIG6B_BATCH_RATIO
    slope = paper.FIG7_SLOPE_US
    assert 1 - slope["PN-Mix"] / slope["Kitty"] == pytest.approx(paper.FIG7_SLOPE_REDUCTION, abs=0.0005)
    assert all(gib < paper.GPU_MEMORY_GIB for _, gib in paper.FIG6B_MAX_BATCH.values())


def test_quoted_methods_and_shares_are_well_formed():
    quoted = {
        *paper.FIG6A_MAX_GENERATION,
        *paper.FIG6B_MAX_BATCH,
        *(m for m, _ in paper.FIG6C_TOKENS_PER_S),
        *paper.FIG7_SLOPE_US,
    }
    assert quoted <= set(METHODS)
    for shares in paper.FIG5_SHARE_PERCENT.values():
        assert len(shares) == len(paper.FIG5_TOP_PERCENT) and list(shares) == sorted(shares)
