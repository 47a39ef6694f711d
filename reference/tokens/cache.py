"""The per-token precision cache as an executable spec (TriAxialKV, and role-aware PN-Mix).

`reference.tokens.config` decides what is stored for tokens of each class; this cache carries
it out for one attention layer, a batch of sequences that share their token classes. It holds
exactly the packed tensors the plan lists (`PARTS`), and reads them back to dequantize.
"""

from __future__ import annotations

import torch

from reference.channels import validation
from reference.channels.cache import all_or_nothing
from reference.channels.derived import Derived
from reference.equations import packing, quant
from reference.equations.attention import attention_logits_ref, attention_ref, saturating_cast
from reference.equations.saliency import channel_mask_from_pairs, prefill_pair_mask
from reference.tokens.config import CLASS_MAP, TokenPrecisionConfig, components, part_shape, token_classes

#: The per-token stores, and the config attribute that gives their bits.
PER_TOKEN = {"leftover_key": "high_bits", "high_key": "high_bits", "low_value": "low_bits", "high_value": "high_bits"}


def _cat(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    return torch.cat([old, new], dim=-2)


class TokenPrecisionCache:
    """One layer's cache, every token at its own precision (`reference.tokens.config`).

    `prefill(q, k, v, token_bits)` then `append(k, v, token_bits)`; token_bits: [T_new] ints, each
    config.low_bits or config.high_bits, one per new token, the same for every sequence of the
    batch. Calls are all or nothing: a refused or failed call leaves the cache as it was.
    """

    def __init__(self, config: TokenPrecisionConfig | None = None) -> None:
        self.config = TokenPrecisionConfig() if config is None else config
        if not isinstance(self.config, TokenPrecisionConfig):
            raise TypeError(f"config must be a TokenPrecisionConfig, got {type(self.config).__name__}")
        self.length = 0
        self.saliency_computations = 0
        self._shape: tuple[int, ...] | None = None
        self._t: dict[str, torch.Tensor] = {}  # every part of `components`, packed, and the class map
        # Every token's key and value read back from its packed bytes, float32 [B, H_kv, T, d] in position order
        # ("key", "value"), and the leftover's keys ("leftover_key", the queue of the next group): new rows are
        # unpacked and dequantized once, as they are stored (their codes never change; a leftover key is read
        # again when its group forms), so that a decode step costs what an exact cache's does plus the new
        # tokens' work. 8 bytes per cached element more than the packed stores, derived state (`Derived`):
        # `storage()` and the conformance suite judge the packed stores.
        self._read_back = Derived()

    # -- building ---------------------------------------------------------------------------

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, token_bits) -> None:
        """Store the prompt; role-aware PN-Mix chooses its salient pairs from it (Eq. 6) first."""
        if self._shape is not None:
            raise RuntimeError("prefill was already called on this cache; create a new cache per sequence")
        low = self.config.low_key_config
        validation.check_prefill(q, k, v, low, values=False)
        self.config.check_head_dim(k.shape[-1])
        bits = self.config.check_token_bits(token_bits, k.shape[2])
        self._check_values(q, k, v)
        b, h, _, d = k.shape
        with all_or_nothing(self):
            self._shape, self._device, self._dtype = tuple(k.shape), k.device, k.dtype
            for p in components(self.config, d, token_classes(self.config, bits[:0])):
                self._t[p.name] = torch.empty(part_shape(p, b, h), dtype=p.dtype, device=k.device)
            self._t[CLASS_MAP] = torch.empty(0, dtype=torch.uint8, device=k.device)
            self._read_back = Derived(
                {name: torch.empty(b, h, 0, d, device=k.device) for name in ("key", "value", "leftover_key")}
            )
            if self.config.low_keys == "pairs":
                self._t["pair_mask"] = packing.pack_mask(prefill_pair_mask(q, k, low))
                self.saliency_computations += 1
            self._store(k, v, bits)

    def append(self, k: torch.Tensor, v: torch.Tensor, token_bits) -> None:
        """Add new tokens k, v [B, H_kv, T_new, d] with their bits [T_new]."""
        if self._shape is None:
            raise RuntimeError("append before prefill: call prefill(q, k, v, token_bits) first")
        for name, t in (("k", k), ("v", v)):
            validation.check_tensor(name, t)
            validation.check_matches_cache(name, t, self._shape, self._dtype, self._device)
        validation.check_kv(k, v, self.config.low_key_config, values=False)
        bits = self.config.check_token_bits(token_bits, k.shape[2])
        self._check_values(None, k, v)
        with all_or_nothing(self):
            self._store(k, v, bits)

    def _check_values(self, q, k, v) -> None:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t is not None:
                validation.check_finite(name, t)
        low = self.config.low_key_config
        validation.check_quantizable("k", k, low, low.b_low)
        validation.check_quantizable("v", v, low, self.config.low_bits)

    def checkpoint(self) -> tuple:
        return self.length, self.saliency_computations, self._shape, dict(self._t), dict(self._read_back)

    def roll_back(self, saved: tuple) -> None:
        self.length, self.saliency_computations, self._shape = saved[:3]
        self._t, self._read_back = dict(saved[3]), Derived(saved[4])

    def release(self, saved: tuple) -> None:
        """Nothing to drop: a checkpoint holds references (updates replace tensors, never write into them)."""

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows `index` ([B'] integers in [0, B), rows may repeat), in that order (as
        `reference.ReferenceCache.select_rows`); the token bits are the batch's, shared, and stay; all or nothing."""
        if self._shape is None:
            raise RuntimeError("call prefill(q, k, v, token_bits) first")
        index = validation.check_rows("index", index, self._shape[0]).to(self._device)
        t = {name: x if name == CLASS_MAP else x.index_select(0, index) for name, x in self._t.items()}
        read_back = Derived({name: x.index_select(0, index) for name, x in self._read_back.items()})
        self._t, self._read_back, self._shape = t, read_back, (index.numel(), *self._shape[1:])

    def _store(self, k: torch.Tensor, v: torch.Tensor, bits: torch.Tensor) -> None:
        """The prompt's low keys form whole groups from their exact values; every later low key goes to
        the leftover first (high bits, per token), and each time the leftover reaches G its G keys
        form a group from what they stored. So the stored state depends on the prompt's length and
        the bits alone, however later tokens are split into appends (token by token, or chunks)."""
        cfg, t = self.config, self._t
        low_rows = (bits == cfg.low_bits).nonzero().flatten().to(k.device)
        high_rows = (bits == cfg.high_bits).nonzero().flatten().to(k.device)
        new_k, new_v = torch.empty(k.shape, device=k.device), torch.empty(v.shape, device=v.device)
        low_keys, read = k[..., low_rows, :], []
        if self.length == 0:  # the prompt
            grouped = token_classes(cfg, bits).n_grouped
            read.append(self._add_groups(low_keys[..., :grouped, :].float()))
            low_keys = low_keys[..., grouped:, :]
        read.append(self._put("leftover_key", low_keys))
        self._read_back["leftover_key"] = _cat(self._read_back["leftover_key"], read[-1])
        new_k[..., low_rows, :] = torch.cat(read, dim=-2)
        new_k[..., high_rows, :] = self._put("high_key", k[..., high_rows, :])
        new_v[..., low_rows, :] = self._put("low_value", v[..., low_rows, :])
        new_v[..., high_rows, :] = self._put("high_value", v[..., high_rows, :])
        key = _cat(self._read_back["key"], new_k)  # a new tensor: what a checkpoint holds is never written
        t[CLASS_MAP] = torch.cat([t[CLASS_MAP], bits.to(device=k.device, dtype=torch.uint8)])
        leftover = t["leftover_key_scale"].shape[2]
        if leftover >= cfg.group_size:
            grouped = leftover // cfg.group_size * cfg.group_size
            formed = self._positions()["leftover_key"][:grouped]
            key[..., formed.to(k.device), :] = self._add_groups(self._read_back["leftover_key"][..., :grouped, :])
            for part in ("leftover_key", "leftover_key_scale", "leftover_key_zero"):  # the rest keep their codes
                t[part] = t[part][..., grouped:, :].clone()
            self._read_back["leftover_key"] = self._read_back["leftover_key"][..., grouped:, :].clone()
        self._read_back["key"], self._read_back["value"] = key, _cat(self._read_back["value"], new_v)
        self.length += k.shape[2]

    def _put(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Quantize x per token (groups of G channels) at the bits of store `name`, add it, and return it as
        read back from its packed bytes (float32). A store given no rows is left as it is."""
        cfg, t = self.config, self._t
        if x.shape[-2] == 0:
            return x.new_empty(x.shape, dtype=torch.float32)
        bits = getattr(cfg, PER_TOKEN[name])
        q = quant.quantize(x, bits, cfg.group_size, dim=-1, scale_dtype=cfg.scale_dtype, midpoint=False)
        parts = {name: packing.pack_fields(q.codes, bits, dim=-1), name + "_scale": q.scale, name + "_zero": q.zero}
        for part, value in parts.items():
            t[part] = _cat(t[part], value)
        stored = quant.Quantized(packing.unpack_fields(parts[name], bits, dim=-1), q.scale, q.zero)
        return quant.dequantize(stored, cfg.group_size, -1)

    def _add_groups(self, keys: torch.Tensor) -> torch.Tensor:
        """Quantize whole groups of G low keys per channel (Eq. 2, or PN-Mix's pairs) onto the low key pages;
        return them as read back from their packed bytes (float32)."""
        low, t = self.config.low_key_config, self._t
        if keys.shape[-2] == 0:
            return keys.new_empty(keys.shape, dtype=torch.float32)
        mask = self._channel_mask()
        q = quant.quantize_keys(
            keys, mask, low.b_high, low.b_low, low.group_size, low.scale_dtype, midpoint=low.one_bit == "midpoint"
        )
        key_low, key_high = packing.pack_key_codes(q.codes, mask, low.b_high, low.b_low)
        for name, x in (
            ("low_key_low", key_low),
            ("low_key_high", key_high),
            ("low_key_scale", q.scale),
            ("low_key_zero", q.zero),
        ):
            t[name] = _cat(t[name], x)
        codes = packing.unpack_key_codes(key_low, key_high, mask, low.b_high, low.b_low)
        return quant.dequantize(quant.Quantized(codes, q.scale, q.zero), low.group_size, -2)

    def _channel_mask(self) -> torch.Tensor:
        """The low keys' b + 1-bit channels: bool [B, H_kv, d] (none for TriAxialKV)."""
        b, h, _, d = self._shape
        if self.config.low_keys == "pairs":
            return channel_mask_from_pairs(packing.unpack_mask(self._t["pair_mask"], d // 2), self.config.pair_layout)
        return torch.zeros(b, h, d, dtype=torch.bool, device=self._device)

    # -- reading ----------------------------------------------------------------------------

    def token_bits(self) -> torch.Tensor:
        """The precision of every token held, in order: int64 [T] on the CPU (a copy)."""
        if self._shape is None:
            return torch.empty(0, dtype=torch.int64)
        return self._t[CLASS_MAP].to("cpu", torch.int64)

    def _positions(self) -> dict[str, torch.Tensor]:
        """The token positions each store holds, in its row order."""
        bits = self._t[CLASS_MAP].long()
        low = (bits == self.config.low_bits).nonzero().flatten()
        high = (bits == self.config.high_bits).nonzero().flatten()
        n = self._t["low_key_scale"].shape[2] * self.config.group_size
        return {"low_key": low[:n], "leftover_key": low[n:], "high_key": high, "low_value": low, "high_value": high}

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All cached keys and values, float32 [B, H_kv, T, d], every token at its position."""
        if self._shape is None:
            raise RuntimeError("dequantize before prefill")
        return self._read_back["key"].clone(), self._read_back["value"].clone()

    def steps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The quantization step (the stored scale of its group) of every key and value element,
        float32 [B, H_kv, T, d]: how far an implementation's rounding may move an element."""
        if self._shape is None:
            raise RuntimeError("steps before prefill")
        b, h, _, d = self._shape
        g, t = self.config.group_size, self._t
        k = torch.empty(b, h, self.length, d, device=self._device)
        v = torch.empty_like(k)
        for name, rows in self._positions().items():
            if name == "low_key":
                step = quant.expand_groups(t["low_key_scale"], g, -2)
            else:
                step = quant.expand_groups(t[name + "_scale"], g, -1)
            (k if name.endswith("key") else v)[..., rows, :] = step.float()
        return k, v

    def attend(self, q: torch.Tensor, *, scale: float | None = None, softcap: float | None = None) -> torch.Tensor:
        """Causal attention of the last q.shape[2] positions over the cache: [B, H, T_new, d], in q's
        dtype (float32 softmax; scale 1/sqrt(d) unless given; softcap as `reference.attention_ref`)."""
        if self._shape is None:
            raise RuntimeError("attend before prefill")
        b, h, _, d = self._shape
        validation.check_query(q, b, h, d, self._dtype, self._device, self.length)
        k, v = self._read_back["key"], self._read_back["value"]
        return attention_ref(q, k, v, scale=scale, causal=True, softcap=softcap)

    def leftover_keys(self) -> torch.Tensor:
        """The leftover low keys as stored (high bits, per token), float32 [B, H_kv, n_leftover, d]."""
        return self._read_back["leftover_key"].clone()

    def attend_stepwise(
        self,
        q: torch.Tensor,
        leftover_before: torch.Tensor,
        new_keys: torch.Tensor,
        *,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """What `attend` gives each of the last append's T_new tokens had they been appended one at a
        time, each query attending right after its own token: a low key whose group formed only later
        in the append is still read from the leftover (high bits, per token); all else is as stored now.

        leftover_before: `leftover_keys()` before the append; new_keys: the append's exact keys.
        """
        cfg, g = self.config, self.config.group_size
        n, t_all = q.shape[2], self.length
        if new_keys.shape[2] != n or t_all - n < 1:
            raise ValueError(f"q ({n} tokens) must be the last append's queries ({new_keys.shape[2]} keys)")
        bits = self._t[CLASS_MAP].long()
        low = bits == cfg.low_bits
        before = int(low[: t_all - n].sum())
        new_low = low[t_all - n :].nonzero().flatten()
        low_positions = low.nonzero().flatten()
        # The low tokens that passed through the leftover during this append, in order, and what they held there.
        passed = torch.cat([low_positions[before - leftover_before.shape[2] : before], t_all - n + new_low])
        held = torch.cat([leftover_before.float(), self._high_path(new_keys[..., new_low, :])], -2)
        full = passed.numel() // g * g
        index = torch.arange(passed.numel(), device=passed.device)
        formed = torch.where(index < full, passed[(index // g * g + g - 1).clamp(max=max(full - 1, 0))], t_all)
        k_hat, v_hat = self._read_back["key"], self._read_back["value"]
        logits = attention_logits_ref(q, k_hat, scale=scale, softcap=softcap)
        early = attention_logits_ref(q, held, scale=scale, softcap=softcap)
        position = torch.arange(t_all - n, t_all, device=q.device)
        use_held = formed[None, :].to(q.device) > position[:, None]  # [T_new, m]: its group not formed yet
        logits[..., passed] = torch.where(use_held, early, logits[..., passed])
        causal = torch.ones(n, t_all, dtype=torch.bool, device=q.device).tril(diagonal=t_all - n)
        probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
        out = probs @ v_hat.repeat_interleave(q.shape[1] // v_hat.shape[1], dim=1)
        return saturating_cast(out, q.dtype)

    def _high_path(self, keys: torch.Tensor) -> torch.Tensor:
        """keys as the leftover stores them (per token at high bits), dequantized."""
        cfg = self.config
        q = quant.quantize(keys, cfg.high_bits, cfg.group_size, dim=-1, scale_dtype=cfg.scale_dtype, midpoint=False)
        return quant.dequantize(q, cfg.group_size, dim=-1)

    @property
    def pair_mask(self) -> torch.Tensor:
        """Role-aware PN-Mix's salient pairs of the low tokens' keys, bool [B, H_kv, d/2]."""
        if self.config.low_keys != "pairs" or self._shape is None:
            raise AttributeError("only a prefilled cache with low_keys='pairs' has salient pairs")
        return packing.unpack_mask(self._t["pair_mask"], self._shape[-1] // 2)

    def stored(self) -> dict[str, torch.Tensor]:
        """Copies of every persistent tensor, by the names of `reference.tokens.config.PARTS`."""
        return {name: x.clone() for name, x in self._t.items()}

    def storage(self) -> dict[str, int]:
        """Bytes of every stored tensor, by name: equals `reference.tokens.config.storage_model`."""
        return {name: x.numel() * x.element_size() for name, x in self._t.items()}


__all__ = ["TokenPrecisionCache"]
