"""The executable spec itself, run through the protocol (it must pass every property), and the
baselines (KIVI, Kitty, FP16) as configurations of the same spec."""

from __future__ import annotations

import dataclasses

import reference
from reference import PNMixConfig, ReferenceCache, methods, packing

from ..api import Capabilities


class ReferenceImplementation:
    name = "reference"
    version = reference.__version__
    capabilities = Capabilities()
    cache_class = ReferenceCache

    def create(self, config: PNMixConfig) -> ReferenceCache:
        return self.cache_class(config)

    def pack_keys(self, codes, channel_mask, config):
        return packing.pack_key_codes(codes, channel_mask, config.b_high, config.b_low)

    def unpack_keys(self, low, high, channel_mask, config):
        return packing.unpack_key_codes(low, high, channel_mask, config.b_high, config.b_low)

    def pack_values(self, codes, config):
        return packing.pack_value_codes(codes, config.value_bits)

    def unpack_values(self, packed, config):
        return packing.unpack_value_codes(packed, config.value_bits)

    def pack_mask(self, pair_mask):
        return packing.pack_mask(pair_mask)

    def unpack_mask(self, packed, n_pairs):
        return packing.unpack_mask(packed, n_pairs)


def make() -> ReferenceImplementation:
    return ReferenceImplementation()


def kivi_preset(config: PNMixConfig) -> PNMixConfig:
    return dataclasses.replace(config, b_high=config.b_low, ratio=0.0, selection="none", one_bit="ends")


def kitty_preset(config: PNMixConfig) -> PNMixConfig:
    return dataclasses.replace(config, selection="page-channels", one_bit="midpoint")


def fp16_preset(config: PNMixConfig) -> PNMixConfig:
    return methods.fp16()


#: What each baseline claims, whichever implementation runs it.
KIVI_CLAIMS = {
    "prefill_selection": False,
    "preset": kivi_preset,
    "midpoint_one_bit": False,
    "key_bits": frozenset((b, b) for b in (1, 2, 3, 4, 8)),
}
KITTY_CLAIMS = {"prefill_selection": False, "preset": kitty_preset, "key_bits": frozenset({(4, 2), (4, 1), (2, 1)})}
FP16_CLAIMS = {"prefill_selection": False, "preset": fp16_preset, "midpoint_one_bit": False}


def _baseline(name: str, claims: dict) -> ReferenceImplementation:
    impl = ReferenceImplementation()
    impl.name = name
    impl.capabilities = Capabilities(**claims)
    return impl


def make_kivi() -> ReferenceImplementation:
    return _baseline("kivi", KIVI_CLAIMS)


def make_kitty() -> ReferenceImplementation:
    return _baseline("kitty", KITTY_CLAIMS)


def make_fp16() -> ReferenceImplementation:
    return _baseline("fp16", FP16_CLAIMS)
