"""Triton kernels of PN-Mix. Importing this package decides compiled vs interpreted (pnmix._runtime)."""

from .. import _runtime  # noqa: F401  (must run before any triton.jit below)
from .append import append_rows
from .attention import decode_attention
from .quantize import dequantize_plane, encode_pack, group_params

__all__ = ["append_rows", "decode_attention", "dequantize_plane", "encode_pack", "group_params"]
