"""The executable spec as an implementation of `reference.contract` (it must pass every
conformance property), and the baselines (KIVI, Kitty, FP16) as configurations of the same spec.
Registered as entry points like any third party's (pyproject.toml)."""

from __future__ import annotations

from reference import __version__
from reference.channels.cache import ReferenceCache
from reference.channels.config import PNMixConfig
from reference.contract import BIT_EXACT, Capabilities, variant
from reference.equations import packing
from reference.methods import design
from reference.tokens.cache import TokenPrecisionCache
from reference.tokens.config import TokenPrecisionConfig


class ReferenceImplementation:
    name = "reference"
    version = __version__
    capabilities = Capabilities(token_precision=frozenset({"channels", "pairs"}), **BIT_EXACT)
    cache_class = ReferenceCache
    token_cache_class = TokenPrecisionCache

    def create(self, config: PNMixConfig | TokenPrecisionConfig) -> ReferenceCache | TokenPrecisionCache:
        """An empty cache of one layer for `config` (a `Cache`; a `TokenCache` for a `TokenPrecisionConfig`, where
        the capabilities claim per-token precision)."""
        if isinstance(config, TokenPrecisionConfig):
            return self.token_cache_class(config)
        return self.cache_class(config)

    def pack_keys(self, codes, channel_mask, config):
        """Key codes uint8 [B, H_kv, T_q, d] (T_q quantized tokens, config.b_high bits at the salient channels,
        config.b_low elsewhere) and the salient channels, bool [B, H_kv, d] ([B, H_kv, pages, d] for a selection
        per page, Kitty) -> (key_low, key_high): the implementation's packed planes, which `unpack_keys` turns
        back into the codes."""
        return packing.pack_key_codes(codes, channel_mask, config.b_high, config.b_low)

    def unpack_keys(self, low, high, channel_mask, config):
        """`pack_keys`' planes and the same channel_mask -> the key codes, uint8 [B, H_kv, T_q, d]."""
        return packing.unpack_key_codes(low, high, channel_mask, config.b_high, config.b_low)

    def pack_values(self, codes, config):
        """Value codes uint8 [B, H_kv, T_q, d] (config.value_bits each) -> the implementation's packed values."""
        return packing.pack_value_codes(codes, config.value_bits)

    def unpack_values(self, packed, config):
        """`pack_values`' output -> the value codes, uint8 [B, H_kv, T_q, d]."""
        return packing.unpack_value_codes(packed, config.value_bits)

    def pack_mask(self, pair_mask):
        """PN-Mix's pair mask, bool [..., d / 2] -> its stored form (needed with `prefill_selection` only)."""
        return packing.pack_mask(pair_mask)

    def unpack_mask(self, packed, n_pairs):
        """`pack_mask`'s output and the number of pairs d / 2 -> the pair mask, bool [..., n_pairs]."""
        return packing.unpack_mask(packed, n_pairs)


def make() -> ReferenceImplementation:
    return ReferenceImplementation()


def _baseline(name: str) -> ReferenceImplementation:
    """The spec as the named design's implementation: its registry name and claims."""
    of = design(name)
    return variant(ReferenceImplementation(), of.spec, Capabilities(**of.claims, **BIT_EXACT))


def make_kivi() -> ReferenceImplementation:
    return _baseline("KIVI")


def make_kitty() -> ReferenceImplementation:
    return _baseline("Kitty")


def make_fp16() -> ReferenceImplementation:
    return _baseline("FP16")


def make_triaxialkv() -> ReferenceImplementation:
    return _baseline("TriAxialKV")


def make_role_aware() -> ReferenceImplementation:
    return _baseline("role-aware PN-Mix")
