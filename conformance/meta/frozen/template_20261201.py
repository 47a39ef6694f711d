"""Template of an adapter: copy it, replace the quantization by calls into your code, and run

    pytest conformance --impl your_package.your_module:make

As shipped it is a working implementation of its own, in plain PyTorch, that differs from the
reference on purpose and says so in its claims: uniform b-bit keys (no salient pairs), codes
stored one per byte (not the reference's bit packing), scale and zero in the input dtype, and
round-half-to-even. The suite judges it on its own format and numerics: every core property
passes, and the opt-in ones (the reference's bytes and numerics, the pair mask) are skipped
with the reason. README, "Plug in your implementation", says what each method must do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from reference import PNMixConfig, StorageReport, validation
from reference.attention import attention_ref
from reference.contract import Capabilities
from reference.layout import exact_tail
from reference.methods import kivi_preset

__version__ = "1.0"


def _quantize(x: torch.Tensor, bits: int, group: int, dim: int):
    """Asymmetric b-bit codes per group of `group` entries along `dim` (Eq. 2), scale and zero in x's dtype."""
    dim = dim % x.dim()
    g = x.float().unflatten(dim, (x.shape[dim] // group, group))
    inner = dim + 1
    lo, hi = g.amin(inner, keepdim=True), g.amax(inner, keepdim=True)
    scale, zero = ((hi - lo) / (2**bits - 1)).to(x.dtype), lo.to(x.dtype)
    s = scale.float()
    codes = torch.round((g - zero.float()) / torch.where(s == 0, 1.0, s)).clamp(0, 2**bits - 1)
    codes = torch.where(s == 0, 0.0, codes).to(torch.uint8).flatten(dim, inner)
    return codes, scale.squeeze(inner), zero.squeeze(inner)


def _dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int, dim: int) -> torch.Tensor:
    s = scale.float().repeat_interleave(group, dim)
    return codes.float() * s + zero.float().repeat_interleave(group, dim)


@dataclass(frozen=True)
class _State:
    """Everything a cache holds. A call builds a new state and swaps it in only once all its
    work succeeded, so a call that fails anywhere (out of memory, bad input) leaves the cache
    as it was: property 10, all or nothing."""

    sink: tuple[torch.Tensor, torch.Tensor]
    keys: tuple = ()  # (codes, scale, zero) per flushed block
    values: tuple = ()  # (codes, scale, zero), or (exact values,), per flushed block
    k: torch.Tensor | None = None  # every token appended so far that is not yet quantized
    v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.sink[0].shape[2] + self.k.shape[2] + sum(c.shape[2] for c, *_ in self.keys)


class TemplateCache:
    """One layer's cache: [sinks | quantized | residual]; the residual is flushed N tokens at a
    time (the "shared" residual policy), keys quantized per channel in groups of G tokens and
    values per token in groups of the value group size."""

    def __init__(self, config: PNMixConfig) -> None:
        self.config = config
        self.saliency_computations = 0  # no pair selection: Eq. 6 is never evaluated
        self._state: _State | None = None

    @property
    def length(self) -> int:
        return 0 if self._state is None else self._state.length

    def prefill(self, q, k, v) -> None:
        if self._state is not None:
            raise RuntimeError("prefill was already called on this cache")
        validation.check_prefill(q, k, v, self.config)
        n_sink = min(k.shape[2], self.config.n_sink)
        state = _State((k[:, :, :n_sink].clone(), v[:, :, :n_sink].clone()), k=k[:, :, n_sink:], v=v[:, :, n_sink:])
        state = self._flushed(state, k.shape[-1])
        self._shape, self._dtype, self._device = tuple(k.shape), k.dtype, k.device
        self._state = state

    def append(self, k, v) -> None:
        self._require_prefill()
        for name, t in (("k", k), ("v", v)):
            validation.check_tensor(name, t)
            validation.check_matches_cache(name, t, self._shape, self._dtype, self._device)
        validation.check_kv(k, v, self.config)
        state = self._state
        room = self.config.n_sink - state.sink[0].shape[2]  # a short prompt leaves sink slots to fill
        if room > 0:
            sink = (torch.cat([state.sink[0], k[:, :, :room]], 2), torch.cat([state.sink[1], v[:, :, :room]], 2))
            state, k, v = replace(state, sink=sink), k[:, :, room:], v[:, :, room:]
        state = replace(state, k=torch.cat([state.k, k], 2), v=torch.cat([state.v, v], 2))
        self._state = self._flushed(state, self._shape[-1])

    def _flushed(self, state: _State, head_dim: int) -> _State:
        """`state` with its whole residuals quantized, and its exact tensors its own copies."""
        cfg = self.config
        n = state.k.shape[2] - exact_tail(cfg, state.length)[0]  # whole residuals to quantize
        keys, values = state.keys, state.values
        if n > 0:
            keys += (_quantize(state.k[:, :, :n], cfg.b_low, cfg.group_size, dim=-2),)
            if cfg.values_quantized:
                values += (_quantize(state.v[:, :, :n], cfg.value_bits, cfg.value_group(head_dim), -1),)
            else:
                values += ((state.v[:, :, :n].clone(),),)
        return replace(state, keys=keys, values=values, k=state.k[:, :, n:].clone(), v=state.v[:, :, n:].clone())

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        cfg, d, state = self.config, self._shape[-1], self._state
        keys = [_dequantize(*block, cfg.group_size, -2) for block in state.keys]
        if cfg.values_quantized:
            values = [_dequantize(*block, cfg.value_group(d), -1) for block in state.values]
        else:
            values = [block[0].float() for block in state.values]
        k = torch.cat([state.sink[0].float(), *keys, state.k.float()], 2)
        return k, torch.cat([state.sink[1].float(), *values, state.v.float()], 2)

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """Causal attention of the newest q.shape[2] positions, in float32 over the dequantized cache."""
        self._require_prefill()
        b, h_kv, _, d = self._shape
        validation.check_query(q, b, h_kv, d, self._dtype, self._device, self.length)
        k, v = self.dequantize()
        return attention_ref(q, k, v, causal=True, upcast=True)

    def sinks(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return tuple(t.clone() for t in self._state.sink)

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return self._state.k.clone(), self._state.v.clone()

    def storage(self) -> StorageReport:
        """Bytes of every tensor this cache holds, by the component it plays."""
        self._require_prefill()

        def size(*tensors):
            return sum(t.numel() * t.element_size() for t in tensors)

        state = self._state
        keys, values = state.keys, state.values
        report = {
            "sink_key": size(state.sink[0]),
            "sink_value": size(state.sink[1]),
            "residual_key": size(state.k),
            "residual_value": size(state.v),
            "key_low": size(*(c for c, _, _ in keys)),
            "key_scale": size(*(s for _, s, _ in keys)),
            "key_zero": size(*(z for _, _, z in keys)),
            "value_payload": size(*(block[0] for block in values)),
        }
        if self.config.values_quantized:
            report["value_scale"] = size(*(s for _, s, _ in values))
            report["value_zero"] = size(*(z for _, _, z in values))
        return StorageReport(**report)

    def _require_prefill(self) -> None:
        if self._state is None:
            raise RuntimeError("the cache is empty: call prefill(q, k, v) first")


class TemplateImplementation:
    name = "template"
    version = __version__
    capabilities = Capabilities(
        dtypes=(torch.float16, torch.bfloat16, torch.float32),
        devices=("cpu", "cuda"),
        key_bits=frozenset((b, b) for b in (1, 2, 3, 4, 8)),
        value_bits=frozenset({1, 2, 3, 4, 8, 16}),
        scale_dtypes=("input",),
        midpoint_one_bit=False,
        prefill_selection=False,
        # The suite draws PN-Mix configurations; a preset maps each onto what the adapter does
        # (here: uniform b_low-bit keys, Eq. 2 at 1 bit, as KIVI); `residual` then sets the value residual.
        preset=kivi_preset,
        residual="shared",
        # `attend` below runs the spec's float32 attention: say so. An adapter whose `attend` calls its
        # library's own attention (its dtypes and functions) claims "own", the default.
        attention="spec",
    )

    def create(self, config: PNMixConfig) -> TemplateCache:
        if config.value_residual != "shared":  # refused, not held with another residual than asked for
            raise ValueError(f"value_residual must be 'shared' (values flush with keys), got {config.value_residual!r}")
        return TemplateCache(config)

    # The storage format's own packing: one code per byte, so packing is a copy.
    def pack_keys(self, codes, channel_mask, config):
        return codes.clone(), codes.new_zeros((*codes.shape[:-1], 0))

    def unpack_keys(self, low, high, channel_mask, config):
        return low.clone()

    def pack_values(self, codes, config):
        return codes.clone()

    def unpack_values(self, packed, config):
        return packed.clone()


def make() -> TemplateImplementation:
    return TemplateImplementation()
