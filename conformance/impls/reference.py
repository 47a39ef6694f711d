"""The executable spec itself, run through the protocol (it must pass every property)."""

from __future__ import annotations

import reference
from reference import PNMixConfig, ReferenceCache, packing

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
