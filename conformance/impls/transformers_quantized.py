"""transformers' `QuantizedCache` under test: one `QuantoQuantizedLayer` (backend "quanto",
optimum-quanto) is one layer's cache, driven through its own `update`, as a model drives it.

What it claims is what the layer does (transformers/cache_utils.py, `QuantizedLayer`): the
prompt is quantized whole (no sinks); appended tokens stay exact until an append would bring them
to `residual_length`, then every token is quantized again from its dequantized values (policy
"requantize"); keys and values alike are quantized per token in groups of `q_group_size`
channels (quanto's axis 0: "key_groups" = "channels"), with `nbits` 2 or 4 for both and scale
and shift in the input dtype; no NaN/Inf or shape checks beyond what it does itself. Attention
is computed, as a transformers model would, over the keys and values `update` returns (its
dequantized states in the input dtype, then the exact residual), with a float32 softmax.
Genuine differences from the spec are listed, each with its reason, in
conformance/xfails/transformers-quanto.txt.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata

import torch

from reference import PNMixConfig, StorageReport
from reference.attention import attention_ref
from reference.contract import Capabilities
from reference.methods import kivi_preset


def quanto_preset(config: PNMixConfig) -> PNMixConfig:
    """Uniform keys (as KIVI); one bit width and one channel group for keys and values (the whole head)."""
    return dataclasses.replace(kivi_preset(config), value_bits=config.b_low, value_group_size=None, n_sink=0)


def _empty_residual(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The layer's residual as [B, H_kv, T, d] (after a flush it holds a 1-D empty tensor)."""
    return t if t.dim() == 4 else like[:, :, :0]


def _bytes(*tensors: torch.Tensor) -> int:
    """Bytes of tensors, quanto's tensor subclasses counted by their inner tensors."""
    total = 0
    for t in tensors:
        if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
            total += _bytes(*(getattr(t, name) for name in t.__tensor_flatten__()[0]))
        else:
            total += t.numel() * t.element_size()
    return total


class QuantizedLayerCache:
    def __init__(self, config: PNMixConfig) -> None:
        self.config = config
        self.layer = None
        self.saliency_computations = 0

    @property
    def length(self) -> int:
        return 0 if self.layer is None else self.layer.get_seq_length()

    def prefill(self, q, k, v) -> None:
        from transformers.cache_utils import QuantoQuantizedLayer

        if self.layer is not None:
            raise RuntimeError("prefill was already called on this cache")
        self._like = k[:, :, :0].clone()
        self.layer = QuantoQuantizedLayer(
            nbits=self.config.b_low, axis_key=0, axis_value=0,
            q_group_size=self.config.value_group(k.shape[-1]), residual_length=self.config.residual_length,
        )  # fmt: skip
        self.layer.update(k, v)  # what it returns is _states(); keeping it would hold a copy

    def append(self, k, v) -> None:
        self._require_prefill()
        self.layer.update(k, v)  # what it returns is _states(); keeping it would hold a copy

    def _states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What attention sees: the dequantized states (input dtype), then the exact residual."""
        layer = self.layer
        parts_k = [layer._dequantize(layer._quantized_keys), _empty_residual(layer.keys, self._like)]
        parts_v = [layer._dequantize(layer._quantized_values), _empty_residual(layer.values, self._like)]
        return torch.cat(parts_k, -2), torch.cat(parts_v, -2)

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        k, v = self._states()
        return k.float(), v.float()

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        self._require_prefill()
        k, v = self._states()
        return attention_ref(q, k, v, causal=True, upcast=True)

    def sinks(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return self._like, self._like

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return _empty_residual(self.layer.keys, self._like), _empty_residual(self.layer.values, self._like)

    def storage(self) -> StorageReport:
        self._require_prefill()
        qk, qv = self.layer._quantized_keys, self.layer._quantized_values
        return StorageReport(
            key_low=_bytes(qk._data), key_scale=_bytes(qk._scale), key_zero=_bytes(qk._shift),
            value_payload=_bytes(qv._data), value_scale=_bytes(qv._scale), value_zero=_bytes(qv._shift),
            residual_key=_bytes(self.layer.keys), residual_value=_bytes(self.layer.values),
        )  # fmt: skip

    def _require_prefill(self) -> None:
        if self.layer is None:
            raise RuntimeError("the cache is empty: call prefill(q, k, v) first")


class QuantoImplementation:
    name = "transformers-quanto"
    capabilities = Capabilities(
        dtypes=(torch.float16, torch.bfloat16, torch.float32),
        devices=("cpu", "cuda"),
        key_bits=frozenset({(2, 2), (4, 4)}),
        value_bits=frozenset({2, 4}),
        scale_dtypes=("input",),
        midpoint_one_bit=False,
        sinks=False,
        prefill_selection=False,
        preset=quanto_preset,
        residual="requantize",
        key_groups="channels",
    )

    @property
    def version(self) -> str:
        have = {d: _version(d) for d in ("transformers", "optimum-quanto")}
        return ", ".join(f"{d} {v}" for d, v in have.items())

    def create(self, config: PNMixConfig) -> QuantizedLayerCache:
        return QuantizedLayerCache(config)

    # Its storage format: quanto's PackedTensor (codes packed along the first dimension).
    def pack_keys(self, codes, channel_mask, config):
        from optimum.quanto.tensor.packed import PackedTensor

        return PackedTensor.pack(codes, bits=config.b_low), None

    def unpack_keys(self, low, high, channel_mask, config):
        return low.unpack()

    def pack_values(self, codes, config):
        from optimum.quanto.tensor.packed import PackedTensor

        return PackedTensor.pack(codes, bits=config.value_bits)

    def unpack_values(self, packed, config):
        return packed.unpack()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def make_quanto() -> QuantoImplementation:
    return QuantoImplementation()
