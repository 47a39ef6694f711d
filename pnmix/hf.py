"""Hugging Face transformers integration: a `Cache` of PN-Mix layers and the "pnmix" attention.

    import pnmix.hf  # registers attn_implementation="pnmix"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="pnmix")
    cache = pnmix.hf.PNMixHFCache(model.config, PNMixConfig())   # or any method of reference.methods
    model.generate(**inputs, past_key_values=cache, do_sample=False)

Prefill runs exact attention and hands the model's own post-RoPE query states to the cache,
which selects its channels once (Eq. 6); every decode step appends the new key/value and reads
the packed cache through the implementation's decode attention (the reference on the CPU,
the Triton kernels on CUDA), without a dense dequantized cache in the model's hands. Sequences
in a batch may be padded on the left: each row then has its own cache (`pnmix.rows`), so padding never enters the
saliency and the sinks. Beam search reorders rows where the caches can select them (`select_rows`);
cropping (assisted and prompt-lookup decoding) needs `PNMixHFCache(..., croppable=True)` and goes back
into the last forward only (`PNMixHFCache.crop`).

Layers with an attention window (those transformers' own cache makes sliding-window layers:
Mistral, Qwen2 with use_sliding_window, the local layers of Gemma 2/3) are not quantized: each
keeps the keys and values of its last W - 1 tokens exact, as the model's own cache does, and
attends as the mask the model builds for it says (`LayerMask`). Other layer kinds (chunked,
linear or hybrid attention) are refused.
Their memory is bounded by W whatever the length, so the cache that grows with the output, the
one PN-Mix compresses, is that of the global layers (a window of 512 with G = N = 128 would
leave at most three pages to quantize). The model's `scaling` is honoured; any other attention
argument it cannot honour (attention sinks, dropout; softcapping on a quantized layer of the
Triton backend, whose kernel does not apply it yet) raises naming it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import sys

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface

from pnmix.rows import RowCaches
from reference import PNMixConfig, attention_ref
from reference.channels.deferred import check_finite_mode
from reference.contract.implementation import ReferenceImplementation
from reference.tokens.config import TokenPrecisionConfig

ATTENTION = "pnmix"

#: Attention arguments that need nothing from PN-Mix: positions come from the cache itself, and
#: the attention window from the mask the model builds for the layer (`LayerMask`).
IGNORABLE = frozenset(
    {"position_ids", "cache_position", "use_cache", "is_causal", "output_attentions", "sliding_window"}
)


class TokenBitsSchedule:
    """The precision of each token position of a per-token precision cache: `known` for the first
    positions (the prompt's tags, and any continuation fed teacher-forced), `generated` past them
    (TriAxialKV's tag of newly generated text: current turn, answer)."""

    def __init__(self, config: TokenPrecisionConfig, known, generated: int | None) -> None:
        self.generated = config.high_bits if generated is None else generated
        config.check_token_bits([self.generated], 1, name="generated_bits")
        known = [] if known is None else known
        self.known = config.check_token_bits(known, len(known))

    def __call__(self, start: int, n: int) -> torch.Tensor:
        part = self.known[start : start + n]
        return torch.cat([part, torch.full((n - len(part),), self.generated, dtype=torch.int64)])


@dataclasses.dataclass(frozen=True)
class LayerMask:
    """The mask `pnmix_mask` gives the model for a layer: causal attention over the last
    `window` positions up to each query's own (all of them: None); `pads`: each row's leading padding
    positions, read from the model's padding mask where a forward has more than one token (None: no row padded,
    or a decode step, which keeps its prompt's)."""

    window: int | None
    pads: tuple[int, ...] | None = None

    def __getattr__(self, name: str):
        raise AttributeError(
            f"this model reads .{name} of its attention mask as a tensor; PN-Mix gives its "
            "attention a LayerMask (the window), and cannot serve such a model"
        )


def cache_argument(model) -> str:
    """The keyword that passes a cache to `model(...)` and `model.generate(...)`: `cache` where
    transformers has renamed `past_key_values` (5.2x), else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class UnsupportedOperation(RuntimeError):
    """An operation a PN-Mix cache cannot perform (row selection without `select_rows`, a crop it cannot undo)."""


def head_dim(model_config) -> int:
    return getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads


def _rotary_fraction(model_config) -> float:
    rope = getattr(model_config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and "partial_rotary_factor" in rope:
        return float(rope["partial_rotary_factor"])
    return float(getattr(model_config, "partial_rotary_factor", 1.0) or 1.0)


def has_rope(model_config) -> bool | None:
    """Whether the model rotates queries and keys by position (RoPE): a rotary parameter in its config
    or a rotary function or class in its modeling module. None when no causal-LM class is known for the
    config (it cannot be told)."""
    rope_keys = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_dim", "rotary_pct", "rotary_emb_base")
    if any(getattr(model_config, k, None) is not None for k in rope_keys):
        return True
    try:
        from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

        module = importlib.import_module(MODEL_FOR_CAUSAL_LM_MAPPING[type(model_config)].__module__)
    except Exception:
        return None
    return any("rotary" in name.lower() for name in vars(module))


def detect_pair_layout(model_config) -> str | None:
    """How the model's RoPE pairs channels, from what its own `apply_rotary_pos_emb` does: each
    basis vector e_c rotated by a quarter turn lands on its pair partner, c + d/2 (mod d) for
    `rotate_half` ("split") or c ^ 1 for interleaved pairs ("adjacent"). None when it cannot
    tell (no causal-LM class or rotary function found, partial rotary embedding, another pairing).
    """
    try:
        from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(model_config)]
        apply = getattr(importlib.import_module(model_class.__module__), "apply_rotary_pos_emb", None)
        d = head_dim(model_config)
    except Exception:  # no causal-LM class, or a head_dim that differs by layer
        return None
    if apply is None or _rotary_fraction(model_config) != 1.0 or d % 2:
        return None
    basis = torch.eye(d).reshape(1, d, 1, d)  # head c holds e_c
    quarter = torch.zeros(1, 1, d), torch.ones(1, 1, d)  # cos 0, sin 1 for every frequency
    try:
        rotated = apply(basis, basis, *quarter)[0]
    except Exception:  # a signature of its own: then the layout must be given
        return None
    if tuple(rotated.shape) != tuple(basis.shape):
        return None
    partner = rotated.abs().argmax(-1).flatten()
    channels = torch.arange(d)
    if torch.equal(partner, (channels + d // 2) % d):
        return "split"
    if torch.equal(partner, channels ^ 1):
        return "adjacent"
    return None


def layer_windows(model_config) -> list[int | None]:
    """The attention window of each decoder layer (None: global), as transformers' own cache
    lays the model out; other layer kinds raise, naming the layer."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        kinds, kwargs = get_layer_types_and_kwargs(model_config.get_text_config(decoder=True))
    except (ImportError, AttributeError):  # an older transformers, or a bare config object
        return [None] * model_config.num_hidden_layers
    if isinstance(kwargs, dict):  # transformers <= 5.18: one dict for every layer (5.19 on: a list, one per layer)
        kwargs = [kwargs] * len(kinds)
    windows = []
    for i, (kind, extra) in enumerate(zip(kinds, kwargs, strict=True)):
        if kind not in ("full_attention", "sliding_attention"):
            raise ValueError(
                f"layer {i} of this model is {kind!r}: PN-Mix caches hold full or sliding-window attention layers only"
            )
        windows.append(extra.get("sliding_window") if kind == "sliding_attention" else None)
    return windows


@dataclasses.dataclass(frozen=True)
class _Unrewindable:
    """The checkpoint of an implementation's cache (`PNMixHFCache(impl=)`): the protocol lets a
    layer read its length, not save or restore its state."""

    length: int


def _name(impl) -> str:
    return str(getattr(impl, "name", type(impl).__name__))


class PNMixLayer(CacheLayerMixin):
    """One attention layer's PN-Mix cache inside a transformers `Cache`."""

    is_compileable = False
    is_sliding = False

    def __init__(
        self,
        config: PNMixConfig,
        backend: str,
        max_cache_len: int | None = None,
        check_finite: bool | str = True,
        window: int | None = None,
        stepwise: bool = False,
        schedule: TokenBitsSchedule | None = None,
        impl=None,
        capturable: bool = False,
    ) -> None:
        super().__init__()
        self.capturable = capturable
        self.config = config
        self.impl = impl  # the implementation whose create(config) builds this layer's cache (`builtin`, or impl=)
        self.stale: str | None = None  # why this layer's cache cannot be used until reset()
        self.schedule = schedule  # a per-token precision cache: each new token's bits
        self.backend = backend
        self.max_cache_len = max_cache_len
        self.check_finite = check_finite
        self.cache = None  # created at prefill, when the attention sees the queries
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self.window = window  # a windowed layer keeps its last window - 1 tokens exact
        self.stepwise = stepwise
        self._tail: tuple[torch.Tensor, torch.Tensor] | None = None  # exact newest tokens, for stepwise attention
        self.is_sliding = window is not None
        self._exact: tuple[torch.Tensor, torch.Tensor] | None = None
        self._values: torch.Tensor | None = None
        self._seen = 0
        self.attended = False  # this layer's attention ran after its last update
        self.owner: PNMixHFCache | None = None  # the Cache this layer belongs to, which rolls forwards back
        # [queries (a prefill's), keys, values] of the last forward, where the owner can crop into it
        self.kept: list | None = None
        self.pads: tuple[int, ...] | None = None  # a left-padded batch: each row's leading padding positions

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    _STATE = ("cache", "_pending", "_exact", "_tail", "_values", "_seen", "is_initialized", "attended")

    def checkpoint(self) -> tuple:
        """This layer's state now, to return to with `roll_back` (until `release`)."""
        if self.cache is None:
            inner = None
        elif not rewindable(self.cache):  # without the optional checkpoints only its length can be compared
            inner = _Unrewindable(self.cache.length)
        else:
            inner = self.cache.checkpoint()
        return tuple(getattr(self, name, None) for name in self._STATE), inner

    def roll_back(self, saved: tuple) -> None:
        fields, inner = saved
        if isinstance(inner, _Unrewindable):
            if fields[0].length != inner.length:  # its append went through and cannot be undone
                self.stale = (
                    f"PN-Mix: a forward failed after this layer's cache (impl={_name(self.impl)}) had stored its "
                    f"tokens ({inner.length} -> {fields[0].length}); its caches have no checkpoints (the protocol's "
                    "optional checkpoint/roll_back/release) to roll it back: call reset() on the PNMixHFCache, or "
                    "build a new one"
                )
        elif inner is not None:  # the packed cache existed: its own state goes back too
            fields[0].roll_back(inner)
        for name, value in zip(self._STATE, fields, strict=True):
            setattr(self, name, value)

    def release(self, saved: tuple) -> None:
        if saved[1] is not None and not isinstance(saved[1], _Unrewindable):
            saved[0][0].release(saved[1])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.stale is not None:
            raise RuntimeError(self.stale)
        self.attended = False
        if self.owner is not None and self.owner.croppable:
            self.kept = [None, key_states, value_states]
        if not self.is_initialized:
            if key_states.shape != value_states.shape:
                raise ValueError(
                    f"PN-Mix caches hold keys and values of one shape; this model's are "
                    f"{tuple(key_states.shape)} and {tuple(value_states.shape)}"
                )
            self.lazy_initialization(key_states, value_states)
        if self._exact is not None:  # a windowed layer: attention reads what it held and the new tokens
            key_states = torch.cat([self._exact[0], key_states], dim=2)
            value_states = torch.cat([self._exact[1], value_states], dim=2)
            self._seen += key_states.shape[2] - self._exact[0].shape[2]
            self._exact = self._keep(key_states, value_states)
        elif self.cache is None:
            if self._pending is not None:
                raise RuntimeError(
                    f"PN-Mix: the model did not run attn_implementation={ATTENTION!r} after a prefill "
                    "update (its attention bypasses transformers' attention interface)"
                )
            self._pending = (key_states, value_states)
        elif self.schedule is not None:
            if self.stepwise:  # what a token-by-token decode would read from the leftover (`attend_stepwise`)
                self._tail = self.cache.leftover_keys(), key_states
            self.cache.append(key_states, value_states, self.schedule(self.cache.length, key_states.shape[2]))
        else:
            if self.stepwise and isinstance(self.cache, RowCaches):  # each row's own residual and new tokens
                self._tail = [
                    (torch.cat([rk, key_states[b : b + 1]], dim=2), torch.cat([rv, value_states[b : b + 1]], dim=2))
                    for b, (rk, rv) in enumerate(self.cache.residual())
                ]
            elif self.stepwise:
                res_k, res_v = self.cache.residual()
                self._tail = torch.cat([res_k, key_states], dim=2), torch.cat([res_v, value_states], dim=2)
            self.cache.append(key_states, value_states)
        # How the attention function finds this layer: an attribute of a fresh alias of the keys, never of a
        # tensor the cache may keep a view of (a view's base is held by C++, out of the garbage collector's sight,
        # so the keys -> layer -> cache -> view -> keys cycle would keep every context's cache alive).
        key_states = key_states.view_as(key_states)
        key_states._pnmix_layer = self
        self._values = value_states  # what attention must be given: it reads the cache's values
        return key_states, value_states

    def _keep(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The last window - 1 tokens: all that a later query can see besides itself."""
        first = max(k.shape[2] - (self.window - 1), 0)
        return k[:, :, first:].contiguous(), v[:, :, first:].contiguous()

    def start(self, query_states: torch.Tensor) -> None:
        """Build the cache from the prompt once the queries are known (Eq. 6 needs them), or,
        for a layer with an attention window, keep its last window - 1 tokens exact."""
        k, v = self._pending
        if self.owner is not None and self.owner.prefill is not None:
            self.owner.prefill.append((query_states, k, v))
        if self.window is not None:
            self._seen, self._exact, self._pending = k.shape[2], self._keep(k, v), None
            return
        cache = self.impl.create(self.config)
        if self.stepwise and not callable(getattr(cache, "attend_stepwise", None)):
            raise ValueError(
                f"stepwise=True: the caches of impl={_name(self.impl)!r} have no attend_stepwise (the "
                "protocol's optional stepwise attention); feed one token per forward, or build without stepwise"
            )
        if self.pads is not None:  # a left-padded batch: a cache per row, from the row's own tokens
            if self.schedule is not None:
                raise UnsupportedOperation(
                    "PN-Mix: a padded batch with a per-token precision config (its bits follow positions): run the "
                    "sequences separately"
                )
            made = iter([cache])
            cache = RowCaches.prefill(
                lambda: next(made, None) or self.impl.create(self.config), self.pads, query_states, k, v
            )
        elif self.schedule is not None:  # a per-token precision cache: the prompt's bits
            cache.prefill(query_states, k, v, self.schedule(0, k.shape[2]))
        else:
            cache.prefill(query_states, k, v)
        self.cache, self._pending = cache, None

    @property
    def started(self) -> bool:
        return self.cache is not None or self._exact is not None

    def get_seq_length(self) -> int:
        if self._exact is not None:
            return self._seen
        if self.cache is not None:
            return self.cache.length
        return 0 if self._pending is None else self._pending[0].shape[2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_cache_shape(self) -> int:
        return -1 if self.max_cache_len is None else self.max_cache_len

    def get_max_length(self) -> int:
        """As `DynamicCache`'s layers: a windowed layer's window, else the capacity (-1: none)."""
        return self.window if self.window is not None else self.get_max_cache_shape()

    # transformers' layers hold `keys` and `values` tensors (None before the first update) that tools read (kvpress,
    # offloading); a PN-Mix layer holds packed pages, so these are what it holds, dequantized, built on each read: the
    # sinks, the quantized region read back and the exact residual, [B, H_kv, T, d] in the model's dtype; a windowed
    # layer's are its exact last window - 1 tokens, as `DynamicSlidingWindowLayer`'s.
    @property
    def keys(self) -> torch.Tensor | None:
        held = self._held()
        return None if held is None else held[0]

    @keys.setter
    def keys(self, value) -> None:
        self._refuse_assignment("keys", value)

    @property
    def values(self) -> torch.Tensor | None:
        held = self._held()
        return None if held is None else held[1]

    @values.setter
    def values(self, value) -> None:
        self._refuse_assignment("values", value)

    def _held(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self._exact is not None:
            return self._exact
        if self.cache is not None:
            k, v = self.cache.dequantize()
            return k.to(self.dtype), v.to(self.dtype)
        return self._pending

    @staticmethod
    def _refuse_assignment(name: str, value) -> None:
        if value is not None:  # transformers' layer constructor sets both to None; nothing else may write them
            raise AttributeError(
                f"a PN-Mix layer's {name} are read from its packed cache; write through update() instead"
            )

    def reset(self) -> None:
        """Back to a layer that has seen nothing: no tensor of the last sequence is kept."""
        self.cache, self._pending, self.is_initialized, self.stale = None, None, False, None
        self._exact, self._tail, self._values, self._seen, self.attended = None, None, None, 0, False
        self.pads = None

    def unselectable(self) -> str | None:
        """Why this layer cannot keep a subset of its batch rows (None: it can)."""
        if self.cache is None or callable(getattr(self.cache, "select_rows", None)):
            return None
        return (
            f"the caches of impl={_name(self.impl)} have no select_rows (the protocol's optional batch-row selection, "
            "which beam search and a batch's expansion need)"
        )

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows `index`, in that order, of everything this layer holds (`PNMixHFCache.select_rows`)."""
        if why := self.unselectable():
            raise UnsupportedOperation(f"PN-Mix: {why}")
        if self.cache is not None:
            self.cache.select_rows(index)
        if not self.is_initialized:
            return
        index = index.to(self.device)

        def rows(held):
            if held is None:
                return None
            if isinstance(held, tuple):
                return tuple(rows(x) for x in held)
            if isinstance(held, list):  # one entry per row (a padded batch's stepwise tails)
                return [held[i] for i in index.tolist()]
            return held.index_select(0, index)

        if self.pads is not None:
            self.pads = tuple(self.pads[i] for i in index.tolist())

        self._pending, self._exact, self._tail, self._values = (
            rows(self._pending),
            rows(self._exact),
            rows(self._tail),
            rows(self._values),
        )

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.select_rows(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if batch := self._batch():
            self.select_rows(torch.arange(batch).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.select_rows(indices.nonzero().flatten() if indices.dtype == torch.bool else indices)

    def _batch(self) -> int:
        for held in (self._exact, self._pending):
            if held is not None:
                return held[0].shape[0]
        if isinstance(self.cache, RowCaches):
            return self.cache.batch
        return self.cache.dequantize()[0].shape[0] if self.cache is not None else 0

    def crop(self, max_length: int) -> None:
        raise UnsupportedOperation(
            "PN-Mix: a layer is cropped through its PNMixHFCache (croppable=True), which rolls every layer back "
            "together"
        )

    @property
    def is_croppable(self) -> bool:
        """Whether `crop` can put this layer back as it was (transformers asks before assisted decoding): its
        PNMixHFCache was built with croppable=True and its cache rolls back (the protocol's optional checkpoints)."""
        return self.owner is not None and self.owner.croppable and (self.cache is None or rewindable(self.cache))

    def replay(self, n: int) -> None:
        """After a roll back to the state before the last forward: store its first n tokens again, as a forward of
        those tokens alone would (a prefill is built again from their queries: Eq. 6 sees none of the tokens
        dropped). What is kept shrinks to them, so a later crop can go back into them again."""
        q, k, v = self.kept
        k, v, q = k[:, :, :n], v[:, :, :n], None if q is None else q[:, :, :n]
        if n == 0:
            self.kept = [q, k, v]
            return
        self.update(k, v)
        if not self.started:
            self.start(q)
        self.kept[0] = q
        self.attended = True


class PNMixHFCache(Cache):
    """A transformers Cache with one PN-Mix layer per decoder layer of `model_config`.

    config: any configuration of the cache family (PN-Mix, or a baseline from
    reference.methods); its pair_layout must match the model's RoPE: it is checked against what
    the model's rotary function does (`detect_pair_layout`), and must be given explicitly
    (`pair_layout=`) where that cannot be told.
    backend: "reference" (CPU), "triton", or "auto" (Triton when CUDA is available).
    max_cache_len: preallocate every layer for this many tokens (the paper's static protocol;
    Triton backend); generating past it raises ValueError.
    check_finite: check inputs for NaN, Inf and magnitude (`pnmix.PNMixCache`). True (default):
    the prompt is checked as it is stored; a decode step's inputs on the device, with no read
    back (Triton backend: a decode step never waits on the GPU), reported when the flags are
    read: by `check()` (one read for every layer), by the next forward of more than one token
    (a prompt continuation or a chunk, whose mask check waits on the device anyway), or by a
    layer cache's `sync_length()`; the error names the argument (k, v or q) and the cache
    refuses further use. "eager": every call checks before it stores (a few syncs per layer
    and step). False (Triton backend): no checks, as the benchmarks run. The reference backend
    and `impl=` check every call as they store it, whether True or "eager", except calls torch.compile
    traces, whose checks the reference backend runs on the device and `check()` reads (no graph break).
    capturable: every layer's one-token decode step launches the same work whatever the length,
    a residual page's completion included (`pnmix.PNMixCache`'s capturable): with max_cache_len,
    Triton backend, a selection fixed at prefill and values flushed with their keys.
    stepwise: each of several new tokens fed in one forward (teacher forcing over chunks) attends
    as it would had the tokens been decoded one at a time (`reference.ReferenceCache.attend_stepwise`,
    the rule of `reference.channels.stepwise` over the cache's own codes; any backend, and impl= whose
    caches have the protocol's optional `attend_stepwise`): long-output fidelity at the cost of one
    forward per chunk. A one-token step reads the cache as `attend` does (the Triton decode kernel).

    config may instead be a `reference.tokens.config.TokenPrecisionConfig` (TriAxialKV, role-aware
    PN-Mix: per-token precision; its Triton backend decodes with `pnmix.kernels.token_attention`, the
    stores quantized by the spec's code): token_bits then gives the bits of the first
    positions (the prompt's, from its role tags: `reference.tokens.roles`, `reference.tokens.allocation`) and
    generated_bits those of every later token (default: config.high_bits).

    croppable: keep every layer's state before the last forward and that forward's inputs until the next one
    completes, so that `crop` can drop tokens of it (assisted and prompt-lookup decoding): one forward's queries,
    keys and values (a prompt's, until the first decode step ends) held on top of the cache.

    impl: instead of a backend, an implementation of `reference.contract` (anything with
    `create(config)`, such as a plug-in the conformance suite loads): each quantized layer's cache
    is then `impl.create(config)`, filled by `prefill(q, k, v)` and `append(k, v)` and read by
    `attend(q)`, and by the protocol's optional methods where its caches have them:
    `attend_stepwise` (for stepwise=True) and `checkpoint` / `roll_back` / `release` (`rewindable`: a
    failed forward rolled back, and `checkpoint()` / `roll_back()` of this Cache). What needs more than
    the protocol is not available and raises: max_cache_len (no preallocation: the protocol has no
    capacity), check_finite=False (the implementation checks its inputs as it does), a per-token
    precision config, and attention with a scaling other than 1/sqrt(head_dim) or with softcapping
    (`attend(q)` takes neither). Without checkpoints a forward that fails is rolled back only where no
    layer's cache stored its tokens yet: otherwise the cache refuses every later update, saying why,
    until `reset()`.
    """

    def __init__(
        self,
        model_config,
        config: PNMixConfig | None = None,
        *,
        backend: str = "auto",
        pair_layout: str | None = None,
        max_cache_len: int | None = None,
        check_finite: bool | str = True,
        capturable: bool = False,
        stepwise: bool = False,
        token_bits=None,
        generated_bits: int | None = None,
        impl=None,
        croppable: bool = False,
    ) -> None:
        config = PNMixConfig() if config is None else config
        if not isinstance(config, (PNMixConfig, TokenPrecisionConfig)):
            raise TypeError(f"config must be a PNMixConfig or a TokenPrecisionConfig, got {type(config).__name__}")
        per_token = isinstance(config, TokenPrecisionConfig)
        if max_cache_len is not None and (
            isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 1
        ):
            raise ValueError(
                f"max_cache_len={max_cache_len!r}: expected a positive int (the tokens to preallocate) or None"
            )
        if not per_token and (token_bits is not None or generated_bits is not None):
            raise ValueError(
                "token_bits and generated_bits are for a per-token precision config (TokenPrecisionConfig)"
            )
        if per_token and max_cache_len is not None:
            raise ValueError(
                "max_cache_len: a per-token precision cache (TokenPrecisionConfig) grows exactly; "
                "static preallocation is not supported for it"
            )
        if has_rope(model_config) is False:
            raise ValueError(
                f"model_type={getattr(model_config, 'model_type', None)!r} has no rotary position embedding (RoPE): "
                "PN-Mix's pairs are the channel pairs RoPE rotates together, which this model does not have"
            )
        detected = detect_pair_layout(model_config)
        expected = pair_layout or detected
        if expected is None:
            raise ValueError(
                f"cannot tell the RoPE pair layout of model_type={getattr(model_config, 'model_type', None)!r}: "
                "pass pair_layout='split' (rotate_half) or 'adjacent' (interleaved pairs)"
            )
        if pair_layout is not None and detected is not None and pair_layout != detected:
            raise ValueError(
                f"pair_layout={pair_layout!r} contradicts the model's {detected!r} RoPE layout "
                "(probed from its apply_rotary_pos_emb)"
            )
        if config.pair_layout != expected:
            raise ValueError(
                f"config.pair_layout is {config.pair_layout!r} but this model's RoPE pairs are {expected!r}: "
                f"use dataclasses.replace(config, pair_layout={expected!r})"
            )
        if backend not in ("auto", "reference", "triton"):
            raise ValueError(f"backend must be 'auto', 'reference' or 'triton', got {backend!r}")
        check_finite = check_finite_mode(check_finite)
        if impl is not None:
            backend = _implementation_backend(impl, backend, per_token, max_cache_len, check_finite, stepwise)
        elif backend == "auto":
            backend = "triton" if torch.cuda.is_available() else "reference"
        if max_cache_len is not None and backend != "triton":
            raise ValueError(f"max_cache_len (static preallocation) needs backend='triton', got backend={backend!r}")
        if not check_finite and backend != "triton":
            raise ValueError(f"check_finite=False needs backend='triton', got backend={backend!r}")
        if capturable is not False and backend != "triton":
            raise ValueError(f"capturable needs backend='triton', got backend={backend!r}")
        if capturable is not False:
            from pnmix.cache import PNMixCache  # deferred: it imports triton

            PNMixCache(config, max_cache_len=max_cache_len, capturable=capturable)  # refuses what it cannot serve
        if not isinstance(croppable, bool):
            raise TypeError(f"croppable must be a bool, got {type(croppable).__name__}")
        self.config = config
        self.check_finite = check_finite
        self.impl = impl
        self.croppable = croppable
        schedule = TokenBitsSchedule(config, token_bits, generated_bits) if per_token else None
        builds = impl if impl is not None else builtin(backend, max_cache_len, check_finite, capturable)
        layers = [
            PNMixLayer(config, backend, max_cache_len, check_finite, window, stepwise, schedule, builds, capturable)
            for window in layer_windows(model_config)
        ]
        super().__init__(layers=layers)
        for layer in layers:
            layer.owner = self
        self._forward: dict[int, tuple] = {}  # layer index -> its checkpoint, for the running forward
        # croppable: every layer's checkpoint before the last complete forward, and the length it started from
        self._last: tuple[dict[int, tuple], int] | None = None
        self._start = 0  # the length the running forward started from
        self.model_checked = False  # the model running the cache has its layers (`_check_model`, once)
        self.prefill: list | None = None  # (q, k, v) per layer of the prefill, once `record_prefill` asked

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """A forward is all or nothing up to its last attention: each layer's state before it is kept
        until every layer's attention has run. A failure inside a PN-Mix update or attention rolls
        every layer back at once; a failure elsewhere between them (e.g. out of memory in an MLP)
        is found when the next forward begins, and rolled back then. What fails after the last
        attention (the final norm, the LM head) leaves the forward stored, as in any Cache."""
        if not 0 <= layer_idx < len(self.layers):
            raise ValueError(
                f"layer_idx={layer_idx}: this PNMixHFCache was built for {len(self.layers)} layers (from the "
                "model_config given); build it from the config of the model that runs it"
            )
        if layer_idx in self._forward:  # a layer updated again: the last forward stopped part-way
            self.roll_back_forward()
        elif any(not self.layers[i].attended for i in self._forward):  # the forward went on past a layer
            self.roll_back_forward()
            raise RuntimeError(
                f"PN-Mix: the model did not run attn_implementation={ATTENTION!r} after a cache "
                "update (its attention bypasses transformers' attention interface)"
            )
        if not self._forward and key_states.shape[2] > 1:  # the forward's mask check waited already
            self.check()
        if not self._forward:
            self._start = self.get_seq_length()
        self._forward[layer_idx] = self.layers[layer_idx].checkpoint()
        try:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        except BaseException:
            self.roll_back_forward()
            raise

    def check(self) -> None:
        """Report the deferred input checks of every layer: the Triton caches' (`pnmix.PNMixCache.check`) with one
        device->host read, and those of any other cache with a `check()` (the spec's defers the checks of calls
        torch.compile traced, `reference.ReferenceCache.check`): ValueError naming the layer and the first bad
        argument given since its prefill. Layers not started yet, and caches that check eagerly, pass."""
        started = [(i, layer.cache) for i, layer in enumerate(self.layers) if _is_triton(layer.cache)]
        if started:
            from pnmix.cache import check_caches  # deferred: it imports triton

            try:
                check_caches([cache for _, cache in started], "PNMixHFCache.check()")
            except ValueError as error:
                bad = next(i for i, cache in started if cache._failure is not None)
                raise ValueError(f"layer {bad}: {error}") from None
        for i, layer in enumerate(self.layers):
            if (
                layer.cache is not None
                and not _is_triton(layer.cache)
                and callable(check := getattr(layer.cache, "check", None))
            ):
                try:
                    check()
                except ValueError as error:
                    raise ValueError(f"layer {i}: {error}") from None

    def attended(self) -> None:
        """A layer's attention ran: once every layer's has, the forward is kept (checkpoints dropped)."""
        if len(self._forward) == len(self.layers) and all(self.layers[i].attended for i in self._forward):
            if self.croppable:  # kept until the next forward completes: `crop` can go back into this one
                self._drop_last()
                self._last = dict(self._forward), self._start
            else:
                for i, saved in self._forward.items():
                    self.layers[i].release(saved)
            self._forward.clear()

    def _drop_last(self) -> None:
        """The checkpoints of the last forward are not needed any more (a later forward, a reset, a selection)."""
        if self._last is not None:
            for i, saved in self._last[0].items():
                self.layers[i].release(saved)
            self._last = None

    def roll_back_forward(self) -> None:
        """Every layer back to its state before the forward in progress (or the last one, if it
        did not go through every layer)."""
        for i, saved in reversed(self._forward.items()):
            self.layers[i].roll_back(saved)
            self.layers[i].release(saved)
        self._forward.clear()

    def record_prefill(self) -> None:
        """Keep what the next prefill gives every layer (post-RoPE queries, keys, values; `prefill`), so that
        caches of other configurations can start from the same forward (`replay_prefill`)."""
        if any(layer.is_initialized for layer in self.layers):
            raise RuntimeError("record_prefill: this cache has already seen a prefill; call it on a new cache")
        self.prefill = []

    def replay_prefill(self, prefill: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        """Start every layer from the (queries, keys, values) another cache recorded at its prefill
        (`record_prefill`), as if this cache had seen that forward: prefill attention is exact and the
        same whatever the cache, so a sweep of configurations runs the model over a prompt once."""
        if any(layer.is_initialized for layer in self.layers):
            raise RuntimeError("replay_prefill: this cache has already seen a prefill; call it on a new cache")
        if len(prefill) != len(self.layers):
            raise ValueError(f"prefill holds {len(prefill)} layers; this model has {len(self.layers)}")
        for layer, (q, k, v) in zip(self.layers, prefill, strict=True):
            layer.update(k, v)
            layer.start(q)

    def checkpoint(self) -> list:
        """Every layer's state now, to return to with `roll_back` (any number of times): how the
        continuations of one context are scored from one pass over it."""
        return [layer.checkpoint() for layer in self.layers]

    def roll_back(self, saved: list) -> None:
        """Every layer back to `saved` (it holds references to tensors that updates replace, never
        write into)."""
        self._drop_last()  # the last forward is not the one that led here
        for layer, state in zip(self.layers, saved, strict=True):
            layer.roll_back(state)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens every layer holds: after a forward that stopped part-way (and before the next one
        rolls it back), the length it started from, which the next forward's positions must use."""
        return min(layer.get_seq_length() for layer in self.layers)

    def get_mask_sizes(self, query_length, layer_idx: int = 0) -> tuple[int, int]:
        n = query_length if isinstance(query_length, int) else query_length.shape[0]
        return self.get_seq_length() + n, 0

    def reset(self) -> None:
        self._drop_last()
        self._forward.clear()
        super().reset()

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows `index` ([B'] integers, rows may repeat), in that order, in every layer: beam search's
        reorder (`reorder_cache`), a batch's expansion (`batch_repeat_interleave`) and selection
        (`batch_select_indices`). Every row's cache is its own, so each kept row holds what that row held (the
        reference backend and any implementation whose caches have `select_rows`); all or nothing: a refusal
        (a cache without it, rows out of range) or a failure leaves every layer as it was."""
        if whys := {why for layer in self.layers if (why := layer.unselectable())}:
            raise UnsupportedOperation("PN-Mix: " + "; ".join(sorted(whys)) + ": use greedy or sampling")
        if not isinstance(index, torch.Tensor):
            raise TypeError(f"index must be a torch.Tensor of batch rows, got {type(index).__name__}")
        saved = self.checkpoint()
        try:
            for layer in self.layers:
                layer.select_rows(index)
        except BaseException:
            self.roll_back(saved)
            raise
        finally:  # a checkpoint left open would log every later overwrite of a preallocated buffer
            for layer, state in zip(self.layers, saved, strict=True):
                layer.release(state)
        self._drop_last()  # its checkpoints hold the rows before the selection

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.select_rows(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        batch = next((b for layer in self.layers if (b := layer._batch())), 0)
        if batch:
            self.select_rows(torch.arange(batch).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.select_rows(indices.nonzero().flatten() if indices.dtype == torch.bool else indices)

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove tokens (0: none), as `DynamicCache.crop` in transformers 5.24 (a positive
        value is the length to keep, as in the transformers releases before it): how assisted and prompt-lookup
        decoding drop the candidate tokens the model rejected. A packed page is not rewound token by token: with
        croppable=True every layer keeps its state before the last forward and that forward's inputs, rolls back to
        it and stores the kept tokens again, so each layer holds what a cache that never saw the dropped tokens
        holds (a prefill is built again from the kept tokens' queries). Only tokens of the last forward can be
        dropped (UnsupportedOperation otherwise, nothing changed)."""
        if isinstance(tokens_to_remove, bool) or not isinstance(tokens_to_remove, int):
            raise TypeError(f"tokens_to_remove must be an int, got {type(tokens_to_remove).__name__}")
        length = self.get_seq_length()
        max_length = length + tokens_to_remove if tokens_to_remove <= 0 else tokens_to_remove
        if max_length >= length:
            return
        if not self.croppable:
            raise UnsupportedOperation(
                "PN-Mix: this cache cannot be cropped (quantized pages are not rewound token by token): build it "
                "with PNMixHFCache(..., croppable=True), which keeps the last forward's inputs and state to go back "
                "into (assisted and prompt-lookup decoding need it)"
            )
        if self._forward:  # a forward stopped part-way: back to where it began
            self.roll_back_forward()
        start = self._last[1] if self._last is not None else length
        if max_length < start:
            raise UnsupportedOperation(
                f"PN-Mix: crop to {max_length} tokens: a croppable cache goes back into its last forward only "
                f"(tokens {start} to {length}), not past it"
            )
        saved = self._last[0]
        if any(isinstance(saved[i][1], _Unrewindable) for i in saved):
            raise UnsupportedOperation(
                f"PN-Mix: the caches of impl={_name(self.impl)} have no checkpoints (the protocol's optional "
                "checkpoint/roll_back/release), which crop needs to go back into a forward"
            )
        for i, layer in enumerate(self.layers):
            layer.roll_back(saved[i])
            layer.replay(max_length - start)


#: The backend of layers whose caches an implementation object builds (`PNMixHFCache(impl=)`).
IMPL_BACKEND = "impl"


def builtin(backend: str, max_cache_len: int | None = None, check_finite: bool | str = True, capturable=False):
    """The built-in implementation a backend name stands for, holding the cache's options: one road from
    the Hugging Face cache to a cache, `create(config)` of an implementation of `reference.contract`."""
    if backend == "triton":
        from pnmix.protocol import TritonImplementation  # deferred: it imports triton, here where it is asked for

        return TritonImplementation(max_cache_len=max_cache_len, check_finite=check_finite, capturable=capturable)
    return ReferenceImplementation()


def _is_triton(cache) -> bool:
    """A cache of the Triton backend (which exists only once its module, and triton, were imported)."""
    module = sys.modules.get("pnmix.cache")
    return module is not None and isinstance(cache, module.PNMixCache)


def _implementation_backend(
    impl, backend: str, per_token: bool, max_cache_len, check_finite: bool, stepwise: bool
) -> str:
    """IMPL_BACKEND once `impl` and the other arguments ask nothing beyond the implementation protocol."""
    if not callable(getattr(impl, "create", None)):
        raise TypeError(f"impl must be an implementation with create(config), got {type(impl).__name__}")
    name = _name(impl)
    refused = {
        f"backend={backend!r}": (backend != "auto", "the implementation's own code runs"),
        "max_cache_len": (max_cache_len is not None, "no preallocation: the static protocol is not claimed"),
        "check_finite=False": (not check_finite, "the implementation checks its inputs as it does"),
        "a TokenPrecisionConfig": (
            per_token,
            "per-token precision caches take token bits the protocol's create(config) cache does not",
        ),
    }
    for what, (asked, why) in refused.items():
        if asked:
            raise ValueError(f"{what} cannot be used with impl={name!r}: {why}")
    return IMPL_BACKEND


def rewindable(cache) -> bool:
    """Whether a layer's cache has the protocol's optional checkpoints: `checkpoint()`, `roll_back(saved)`
    (to that state, any number of times until released) and `release(saved)`."""
    inner = cache.caches[0] if isinstance(cache, RowCaches) else cache  # a padded batch's: its rows'
    return all(callable(getattr(inner, name, None)) for name in ("checkpoint", "roll_back", "release"))


def _check_arguments(kwargs: dict, dropout: float) -> None:
    if dropout:
        raise ValueError(f"PN-Mix attention is for inference: dropout={dropout} cannot be honoured")
    for name, value in kwargs.items():
        if name in IGNORABLE or name == "softcap" or value is None or value is False:
            continue  # an argument left off asks nothing
        raise ValueError(f"PN-Mix attention cannot honour the attention argument {name}={value!r} this model passes")


def exact_attention(
    query, key, value, scaling: float, window: int | None, softcap: float | None, pads=None, first: int = 0
) -> torch.Tensor:
    """Causal attention of the last query.shape[2] positions over the last key.shape[2] positions,
    each query seeing the last `window` positions up to its own (all, with None), logits
    softcapped as cap * tanh(logits / cap) when given. [B, H, T, d] in, [B, H, T, d] out.
    pads: each row's leading padding positions, which no query of the row sees; `first`: the position of
    key 0 (the keys are positions first .. first + T_k - 1)."""
    t_q, t_k = query.shape[2], key.shape[2]
    if pads is not None and first < max(pads):  # some padding is among these keys
        return _padded_attention(query, key, value, scaling, window, softcap, pads, first)
    if softcap is not None:  # SDPA cannot cap logits: the spec's attention can
        return attention_ref(query, key, value, scale=scaling, causal=True, softcap=softcap, window=window)
    # SDPA as transformers calls it: no mask where none is needed, decided on the host (no sync)
    causal = window is None and t_q == t_k
    if causal or (t_q == 1 and (window is None or t_k <= window)):
        mask = None
    else:
        q_pos = torch.arange(t_k - t_q, t_k, device=query.device)[:, None]
        k_pos = torch.arange(t_k, device=query.device)[None, :]
        mask = (k_pos <= q_pos) & (k_pos > q_pos - (t_k if window is None else window))
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=causal and t_q > 1, scale=scaling, enable_gqa=True
    )


def _padded_attention(query, key, value, scaling, window, softcap, pads, first: int) -> torch.Tensor:
    """`exact_attention` where some keys are a row's padding: masked out for every query of the row, but a padding
    query's own position, so that no softmax row is empty (a padding position's output is never read by a real
    token, which sees no padding)."""
    t_q, t_k, device = query.shape[2], key.shape[2], query.device
    k_pos = torch.arange(first, first + t_k, device=device)
    q_pos = k_pos[t_k - t_q :]
    sees = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        sees &= k_pos[None, :] > q_pos[:, None] - window
    real = k_pos[None, :] >= torch.tensor(pads, device=device)[:, None]  # [B, T_k]
    mask = (sees[None] & real[:, None, :]) | (k_pos[None, None, :] == q_pos[None, :, None])
    mask = mask[:, None]  # [B, 1, T_q, T_k]
    if softcap is None:
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scaling, enable_gqa=True
        )
    group = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(group, dim=1).float(), value.repeat_interleave(group, dim=1).float()
    logits = softcap * torch.tanh(query.float() @ k.transpose(-1, -2) * scaling / softcap)
    weights = torch.softmax(logits.masked_fill(~mask, -math.inf), dim=-1)
    return (weights @ v).to(query.dtype)


def pnmix_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """attn_implementation="pnmix": exact prefill, packed-cache decode; layers with an attention
    window stay exact. Returns ([B, T, H, d], None)."""
    layer = getattr(key, "_pnmix_layer", None)
    if layer is None:
        raise RuntimeError(
            f"PN-Mix: attn_implementation={ATTENTION!r} needs past_key_values=PNMixHFCache(...) "
            "and the keys its update returned"
        )
    if getattr(layer, "ragged", False):  # rows at their own lengths (`pnmix.ragged`): each row's own attention
        return layer.attention(module, query, value, attention_mask, scaling, dropout, **kwargs)
    if layer.owner is not None and not layer.owner.model_checked:
        _check_model(layer.owner, getattr(module, "config", None))
    try:
        out = _attend(layer, query, key, value, attention_mask, scaling, dropout, **kwargs)
    except BaseException:
        if layer.owner is not None:
            layer.owner.roll_back_forward()  # the forward fails: no layer keeps its tokens
        raise
    layer.attended = True
    if layer.owner is not None:
        layer.owner.attended()
    return out.transpose(1, 2).contiguous(), None


def _check_model(cache, model_config) -> None:
    """Once per cache: the model that runs it has the layers it was built for (a cache built from another
    model's config would leave layers without a forward, or name a layer it does not have)."""
    try:
        expected = len(layer_windows(model_config)) if model_config is not None else None
    except Exception:  # a config this check cannot read: the cache's own checks remain
        expected = None
    if expected is not None and expected != len(cache.layers):
        cache.roll_back_forward()
        raise ValueError(
            f"this model has {expected} cache layers and its PNMixHFCache {len(cache.layers)}: build the cache from "
            "the config of the model that runs it"
        )
    cache.model_checked = True


def _attend(layer, query, key, value, attention_mask, scaling, dropout, **kwargs) -> torch.Tensor:
    if value is not layer._values:
        raise ValueError(
            "PN-Mix attention reads the values the cache holds; this model attends with other values "
            "(e.g. differential attention)"
        )
    _check_arguments(kwargs, dropout)
    if attention_mask is not None and not isinstance(attention_mask, LayerMask):
        raise ValueError(
            f"attention_mask of type {type(attention_mask).__name__}: PN-Mix reads only the masks its "
            f"attn_implementation={ATTENTION!r} mask function builds"
        )
    d = query.shape[-1]
    scaling = d**-0.5 if scaling is None else float(scaling)
    window, softcap = attention_mask.window if attention_mask is not None else None, kwargs.get("softcap")
    pads = attention_mask.pads if attention_mask is not None else None
    if not layer.started:
        layer.pads = pads
    elif pads is not None and pads != layer.pads:
        raise ValueError(
            f"the padding of this forward's rows {pads} is not that of their prompt {layer.pads}: a padded batch "
            "keeps its prompt's left padding"
        )
    if not layer.started and layer.window is None and softcap is not None and layer.backend == "triton":
        raise ValueError(
            f"softcap={softcap}: the Triton decode kernel does not apply attention logit softcapping "
            "(a quantized layer of this model needs it); use backend='reference'"
        )
    if layer.backend == IMPL_BACKEND and layer.window is None:
        _check_protocol_attention(layer.impl, d, scaling, softcap)
    through_impl = layer.backend == IMPL_BACKEND and layer.started and layer.window is None
    if not layer.started or layer.window is not None:  # the prompt, or a windowed layer
        first = layer.get_seq_length() - key.shape[2]  # the position of the first key given
        out = exact_attention(query, key, value, scaling, window, softcap, layer.pads, first)
        if not layer.started:
            if layer.kept is not None and layer.window is None:  # a cropped prefill is built again from its queries
                layer.kept[0] = query  # (a windowed layer keeps exact keys and values alone: no queries)
            layer.start(query)
    elif layer.stepwise and isinstance(layer.cache, RowCaches):
        out = layer.cache.attend_stepwise(query, layer._tail, scale=scaling, softcap=softcap)
    elif layer.stepwise:
        out = layer.cache.attend_stepwise(query, *layer._tail, scale=scaling, softcap=softcap)
    elif layer.backend == IMPL_BACKEND:
        out = layer.cache.attend(query)
    else:
        out = layer.cache.attend(query, scale=scaling, softcap=softcap)
    if through_impl:
        _check_attention_output(layer, query, out)
    return out


def _check_attention_output(layer, query: torch.Tensor, out: object) -> None:
    """An implementation's attention (impl=) is finite where its queries are (its cache was given finite
    keys and values: `update` checks them): a NaN it returns is named here, with its layer, not found as
    the next layer's keys. One device->host read per layer and forward."""
    where = f"impl={_name(layer.impl)!r} at layer {_index(layer)}"
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(query.shape):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"attention of {where} returned {shape}, expected the queries' shape {tuple(query.shape)}")
    if not bool(torch.isfinite(out).all()) and bool(torch.isfinite(query).all()):
        raise ValueError(
            f"attention of {where} returned NaN or Inf from finite queries over its cache of finite keys and "
            "values: the implementation's attend is at fault"
        )


def _index(layer) -> int | str:
    owner = layer.owner
    return next((i for i, other in enumerate(owner.layers) if other is layer), "?") if owner is not None else "?"


def _check_protocol_attention(impl, head_dim: int, scaling: float, softcap: float | None) -> None:
    """`attend(q)` of the implementation protocol scales by 1/sqrt(head_dim) and caps nothing."""
    if softcap is not None:
        raise ValueError(
            f"softcap={softcap}: attend(q) of impl={_name(impl)!r} (the implementation protocol) "
            "does not apply attention logit softcapping, which this model needs"
        )
    if not math.isclose(scaling, head_dim**-0.5, rel_tol=1e-6):
        raise ValueError(
            f"scaling={scaling}: attend(q) of impl={_name(impl)!r} (the implementation protocol) "
            f"scales by 1/sqrt(head_dim) = {head_dim**-0.5:.6g}; this model asks otherwise"
        )


def _window(mask_function, local_size: int | None) -> int | None:
    """The attention window of the model's mask function, checked at a few positions to be
    causal, limited to the last local_size positions when the model asks for a local mask."""
    q = (1 << 20) + 3

    def sees(k: int) -> bool:
        return bool(mask_function(0, 0, torch.tensor(q), torch.tensor(k)))

    span = q if local_size is None else local_size
    probes = sorted({0, q - span, q - span + 1, q - 2, q - 1, q, q + 1} - {-1})
    try:
        ok = all(sees(k) == (k <= q and (local_size is None or k > q - span)) for k in probes)
    except Exception as error:  # a mask that needs more than positions (e.g. per-token types)
        raise ValueError(f"PN-Mix cannot read this model's attention mask function ({error})") from None
    if not ok:
        raise ValueError(
            f"this model's attention mask is not causal{'' if local_size is None else f' over a window of {span}'} "
            "(chunked or bidirectional attention): PN-Mix caches cannot honour it"
        )
    return local_size


def pnmix_mask(
    batch_size,
    q_length,
    kv_length,
    q_offset=0,
    kv_offset=0,
    mask_function=None,
    attention_mask=None,
    local_size=None,
    **kwargs,
):
    """The layer's `LayerMask`: causal attention, over the last local_size positions when the model
    builds a local (sliding-window) mask; anything else (chunked, bidirectional) raises.

    A left-padded batch gives each row's leading padding (`_pads`); any other padding raises. Padding and the
    mask function are looked at in the prompt and any multi-token call; one-token decode steps skip both, which
    would read values back every step (generation extends the mask with ones, and the model's mask function stays
    the same)."""
    decode_step = q_length == 1 and q_offset != 0
    pads = None if attention_mask is None or decode_step else _pads(attention_mask)
    if mask_function is None or decode_step:  # a decode step keeps the mask its prompt was checked with
        return LayerMask(local_size, pads)
    return LayerMask(_window(mask_function, local_size), pads)


def _pads(attention_mask: torch.Tensor) -> tuple[int, ...] | None:
    """Each row's leading padding in a padding mask [B, T] (ones: tokens, zeros: padding); None when no row is
    padded. Left padding only: padding after a token (right padding, holes) would sit inside a row's cache."""
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask of shape {tuple(attention_mask.shape)}: PN-Mix reads a 2D padding mask [batch, length]"
        )
    tokens = attention_mask.bool()
    if bool(tokens.all()):
        return None
    pads = (~tokens).sum(dim=-1)
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    if not bool((tokens == (positions[None, :] >= pads[:, None])).all()):
        raise ValueError(
            "PN-Mix caches take left padding only: this attention_mask has padding after a token (right padding or "
            "holes), which would enter a row's cache; pad on the left (tokenizer.padding_side = 'left')"
        )
    if bool((pads == tokens.shape[1]).any()):
        raise ValueError("a row of this batch is all padding: give every row at least one token")
    return tuple(int(p) for p in pads.tolist())


AttentionInterface.register(ATTENTION, pnmix_attention)
AttentionMaskInterface.register(ATTENTION, pnmix_mask)
