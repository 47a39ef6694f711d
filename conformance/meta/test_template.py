"""The adapter template (conformance/impls/template.py) is a working implementation that differs
from the reference on purpose (own format, scales in the input dtype, round half to even, no
pair mask): the core properties pass on it and only the opt-in ones skip, each with its claim. The
config it is handed follows its claimed residual, not the preset it borrows from KIVI."""

import dataclasses
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from conformance import harness
from conformance import strategies as cs
from conformance.impls.template import TemplateCache, TemplateImplementation, make
from conformance.meta.test_mutants import run_suite
from reference import PNMixConfig

#: The properties that need a claim the template does not make, by the claim's wording in the skip.
OPT_IN = {
    "test_key_bytes_are_the_reference_layout": "reference's byte layout",
    "test_value_bytes_are_the_reference_layout": "reference's byte layout",
    "test_pair_mask_roundtrips": "pair mask chosen at prefill",
    "test_one_bit_channels_reconstruct_to_the_nearer_bin_midpoint": "Eq. 7 midpoints",
    "test_mask_is_the_reference_prefill_selection": "selection made once at prefill",
    "test_mask_never_changes_after_prefill": "selection made once at prefill",
    "test_codes_and_scales_are_the_reference_numerics": "reference's numerics",
    "test_storage_report_is_exact": "reference's storage layout",
    # the evaluation path's optional methods (property 12): the template keeps to the required protocol
    "test_a_checkpoint_is_returned_to_any_number_of_times": "the optional checkpoint",
    "test_stepwise_attention_is_what_each_token_would_have_read": "the optional attend_stepwise",
    "test_selected_rows_hold_what_a_cache_of_those_rows_alone_holds": "the optional select_rows",
    **dict.fromkeys(
        (
            "test_every_token_is_held_at_its_precision",
            "test_token_bits_are_the_ones_given",
            "test_storage_is_the_accounting",
            "test_attention_over_its_own_cache_within_the_low_precision_error",
            "test_bad_token_bits_are_refused_and_change_nothing",
            "test_a_fault_leaves_the_cache_as_it_was",
            "test_the_realistic_token_workload_holds_what_it_reports",
            "test_the_realistic_token_workload_attention",
        ),
        "per-token precision",
    ),
}


def test_template_passes_every_core_property_and_skips_only_the_opt_in_ones(tmp_path):
    out = tmp_path / "template.json"
    result = run_suite("conformance", "--impl", "conformance.impls.template:make", "--conformance-json", str(out))
    assert result.returncode == 0, result.stdout[-4000:]
    records = json.loads(out.read_text())["results"]
    skipped = {r["property"]: r["reason"] for r in records if r["outcome"] == "skipped"}
    assert set(skipped) == set(OPT_IN), f"skipped {sorted(skipped)}, expected the opt-in properties {sorted(OPT_IN)}"
    for prop, claim in OPT_IN.items():
        assert claim in skipped[prop], f"{prop} skipped with {skipped[prop]!r}, not naming the claim {claim!r}"
    # every verdict passes; the storage measurements are recorded as such, never as passes
    assert {r["outcome"] for r in records if r["property"] not in OPT_IN} == {"passed", "measured"}
    assert {r["property"] for r in records if r["outcome"] == "measured"} == {
        "test_the_common_workload_holds_what_it_reports",
        "test_the_realistic_workload_holds_what_it_reports",
    }


class Recording(TemplateImplementation):
    """The template, remembering the configs create() was handed."""

    def __init__(self, **claims) -> None:
        self.capabilities = dataclasses.replace(TemplateImplementation.capabilities, **claims)
        self.handed = []

    def create(self, config):
        self.handed.append(config)
        return TemplateCache(config)


@pytest.mark.parametrize(
    ("residual", "value_residual"), [("shared", "shared"), ("sliding_values", "sliding"), ("requantize", "shared")]
)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cs.cases())
def test_create_is_handed_the_residual_it_claims_whatever_the_preset(residual, value_residual, case):
    """kivi_preset sets KIVI's sliding value window; the claimed residual decides what create() gets."""
    impl = Recording(residual=residual)
    fitted = case.fit(impl.capabilities)
    harness.final_state(impl, fitted, torch.device("cpu"))
    assert impl.handed and {c.value_residual for c in impl.handed} == {value_residual}
    assert all(c.b_high == c.b_low for c in impl.handed), "the preset no longer applies"


def test_the_template_refuses_a_residual_it_does_not_hold():
    sliding = dataclasses.replace(PNMixConfig(), value_residual="sliding")
    with pytest.raises(ValueError, match="value_residual must be 'shared'"):
        make().create(sliding)
