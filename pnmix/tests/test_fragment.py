"""Codes in fragment order: the mapping is a bijection of the tile's bits, `unpack` (the kernel's own joins and
permutations) inverts `pack`, and the fragment-order loop's CPU twin computes attention over the right tokens."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from pnmix import _runtime, aot, perfmodel
from pnmix.kernels import fragment, fragment_check, fragment_decode, ptx


def codes(slices: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, 2, (slices, 128, 16), generator=g),
        torch.randint(0, 4, (slices, 64, 16), generator=g),
        torch.randint(0, 4, (slices, 16, 128), generator=g),
    )


@pytest.mark.parametrize("seed", range(3))
def test_unpack_inverts_pack(seed):
    low, high, values = codes(8, seed)
    words = fragment.pack(low, high, values)
    assert words.shape == (2, fragment.WARPS, 32, fragment.WORDS) and words.dtype == torch.int32
    for got, want in zip(fragment.unpack(words), (low, high, values), strict=True):
        assert torch.equal(got, want)


def test_every_bit_of_a_tile_holds_exactly_one_code():
    """The three planes' (lane, word, bit) positions tile the 32 lanes x 8 words x 32 bits of a warp's slice once:
    the stored bytes are the spec's, in another order."""
    seen = torch.zeros(32, fragment.WORDS, 32, dtype=torch.int64)
    for position, shape, bits in (
        (fragment.key_low_position, (128, 16), 1),
        (fragment.key_high_position, (64, 16), 2),
        (fragment.value_position, (16, 128), 2),
    ):
        a, b = torch.meshgrid(torch.arange(shape[0]), torch.arange(shape[1]), indexing="ij")
        lane, word, bit = (x.flatten() for x in position(a, b))
        for k in range(bits):
            seen.index_put_((lane, word, bit + k), torch.ones_like(lane), accumulate=True)
    assert torch.equal(seen, torch.ones_like(seen))
    full = fragment.pack(
        torch.ones(4, 128, 16, dtype=torch.int64), torch.full((4, 64, 16), 3), torch.full((4, 16, 128), 3)
    )
    assert bool((full == -1).all())


def test_one_code_lands_where_the_table_says():
    low, high, values = (torch.zeros_like(x) for x in codes(4, 0))
    values[2, 9, 77] = 3  # warp 2, token 9, channel 77
    words = fragment.pack(low, high, values)
    lane, word, bit = (int(x) for x in fragment.value_position(torch.tensor(9), torch.tensor(77)))
    expected = torch.zeros_like(words)
    expected[0, 2, lane, word] = 3 << bit
    assert torch.equal(words, expected)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"low": torch.zeros(4, 128, 8, dtype=torch.int64)}, r"low must have shape"),
        ({"high": torch.full((4, 64, 16), 4)}, r"high must hold 2-bit codes"),
        ({"values": torch.zeros(4, 16, 128)}, r"values must be an integer tensor"),
        ({"low": torch.zeros(3, 128, 16, dtype=torch.int64)}, r"same whole tiles"),
    ],
)
def test_pack_names_the_bad_argument(bad, match):
    low, high, values = codes(4, 0)
    args = {"low": low, "high": high, "values": values} | bad
    with pytest.raises(ValueError, match=match):
        fragment.pack(**args)


def test_unpack_refuses_words_of_another_shape():
    with pytest.raises(ValueError, match=r"words must be int32"):
        fragment.unpack(torch.zeros(1, 4, 32, 4, dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "tiles, splits, rows, sinks, residual, exact_split",
    [(2, 1, 4, 0, 0, None), (6, 2, 8, 32, 100, None), (6, 4, 16, 5, 64, None), (4, 4, 1, 0, 1, 4), (4, 3, 4, 70, 0, 3)],
)
def test_the_twin_attends_over_every_token_as_the_reference_does(
    tiles, splits, rows, sinks, residual, exact_split, dtype
):
    """The twin's output against float64 attention over the quantized tiles and the exact regions (read by the last
    split or by one of their own): its error within twice that of the same attention computed in float32 (the
    kernel's operands are exact products or hi + lo pairs: float32 grade; a wrong mapping, warp merge, split merge or
    exact tile errs by O(1))."""
    stacked, planes = fragment_check.synthetic(tiles, tiles * 10 + splits, rows, 1, sinks, residual, dtype)
    args = fragment_check.head(stacked, 0)
    qk_scale = 1 / math.sqrt(128) / math.log(2)
    parts = fragment_decode.twin(**args, qk_scale=qk_scale, n_splits=splits, exact_split=exact_split)
    out = fragment_decode.merge(*parts)[:rows].double()
    exact = fragment_check.reference(args, planes[0], qk_scale, torch.float64)[:rows]
    single = fragment_check.reference(args, planes[0], qk_scale, torch.float32)[:rows].double()
    bound = 2 * (single - exact).abs().max()
    assert (out - exact).abs().max() <= bound, ((out - exact).abs().max(), bound)
    # and a misplaced token would show: the same tiles with two tokens' values swapped do not pass
    low, high, values = fragment.unpack(args["words"])
    values = values.clone()
    values[0, [0, 1]] = values[0, [1, 0]] ^ 3  # different codes at two tokens
    swapped = dict(args, words=fragment.pack(low, high, values))
    wrong = fragment_decode.merge(*fragment_decode.twin(**swapped, qk_scale=qk_scale, n_splits=splits))[:rows]
    assert (wrong.double() - exact).abs().max() > bound
    if sinks + residual:  # and so would an exact region left out
        left_out = dict(args, exact=tuple(t[:0] for t in args["exact"]))
        partial = fragment_decode.merge(*fragment_decode.twin(**left_out, qk_scale=qk_scale, n_splits=splits))[:rows]
        assert (partial.double() - exact).abs().max() > bound


@pytest.mark.parametrize("slots", [0, 64, 264, 10_000])
@pytest.mark.parametrize("items", [1, 8, 512])
def test_the_gate_predicts_the_split_plan_the_loop_runs(items, slots):
    """`pnmix.perfmodel.split_plan` (what the gate simulates) is `fragment_decode.split_plan` (what is launched), and
    every plan launches the splits it reports, the exact regions on one of them."""
    for splits in range(1, 70):
        plan = fragment_decode.split_plan(splits, items, slots)
        assert perfmodel.split_plan(splits, items, slots) == plan
        quantized, exact_split, programs = plan
        assert programs == max(quantized, exact_split + 1) and 1 <= quantized <= programs


def twin_launcher(
    perturb_ptx: bool = False, perturb_plain: bool = False, raises: bool = False, merge_drops_a_split: bool = False
):
    """A stand-in for `fragment_check.launch` on the CPU: the twin per head and its merge in q's dtype (the loop's
    own), optionally wrong (one output channel off by one) on either path, raising as a kernel that does not compile
    would, or with a merge that leaves the last split out (the partials right)."""

    def run(args, qk_scale, n_splits, use_ptx):
        if raises:
            raise RuntimeError("PTX assembly aborted\nmore lines")
        outs = [
            fragment_decode.twin(**fragment_check.head(args, h), qk_scale=qk_scale, n_splits=n_splits)
            for h in range(args["q"].shape[0])
        ]
        m, l, acc = (torch.stack(x) for x in zip(*outs, strict=True))  # noqa: E741
        if (perturb_ptx and use_ptx) or (perturb_plain and not use_ptx):
            acc = acc.clone()
            acc[..., 5] += l[..., None][..., 0]  # the output's channel 5 off by one
        rows = args["q"].shape[1]
        kept = slice(None, -1) if merge_drops_a_split else slice(None)
        merged = torch.stack(
            [fragment_decode.merge(m[h, kept], l[h, kept], acc[h, kept])[:rows] for h in range(m.shape[0])]
        )
        return m, l, acc, merged.to(args["q"].dtype)

    return run


@pytest.fixture
def clean_decisions():
    fragment_check.forget()
    yield
    fragment_check.forget()


def test_a_correct_fast_path_is_taken_with_its_ptx_and_no_warning(clean_decisions, recwarn):
    path, why = fragment_check.decide("cpu", torch.float16, launcher=twin_launcher())
    assert path == "ptx" and "passed" in why
    assert not [w for w in recwarn if "fragment-order" in str(w.message)]


def test_a_wrong_ptx_path_falls_back_to_the_plain_unpack_with_one_warning(clean_decisions):
    with pytest.warns(
        RuntimeWarning, match=r"fragment-order loop on cpu, float16: the inline-PTX unpack failed"
    ) as caught:
        path, why = fragment_check.decide("cpu", torch.float16, launcher=twin_launcher(perturb_ptx=True))
    assert path == "plain" and "error" in why and len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # decided once: no second warning
        assert fragment_check.decide("cpu", torch.float16, launcher=twin_launcher(perturb_ptx=True)) == (path, why)


@pytest.mark.parametrize("launcher", [twin_launcher(perturb_ptx=True, perturb_plain=True), twin_launcher(raises=True)])
def test_a_fast_path_wrong_both_ways_is_off_with_one_warning_naming_what_differed(clean_decisions, launcher):
    with pytest.warns(RuntimeWarning, match=r"self-test failed with the inline-PTX unpack") as caught:
        path, why = fragment_check.decide("cpu", torch.float16, launcher=launcher)
    assert path == "off" and len(caught) == 1
    assert ("above" in why) or ("RuntimeError: PTX assembly aborted" in why and "more lines" not in why), why


def test_a_loop_whose_own_merge_is_wrong_fails_its_self_test_though_its_partials_are_right(clean_decisions):
    """The loop's merge (the last program of a head) is judged as its partials are: one that leaves a split out
    turns the path off, named."""
    with pytest.warns(RuntimeWarning, match=r"self-test failed") as caught:
        path, why = fragment_check.decide("cpu", torch.float16, launcher=twin_launcher(merge_drops_a_split=True))
    assert path == "off" and len(caught) == 1 and "its merge: error" in why, why


def test_the_loop_merges_in_its_last_program_only_with_counters_for_every_head_and_its_own_partials():
    q = torch.zeros(4, 128, dtype=torch.float16)
    planes = tuple(torch.zeros(2, 8, dtype=torch.int32) for _ in range(3))
    scales = tuple(torch.zeros(2, 8, dtype=torch.float16) for _ in range(4))
    exact = tuple(torch.zeros(2, 1, 128, dtype=torch.float16) for _ in range(4))
    out = tuple(torch.zeros(2 * 3 * 2) for _ in range(3))
    counts, merged = torch.zeros(4, dtype=torch.int32), torch.empty(4, 128, dtype=torch.float16)
    common = (q, torch.zeros(2, 64, dtype=torch.int32), planes, scales, exact, counts, out, 2, 2, 2, 2)
    for semaphores, total, first in ((None, 3, 0), (torch.zeros(1, dtype=torch.int32), 3, 0),
                                     (torch.zeros(2, dtype=torch.int32), 4, 0),
                                     (torch.zeros(2, dtype=torch.int32), 3, 1)):  # fmt: skip
        with pytest.raises(ValueError, match="a merge in the loop needs semaphores for 2 heads"):
            fragment_decode.launch_split(*common, total, first, 1.0, True, merged, semaphores)


@pytest.mark.parametrize(
    ("items", "programs", "slots", "merges"),
    [(8, 9, 264, True), (8, 33, 264, True), (512, 1, 264, False), (8, 34, 264, False)],
)
def test_the_loop_merges_its_splits_itself_where_its_grid_is_one_wave(items, programs, slots, merges):
    assert perfmodel.merges_in_loop(items, programs, slots) is merges


def test_without_a_launcher_a_cpu_is_off_without_a_self_test(clean_decisions):
    assert fragment_check.decide("cpu") == ("off", "the fragment-order loop needs a CUDA device")


@pytest.mark.parametrize("width", [1, 2, 4])
def test_the_fragment_pair_ptx_gives_the_codes_of_both_halves_of_a_word(width):
    """`ptx.fragment_pair`, executed by the PTX emulator (the Triton interpreter cannot run it): at every shift of
    its width, the float16 pair of the codes at bits [s, s + width) and [16 + s, ...), low half first."""
    g = torch.Generator().manual_seed(width)
    words = [0, 0xFFFFFFFF, 0x80008000, *torch.randint(0, 1 << 32, (200,), generator=g).tolist()]
    asm = ptx.fragment_pair(width)
    mask = (1 << width) - 1
    for shift in range(0, 16, width):
        for w in words:
            (pair,) = ptx.emulate(asm, w, w, shift, shift, outputs=1)
            assert ptx.float16_halves([pair]) == [float(w >> shift & mask), float(w >> (16 + shift) & mask)]


def test_the_fragment_pair_ptx_refuses_other_widths():
    with pytest.raises(ValueError, match="width must be 1, 2 or 4"):
        ptx.fragment_pair(3)


def test_compiling_the_loop_under_the_interpreter_says_how_to_compile_it():
    if not _runtime.INTERPRETED:
        pytest.skip("kernels are compiled in this process")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
        aot.compile_fragment_loop(80)
