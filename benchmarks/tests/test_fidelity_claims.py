"""Whether each fidelity claim holds is decided from the numbers, and the sentences agree with it."""

import copy
import json
from pathlib import Path

from benchmarks import fidelity

RESULT = Path(__file__).parents[1] / "results" / "fidelity-20261129T145337_176889Z.json"


def test_claims_hold_on_the_committed_result_and_flip_when_the_numbers_do():
    summary = json.loads(RESULT.read_text())["summary"]
    assert fidelity.claim_holds(summary) == {"fig4": True, "table9": True, "table11": True, "fig5": None}
    broken = copy.deepcopy(summary)
    jac = broken["fig4_jaccard_mean"]
    jac["k-range (full), r=10%"] = jac["qk-pair-norm (full), r=10%"] + 0.01  # k-range now beats k-magnitude
    kl = broken["table9_mean"]
    kl["H3(50%)L1, k-range (full)"]["kl"] = 0.0  # another criterion now has the lowest KL
    ranges = next(iter(broken["table11_overlap_mean"].values()))
    ranges[next(iter(ranges))] = 0.1  # a spread well over 0.1
    assert fidelity.claim_holds(broken) == {"fig4": False, "table9": False, "table11": False, "fig5": None}
    said = fidelity.verdicts(broken)
    assert "does not hold" in said["fig4"] and "not as the paper" in said["table9"] and "not stable" in said["table11"]
