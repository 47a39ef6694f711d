"""The PN-Mix online key/value cache as an executable spec (paper Fig. 1 and Section 5).

Tokens live in three regions, read by attention in this order:
[sinks (exact) | quantized region (packed codes) | residual (exact)], for keys and for values;
the values' boundary lies earlier with a sliding value residual (`PNMixConfig.value_residual`).
`reference.channels.layout` decides which token goes where and what is stored; this cache carries it out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator

import torch

from reference.channels import deferred, validation
from reference.channels.config import PNMixConfig
from reference.channels.derived import Derived
from reference.channels.layout import CacheLayout, TokenLayout, token_layout
from reference.channels.stepwise import stepwise_attention
from reference.channels.storage import StorageReport, measure
from reference.equations import packing, quant, saliency
from reference.equations.attention import attention_ref


def _cat(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    return torch.cat([old, new], dim=-2)


@contextlib.contextmanager
def all_or_nothing(cache) -> Iterator[None]:
    """Whatever fails inside the block, `cache` is left as it was: its `checkpoint()` is taken
    before, `roll_back(checkpoint)` runs on any exception, then `release(checkpoint)` in any case."""
    saved = cache.checkpoint()
    try:
        yield
    except BaseException:
        cache.roll_back(saved)
        cache.release(saved)
        raise
    cache.release(saved)


class ReferenceCache:
    """PN-Mix cache for one attention layer: batch B, H_kv KV heads, head_dim d, equal lengths.

    Use `ReferenceCache.from_prefill(q, k, v, config)`, then `append(k, v)` for each new
    token(s) and `attend(q)` for decode attention. The stored tensors are the components of
    its `reference.channels.layout.CacheLayout`, grown exactly; every append carries out the layout's
    plan. A rejected call (ValueError/TypeError) leaves the cache exactly as it was: every
    check runs before any state changes. So does any other failure (out of memory, an
    interrupt): `prefill` and `append` are all or nothing (`all_or_nothing`).
    """

    def __init__(self, config: PNMixConfig | None = None) -> None:
        self.config = PNMixConfig() if config is None else config
        if not isinstance(self.config, PNMixConfig):
            raise TypeError(f"config must be a PNMixConfig, got {type(self.config).__name__}")
        self.saliency_computations = 0
        self.length = 0
        self.cache_layout: CacheLayout | None = None  # set by prefill
        # Every component of the layout by name (see CacheLayout.components); "mask" holds the
        # selection metadata: a packed pair mask, nothing, or per-page channel ranks.
        self._t: dict[str, torch.Tensor] = {}
        # The quantized region read back from its packed bytes, float32 [B, H_kv, T_q (T_vq), d]: each page
        # is unpacked and dequantized once, when it flushes (its codes never change), so that a decode step
        # costs what an exact cache's does plus the new tokens' work. 8 bytes per cached element more than
        # the packed region, derived state (`Derived`): `storage()` and the conformance suite judge the packed ones.
        self._read_back = Derived()
        # Where torch.compile traces a call, reading an input back to judge it would break the graph: the value
        # checks of such calls run on the device into these flags (`reference.channels.deferred`) and are read
        # by `check()`, which every call made outside compiled code runs first.
        self._flags: torch.Tensor | None = None
        self._failure: str | None = None

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
        if self.cache_layout is not None:
            raise RuntimeError("prefill was already called on this cache; create a new cache per sequence")
        validation.check_prefill(q, k, v, self.config)
        b, h, _, d = k.shape
        with all_or_nothing(self):
            layout = CacheLayout(self.config, b, h, d, k.dtype)
            tensors = layout.allocate(k.device)
            tensors["mask"] = layout.selection.at_prefill(q, k, self.config)
            self.saliency_computations += layout.selection.prefill_evaluations
            self.cache_layout, self._t = layout, tensors
            self._read_back = Derived({name: torch.empty(b, h, 0, d, device=k.device) for name in ("key", "value")})
            self._store(k, v)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add new tokens k, v [B, H_kv, T_new, d]; the saliency selection is not touched."""
        self._require_prefill()
        traced = self._checked()
        for name, t in (("k", k), ("v", v)):
            validation.check_tensor(name, t)
            validation.check_matches_cache(name, t, self._shape, self.cache_layout.dtype, self._device)
        validation.check_kv(k, v, self.config, values=not traced)
        if traced:
            self._defer(k=k, v=v)
        with all_or_nothing(self):
            self._store(k, v)

    def _checked(self) -> bool:
        """True where torch.compile traces this call (its value checks are then deferred); otherwise the checks
        deferred so far are read first (`check`)."""
        if torch.compiler.is_compiling():
            return True
        self.check()
        return False

    def _defer(self, **inputs: torch.Tensor) -> None:
        if self._flags is None:
            self._flags = deferred.new_flags(self._device)
        deferred.watch(self._flags, **inputs)

    def check(self) -> None:
        """Read the value checks deferred while torch.compile traced this cache's calls (one device->host read;
        nothing to read otherwise): ValueError naming the first bad argument, after which the cache, which
        stored it, refuses further use. Every call made outside compiled code runs it first."""
        if self._failure is not None:
            raise ValueError(self._failure)
        if self._flags is not None and (found := deferred.problem(self._flags[1].tolist(), self.config, "check()")):
            self._failure = found
            raise ValueError(found)

    def checkpoint(self) -> tuple:
        """The state now, to return to with `roll_back`. Updates replace tensors and never write into
        them, so the state is the counts and the dict of tensors, saved by reference."""
        return self.length, self.saliency_computations, self.cache_layout, dict(self._t), dict(self._read_back)

    def roll_back(self, saved: tuple) -> None:
        self.length, self.saliency_computations, self.cache_layout = saved[:3]
        self._t, self._read_back = dict(saved[3]), Derived(saved[4])

    def release(self, saved: tuple) -> None:
        """Nothing to drop: a checkpoint is references only (the same calls as `pnmix.PNMixCache`)."""

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows `index` ([B'] integers in [0, B), rows may repeat), in that order: beam search's
        reorder, and a batch's expansion or selection. Every row's cache is its own (selection, groups and
        scales are per row), so each kept row is what that row's cache was; all or nothing."""
        self._require_prefill()
        index = validation.check_rows("index", index, self.cache_layout.batch).to(self._device)
        t = {name: x.index_select(0, index) for name, x in self._t.items()}
        read_back = Derived({name: x.index_select(0, index) for name, x in self._read_back.items()})
        layout = dataclasses.replace(self.cache_layout, batch=index.numel())
        self.cache_layout, self._t, self._read_back = layout, t, read_back

    def _store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Carry out the layout's plan for k, v: sinks, then whole residual key pages flushed in
        order, and the values leaving their residual (with the keys, or one by one past a sliding window)."""
        step = self.cache_layout.plan(self.length, k.shape[-2])
        t, s, n = self._t, step.to_sink, self.config.residual_length
        t["sink_key"] = _cat(t["sink_key"], k[..., :s, :].clone())
        t["sink_value"] = _cat(t["sink_value"], v[..., :s, :].clone())
        queue_k, queue_v = _cat(t["residual_key"], k[..., s:, :]), _cat(t["residual_value"], v[..., s:, :])
        for page in range(step.pages(n)):
            self._flush_keys(queue_k[..., page * n : (page + 1) * n, :])
        self._flush_values(queue_v[..., : step.value_flush, :])
        t["residual_key"] = queue_k[..., step.flush :, :].clone()
        t["residual_value"] = queue_v[..., step.value_flush :, :].clone()
        self.length = step.after.length

    def _flush_keys(self, k: torch.Tensor) -> None:
        """Quantize one page of N residual keys (N / G key groups) onto the quantized region."""
        cfg, t = self.config, self._t
        midpoint = cfg.one_bit == "midpoint"
        chosen = self.cache_layout.selection.for_groups(k, cfg)  # Kitty: this page's channels, from its own keys
        if chosen is not None:
            t["mask"] = torch.cat([t["mask"], chosen], dim=2)
            self.saliency_computations += chosen.shape[2]
        new_groups = k.shape[-2] // cfg.group_size
        mask = self._group_masks(t["key_scale"].shape[2] + new_groups)[:, :, -new_groups:]
        keys = quant.quantize_keys(k, mask, cfg.b_high, cfg.b_low, cfg.group_size, cfg.scale_dtype, midpoint)
        low, high = packing.pack_key_codes(keys.codes, mask, cfg.b_high, cfg.b_low)
        for name, x in {"key_low": low, "key_high": high, "key_scale": keys.scale, "key_zero": keys.zero}.items():
            t[name] = _cat(t[name], x)
        stored = quant.Quantized(
            packing.unpack_key_codes(low, high, mask, cfg.b_high, cfg.b_low), keys.scale, keys.zero
        )
        self._read_back["key"] = _cat(self._read_back["key"], quant.dequantize(stored, cfg.group_size, dim=-2))

    def _flush_values(self, v: torch.Tensor) -> None:
        """Quantize values [B, H_kv, n, d] (per token, so any n) onto the quantized region."""
        cfg, t = self.config, self._t
        if cfg.values_quantized:
            vg = cfg.value_group(v.shape[-1])
            values = quant.quantize(v, cfg.value_bits, vg, -1, cfg.scale_dtype, cfg.one_bit == "midpoint")
            new = {
                "value_payload": packing.pack_value_codes(values.codes, cfg.value_bits),
                "value_scale": values.scale,
                "value_zero": values.zero,
            }
            codes = packing.unpack_value_codes(new["value_payload"], cfg.value_bits)
            read_back = quant.dequantize(quant.Quantized(codes, values.scale, values.zero), vg, dim=-1)
        else:
            new = {"value_payload": v.clone()}
            new["value_scale"] = new["value_zero"] = v.new_empty(*v.shape[:-1], 0, dtype=cfg.scale_dtype)
            read_back = new["value_payload"].float()
        for name, x in new.items():
            t[name] = _cat(t[name], x)
        self._read_back["value"] = _cat(self._read_back["value"], read_back)

    # -- reading ------------------------------------------------------------------------

    @property
    def _shape(self) -> tuple[int, int, int, int]:
        lay = self.cache_layout
        return (lay.batch, lay.kv_heads, self.length, lay.head_dim)

    @property
    def _device(self) -> torch.device:
        return self._t["sink_key"].device

    @property
    def layout(self) -> TokenLayout:
        """Where the tokens held live (`reference.channels.layout.TokenLayout`)."""
        return token_layout(self.config, self.length)

    def _group_masks(self, n_groups: int) -> torch.Tensor:
        return self.cache_layout.selection.group_masks(self._t["mask"], self.config, self._shape[-1], n_groups)

    @property
    def pair_mask(self) -> torch.Tensor:
        """Salient RoPE pairs chosen at prefill: bool [B, H_kv, d/2] (all False for uniform keys)."""
        self._require_prefill()
        return self.cache_layout.selection.pair_mask(self._t["mask"], self._shape[-1])

    @property
    def channel_mask(self) -> torch.Tensor:
        """Channels quantized with b_high bits: bool [B, H_kv, d]."""
        return saliency.channel_mask_from_pairs(self.pair_mask, self.config.pair_layout)

    def page_channel_masks(self) -> torch.Tensor:
        """Channels with b_high bits in each quantized group of G tokens: bool [B, H_kv, T_q / G, d]."""
        self._require_prefill()
        return self._group_masks(self._t["key_scale"].shape[2])

    def packed(self) -> dict[str, torch.Tensor]:
        """The packed quantized region (layouts in `reference.equations.packing`); [B, H_kv, 0, .] before a flush.
        The cache's own tensors, not copies: read them, never write them."""
        self._require_prefill()
        return {c.name: self._t[c.name] for c in self.cache_layout.components if c.region == "quantized"}

    def key_codes(self) -> quant.Quantized:
        """Key codes [B, H_kv, T_q, d] and scale/zero [B, H_kv, T_q / G, d] of the quantized region."""
        cfg = self.config
        p = self.packed()
        codes = packing.unpack_key_codes(p["key_low"], p["key_high"], self.page_channel_masks(), cfg.b_high, cfg.b_low)
        return quant.Quantized(codes, p["key_scale"].clone(), p["key_zero"].clone())

    def value_codes(self) -> quant.Quantized | None:
        """Value codes [B, H_kv, T_vq, d] and scale/zero [B, H_kv, T_vq, d / value_group] (T_vq the layout's
        n_value_quantized); None if unquantized."""
        if not self.config.values_quantized:
            return None
        p = self.packed()
        codes = packing.unpack_value_codes(p["value_payload"], self.config.value_bits)
        return quant.Quantized(codes, p["value_scale"].clone(), p["value_zero"].clone())

    def sinks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact sink keys and values [B, H_kv, min(T, n_sink), d] in the input dtype (copies)."""
        self._require_prefill()
        return self._t["sink_key"].clone(), self._t["sink_value"].clone()

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact residual keys [B, H_kv, n_residual, d] and values [B, H_kv, n_value_residual, d],
        in the input dtype (copies)."""
        self._require_prefill()
        return self._t["residual_key"].clone(), self._t["residual_value"].clone()

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All T cached keys and values, float32 [B, H_kv, T, d]: sinks and residual exact, the quantized
        region as its packed bytes read back (Eq. 2 / Eq. 7 inverted: `key_codes`, `value_codes`), each
        page once, when it flushed."""
        self._require_prefill()
        t, back = self._t, self._read_back
        k = torch.cat([t["sink_key"].float(), back["key"], t["residual_key"].float()], dim=-2)
        v = torch.cat([t["sink_value"].float(), back["value"], t["residual_value"].float()], dim=-2)
        return k, v

    def attend(self, q: torch.Tensor, *, scale: float | None = None, softcap: float | None = None) -> torch.Tensor:
        """Decode attention of new queries q [B, H, T_new, d] over the whole cache -> [B, H, T_new, d].

        The queries are the last T_new cached positions (causal, bottom-right aligned);
        scaling 1/sqrt(d) unless `scale` is given, float32 softmax, GQA head h reads KV head
        h // (H / H_kv); softcap: logits softcapped as a model asks (`attention_ref`).
        """
        self._check_query(q)
        k, v = self.dequantize()
        for name, x in (("scale", scale), ("softcap", softcap)):
            if x is not None and not (isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf):
                raise ValueError(f"{name} must be a positive finite number or None, got {x!r}")
        return attention_ref(q, k, v, scale=scale, causal=True, upcast=True, softcap=softcap)

    def attend_stepwise(
        self,
        q: torch.Tensor,
        exact_keys: torch.Tensor,
        exact_values: torch.Tensor,
        *,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """What `attend` gives each of the newest T_new tokens had they been appended one at a time,
        each query attending right after its own token (`reference.channels.stepwise`): query j
        (position t = T - T_new + j) reads the tokens quantized at length t + 1 (`token_layout`) from
        this cache, whose codes do not change once written, and the rest exact. Teacher-forced decoding
        over chunks of tokens then costs one append per chunk and reads what token-by-token decoding
        reads, given the same keys and values; a model computes a chunk's keys with other float sums
        than one token's, so a key on a quantization boundary may take the neighbouring code at its
        flush, the one difference (`pnmix/tests/test_hf_models.py`: every differing code is within
        0.01 of a boundary).

        exact_keys / exact_values: [B, H_kv, m, d], the exact keys / values of the newest m tokens,
        enough to reach back to the first position some query still sees exact (the residual
        before the chunk and the chunk itself do).
        """
        self._check_query(q)
        k_hat, v_hat = self.dequantize()
        return stepwise_attention(self.config, q, k_hat, v_hat, exact_keys, exact_values, scale=scale, softcap=softcap)

    def _check_query(self, q: torch.Tensor) -> None:
        """The queries of `attend` / `attend_stepwise` against the cache (shape, dtype, device, at most as many as
        it holds); their values now, or, in a call torch.compile traces, on the device until `check()`."""
        self._require_prefill()
        b, h, t_all, d = self._shape
        traced = self._checked()
        validation.check_query(q, b, h, d, self.cache_layout.dtype, self._device, t_all, values=not traced)
        if traced:
            self._defer(q=q)

    def storage(self) -> StorageReport:
        """Bytes of every tensor this cache persists, by component (measured, not modelled)."""
        self._require_prefill()
        return measure(self._t)

    def _require_prefill(self) -> None:
        if self.cache_layout is None:
            raise RuntimeError("the cache is empty: call prefill(q, k, v) first")
