"""Codes in fragment order: the mapping is a bijection of the tile's bits, `unpack` (the kernel's own joins and
permutations) inverts `pack`, and the fragment-order loop's CPU twin computes attention over the right tokens."""

from __future__ import annotations

import math

import pytest
import torch

from pnmix.kernels import fragment, fragment_decode, ptx


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


def head(tiles: int, seed: int, rows: int = 4):
    """One KV head's fragment-order tiles and scales, and its queries (rows real rows of 16)."""
    g = torch.Generator().manual_seed(seed)
    low, high, values = codes(tiles * fragment.WARPS, seed)
    groups = -(-tiles * fragment.TILE // fragment_decode.GROUP)
    q = torch.zeros(16, 128, dtype=torch.float16)
    q[:rows] = torch.randn(rows, 128, generator=g).to(torch.float16)
    channel = torch.randperm(128, generator=g)[:64]
    ks = (torch.rand(groups, 128, generator=g) * 0.5 + 0.05).to(torch.float16)
    kz = (torch.randn(groups, 128, generator=g) * 0.3).to(torch.float16)
    khs = (2 * ks[:, channel].float()).to(torch.float16)
    n = tiles * fragment.TILE
    vs = (torch.rand(n, generator=g) * 0.5 + 0.05).to(torch.float16)
    vz = (torch.randn(n, generator=g) * 0.3).to(torch.float16)
    return dict(
        q=q, qh=q[:, channel].contiguous(), words=fragment.pack(low, high, values), ks=ks, kz=kz, khs=khs, vs=vs, vz=vz
    ), (low, high, values, channel)


def reference(args: dict, planes, qk_scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Attention over the dequantized tokens computed in `dtype` (token order as stored: warp slices of 16 per tile):
    keys s lo + 2 s hi (salient channels) + z, values s v + z, per the cache's groups."""
    low, high, values, channel = planes
    keys, vals = [], []
    for s in range(low.shape[0]):
        g = s * 16 // fragment_decode.GROUP
        sk, zk = args["ks"][g].to(dtype), args["kz"][g].to(dtype)
        keys.append((sk[:, None] * low[s].to(dtype) + zk[:, None]).T)  # [16 tokens, 128]
        vals.append(values[s].to(dtype))
    k = torch.cat(keys)
    n = k.shape[0]
    groups = torch.arange(n) // fragment_decode.GROUP
    k[:, channel] += args["khs"][groups].to(dtype) * torch.cat([high[s].T for s in range(high.shape[0])]).to(dtype)
    logits = args["q"].to(dtype) @ k.T * qk_scale  # log2 domain, as the kernel
    p = torch.softmax(logits * math.log(2), dim=-1)
    v = args["vs"].to(dtype)[:, None] * torch.cat(vals) + args["vz"].to(dtype)[:, None]
    return p @ v


@pytest.mark.parametrize("tiles, splits, rows", [(2, 1, 4), (6, 2, 8), (6, 4, 16), (4, 4, 1)])
def test_the_twin_attends_over_every_token_as_the_reference_does(tiles, splits, rows):
    """The twin's output against float64 attention: its error within twice that of the same attention computed in
    float32 (the kernel's operands are exact products or hi + lo pairs: float32 grade; a wrong mapping, warp merge or
    split merge errs by O(1))."""
    args, planes = head(tiles, seed=tiles * 10 + splits)
    qk_scale = 1 / math.sqrt(128) / math.log(2)
    out = fragment_decode.merge(*fragment_decode.twin(**args, qk_scale=qk_scale, n_splits=splits))[:rows].double()
    exact = reference(args, planes, qk_scale, torch.float64)[:rows]
    single = reference(args, planes, qk_scale, torch.float32)[:rows].double()
    bound = 2 * (single - exact).abs().max()
    assert (out - exact).abs().max() <= bound, ((out - exact).abs().max(), bound)
    # and a misplaced token would show: the same tiles with two tokens' values swapped do not pass
    low, high, values = fragment.unpack(args["words"])
    values = values.clone()
    values[0, [0, 1]] = values[0, [1, 0]] ^ 3  # different codes at two tokens
    swapped = dict(args, words=fragment.pack(low, high, values))
    wrong = fragment_decode.merge(*fragment_decode.twin(**swapped, qk_scale=qk_scale, n_splits=splits))[:rows]
    assert (wrong.double() - exact).abs().max() > bound


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
    from pnmix import _runtime

    if not _runtime.INTERPRETED:
        pytest.skip("kernels are compiled in this process")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
        fragment_decode.compile_for(80)
