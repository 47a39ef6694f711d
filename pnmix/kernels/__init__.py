"""Triton kernels of PN-Mix. Importing this package decides compiled vs interpreted (pnmix._runtime)."""

from pnmix import _runtime  # noqa: F401  (must run before any triton.jit below)
from pnmix.kernels.append import append_rows
from pnmix.kernels.attention import decode_attention
from pnmix.kernels.quantize import dequantize_plane, encode_pack, group_params

__all__ = ["append_rows", "decode_attention", "dequantize_plane", "encode_pack", "group_params"]
