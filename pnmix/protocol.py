"""The Triton implementation under the contract of `reference.contract` (`--impl triton`; registered
as an entry point in pyproject.toml)."""

from __future__ import annotations

import torch

from pnmix import __version__, _runtime
from pnmix.cache import BOOKKEEPING_BYTES, PNMixCache
from pnmix.kernels import dequantize_plane, encode_pack
from pnmix.token_cache import TritonTokenPrecisionCache
from reference import PNMixConfig, TokenPrecisionConfig
from reference.contract import BIT_EXACT, Capabilities, variant
from reference.equations import packing
from reference.methods import design


def _identity_params(b: int, h: int, rows: int, cols: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    # Packing given codes is encoding them with scale 1 and zero 0: the same kernel, no copy.
    return torch.ones(b, h, rows, cols, device=device), torch.zeros(b, h, rows, cols, device=device)


def claims(tokens: int = 96, **method) -> Capabilities:
    """What the Triton kernels claim; the interpreter runs them in numpy, so CI draws small shapes."""
    return Capabilities(
        dtypes=(torch.float16, torch.bfloat16),
        devices=("cpu",) if _runtime.INTERPRETED else ("cuda",),
        max_tokens=tokens if _runtime.INTERPRETED else 320,
        max_head_dim=16 if _runtime.INTERPRETED else 32,
        **{"bookkeeping_bytes": BOOKKEEPING_BYTES, **BIT_EXACT, **method},
    )


class TritonImplementation:
    """The Triton caches behind the contract. The defaults are the contract's (bad input raises before
    it is stored); the Hugging Face cache builds it with its own options (`pnmix.hf.builtin`):
    preallocation, device-side finite checks, capturable steps."""

    name = "triton"
    version = __version__
    capabilities = claims()

    def __init__(self, *, max_cache_len: int | None = None, check_finite: bool | str = "eager", capturable=False):
        self.max_cache_len, self.check_finite, self.capturable = max_cache_len, check_finite, capturable

    def create(self, config: PNMixConfig | TokenPrecisionConfig) -> PNMixCache | TritonTokenPrecisionCache:
        if isinstance(config, TokenPrecisionConfig):
            return TritonTokenPrecisionCache(config)
        return PNMixCache(
            config, max_cache_len=self.max_cache_len, check_finite=self.check_finite, capturable=self.capturable
        )

    def pack_keys(self, codes, channel_mask, config):
        b, h, t, d = codes.shape
        bits = torch.where(channel_mask, config.b_high, config.b_low).to(torch.int32)
        index = packing.salient_channel_index(channel_mask).to(torch.int32).contiguous()
        x = codes.float().contiguous()
        scale, zero = _identity_params(b, h, 1, d, codes.device)
        low = torch.empty(b, h, t * config.b_low // 8, d, dtype=torch.uint8, device=codes.device)
        encode_pack(x, t, "tokens", bits, scale, zero, low, field_bits=config.b_low)
        hi_bits = config.b_high - config.b_low
        high = torch.zeros(b, h, t * hi_bits // 8, index.shape[-1], dtype=torch.uint8, device=codes.device)
        if hi_bits:
            encode_pack(x, t, "tokens", bits, scale, zero, high, field_bits=hi_bits, shift=config.b_low, colmap=index)
        return low, high

    def unpack_keys(self, low, high, channel_mask, config):
        b, h, _, d = low.shape
        t = low.shape[2] * 8 // config.b_low
        codes = torch.empty(b, h, t, d, dtype=torch.uint8, device=low.device)
        scale, zero = _identity_params(b, h, 1, d, low.device)
        slot = packing.high_plane_columns(channel_mask)
        dequantize_plane(
            low,
            scale,
            zero,
            codes,
            group=max(t, 1),
            along="tokens",
            low_bits=config.b_low,
            high=high,
            high_bits=config.b_high - config.b_low,
            slot=slot,
            codes=True,
        )
        return codes

    def pack_values(self, codes, config):
        b, h, t, d = codes.shape
        scale, zero = _identity_params(b, h, t, 1, codes.device)
        out = torch.empty(b, h, t, d * config.value_bits // 8, dtype=torch.uint8, device=codes.device)
        encode_pack(
            codes.float().contiguous(), d, "channels", config.value_bits, scale, zero, out, field_bits=config.value_bits
        )
        return out

    def unpack_values(self, packed, config):
        b, h, t, n = packed.shape
        d = n * 8 // config.value_bits
        scale, zero = _identity_params(b, h, t, 1, packed.device)
        codes = torch.empty(b, h, t, d, dtype=torch.uint8, device=packed.device)
        dequantize_plane(packed, scale, zero, codes, group=d, along="channels", low_bits=config.value_bits, codes=True)
        return codes

    def pack_mask(self, pair_mask):
        return packing.pack_mask(pair_mask)

    def unpack_mask(self, packed, n_pairs):
        return packing.unpack_mask(packed, n_pairs)


def make() -> TritonImplementation:
    return TritonImplementation()


def _of(name: str, **limits) -> TritonImplementation:
    """The Triton implementation as the named design's: its registry name and claims, with `limits`."""
    of = design(name)
    return variant(TritonImplementation(), of.triton, claims(**limits, **of.claims))


def make_kivi() -> TritonImplementation:
    """KIVI on the same kernels (uniform keys, Eq. 2 at 1 bit); smaller CI shapes, same code paths."""
    return _of("KIVI", tokens=48)


def make_kitty() -> TritonImplementation:
    """Kitty on the same kernels (per-page channel ranks read by the decode kernel)."""
    return _of("Kitty", tokens=48)


def make_triaxialkv() -> TritonImplementation:
    """TriAxialKV: the spec's per-token stores, read by the Triton decode (`pnmix.kernels.token_attention`)."""
    return _of("TriAxialKV", bookkeeping_bytes=0)


def make_role_aware() -> TritonImplementation:
    """Role-aware PN-Mix on the same decode (its low keys' pairs in the high plane)."""
    return _of("role-aware PN-Mix", bookkeeping_bytes=0)
