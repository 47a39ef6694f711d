"""The PN-Mix online key/value cache as an executable spec (paper Fig. 1 and Section 5).

Tokens live in three regions, read by attention in this order:
[sinks (exact) | quantized region (packed codes) | residual (exact)].
See `reference.storage.token_layout` for which token goes where.
"""

from __future__ import annotations

import torch

from . import packing, quant, saliency, validation
from .attention import attention_ref
from .config import PNMixConfig, field_width
from .storage import StorageReport, TokenLayout, measure, token_layout


def _cat(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    return torch.cat([old, new], dim=-2)


def empty_quantized_region(
    config: PNMixConfig, batch: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device
) -> dict[str, torch.Tensor]:
    """The packed quantized region holding no token: each tensor is [B, H_kv, 0, last].

    Tensors grow along dim 2 (tokens, or packed token bytes for the key planes).
    """
    d, sd = head_dim, config.scale_dtype
    if config.values_quantized:
        value = (d * field_width(config.value_bits) // 8, torch.uint8)
        value_groups = d // config.value_group(d)
    else:
        value, value_groups = (d, dtype), 0
    lasts = {
        "key_low": (d, torch.uint8),
        "key_high": (config.n_salient_channels(d), torch.uint8),
        "key_scale": (d, sd),
        "key_zero": (d, sd),
        "value_payload": value,
        "value_scale": (value_groups, sd),
        "value_zero": (value_groups, sd),
    }
    return {name: torch.empty(batch, kv_heads, 0, last, dtype=dt, device=device) for name, (last, dt) in lasts.items()}


def held_pair_mask(config: PNMixConfig, stored: torch.Tensor, batch: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """The prefill pair mask [B, H_kv, d/2] a cache holds as `stored`: the unpacked bits (PN-Mix),
    or all False (uniform keys). A per-page selection (Kitty) has no single mask."""
    if config.selection == "page-channels":
        raise AttributeError("a per-page selection (page-channels) has no single pair mask; see page_channel_masks")
    if config.selection == "none":
        return torch.zeros(batch, kv_heads, head_dim // 2, dtype=torch.bool, device=stored.device)
    return packing.unpack_mask(stored, head_dim // 2)


class ReferenceCache:
    """PN-Mix cache for one attention layer: batch B, H_kv KV heads, head_dim d, equal lengths.

    Use `ReferenceCache.from_prefill(q, k, v, config)`, then `append(k, v)` for each new
    token(s) and `attend(q)` for decode attention. A rejected call (ValueError/TypeError)
    leaves the cache exactly as it was: every check runs before any state changes.
    """

    def __init__(self, config: PNMixConfig | None = None) -> None:
        self.config = PNMixConfig() if config is None else config
        if not isinstance(self.config, PNMixConfig):
            raise TypeError(f"config must be a PNMixConfig, got {type(self.config).__name__}")
        self.saliency_computations = 0
        self.length = 0
        self._shape: tuple[int, int, int, int] | None = None  # (B, H_kv, -, d)
        self._dtype: torch.dtype | None = None
        self._device: torch.device | None = None
        # Selection metadata: the packed pair mask [B, H_kv, ceil(d/16)] (PN-Mix), nothing
        # [B, H_kv, 0] (uniform keys) or per-page channel ranks [B, H_kv, pages, d] (Kitty).
        self._mask: torch.Tensor | None = None
        # Exact tokens [B, H_kv, n, d] and the packed quantized region, set up by prefill.
        self._sink_k = self._sink_v = self._res_k = self._res_v = None
        self._q: dict[str, torch.Tensor] = {}

    @classmethod
    def from_prefill(
        cls, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: PNMixConfig | None = None
    ) -> ReferenceCache:
        cache = cls(config)
        cache.prefill(q, k, v)
        return cache

    # -- building -----------------------------------------------------------------------

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Select the salient pairs once from the prompt (Eq. 6), then store the prompt's k, v.

        q: [B, H, T, d], k, v: [B, H_kv, T, d], post-RoPE.
        """
        if self._shape is not None:
            raise RuntimeError("prefill was already called on this cache; create a new cache per sequence")
        validation.check_prefill(q, k, v, self.config)
        b, h, _, d = k.shape
        selection = self.config.selection
        if selection == "prefill-pairs":
            self._mask = packing.pack_mask(saliency.prefill_pair_mask(q, k, self.config))
            self.saliency_computations += 1
        else:
            self._mask = k.new_empty((b, h, 0, d) if selection == "page-channels" else (b, h, 0), dtype=torch.uint8)
        self._shape, self._dtype, self._device = tuple(k.shape), k.dtype, k.device
        self._sink_k, self._sink_v, self._res_k, self._res_v = (k.new_empty(b, h, 0, d) for _ in range(4))
        self._q = empty_quantized_region(self.config, b, h, d, k.dtype, k.device)
        self._store(k, v)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add new tokens k, v [B, H_kv, T_new, d]; the saliency selection is not touched."""
        self._require_prefill()
        for name, t in (("k", k), ("v", v)):
            validation.check_tensor(name, t)
            validation.check_matches_cache(name, t, self._shape, self._dtype, self._device)
        validation.check_kv(k, v, self.config)
        self._store(k, v)

    def _store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        take = min(self.config.n_sink - self._sink_k.shape[-2], k.shape[-2])
        if take:
            self._sink_k = _cat(self._sink_k, k[..., :take, :].clone())
            self._sink_v = _cat(self._sink_v, v[..., :take, :].clone())
        self._res_k = _cat(self._res_k, k[..., take:, :].clone())
        self._res_v = _cat(self._res_v, v[..., take:, :].clone())
        n = self.config.residual_length
        while self._res_k.shape[-2] >= n:
            self._flush(self._res_k[..., :n, :], self._res_v[..., :n, :])
            self._res_k, self._res_v = self._res_k[..., n:, :].clone(), self._res_v[..., n:, :].clone()
        self.length += k.shape[-2]

    def _flush(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize N residual tokens (N / G key groups) and append them to the quantized region."""
        cfg = self.config
        midpoint = cfg.one_bit == "midpoint"
        if cfg.selection == "page-channels":  # Kitty: each page's channels from its own keys
            n_boost = cfg.n_salient_channels(k.shape[-1])
            ranks = saliency.page_channel_ranks(k, cfg.group_size, n_boost)
            self._mask = torch.cat([self._mask, ranks], dim=2)
            self.saliency_computations += ranks.shape[2]
            mask = ranks < n_boost
        else:
            mask = self.channel_mask
        keys = quant.quantize_keys(k, mask, cfg.b_high, cfg.b_low, cfg.group_size, cfg.scale_dtype, midpoint)
        low, high = packing.pack_key_codes(keys.codes, mask, cfg.b_high, cfg.b_low)
        new = {"key_low": low, "key_high": high, "key_scale": keys.scale, "key_zero": keys.zero}
        if cfg.values_quantized:
            vg = cfg.value_group(v.shape[-1])
            values = quant.quantize(v, cfg.value_bits, vg, -1, cfg.scale_dtype, midpoint)
            new |= {
                "value_payload": packing.pack_value_codes(values.codes, cfg.value_bits),
                "value_scale": values.scale,
                "value_zero": values.zero,
            }
        else:
            new["value_payload"] = v.clone()
        for name, t in new.items():
            self._q[name] = _cat(self._q[name], t)

    # -- reading ------------------------------------------------------------------------

    @property
    def layout(self) -> TokenLayout:
        return token_layout(self.config, self.length)

    @property
    def pair_mask(self) -> torch.Tensor:
        """Salient RoPE pairs chosen at prefill: bool [B, H_kv, d/2] (all False for uniform keys)."""
        self._require_prefill()
        b, h, _, d = self._shape
        return held_pair_mask(self.config, self._mask, b, h, d)

    @property
    def channel_mask(self) -> torch.Tensor:
        """Channels quantized with b_high bits: bool [B, H_kv, d]."""
        return saliency.channel_mask_from_pairs(self.pair_mask, self.config.pair_layout)

    def page_channel_masks(self) -> torch.Tensor:
        """Channels with b_high bits in each quantized page of G tokens: bool [B, H_kv, T_q / G, d]."""
        self._require_prefill()
        cfg = self.config
        if cfg.selection == "page-channels":
            return self._mask < cfg.n_salient_channels(self._shape[-1])
        return self.channel_mask.unsqueeze(2).expand(-1, -1, self._q["key_scale"].shape[2], -1)

    def packed(self) -> dict[str, torch.Tensor]:
        """The packed quantized region (layouts in `reference.packing`); [B, H_kv, 0, .] before a flush."""
        self._require_prefill()
        return dict(self._q)

    def key_codes(self) -> quant.Quantized:
        """Key codes [B, H_kv, T_q, d] and scale/zero [B, H_kv, T_q / G, d] of the quantized region."""
        cfg = self.config
        p = self.packed()
        codes = packing.unpack_key_codes(p["key_low"], p["key_high"], self.page_channel_masks(), cfg.b_high, cfg.b_low)
        return quant.Quantized(codes, p["key_scale"], p["key_zero"])

    def value_codes(self) -> quant.Quantized | None:
        """Value codes [B, H_kv, T_q, d] and scale/zero [B, H_kv, T_q, d / value_group]; None if unquantized."""
        if not self.config.values_quantized:
            return None
        p = self.packed()
        codes = packing.unpack_value_codes(p["value_payload"], self.config.value_bits)
        return quant.Quantized(codes, p["value_scale"], p["value_zero"])

    def sinks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact sink keys and values [B, H_kv, min(T, n_sink), d] in the input dtype."""
        self._require_prefill()
        return self._sink_k, self._sink_v

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact residual keys and values [B, H_kv, n_residual, d] in the input dtype."""
        self._require_prefill()
        return self._res_k, self._res_v

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All T cached keys and values, float32 [B, H_kv, T, d]: sinks and residual exact."""
        self._require_prefill()
        cfg = self.config
        d = self._shape[-1]
        k_q = quant.dequantize(self.key_codes(), cfg.group_size, dim=-2)
        if cfg.values_quantized:
            v_q = quant.dequantize(self.value_codes(), cfg.value_group(d), dim=-1)
        else:
            v_q = self.packed()["value_payload"].float()
        k = torch.cat([self._sink_k.float(), k_q, self._res_k.float()], dim=-2)
        v = torch.cat([self._sink_v.float(), v_q, self._res_v.float()], dim=-2)
        return k, v

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """Decode attention of new queries q [B, H, T_new, d] over the whole cache -> [B, H, T_new, d].

        The queries are the last T_new cached positions (causal, bottom-right aligned);
        scaling 1/sqrt(d), float32 softmax, GQA head h reads KV head h // (H / H_kv).
        """
        self._require_prefill()
        b, h, _, d = self._shape
        validation.check_query(q, b, h, d, self._dtype, self._device, self.length)
        k, v = self.dequantize()
        return attention_ref(q, k, v, causal=True, upcast=True)

    def storage(self) -> StorageReport:
        """Bytes of every tensor this cache persists, by component (measured, not modelled)."""
        self._require_prefill()
        p = self.packed()
        return measure(
            {
                **p,
                "sink_key": self._sink_k,
                "sink_value": self._sink_v,
                "residual_key": self._res_k,
                "residual_value": self._res_v,
                "mask": self._mask,
            }
        )

    def _require_prefill(self) -> None:
        if self._shape is None:
            raise RuntimeError("the cache is empty: call prefill(q, k, v) first")
