"""Executable PyTorch spec of PN-Mix (arXiv 2610.19605): one function per equation.

Eq. 2 and Eq. 7: `quantize`, `dequantize`, `asymmetric_params`, `midpoint_params`, `quantize_keys`.
Eq. 6: `pair_norms`, `pair_saliency`, `select_salient_pairs`, `channel_mask_from_pairs`.
Packing (Appendix G): `pack_fields`, `pack_key_codes`, `pack_value_codes`, `pack_mask` and inverses.
Cache-layout plan (which token goes where, what is stored): `CacheLayout`, `token_layout`, `allocation`.
Channel selection rules: `reference.channels.selection`. Online cache (Fig. 1): `ReferenceCache`.
Storage accounting: `storage_model` (sums the layout's table), `measure`, `bit_widths`.
Attention oracle: `attention_ref`.
Per-token precision (TriAxialKV, role-aware PN-Mix): `TokenPrecisionConfig` (its storage plan,
`reference.tokens.config`) and `TokenPrecisionCache`; role tags `reference.tokens.roles`, calibration
`reference.tokens.distortion`, allocation `reference.tokens.allocation`.
"""

from reference import moved as _moved
from reference.channels.cache import ReferenceCache
from reference.channels.config import PNMixConfig
from reference.channels.layout import (
    AppendPlan,
    CacheLayout,
    Component,
    TokenLayout,
    allocation,
    exact_tail,
    token_layout,
)
from reference.channels.selection import SELECTIONS, Selection
from reference.channels.storage import COMPONENTS, BitWidths, StorageReport, bit_widths, measure, storage_model
from reference.equations.attention import attention_ref
from reference.equations.packing import (
    bit_planes,
    block_positions,
    pack_fields,
    pack_key_codes,
    pack_mask,
    pack_value_codes,
    unpack_fields,
    unpack_key_codes,
    unpack_mask,
    unpack_value_codes,
)
from reference.equations.quant import (
    Quantized,
    asymmetric_params,
    dequantize,
    encode,
    group_min_max,
    group_params,
    midpoint_params,
    quantize,
    quantize_keys,
)
from reference.equations.saliency import (
    channel_mask_from_pairs,
    pair_channels,
    pair_norms,
    pair_saliency,
    prefill_pair_mask,
    select_salient_pairs,
)
from reference.models import MODEL_SHAPES, ModelShape
from reference.tokens.cache import TokenPrecisionCache
from reference.tokens.config import TokenPrecisionConfig

__version__ = "0.1.0"

_moved.install()  # the modules' names before they moved keep importing, for a release

__all__ = [
    "COMPONENTS",
    "MODEL_SHAPES",
    "SELECTIONS",
    "AppendPlan",
    "BitWidths",
    "CacheLayout",
    "Component",
    "ModelShape",
    "PNMixConfig",
    "Quantized",
    "ReferenceCache",
    "Selection",
    "StorageReport",
    "TokenLayout",
    "TokenPrecisionCache",
    "TokenPrecisionConfig",
    "allocation",
    "asymmetric_params",
    "attention_ref",
    "bit_planes",
    "bit_widths",
    "block_positions",
    "channel_mask_from_pairs",
    "dequantize",
    "encode",
    "exact_tail",
    "group_min_max",
    "group_params",
    "measure",
    "midpoint_params",
    "pack_fields",
    "pack_key_codes",
    "pack_mask",
    "pack_value_codes",
    "pair_channels",
    "pair_norms",
    "pair_saliency",
    "prefill_pair_mask",
    "quantize",
    "quantize_keys",
    "select_salient_pairs",
    "storage_model",
    "token_layout",
    "unpack_fields",
    "unpack_key_codes",
    "unpack_mask",
    "unpack_value_codes",
]
