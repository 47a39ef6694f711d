"""Everything an adapter needs, from one module that does not move.

    from reference.adapter import Capabilities, PNMixConfig, StorageReport, check_prefill, ...

An adapter (an implementation plugged into the conformance suite, the benchmarks and the report through
`--impl package.module:factory` or the entry-point group `ENTRY_POINT_GROUP`) imports only from here: the
protocol (`Capabilities`, `Cache`, `TokenCache`), the configurations it is handed, the storage report it
returns, the input checks whose errors the suite expects (each names the argument and what was expected),
the layout of the exact tail, the storage format's pack/unpack functions, the attention oracle and the
presets of the baselines. The names here stay for as long as this module exists; where the spec's modules
move, their old names keep importing for a release with a `DeprecationWarning` (`reference.moved`).
`conformance/impls/template.py` is an adapter written this way.
"""

from __future__ import annotations

from reference.channels.config import KEY_BITS, VALUE_BITS, PNMixConfig
from reference.channels.layout import CacheLayout, exact_tail, token_layout
from reference.channels.storage import StorageReport, bit_widths, storage_model
from reference.channels.validation import (
    INPUT_DTYPES,
    check_finite,
    check_kv,
    check_matches_cache,
    check_prefill,
    check_quantizable,
    check_query,
    check_query_heads,
    check_same,
    check_tensor,
)
from reference.contract import (
    ATTENTION,
    BIT_EXACT,
    ENTRY_POINT_GROUP,
    REQUIRED,
    RESIDUAL_POLICIES,
    Cache,
    Capabilities,
    Derived,
    TokenCache,
    missing_names,
    variant,
)
from reference.equations.attention import attention_ref
from reference.equations.packing import (
    pack_key_codes,
    pack_mask,
    pack_value_codes,
    unpack_key_codes,
    unpack_mask,
    unpack_value_codes,
)
from reference.equations.quant import Quantized
from reference.methods import fp16_preset, kitty_preset, kivi_preset
from reference.tokens.config import TokenPrecisionConfig

__all__ = [
    "ATTENTION",
    "BIT_EXACT",
    "ENTRY_POINT_GROUP",
    "INPUT_DTYPES",
    "KEY_BITS",
    "REQUIRED",
    "RESIDUAL_POLICIES",
    "VALUE_BITS",
    "Cache",
    "CacheLayout",
    "Capabilities",
    "Derived",
    "PNMixConfig",
    "Quantized",
    "StorageReport",
    "TokenCache",
    "TokenPrecisionConfig",
    "attention_ref",
    "bit_widths",
    "check_finite",
    "check_kv",
    "check_matches_cache",
    "check_prefill",
    "check_quantizable",
    "check_query",
    "check_query_heads",
    "check_same",
    "check_tensor",
    "exact_tail",
    "fp16_preset",
    "kitty_preset",
    "kivi_preset",
    "missing_names",
    "pack_key_codes",
    "pack_mask",
    "pack_value_codes",
    "storage_model",
    "token_layout",
    "unpack_key_codes",
    "unpack_mask",
    "unpack_value_codes",
    "variant",
]
