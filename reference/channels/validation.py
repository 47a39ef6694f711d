"""Input checks shared by every cache implementation: errors name the argument and what was expected."""

from __future__ import annotations

import math

import torch

from reference.channels.config import PNMixConfig, check_head_dim

INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_tensor(name: str, t: object, ndim: int = 4) -> torch.Tensor:
    """A floating [B, H, T, d] tensor of a supported dtype (finiteness is `check_finite`)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims [batch, heads, tokens, head_dim], got shape {tuple(t.shape)}")
    if t.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    return t


def check_rows(name: str, index: object, batch: int) -> torch.Tensor:
    """Batch rows to keep: a 1-D integer tensor of at least one row, each in [0, batch) (rows may repeat)."""
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of batch rows, got {type(index).__name__}")
    if index.dim() != 1 or index.numel() == 0 or index.dtype.is_floating_point or index.dtype == torch.bool:
        raise ValueError(
            f"{name} must be a non-empty 1-D integer tensor of batch rows, got shape {tuple(index.shape)} "
            f"and dtype {index.dtype}"
        )
    low, high = int(index.min()), int(index.max())
    if low < 0 or high >= batch:
        raise ValueError(f"{name} holds rows {low}..{high}; this cache's batch has rows 0..{batch - 1}")
    return index.long()


def check_finite(name: str, t: torch.Tensor) -> None:
    """No NaN or Inf in t (reads the answer back: one device->host sync)."""
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or Inf")


def check_same(names: tuple[str, ...], tensors: tuple[torch.Tensor, ...], what: str) -> None:
    """All tensors share `what` ('dtype' or 'device')."""
    values = [getattr(t, what) for t in tensors]
    if any(v != values[0] for v in values):
        pairs = ", ".join(f"{n}: {v}" for n, v in zip(names, values, strict=True))
        raise ValueError(f"{', '.join(names)} must share one {what}, got {pairs}")


def quantizable_limit(config: PNMixConfig, bits: int) -> float:
    """The largest |x| a group of `bits`-bit codes may hold: its zero must fit the scale/zero
    storage dtype, a 1-bit Eq. 2 scale is the whole range max - min (so half of that dtype's
    largest value), and the range max - min is computed in float32 (so half of float32's)."""
    limit = min(torch.finfo(config.scale_dtype).max, torch.finfo(torch.float32).max / 2)
    if bits == 1 and config.one_bit == "ends":
        limit = min(limit, torch.finfo(config.scale_dtype).max / 2)
    return limit


def check_quantizable(name: str, t: torch.Tensor, config: PNMixConfig, bits: int) -> None:
    """|t| within `quantizable_limit`, or the stored scale or zero would overflow."""
    top = float(t.detach().float().abs().max()) if t.numel() else 0.0
    if top > quantizable_limit(config, bits):
        raise ValueError(_magnitude_message(name, top, config, bits))


def _magnitude_message(name: str, top: float, config: PNMixConfig, bits: int) -> str:
    hint = "; use a wider scale_dtype" if config.scale_dtype == torch.float16 else ""
    return (
        f"{name} has magnitude {top:.4g}, above {quantizable_limit(config, bits):.4g}, the most a "
        f"{bits}-bit group with {config.scale_dtype} scale/zero can hold{hint}"
    )


def value_problem(name: str, top: float, config: PNMixConfig, bits: int | None) -> str | None:
    """What `check_finite` and `check_quantizable` (bits: None, finiteness only) say of a tensor
    whose largest |x| is `top` (NaN or Inf where it holds one), or None where they pass it: the
    verdict of checks reduced on the device and read back later (`pnmix.PNMixCache.check`)."""
    if math.isnan(top) or math.isinf(top):
        return f"{name} contains NaN or Inf"
    if bits is not None and top > quantizable_limit(config, bits):
        return _magnitude_message(name, top, config, bits)
    return None


def check_kv(k: object, v: object, config: PNMixConfig, *, values: bool = True) -> None:
    """Keys and values [B, H_kv, T, d] of one shape, dtype and device, T >= 1; with `values`,
    also `check_kv_values`."""
    check_tensor("k", k)
    check_tensor("v", v)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    check_same(("k", "v"), (k, v), "dtype")
    check_same(("k", "v"), (k, v), "device")
    if k.shape[2] < 1:
        raise ValueError("k and v must hold at least one token (dim 2), got 0")
    for dim, what in ((0, "batch"), (1, "KV heads")):
        if k.shape[dim] < 1:
            raise ValueError(f"k and v must hold at least one sequence and head: {what} (dim {dim}) is 0")
    check_head_dim(config, k.shape[-1])
    if values:
        check_kv_values(k, v, config)


def check_kv_values(k: torch.Tensor, v: torch.Tensor, config: PNMixConfig) -> None:
    """What k and v hold: finite, and within the scale/zero dtype. Unlike the shape checks,
    these read data back to the host, one device->host sync each."""
    check_finite("k", k)
    check_finite("v", v)
    check_quantizable("k", k, config, config.b_low)
    if config.values_quantized:
        check_quantizable("v", v, config, config.value_bits)


def check_prefill(q: object, k: object, v: object, config: PNMixConfig, *, values: bool = True) -> None:
    """Prefill q [B, H, T, d] with k, v [B, H_kv, T, d]; H a multiple of H_kv. values=False
    leaves out the checks that read the data (`check_kv_values`, q finite)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
    check_same(("q", "k", "v"), (q, k, v), "device")
    check_same(("q", "k", "v"), (q, k, v), "dtype")
    check_kv(k, v, config, values=values)
    if values:
        check_finite("q", q)
    check_query_heads(q, k.shape[0], k.shape[1], k.shape[-1])
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must cover the same prefill tokens (dim 2), got {q.shape[2]} and {k.shape[2]}")


def check_query_heads(q: torch.Tensor, batch: int, kv_heads: int, head_dim: int) -> None:
    """q's batch and head_dim match the cache and its heads are a multiple of the KV heads (at least one:
    a prefill chooses the salient pairs from the queries)."""
    if q.shape[1] < 1:
        raise ValueError("q must hold at least one head: q heads (dim 1) is 0")
    if q.shape[0] != batch:
        raise ValueError(f"q batch (dim 0) must be {batch}, got {q.shape[0]}")
    if q.shape[-1] != head_dim:
        raise ValueError(f"q head_dim (dim 3) must be {head_dim}, got {q.shape[-1]}")
    if q.shape[1] % kv_heads:
        raise ValueError(f"q heads (dim 1) must be a multiple of the KV heads ({kv_heads}), got {q.shape[1]}")


def check_matches_cache(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device) -> None:
    """An appended tensor matches the cache's batch, heads, head_dim, dtype and device."""
    if (t.shape[0], t.shape[1], t.shape[3]) != (shape[0], shape[1], shape[3]):
        raise ValueError(
            f"{name} must be [batch={shape[0]}, kv_heads={shape[1]}, tokens, head_dim={shape[3]}] "
            f"like the cache, got {tuple(t.shape)}"
        )
    if t.dtype != dtype:
        raise TypeError(f"{name} must have the cache's dtype {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} must be on the cache's device {device}, got {t.device}")


def check_query(
    q: object, batch: int, kv_heads: int, head_dim: int, dtype, device, length: int, *, values: bool = True
) -> None:
    """New queries q [B, H, T_new, d] for a cache of this shape, dtype and device holding `length`
    tokens; values=False leaves out the finite check (the one that reads q)."""
    check_tensor("q", q)
    check_query_heads(q, batch, kv_heads, head_dim)
    if q.dtype != dtype:
        raise TypeError(f"q must have the cache's dtype {dtype}, got {q.dtype}")
    if q.device != device:
        raise ValueError(f"q must be on the cache's device {device}, got {q.device}")
    if values:
        check_finite("q", q)
    if q.shape[2] > length:
        raise ValueError(f"q has {q.shape[2]} tokens (dim 2) but the cache holds only {length}")
