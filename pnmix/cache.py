"""`PNMixCache`: the PN-Mix key/value cache on Triton kernels, dynamic or preallocated.

Same behaviour as `reference.ReferenceCache` (the spec), bit for bit in what it stores.
Everything persistent lives in `_Rows` buffers plus the bit-packed pair mask, so the storage
report is measured from the tensors actually held. Derived metadata (per-channel bits, the
salient-channel index) is rebuilt from the mask when a page is flushed, never stored.
"""

from __future__ import annotations

import torch

from reference import PNMixConfig, StorageReport, TokenLayout, measure, saliency, token_layout, validation
from reference import packing as spec_packing
from reference.cache import held_pair_mask
from reference.config import field_width
from reference.quant import Quantized
from reference.storage import allocation

from . import _runtime
from .kernels import decode_attention, dequantize_plane, encode_pack, group_params
from .kernels.attention import PackedRegion


class _Rows:
    """A [B, H, rows, cols] buffer that grows along rows: exact-size, or preallocated to `capacity` rows."""

    def __init__(self, b: int, h: int, cols: int, dtype, device, capacity: int | None) -> None:
        self.static = capacity is not None
        self.data = torch.empty(b, h, capacity or 0, cols, dtype=dtype, device=device)
        self.used = 0

    def view(self) -> torch.Tensor:
        return self.data[:, :, : self.used]

    def grow(self, n: int) -> torch.Tensor:
        """Room for n more rows, returned as the view to write them into."""
        if self.static:
            if self.used + n > self.data.shape[2]:
                raise AssertionError("capacity was checked before any write")
        else:
            new = torch.empty(*self.data.shape[:2], self.used + n, self.data.shape[3], dtype=self.data.dtype,
                              device=self.data.device)  # fmt: skip
            new[:, :, : self.used] = self.view()
            self.data = new
        self.used += n
        return self.data[:, :, self.used - n : self.used]

    def replace(self, rows: torch.Tensor) -> None:
        """Hold exactly `rows` (the residual after a flush)."""
        if self.static:
            self.data[:, :, : rows.shape[2]] = rows
        else:
            self.data = rows.clone()
        self.used = rows.shape[2]


class PNMixCache:
    """PN-Mix cache for one attention layer (batch of equal-length sequences).

    max_cache_len preallocates every buffer once (the paper's static protocol); appending past
    it raises ValueError. Without it buffers grow exactly. float16 and bfloat16 inputs (the
    spec's ReferenceCache also takes float32); the kernels run compiled on CUDA or under the
    Triton interpreter on the CPU (pnmix._runtime).
    """

    def __init__(self, config: PNMixConfig | None = None, *, max_cache_len: int | None = None) -> None:
        self.config = PNMixConfig() if config is None else config
        if not isinstance(self.config, PNMixConfig):
            raise TypeError(f"config must be a PNMixConfig, got {type(self.config).__name__}")
        if max_cache_len is not None and (
            isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 1
        ):
            raise ValueError(f"max_cache_len must be a positive int or None, got {max_cache_len!r}")
        self.capacity = max_cache_len
        self.saliency_computations = 0
        self.length = 0
        self._shape = None  # (B, H_kv, d)
        self._dtype = self._device = None
        self._mask = None

    @classmethod
    def from_prefill(cls, q, k, v, config: PNMixConfig | None = None, **kwargs) -> PNMixCache:
        cache = cls(config, **kwargs)
        cache.prefill(q, k, v)
        return cache

    # -- building -----------------------------------------------------------------------

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Eq. 6 once from the prompt's post-RoPE q [B, H, T, d] and k [B, H_kv, T, d], then store k, v."""
        if self._shape is not None:
            raise RuntimeError("prefill was already called on this cache; create a new cache per sequence")
        for name, t in (("q", q), ("k", k), ("v", v)):
            validation.check_tensor(name, t)
            _runtime.check_device(name, t)
        validation.check_prefill(q, k, v, self.config)
        if k.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(
                f"k must be float16 or bfloat16 for PNMixCache, got {k.dtype} (ReferenceCache takes float32)"
            )
        self._check_capacity(k.shape[2])
        cfg = self.config
        b, h, _, d = k.shape
        if cfg.selection == "prefill-pairs":
            self._mask = spec_packing.pack_mask(saliency.prefill_pair_mask(q, k, cfg))
            self.saliency_computations += 1
        else:
            self._mask = k.new_empty((b, h, 0), dtype=torch.uint8)
        self._shape, self._dtype, self._device = (b, h, d), k.dtype, k.device
        alloc = allocation(cfg, 0, self.capacity)
        n_sal = cfg.n_salient_channels(d)
        rows = lambda n, w: n * w // 8 if self.capacity else None  # noqa: E731
        cap = lambda n: n if self.capacity else None  # noqa: E731
        new = lambda cols, dtype, capacity: _Rows(b, h, cols, dtype, k.device, capacity)  # noqa: E731
        sd, nq = cfg.scale_dtype, alloc.n_quantized
        self._sink_k, self._sink_v = new(d, k.dtype, cap(alloc.n_sink)), new(d, k.dtype, cap(alloc.n_sink))
        self._res_k, self._res_v = new(d, k.dtype, cap(alloc.n_residual)), new(d, k.dtype, cap(alloc.n_residual))
        self._q = {
            "key_low": new(d, torch.uint8, rows(nq, field_width(cfg.b_low))),
            "key_high": new(n_sal, torch.uint8, rows(nq, field_width(cfg.b_high - cfg.b_low))),
            "key_scale": new(d, sd, cap(nq // cfg.group_size)),
            "key_zero": new(d, sd, cap(nq // cfg.group_size)),
        }
        if cfg.selection == "page-channels":  # Kitty's per-page channel ranks, d bytes a page
            self._mask = new(d, torch.uint8, cap(nq // cfg.group_size))
        if cfg.values_quantized:
            groups = d // cfg.value_group(d)
            self._q["value_payload"] = new(d * field_width(cfg.value_bits) // 8, torch.uint8, cap(nq))
            self._q["value_scale"] = new(groups, sd, cap(nq))
            self._q["value_zero"] = new(groups, sd, cap(nq))
        else:
            self._q["value_payload"] = new(d, k.dtype, cap(nq))
            self._q["value_scale"] = new(0, sd, cap(nq))
            self._q["value_zero"] = new(0, sd, cap(nq))
        self._store(k, v)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add k, v [B, H_kv, T_new, d]; full residual pages are quantized and packed in place."""
        self._require_prefill()
        b, h, d = self._shape
        for name, t in (("k", k), ("v", v)):
            validation.check_tensor(name, t)
            validation.check_matches_cache(name, t, (b, h, 0, d), self._dtype, self._device)
        validation.check_kv(k, v, self.config)
        self._check_capacity(self.length + k.shape[2])
        self._store(k, v)

    def _check_capacity(self, length: int) -> None:
        if self.capacity is not None and length > self.capacity:
            raise ValueError(
                f"k would make the cache hold {length} tokens, past its capacity max_cache_len={self.capacity}"
            )

    def _store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        cfg = self.config
        take = min(cfg.n_sink - self._sink_k.used, k.shape[2])
        if take > 0:
            self._sink_k.grow(take).copy_(k[:, :, :take])
            self._sink_v.grow(take).copy_(v[:, :, :take])
        k, v = k[:, :, take:], v[:, :, take:]
        n = cfg.residual_length
        if self._res_k.used + k.shape[2] < n:  # the decode path: no page completes
            if k.shape[2]:
                self._res_k.grow(k.shape[2]).copy_(k)
                self._res_v.grow(v.shape[2]).copy_(v)
        else:
            all_k = torch.cat([self._res_k.view(), k], dim=2)
            all_v = torch.cat([self._res_v.view(), v], dim=2)
            full = all_k.shape[2] // n * n
            self._flush(all_k[:, :, :full].contiguous(), all_v[:, :, :full].contiguous())
            self._res_k.replace(all_k[:, :, full:])
            self._res_v.replace(all_v[:, :, full:])
        self.length += take + k.shape[2]

    def _selection(self) -> torch.Tensor:
        """The selection metadata tensor as held (pair mask, page ranks, or empty)."""
        return self._mask.data if isinstance(self._mask, _Rows) else self._mask

    def _channel_metadata(self, channel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(bits per channel, salient-channel index, channel -> high-plane column) of a channel mask."""
        cfg = self.config
        bits = torch.where(channel, cfg.b_high, cfg.b_low).to(torch.int32)
        index = spec_packing.salient_channel_index(channel).to(torch.int32).contiguous()
        slot = torch.full(channel.shape, -1, dtype=torch.int32, device=channel.device)
        slot.scatter_(-1, index.long(), torch.arange(index.shape[-1], dtype=torch.int32, device=slot.device)
                      .expand_as(index).contiguous())  # fmt: skip
        return bits, index, slot

    def _flush(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize and pack whole pages k, v [B, H_kv, n * N, d] onto the quantized region."""
        cfg, n = self.config, k.shape[2]
        g, midpoint = cfg.group_size, cfg.one_bit == "midpoint"
        w_lo, w_hi = field_width(cfg.b_low), field_width(cfg.b_high - cfg.b_low)
        q = self._q
        scale, zero = q["key_scale"].grow(n // g), q["key_zero"].grow(n // g)
        low, high = q["key_low"].grow(n * w_lo // 8), q["key_high"].grow(n * w_hi // 8)
        for a, b, channel in self._spans(k):
            bits, index, _ = self._channel_metadata(channel)
            kp, sp, zp = k[:, :, a:b], scale[:, :, a // g : b // g], zero[:, :, a // g : b // g]
            group_params(kp, g, "tokens", bits, sp, zp, midpoint)
            encode_pack(kp, g, "tokens", bits, sp, zp, low[:, :, a * w_lo // 8 : b * w_lo // 8], field_bits=cfg.b_low)
            if cfg.b_high > cfg.b_low:
                encode_pack(kp, g, "tokens", bits, sp, zp, high[:, :, a * w_hi // 8 : b * w_hi // 8],
                            field_bits=cfg.b_high - cfg.b_low, shift=cfg.b_low, colmap=index)  # fmt: skip
        if cfg.values_quantized:
            vg = cfg.value_group(v.shape[-1])
            vs, vz = q["value_scale"].grow(n), q["value_zero"].grow(n)
            group_params(v, vg, "channels", cfg.value_bits, vs, vz, midpoint)
            payload = q["value_payload"].grow(n)
            encode_pack(v, vg, "channels", cfg.value_bits, vs, vz, payload, field_bits=cfg.value_bits)
        else:
            q["value_payload"].grow(n).copy_(v)
            q["value_scale"].grow(n)
            q["value_zero"].grow(n)

    def _spans(self, k: torch.Tensor | None = None):
        """(start, end, channel mask) of token spans sharing one selection: the whole flush, or,
        for Kitty, each page (whose channels are chosen now from k, or read back when k is None)."""
        cfg = self.config
        g = cfg.group_size
        if cfg.selection != "page-channels":
            n = k.shape[2] if k is not None else self._q["key_scale"].used * g
            return [(0, n, self.channel_mask)]
        n_boost = cfg.n_salient_channels(self._shape[2])
        if k is not None:
            ranks = saliency.page_channel_ranks(k, g, n_boost)
            self._mask.grow(ranks.shape[2]).copy_(ranks)
            self.saliency_computations += ranks.shape[2]
        else:
            ranks = self._mask.view()
        return [(p * g, (p + 1) * g, ranks[:, :, p] < n_boost) for p in range(ranks.shape[2])]

    # -- reading ------------------------------------------------------------------------

    @property
    def layout(self) -> TokenLayout:
        return token_layout(self.config, self.length)

    @property
    def pair_mask(self) -> torch.Tensor:
        self._require_prefill()
        return held_pair_mask(self.config, self._selection(), *self._shape)

    @property
    def channel_mask(self) -> torch.Tensor:
        return saliency.channel_mask_from_pairs(self.pair_mask, self.config.pair_layout)

    def packed(self) -> dict[str, torch.Tensor]:
        """The used part of the packed quantized region, in the `reference.packing` layouts."""
        self._require_prefill()
        return {name: rows.view() for name, rows in self._q.items()}

    def _unpack(self, codes: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        cfg = self.config
        b, h, d = self._shape
        n_q = self._q["key_scale"].used * cfg.group_size
        dtype = torch.uint8 if codes else torch.float32
        p = self.packed()
        keys = torch.empty(b, h, n_q, d, dtype=dtype, device=self._device)
        g, w_lo, w_hi = cfg.group_size, field_width(cfg.b_low), field_width(cfg.b_high - cfg.b_low)
        for a, e, channel in self._spans():
            _, _, slot = self._channel_metadata(channel)
            dequantize_plane(p["key_low"][:, :, a * w_lo // 8 : e * w_lo // 8], p["key_scale"][:, :, a // g : e // g],
                             p["key_zero"][:, :, a // g : e // g], keys[:, :, a:e], group=g, along="tokens",
                             low_bits=cfg.b_low, high=p["key_high"][:, :, a * w_hi // 8 : e * w_hi // 8],
                             high_bits=cfg.b_high - cfg.b_low, slot=slot, codes=codes)  # fmt: skip
        if not cfg.values_quantized:
            return keys, None if codes else p["value_payload"].float()
        values = torch.empty(b, h, n_q, d, dtype=dtype, device=self._device)
        dequantize_plane(p["value_payload"], p["value_scale"], p["value_zero"], values, group=cfg.value_group(d),
                         along="channels", low_bits=cfg.value_bits, codes=codes)  # fmt: skip
        return keys, values

    def key_codes(self) -> Quantized:
        p = self.packed()
        return Quantized(self._unpack(codes=True)[0], p["key_scale"].clone(), p["key_zero"].clone())

    def value_codes(self) -> Quantized | None:
        if not self.config.values_quantized:
            return None
        p = self.packed()
        return Quantized(self._unpack(codes=True)[1], p["value_scale"].clone(), p["value_zero"].clone())

    def sinks(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return self._sink_k.view(), self._sink_v.view()

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return self._res_k.view(), self._res_v.view()

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All cached keys and values, float32 [B, H_kv, T, d] (for fidelity studies and debugging)."""
        self._require_prefill()
        k_q, v_q = self._unpack(codes=False)
        k = torch.cat([self._sink_k.view().float(), k_q, self._res_k.view().float()], dim=2)
        v = torch.cat([self._sink_v.view().float(), v_q, self._res_v.view().float()], dim=2)
        return k, v

    def attend(self, q: torch.Tensor, *, num_splits: int | None = None) -> torch.Tensor:
        """Causal decode attention of q [B, H, T_new, d] (the last T_new positions) -> [B, H, T_new, d]."""
        self._require_prefill()
        b, h, d = self._shape
        validation.check_query(q, b, h, d, self._dtype, self._device, self.length)
        cfg = self.config
        p = self.packed()
        region = PackedRegion(
            self._sink_k.data, self._sink_v.data, self._res_k.data, self._res_v.data, p["key_low"],
            p["key_high"], p["key_scale"], p["key_zero"], self._selection(), p["value_payload"], p["value_scale"],
            p["value_zero"],
        )  # fmt: skip
        return decode_attention(
            q, region, n_sink=self._sink_k.used, n_quantized=self._q["key_scale"].used * cfg.group_size,
            length=self.length, group_size=cfg.group_size, value_group=cfg.value_group(d), b_high=cfg.b_high,
            b_low=cfg.b_low, value_bits=cfg.value_bits, pair_layout=cfg.pair_layout, num_splits=num_splits,
            selection=cfg.selection, n_boost=cfg.n_salient_channels(d),
        )  # fmt: skip

    def storage(self) -> StorageReport:
        """Bytes of every buffer this cache holds (allocated, so capacity counts when preallocated)."""
        self._require_prefill()
        return measure(
            {
                **{name: rows.data for name, rows in self._q.items()},
                "sink_key": self._sink_k.data,
                "sink_value": self._sink_v.data,
                "residual_key": self._res_k.data,
                "residual_value": self._res_v.data,
                "mask": self._selection(),
            }
        )

    def _require_prefill(self) -> None:
        if self._shape is None:
            raise RuntimeError("the cache is empty: call prefill(q, k, v) first")
