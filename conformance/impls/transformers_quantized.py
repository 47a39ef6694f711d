"""transformers' `QuantizedCache` under test, for each integer backend: one `QuantizedLayer`
(`QuantoQuantizedLayer`, optimum-quanto; `HQQQuantizedLayer`, hqq) is one layer's cache, driven
through its own `update`, as a model drives it.

What it claims is what the layer does (transformers/cache_utils.py, `QuantizedLayer`): the
prompt is quantized whole (no sinks); appended tokens stay exact until an append would bring them
to `residual_length`, then every token is quantized again from its dequantized values (policy
"requantize"); keys and values alike are quantized per token in groups of `q_group_size`
channels (the backend's axis over the last dimension: "key_groups" = "channels"), with one
`nbits` for both and scale and zero in the input dtype; no NaN/Inf or shape checks beyond what
it does itself. Attention is computed, as a transformers model would, over the keys and values
`update` returns (its dequantized states in the input dtype, then the exact residual), with
transformers' own attention arithmetic: its default attention implementation ("sdpa",
`sdpa_attention_forward`, in the input dtype) under the causal mask its `masking_utils` builds.
Genuine differences from the spec are listed, each with its reason, in
conformance/xfails/transformers-<backend>.txt.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import sys
import types
from pathlib import Path

import torch

from reference import PNMixConfig, StorageReport
from reference.contract import Capabilities
from reference.methods import kivi_preset


def layer_preset(config: PNMixConfig) -> PNMixConfig:
    """Uniform keys (as KIVI); one bit width and one channel group for keys and values (the whole head)."""
    return dataclasses.replace(kivi_preset(config), value_bits=config.b_low, value_group_size=None, n_sink=0)


@dataclasses.dataclass(frozen=True)
class Backend:
    """How one backend's layer is built and what its quantized states hold."""

    name: str
    layer: str  # the QuantizedLayer class in transformers.cache_utils
    axis: int  # its axis argument that groups along the last dimension (channels)
    bits: tuple[int, ...]
    distribution: str
    token_multiple: int = 1

    def make_layer(self, config: PNMixConfig, head_dim: int):
        import transformers.cache_utils as cache_utils

        return getattr(cache_utils, self.layer)(
            nbits=config.b_low,
            axis_key=self.axis,
            axis_value=self.axis,
            q_group_size=config.value_group(head_dim),
            residual_length=config.residual_length,
        )

    def parts(self, states) -> tuple:
        """(payload, scale, zero) of one quantized state."""
        if self.name == "quanto":  # a WeightQBitsTensor
            return states._data, states._scale, states._shift
        codes, meta = states  # hqq: packed codes and their meta
        return codes, meta["scale"], meta["zero"]

    def pack(self, codes: torch.Tensor, bits: int):
        if self.name == "quanto":
            from optimum.quanto.tensor.packed import PackedTensor

            return PackedTensor.pack(codes, bits=bits)
        from hqq.core.quantize import Quantizer

        rows = codes.reshape(-1, codes.shape[-1])
        rows = torch.cat([rows, rows.new_zeros(-len(rows) % 32, rows.shape[-1])])  # whole bytes at any width
        return Quantizer.pack[Quantizer.bit_to_packing[bits]](rows), codes.shape, bits

    def unpack(self, packed) -> torch.Tensor:
        if self.name == "quanto":
            return packed.unpack()
        from hqq.core.quantize import Quantizer

        data, shape, bits = packed
        rows = Quantizer.unpack[Quantizer.bit_to_packing[bits]](data, dtype=torch.uint8)
        return rows[: shape[:-1].numel()].reshape(shape)


BACKENDS = {
    "quanto": Backend("quanto", "QuantoQuantizedLayer", 0, (2, 4), "optimum-quanto"),
    # hqq packs whole bytes (words of 10 codes at 3 bits) of group rows and does not trim the
    # padding when it dequantizes: a state whose token count is not a multiple of 8 / nbits fails
    # (RuntimeError at update), and at 3 bits almost every shape does. Claimed: multiples of 8
    # tokens, 3 bits left out.
    "hqq": Backend("hqq", "HQQQuantizedLayer", 1, (1, 2, 4, 8), "hqq", token_multiple=8),
}


def model_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of the newest q.shape[2] positions over k, v as a transformers model computes
    it: `sdpa_attention_forward` (its default "sdpa" implementation; scores, softmax and sums in the
    states' dtype, as torch's SDPA does them), the mask from `masking_utils.sdpa_mask`. [B, H, T, d]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    batch, heads, new, head_dim = q.shape
    length = k.shape[-2]
    mask = sdpa_mask(batch_size=batch, q_length=new, kv_length=length, q_offset=length - new, device=q.device)
    # What the function reads of a model's attention module: its GQA ratio and that it is causal.
    module = types.SimpleNamespace(num_key_value_groups=heads // k.shape[1], is_causal=True)
    out, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=head_dim**-0.5)
    return out.transpose(1, 2).contiguous()  # it returns [B, T, H, d], as a model's o_proj takes it


def _empty_residual(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The layer's residual as [B, H_kv, T, d] (after a flush it holds a 1-D empty tensor)."""
    return t.clone() if t.dim() == 4 else like[:, :, :0].clone()


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
    def __init__(self, config: PNMixConfig, backend: Backend) -> None:
        self.config, self.backend = config, backend
        self.layer = None
        self.saliency_computations = 0

    @property
    def length(self) -> int:
        return 0 if self.layer is None else self.layer.get_seq_length()

    def prefill(self, q, k, v) -> None:
        if self.layer is not None:
            raise RuntimeError("prefill was already called on this cache")
        self._like = k[:, :, :0].clone()
        self.layer = self.backend.make_layer(self.config, k.shape[-1])
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

    # The protocol's optional checkpoints: the continuations of one context share one pass over it (the evaluation
    # path rolls back instead of running the context again per continuation). `QuantizedLayer.update` replaces its
    # tensors and quantized states (torch.cat, `_quantize`) and never writes into them, so the layer's attributes
    # as they are hold its whole state; conformance property 12 checks the round trip bit for bit.
    def checkpoint(self) -> dict:
        self._require_prefill()
        return dict(vars(self.layer))

    def roll_back(self, saved: dict) -> None:
        self._require_prefill()
        state = vars(self.layer)
        state.clear()
        state.update(saved)

    def release(self, saved: dict) -> None:
        """Nothing to free: a checkpoint holds references only."""

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        self._require_prefill()
        return model_attention(q, *self._states())

    def sinks(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return self._like.clone(), self._like.clone()

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return _empty_residual(self.layer.keys, self._like), _empty_residual(self.layer.values, self._like)

    def storage(self) -> StorageReport:
        self._require_prefill()
        kp, ks, kz = self.backend.parts(self.layer._quantized_keys)
        vp, vs, vz = self.backend.parts(self.layer._quantized_values)
        return StorageReport(
            key_low=_bytes(kp),
            key_scale=_bytes(ks),
            key_zero=_bytes(kz),
            value_payload=_bytes(vp),
            value_scale=_bytes(vs),
            value_zero=_bytes(vz),
            residual_key=_bytes(self.layer.keys),
            residual_value=_bytes(self.layer.values),
        )

    def _require_prefill(self) -> None:
        if self.layer is None:
            raise RuntimeError("the cache is empty: call prefill(q, k, v) first")


class LayerImplementation:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = f"transformers-{backend.name}"
        self.capabilities = Capabilities(
            dtypes=(torch.float16, torch.bfloat16, torch.float32),
            devices=("cpu", "cuda"),
            key_bits=frozenset((b, b) for b in backend.bits),
            value_bits=frozenset(backend.bits),
            scale_dtypes=("input",),
            midpoint_one_bit=False,
            sinks=False,
            prefill_selection=False,
            preset=layer_preset,
            residual="requantize",
            key_groups="channels",
            token_multiple=backend.token_multiple,
        )

    @property
    def version(self) -> str:
        return ", ".join(f"{d} {_version(d)}" for d in ("transformers", self.backend.distribution))

    def create(self, config: PNMixConfig) -> QuantizedLayerCache:
        return QuantizedLayerCache(config, self.backend)

    # The backend's own packing (quanto: a PackedTensor; hqq: its bitpack, with the shape it drops).
    def pack_keys(self, codes, channel_mask, config):
        return self.backend.pack(codes, config.b_low), None

    def unpack_keys(self, low, high, channel_mask, config):
        return self.backend.unpack(low)

    def pack_values(self, codes, config):
        return self.backend.pack(codes, config.value_bits)

    def unpack_values(self, packed, config):
        return self.backend.unpack(packed)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def quanto_extensions() -> list:
    """optimum-quanto's C++/CUDA extensions registered on this machine (compiled by torch's cpp_extension
    into each one's `build_directory` inside site-packages on first use)."""
    try:
        from optimum.quanto.library.extensions import extension
    except ImportError:
        return []
    return list(getattr(extension, "_extensions", {}).values())


def lock_holders(path: Path) -> list[int] | None:
    """The processes that hold `path` open (Linux /proc); None where that cannot be told (no /proc, or
    processes whose open files this user cannot read)."""
    proc, target = Path("/proc"), os.path.realpath(path)
    if not (proc / "self" / "fd").is_dir():
        return None
    holders, unreadable = [], False
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except PermissionError:
            unreadable = True
            continue
        except OSError:  # the process ended meanwhile
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    holders.append(int(entry.name))
                    break
            except OSError:
                continue
    return holders if holders or not unreadable else None


def check_quanto_build(extensions=None, say=None) -> None:
    """Before optimum-quanto's first use: torch's cpp_extension builds an extension under a lock file,
    `<build_directory>/lock` (`torch.utils.file_baton.FileBaton`, which holds it open while it builds),
    and every later use waits, without a word, for as long as that file exists. A lock no process holds
    is left by an interrupted build: RuntimeError naming the file to delete. A build in progress, or one
    about to start (minutes, once per install), is said on stderr."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    for ext in quanto_extensions() if extensions is None else extensions:
        build = Path(ext.build_directory)
        lock = build / "lock"
        if lock.exists():
            holders = lock_holders(lock)
            if holders == []:
                raise RuntimeError(
                    f"optimum-quanto's extension {ext.name} has a stale build lock {lock} (left by an interrupted "
                    "build: no process holds it), on which every use would wait forever; delete that file (the "
                    "next use compiles the extension again, minutes once)"
                )
            who = "another process" if holders is None else f"process {', '.join(map(str, holders))}"
            say(
                f"transformers-quanto: {who} is compiling optimum-quanto's extension {ext.name} (lock {lock}); "
                "its first use waits for that build (if none is running, delete the lock)"
            )
        elif getattr(ext, "_lib", None) is None and not any(build.glob("*.so")):
            say(
                f"transformers-quanto: optimum-quanto compiles its extension {ext.name} on first use, in {build} "
                "(minutes, once per install)"
            )


def make_quanto() -> LayerImplementation:
    check_quanto_build()
    return LayerImplementation(BACKENDS["quanto"])


def make_hqq() -> LayerImplementation:
    return LayerImplementation(BACKENDS["hqq"])
