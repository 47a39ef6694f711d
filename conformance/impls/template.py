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


class TemplateCache:
    """One layer's cache: [sinks | quantized | residual]; the residual is flushed N tokens at a
    time (the "shared" residual policy), keys quantized per channel in groups of G tokens and
    values per token in groups of the value group size."""

    def __init__(self, config: PNMixConfig) -> None:
        self.config = config
        self.length = 0
        self.saliency_computations = 0  # no pair selection: Eq. 6 is never evaluated
        self._k = self._v = None  # every token appended so far that is not yet quantized

    def prefill(self, q, k, v) -> None:
        if self._k is not None:
            raise RuntimeError("prefill was already called on this cache")
        validation.check_prefill(q, k, v, self.config)
        self._shape, self._dtype, self._device = tuple(k.shape), k.dtype, k.device
        n_sink = min(k.shape[2], self.config.n_sink)
        self._sink = (k[:, :, :n_sink].clone(), v[:, :, :n_sink].clone())
        self._quant = {"key": [], "value": []}  # (codes, scale, zero) per flushed block
        self._k, self._v = k[:, :, n_sink:].clone(), v[:, :, n_sink:].clone()
        self.length = k.shape[2]
        self._flush()

    def append(self, k, v) -> None:
        self._require_prefill()
        for name, t in (("k", k), ("v", v)):
            validation.check_tensor(name, t)
            validation.check_matches_cache(name, t, self._shape, self._dtype, self._device)
        validation.check_kv(k, v, self.config)
        room = self.config.n_sink - self._sink[0].shape[2]  # a short prompt leaves sink slots to fill
        if room > 0:
            self._sink = (torch.cat([self._sink[0], k[:, :, :room]], 2), torch.cat([self._sink[1], v[:, :, :room]], 2))
            k, v = k[:, :, room:], v[:, :, room:]
        self._k, self._v = torch.cat([self._k, k], 2), torch.cat([self._v, v], 2)
        self.length = self._sink[0].shape[2] + self._k.shape[2] + sum(c.shape[2] for c, *_ in self._quant["key"])
        self._flush()

    def _flush(self) -> None:
        n = self._k.shape[2] - exact_tail(self.config, self.length)[0]  # whole residuals to quantize
        if n == 0:
            return
        cfg = self.config
        self._quant["key"].append(_quantize(self._k[:, :, :n], cfg.b_low, cfg.group_size, dim=-2))
        if cfg.values_quantized:
            self._quant["value"].append(
                _quantize(self._v[:, :, :n], cfg.value_bits, cfg.value_group(self._shape[-1]), -1)
            )
        else:
            self._quant["value"].append((self._v[:, :, :n].clone(),))
        self._k, self._v = self._k[:, :, n:].clone(), self._v[:, :, n:].clone()

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        cfg, d = self.config, self._shape[-1]
        keys = [_dequantize(*block, cfg.group_size, -2) for block in self._quant["key"]]
        if cfg.values_quantized:
            values = [_dequantize(*block, cfg.value_group(d), -1) for block in self._quant["value"]]
        else:
            values = [block[0].float() for block in self._quant["value"]]
        k = torch.cat([self._sink[0].float(), *keys, self._k.float()], 2)
        return k, torch.cat([self._sink[1].float(), *values, self._v.float()], 2)

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """Causal attention of the newest q.shape[2] positions, in float32 over the dequantized cache."""
        self._require_prefill()
        b, h_kv, _, d = self._shape
        validation.check_query(q, b, h_kv, d, self._dtype, self._device, self.length)
        k, v = self.dequantize()
        return attention_ref(q, k, v, causal=True, upcast=True)

    def sinks(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return self._sink

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return self._k, self._v

    def storage(self) -> StorageReport:
        """Bytes of every tensor this cache holds, by the component it plays."""
        self._require_prefill()

        def size(*tensors):
            return sum(t.numel() * t.element_size() for t in tensors)

        keys, values = self._quant["key"], self._quant["value"]
        report = {
            "sink_key": size(self._sink[0]), "sink_value": size(self._sink[1]),
            "residual_key": size(self._k), "residual_value": size(self._v),
            "key_low": size(*(c for c, _, _ in keys)),
            "key_scale": size(*(s for _, s, _ in keys)), "key_zero": size(*(z for _, _, z in keys)),
            "value_payload": size(*(block[0] for block in values)),
        }  # fmt: skip
        if self.config.values_quantized:
            report["value_scale"] = size(*(s for _, s, _ in values))
            report["value_zero"] = size(*(z for _, _, z in values))
        return StorageReport(**report)

    def _require_prefill(self) -> None:
        if self._k is None:
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
        # (here: uniform b_low-bit keys, Eq. 2 at 1 bit, as KIVI).
        preset=kivi_preset,
        residual="shared",
    )

    def create(self, config: PNMixConfig) -> TemplateCache:
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
