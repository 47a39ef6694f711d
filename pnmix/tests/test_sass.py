"""Machine code as SASS digests: the same instructions digest alike wherever they sit and whatever line tables
say; one instruction, one label or another target changes the digest; the package's own launches compile to
the same digests every time, and observing a call names the kernels it ran."""

from __future__ import annotations

import pytest
import torch

from pnmix import _runtime, aot, sass
from pnmix.cache import PNMixCache
from reference import PNMixConfig

needs_tools = pytest.mark.skipif(isinstance(sass.toolchain(), str), reason=f"toolchain absent: {sass.toolchain()}")

LISTING = """\
\t.headerflags\t@"EF_CUDA_SM90"
//--------------------- .text._k       --------------------------
_k:
.text._k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R8, SR_TID.X ;
.L_x_0:
        /*0020*/                   IMAD R0, R18, UR9, R7 ;
        /*0030*/               @P0 BRA `(.L_x_0) ;
        /*0040*/                   EXIT ;
"""


def test_addresses_headers_and_blank_lines_do_not_enter_the_digest():
    shifted = LISTING.replace("/*00", "/*01").replace('"EF_CUDA_SM90"', '"EF_CUDA_SM90 other"') + "\n\n"
    assert sass.code_lines(LISTING) == [
        "LDC R1, c[0x0][0x28]",
        "S2R R8, SR_TID.X",
        ".L_x_0:",
        "IMAD R0, R18, UR9, R7",
        "@P0 BRA `(.L_x_0)",
        "EXIT",
    ]
    assert sass.listing_digest(shifted) == sass.listing_digest(LISTING)


@pytest.mark.parametrize(
    "edit",
    [
        ("IMAD R0, R18, UR9, R7", "IMAD R0, R18, UR9, R6"),  # one operand
        ("S2R R8, SR_TID.X ;", "S2R R8, SR_TID.Y ;"),
        (".L_x_0:\n", ""),  # the loop's label gone: another control flow
        ("EXIT ;", "EXIT ;\n        /*0050*/                   BRA `(.L_x_0) ;"),  # one more instruction
    ],
)
def test_any_change_of_an_instruction_or_label_changes_the_digest(edit):
    old, new = edit
    assert old in LISTING
    assert sass.listing_digest(LISTING.replace(old, new, 1)) != sass.listing_digest(LISTING)


def test_a_listing_without_instructions_is_refused():
    with pytest.raises(RuntimeError, match="no instruction"):
        sass.listing_digest('\t.headerflags\t@"EF_CUDA_SM90"\n')


@pytest.mark.gpu_gate
@needs_tools
def test_the_packages_launches_compile_to_the_same_digests_every_time_and_differ_by_target():
    case, names = aot.Case("PN-Mix", "float16", 128, 4), ["_split_kernel", "_merge_kernel"]
    h200 = aot.kernel_digests(case, _runtime.Target(90, 132), names)
    assert sorted(h200) == sorted(names) and all(len(d) == 1 and len(d[0]) == 64 for d in h200.values())
    assert aot.kernel_digests(case, _runtime.Target(90, 132), names) == h200
    a100 = aot.kernel_digests(case, _runtime.Target(80, 108), names)
    assert a100["_split_kernel"] != h200["_split_kernel"]
    other = aot.kernel_digests(aot.Case("KIVI-2", "float16", 128, 4), _runtime.Target(90, 132), ["_split_kernel"])
    assert other["_split_kernel"] != h200["_split_kernel"]  # another layout: another decode kernel


@pytest.mark.interpreter
@pytest.mark.skipif(not _runtime.INTERPRETED, reason="checks the interpreter's launches")
def test_observing_names_every_kernel_a_call_runs_and_only_within_the_block():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 300, 64, generator=gen).to(torch.float16) for h in (4, 2, 2))
    cache = PNMixCache(PNMixConfig())
    cache.prefill(q, k, v)
    with _runtime.observing() as ran:
        cache.attend(q[:, :, -1:])
    seen = len(ran)
    cache.attend(q[:, :, -1:])  # outside the block: not observed
    assert len(ran) == seen
    with _runtime.observing() as again:
        cache.attend(q[:, :, -1:])
    assert "_split_kernel" in [name for name, _ in ran] and again == ran
    assert all(compiled is None for _, compiled in ran)  # interpreted: no machine code to digest
