"""Per-token precision: TriAxialKV's quantizer (arXiv 2605.17170), with exact storage accounting.

Each token of a sequence has a precision, 2 or 4 bits (its tag's, from `reference.bit_allocation`).
Quantization is asymmetric (Eq. 2, `reference.quant`'s numerics) in groups of G = 32:

- 4-bit tokens: keys and values per token, in groups of G channels;
- 2-bit tokens: values per token, in groups of G channels; keys per channel over groups of G
  2-bit tokens taken in order of position (the paper's INT2 pages, stored before the INT4 ones);
- leftover: the 2-bit tokens past the last whole group of G keep their keys on the 4-bit per-token
  path instead of a full-precision residual (their values stay 2-bit: per token, values need no
  group of tokens). This project's reading of the paper's rule, stated here.

Attention does not depend on the order keys are stored in once RoPE has been applied, so the
record keeps each class with the positions of its tokens and `dequantize` puts them back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .attention import attention_ref
from .quant import Quantized, dequantize, quantize

PRECISIONS = (2, 4)
GROUP = 32


@dataclass(frozen=True)
class TokenPrecisionKV:
    """One sequence's keys and values [H, T, d] stored at per-token precision (module doc)."""

    length: int
    head_dim: int
    group_size: int
    key_int2: Quantized  # codes [H, n2g, d], scale/zero [H, n2g / G, d]: per channel over 2-bit tokens
    key_int2_positions: torch.Tensor
    key_int4: Quantized  # codes [H, n4k, d], scale/zero [H, n4k, d / G]: per token
    key_int4_positions: torch.Tensor
    value_int2: Quantized
    value_int2_positions: torch.Tensor
    value_int4: Quantized
    value_int4_positions: torch.Tensor

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) [H, T, d] in float32, every token at its position."""
        g = self.group_size
        heads = self.key_int2.codes.shape[0]
        k = torch.empty(heads, self.length, self.head_dim, device=self.key_int2.codes.device)
        v = torch.empty_like(k)
        k[:, self.key_int2_positions] = dequantize(self.key_int2, g, dim=-2)
        k[:, self.key_int4_positions] = dequantize(self.key_int4, g, dim=-1)
        v[:, self.value_int2_positions] = dequantize(self.value_int2, g, dim=-1)
        v[:, self.value_int4_positions] = dequantize(self.value_int4, g, dim=-1)
        return k, v

    def storage_bits(self) -> dict[str, int]:
        """Bits each part holds: codes at exactly their width, scales and zeros in their dtype."""
        out = {}
        for name, bits in (("key_int2", 2), ("key_int4", 4), ("value_int2", 2), ("value_int4", 4)):
            q = getattr(self, name)
            out[name] = q.codes.numel() * bits
            out[name + "_params"] = (q.scale.numel() + q.zero.numel()) * q.scale.element_size() * 8
        return out

    def bits_per_element(self) -> tuple[float, float]:
        """Average (key, value) bits per element, everything stored counted."""
        parts = self.storage_bits()
        elements = self.key_int2.codes.shape[0] * self.length * self.head_dim
        key = sum(v for n, v in parts.items() if n.startswith("key"))
        value = sum(v for n, v in parts.items() if n.startswith("value"))
        return key / elements, value / elements


def quantize_tokens(
    k: torch.Tensor,
    v: torch.Tensor,
    bits: torch.Tensor,
    *,
    group_size: int = GROUP,
    scale_dtype: torch.dtype = torch.float16,
) -> TokenPrecisionKV:
    """Store one sequence's k, v [H, T, d] with bits [T] (2 or 4 per token), as the module doc says."""
    if k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"k and v must both be [H, T, d], got {tuple(k.shape)} and {tuple(v.shape)}")
    _, length, d = k.shape
    if bits.shape != (length,):
        raise ValueError(f"bits must be [{length}] (one precision per token), got shape {tuple(bits.shape)}")
    if not bool(torch.isin(bits, torch.tensor(PRECISIONS)).all()):
        raise ValueError(f"bits must be one of {PRECISIONS} per token, got {sorted(set(bits.tolist()))}")
    if group_size <= 0 or d % group_size:
        raise ValueError(f"group_size ({group_size}) must divide head_dim ({d})")
    if not (bool(torch.isfinite(k).all()) and bool(torch.isfinite(v).all())):
        raise ValueError("k and v must be finite (no NaN or Inf)")
    low, high = torch.nonzero(bits == 2).flatten(), torch.nonzero(bits == 4).flatten()
    grouped = low[: len(low) // group_size * group_size]
    key4 = torch.sort(torch.cat([high, low[len(grouped) :]])).values  # the leftover keys join the 4-bit path

    def per_token(x, positions, b):
        return quantize(x[:, positions], b, group_size, dim=-1, scale_dtype=scale_dtype, midpoint=False)

    return TokenPrecisionKV(
        length,
        d,
        group_size,
        quantize(k[:, grouped], 2, group_size, dim=-2, scale_dtype=scale_dtype, midpoint=False),
        grouped,
        per_token(k, key4, 4),
        key4,
        per_token(v, low, 2),
        low,
        per_token(v, high, 4),
        high,
    )


def tag_distortion(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    token_tags: Sequence[object],
    table: Sequence[object],
    *,
    scale: float | None = None,
    group_size: int = GROUP,
    scale_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """TriAxialKV's calibration measure for one layer and one request: D[i, j], for tag table[i]
    stored at PRECISIONS[j] and every other token exact, the attention-output MSE of the worst
    query head (mean over the prefill's positions and channels; causal float32 attention).

    q: [H, T, d] queries, k, v: [H_kv, T, d] keys and values (after RoPE), token_tags: [T].
    A tag absent from the request gets NaN (the caller averages over the requests that hold it).
    """
    if len(token_tags) != k.shape[1]:
        raise ValueError(f"token_tags must have one tag per token ({k.shape[1]}), got {len(token_tags)}")
    exact = attention_ref(q[None].float(), k[None].float(), v[None].float(), scale=scale, causal=True)[0]
    out = torch.full((len(table), len(PRECISIONS)), float("nan"), dtype=torch.float64)
    for i, tag in enumerate(table):
        idx = torch.tensor([t == tag for t in token_tags]).nonzero().flatten()
        if not len(idx):
            continue
        for j, bits in enumerate(PRECISIONS):
            part = quantize_tokens(k[:, idx], v[:, idx], torch.full((len(idx),), bits), group_size=group_size,
                                   scale_dtype=scale_dtype)  # fmt: skip
            k_hat, v_hat = k.float().clone(), v.float().clone()
            k_hat[:, idx], v_hat[:, idx] = part.dequantize()
            approx = attention_ref(q[None].float(), k_hat[None], v_hat[None], scale=scale, causal=True)[0]
            out[i, j] = float(((approx - exact) ** 2).mean(dim=(1, 2)).max())
    return out


__all__ = ["GROUP", "PRECISIONS", "TokenPrecisionKV", "quantize_tokens", "tag_distortion"]
