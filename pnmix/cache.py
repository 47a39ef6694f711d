"""`PNMixCache`: the PN-Mix key/value cache on Triton kernels, dynamic or preallocated.

Same behaviour as `reference.ReferenceCache` (the spec), bit for bit in what it stores: the
components of `reference.channels.layout.CacheLayout`, each a `_Rows` buffer (or, for the pair mask,
a tensor stored once), so the storage report is measured from the tensors actually held.
Derived metadata (per-channel bits, the high-plane columns) is rebuilt from the stored
selection when a page is flushed, never stored.
"""

from __future__ import annotations

import dataclasses
import struct

import torch

from pnmix import _runtime
from pnmix.kernels import (
    append_rows,
    decode_attention,
    dequantize_plane,
    encode_pack,
    fragment,
    fragment_attention,
    fragment_check,
    group_params,
)
from pnmix.kernels.attention import PackedRegion
from reference import CacheLayout, PNMixConfig, StorageReport, TokenLayout, measure, token_layout
from reference.channels import deferred, validation
from reference.channels.cache import all_or_nothing
from reference.channels.deferred import FLAG_BYTES, WATCHED, check_finite_mode  # noqa: F401 (this module's interface)
from reference.channels.stepwise import stepwise_attention
from reference.equations import packing as spec_packing
from reference.equations import saliency
from reference.equations.quant import Quantized


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


#: Device-side int32 counts: n_sink, n_quantized, n_residual, n_value_quantized and the append
#: kernel's arrivals.
COUNTS = 5
LAYOUT_COUNTS = 4
#: Bytes a cache holds beyond its layout's components (the counts), whatever its size; the deferred checks'
#: flags (check_finite=True) hold FLAG_BYTES more (`reference.channels.deferred`).
BOOKKEEPING_BYTES = COUNTS * 4
#: How a cache may order the codes of its quantized region (`PNMixCache`'s code_order).
CODE_ORDERS = ("auto", "spec", "fragment")
#: The quantized components whose codes fragment order reorders (scales and zeros keep the spec's order).
REORDERED = ("key_low", "key_high", "value_payload")


def check_caches(caches: list[PNMixCache], where: str) -> None:
    """`PNMixCache.check()` of several caches (a model's layers) with one device->host read per
    device; `where` names the caller in the error."""
    by_device: dict[torch.device, list[PNMixCache]] = {}
    for cache in caches:
        cache._require_prefill()
        cache._refuse_if_failed()
        if cache._flags is not None:
            by_device.setdefault(cache._flags.device, []).append(cache)
    for group in by_device.values():
        for cache, worst in zip(group, torch.stack([c._flags[1] for c in group]).tolist(), strict=True):
            cache._judge(worst, where)


class _Rows:
    """A [B, H, rows, cols] buffer that grows along rows: exact-size, or preallocated to `capacity` rows."""

    def __init__(self, b: int, h: int, cols: int, dtype, device, capacity: int | None) -> None:
        self.static = capacity is not None
        self.data = torch.empty(b, h, capacity or 0, cols, dtype=dtype, device=device)
        self.used = 0

    def view(self) -> torch.Tensor:
        return self.data[:, :, : self.used]

    def extend(self, n: int) -> torch.Tensor | None:
        """Room for n more rows, which the caller writes at row `used` (before the call) of `data`.
        Returns the previous buffer when growing reallocated it (the caller copies its rows over)."""
        old = None
        if self.static:
            if self.used + n > self.data.shape[2]:
                raise AssertionError("capacity was checked before any write")
        else:
            old = self.data
            self.data = torch.empty(*old.shape[:2], self.used + n, old.shape[3], dtype=old.dtype, device=old.device)
        self.used += n
        return old

    def grow(self, n: int) -> torch.Tensor:
        """Room for n more rows, returned as the view to write them into."""
        if self.static:
            if self.used + n > self.data.shape[2]:
                raise AssertionError("capacity was checked before any write")
        else:
            new = torch.empty(
                *self.data.shape[:2], self.used + n, self.data.shape[3], dtype=self.data.dtype, device=self.data.device
            )
            new[:, :, : self.used] = self.view()
            self.data = new
        self.used += n
        return self.data[:, :, self.used - n : self.used]

    def replace(self, rows: torch.Tensor) -> None:
        """Hold exactly `rows` (the residual after a flush)."""
        if self.static:
            self.data[:, :, : rows.shape[2]] = rows
        else:
            self.data = rows.clone(memory_format=torch.contiguous_format)
        self.used = rows.shape[2]


@dataclasses.dataclass
class _PageWork:
    """What a capturable cache launches every decode step to complete a residual page: the page
    quantized into `scratch` (one tensor per quantized component, one page of rows), then
    committed to page n_quantized / N of each component where the device count says the
    residual is full, and written back unchanged where it is not."""

    pages: int  # whole pages the quantized region has room for (> 0)
    bits: torch.Tensor  # int32 [B, H_kv, d]: each key channel's bits (the fixed selection)
    index: torch.Tensor  # int32 [B, H_kv, high channels]: the high plane's channels
    scratch: dict[str, torch.Tensor]
    delta: torch.Tensor  # int32 [3]: what a completed page adds to (n_quantized, n_residual, n_value_quantized)


@dataclasses.dataclass(eq=False)  # compared by identity: _open is searched for a checkpoint
class _Checkpoint:
    """A `PNMixCache` state to return to: host fields, each buffer's (tensor, rows used), and the
    held rows overwritten since, with what they held."""

    host: tuple
    rows: dict[str, tuple[_Rows, torch.Tensor, int]]
    # (buffer, the tensor written, what its held rows held): a selection since may have replaced the tensor
    overwritten: list[tuple[_Rows, torch.Tensor, torch.Tensor]] = dataclasses.field(default_factory=list)


class _NoBackward(torch.autograd.Function):
    """Decode attention as a node of the autograd graph whose backward raises: its output
    requires grad as the spec's does, and a backward through it fails by name instead of
    leaving the queries' gradient silently out."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, run) -> torch.Tensor:
        return run(q)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise RuntimeError(
            "PN-Mix's Triton decode attention has no backward: decode under torch.no_grad(), or use "
            "reference.ReferenceCache (plain PyTorch) where gradients must flow to the queries"
        )


def why_not_capturable(config: PNMixConfig) -> str | None:
    """What a cache of `config` lacks to be capturable (`PNMixCache`'s capturable=True), or None
    where it can be: a selection fixed at prefill and values flushed with their keys."""
    if config.selector.per_group or config.value_residual != "shared":
        return (
            "a selection fixed at prefill and values flushed with their keys (value_residual='shared'); "
            f"this configuration ({config.selector.name} selection, value_residual={config.value_residual!r}) "
            "decides on the host what a page completion writes"
        )
    return None


class PNMixCache:
    """PN-Mix cache for one attention layer (batch of equal-length sequences).

    max_cache_len preallocates every buffer once (the paper's static protocol); appending past
    it raises ValueError. Without it buffers grow exactly. float16 and bfloat16 inputs (the
    spec's ReferenceCache also takes float32); the kernels run compiled on CUDA or under the
    Triton interpreter on the CPU (pnmix._runtime). The buffers are the components of its
    `reference.channels.layout.CacheLayout`; every append carries out the layout's plan.

    code_order: the order of the codes inside the quantized region's pages (the bytes and their
    count are the spec's either way; `storage()` does not move). "spec": the layouts of
    `reference.equations.packing`, read by the Triton decode kernel. "fragment": the order the
    fragment-order loop's tensor-core fragments read them (`pnmix.kernels.fragment`), written at
    each page flush, read by that loop (`pnmix.kernels.fragment_attention`); needs the shape the
    loop is written for (ValueError naming what is missing: the default configuration, d = 128,
    float16 or bfloat16, float16 scales). "auto" (the default): fragment where the configuration allows it and the loop
    passed its first-use self-test on the device (`pnmix.kernels.fragment_check.decide`: one
    warning naming the case if it falls back), the spec's order elsewhere (a CPU). On a CPU a
    cache asked for "fragment" computes the loop's part with the loop's torch twin (tests).
    `packed()` gives the spec's bytes in both orders.

    check_finite: check that inputs hold no NaN or Inf and that keys and values fit the
    scale/zero dtype (the errors of `reference.channels.validation`, naming the argument).

    - True (the default): `prefill` checks q, k and v before it stores anything (ValueError,
      the cache stays empty). `append` and `attend` never wait on the device: each reduces its
      inputs to max |x| (NaN and Inf carry through) into flags the cache holds (a reduction per
      input and a maximum per call: five aten ops a decode step, FLAG_BYTES held) and reads
      nothing back, so a decode step stays three launches the host issues without waiting,
      and can be captured in a CUDA graph. Bad input goes through as given (NaN in, NaN out)
      and is reported at the first read of the flags: `check()`, `sync_length()` (one read,
      shared with the counts), `pnmix.hf.PNMixHFCache.check()` and the HF cache's next forward
      of more than one token. That read raises ValueError with the eager check's message,
      naming the first bad argument in the order k, v, q ("k contains NaN or Inf", "v has
      magnitude ...") and saying it was given since prefill; the cache then holds (or has
      attended with) what it was given, and every later `append`, `attend`, `check` and
      `sync_length` raises the same ValueError without a read: build a new cache. The inputs
      of a call that failed and was rolled back count too.
    - "eager": every call reads its checks back before it changes anything (up to five
      device->host syncs a decode step: k and v finite and in range, q finite); a bad input
      raises at once and leaves the cache as it was. What the implementation protocol
      promises (`pnmix.protocol`); cannot be captured in a CUDA graph.
    - False: no checks (the benchmarks, which record the setting).

    The token counts are held on the device too, next to the host mirror `length`, so that a
    decode step (an append that neither writes sinks nor completes a page, then attend) is
    three launches (append, attention splits, merge) that the host issues without waiting,
    and can be captured in a CUDA graph on a preallocated cache (check_finite True or False).
    Eager calls keep `length` exact; after replaying captured steps call `sync_length()`.

    capturable (needs max_cache_len, a selection fixed at prefill and values flushed with their
    keys: PN-Mix, KIVI with value_residual="shared"): every one-token decode step also launches
    the work of completing a residual page (quantize the residual's N rows, commit them to the
    next page of the quantized region where the device count says the residual is full, write
    that page back unchanged where it is not, move the counts), so the host makes no decision
    from the length and every step launches the same kernels with the same arguments: one
    captured step replays across page completions. It costs every step that page's kernels
    (group_params and encode_pack on N rows of keys and of values) and a few aten ops.

    `prefill` and `append` are all or nothing: whatever fails inside (a rejected argument, an
    allocation, a kernel, an interrupt), the cache is left as it was (`reference.channels.cache.all_or_nothing`).
    """

    def __init__(
        self,
        config: PNMixConfig | None = None,
        *,
        max_cache_len: int | None = None,
        check_finite: bool | str = True,
        capturable: bool = False,
        code_order: str = "auto",
    ) -> None:
        self.config = PNMixConfig() if config is None else config
        if not isinstance(self.config, PNMixConfig):
            raise TypeError(f"config must be a PNMixConfig, got {type(self.config).__name__}")
        if max_cache_len is not None and (
            isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 1
        ):
            raise ValueError(f"max_cache_len must be a positive int or None, got {max_cache_len!r}")
        if not isinstance(capturable, bool):
            raise TypeError(f"capturable must be a bool, got {capturable!r}")
        if capturable and max_cache_len is None:
            raise ValueError("capturable=True needs max_cache_len: a captured step writes into preallocated buffers")
        if capturable and (reason := why_not_capturable(self.config)):
            raise ValueError(f"capturable=True needs {reason}")
        if code_order not in CODE_ORDERS:
            raise ValueError(f"code_order must be one of {CODE_ORDERS}, got {code_order!r}")
        self.code_order_asked = code_order
        #: The order the quantized region's codes are stored in, set by prefill: "spec" or "fragment".
        self.code_order: str | None = None
        #: Where fragment order: how decode computes the quantized region (`fragment_attention.PATHS`) and why.
        self.fragment_path: tuple[str, str] | None = None
        self._high_index: torch.Tensor | None = None  # fragment order: each head's salient channels, int32
        self._semaphores: torch.Tensor | None = None  # fragment order on a device: the loop's merge counters
        self.capacity = max_cache_len
        self.capturable = capturable
        self._page: _PageWork | None = None  # capturable: set by prefill where a page fits
        self.check_finite = check_finite_mode(check_finite)
        self.saliency_computations = 0
        self.length = 0
        self.cache_layout: CacheLayout | None = None  # set by prefill
        self._rows: dict[str, _Rows] = {}  # components with a row axis
        self._fixed: dict[str, torch.Tensor] = {}  # components stored once (the pair mask)
        # int32 (n_sink, n_quantized, n_residual, n_value_quantized, arrivals): the layout on the
        # device, and the append kernel's arrival counter (0 between launches); set by prefill.
        self._counts: torch.Tensor | None = None
        self._open: list[_Checkpoint] = []  # checkpoints that may still be returned to, oldest first
        # check_finite=True: float32 [2, WATCHED], max |x| of the last call's inputs and since prefill
        self._flags: torch.Tensor | None = None
        self._failure: str | None = None  # the deferred checks' verdict, once read: every later call raises it

    @classmethod
    def from_prefill(cls, q, k, v, config: PNMixConfig | None = None, **kwargs) -> PNMixCache:
        cache = cls(config, **kwargs)
        cache.prefill(q, k, v)
        return cache

    # -- building -----------------------------------------------------------------------

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Eq. 6 once from the prompt's post-RoPE q [B, H, T, d] and k [B, H_kv, T, d], then store k, v."""
        if self.cache_layout is not None:
            raise RuntimeError("prefill was already called on this cache; create a new cache per sequence")
        for name, t in (("q", q), ("k", k), ("v", v)):
            validation.check_tensor(name, t)
            _runtime.check_device(name, t)
        validation.check_prefill(q, k, v, self.config, values=bool(self.check_finite))
        if k.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(
                f"k must be float16 or bfloat16 for PNMixCache, got {k.dtype} (ReferenceCache takes float32)"
            )
        b, h, _, d = k.shape
        layout = CacheLayout(self.config, b, h, d, k.dtype, self.capacity)
        layout.check_capacity(k.shape[2])
        with all_or_nothing(self):
            room, n = layout.allocated(), self.config.residual_length
            selected = layout.selection.at_prefill(q, k, self.config)
            rows, fixed = {}, {}
            for c in layout.components:
                if c.region == "sequence":
                    fixed[c.name] = selected
                else:
                    capacity = c.rows(room, n) if self.capacity is not None else None
                    rows[c.name] = _Rows(b, h, c.columns, c.dtype, k.device, capacity)
            self.saliency_computations += layout.selection.prefill_evaluations
            self.cache_layout, self._rows, self._fixed = layout, rows, fixed
            self._choose_code_order(k.device)
            self._counts = torch.zeros(COUNTS, dtype=torch.int32, device=k.device)
            if self.check_finite is True:
                self._flags = deferred.new_flags(k.device)
            self._store(k, v)
            if capturable_pages := (room.n_quantized // n if self.capturable else 0):
                self._page = self._page_work(capturable_pages)

    def _choose_code_order(self, device: torch.device) -> None:
        """Settle `code_order` (and the loop's path) for this cache's layout on `device` (see the class docstring)."""
        asked, layout = self.code_order_asked, self.cache_layout
        reason = fragment_attention.why_not(layout)
        if asked == "fragment" and reason is not None:
            raise ValueError(f"code_order='fragment': {reason}")
        path, why = ("off", reason) if reason is not None else fragment_check.decide(device, layout.dtype)
        if asked == "spec" or (asked == "auto" and path == "off"):
            self.code_order, self.fragment_path = "spec", None
            return
        if path == "off":  # asked for fragment order where the loop does not run: its torch twin computes it
            path, why = "twin", f"{why}; the loop's torch twin computes its part"
        self.code_order, self.fragment_path = "fragment", (path, why)
        self._high_index = spec_packing.salient_channel_index(self.channel_mask, layout.n_high_channels).to(torch.int32)
        if path in ("ptx", "plain"):  # the loop's merge counters, zero between launches (allocated before any capture)
            self._semaphores = torch.zeros(layout.batch * layout.kv_heads, dtype=torch.int32, device=device)

    def _reorder(self, planes: dict[str, torch.Tensor]) -> None:
        """Rewrite the spec's bytes of whole pages (views of the reordered components) in fragment order, in place."""
        for view, new in zip(
            (planes[n] for n in REORDERED), fragment.to_fragment_order(*(planes[n] for n in REORDERED)), strict=True
        ):
            view.copy_(new)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add k, v [B, H_kv, T_new, d]; full residual pages are quantized and packed in place."""
        self._require_prefill()
        self._refuse_if_failed()
        lay = self.cache_layout
        for name, t in (("k", k), ("v", v)):
            validation.check_tensor(name, t)
            validation.check_matches_cache(name, t, (lay.batch, lay.kv_heads, 0, lay.head_dim), lay.dtype, self._device)
        self._check_capturable(k)
        validation.check_kv(k, v, self.config, values=self.check_finite == "eager")
        self._watch(k=k, v=v)
        with all_or_nothing(self):
            self._store(k, v)

    def checkpoint(self) -> _Checkpoint:
        """The state now, to return to with `roll_back` (until `release`). Growing a dynamic
        buffer makes a new tensor, and a preallocated one is written past its used rows, so the
        buffers' (tensor, rows used) pairs and the counts restore it; the one write over held rows
        (a static residual after a flush) logs what it overwrote in every open checkpoint. Taking
        one adds no device work (a decode step stays capturable)."""
        cp = _Checkpoint(
            (
                self.length,
                self.saliency_computations,
                self.cache_layout,
                self._counts,
                dict(self._fixed),
                self._high_index,
                self._semaphores,
            ),
            {name: (r, r.data, r.used) for name, r in self._rows.items()},
        )
        self._open.append(cp)
        return cp

    def roll_back(self, cp: _Checkpoint) -> None:
        """Back to the state of `cp`, which stays open (the continuations of one context each return to
        it); the checkpoints taken after it are dropped. Rewrites the device counts."""
        (
            self.length,
            self.saliency_computations,
            self.cache_layout,
            self._counts,
            self._fixed,
            self._high_index,
            self._semaphores,
        ) = cp.host
        self._rows = {name: r for name, (r, _, _) in cp.rows.items()}
        for r, data, used in cp.rows.values():
            r.data, r.used = data, used
        for r, written, old in reversed(cp.overwritten):
            if r.data is written:  # else written after a selection, in a tensor this state does not hold
                r.data[:, :, : old.shape[2]] = old
        if self._counts is not None:
            self._counts.copy_(torch.tensor([*self.layout[:LAYOUT_COUNTS], 0], dtype=torch.int32))
        cp.overwritten.clear()  # restored: what is overwritten from here on is logged afresh
        self._open = self._open[: self._open.index(cp) + 1]

    def release(self, cp: _Checkpoint) -> None:
        """`cp` will not be returned to (its log of overwritten rows is dropped)."""
        self._open.remove(cp)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows `index` ([B'] integers in [0, B), rows may repeat), in that order: beam search's
        reorder and a batch's expansion or selection (the protocol's optional method, as
        `reference.ReferenceCache.select_rows`). Every row's selection, groups and scales are its own, so each kept
        row holds what that row held; a preallocated cache keeps its capacity. Refused for a capturable cache (a
        captured step holds its buffers' addresses). All or nothing; open checkpoints still return to the rows
        before it."""
        self._require_prefill()
        self._refuse_if_failed()
        if self._page is not None:
            raise ValueError(
                "select_rows: a capturable cache's captured steps hold its buffers' addresses, which a selection "
                "replaces; build the cache without capturable=True for beam search"
            )
        index = validation.check_rows("index", index, self.cache_layout.batch).to(self._device)
        data = {name: r.data.index_select(0, index) for name, r in self._rows.items()}
        fixed = {name: t.index_select(0, index) for name, t in self._fixed.items()}
        high = None if self._high_index is None else self._high_index.index_select(0, index)
        semaphores = None
        if self._semaphores is not None:  # zero between launches: only their number follows the batch
            semaphores = self._semaphores.new_zeros(index.numel() * self.cache_layout.kv_heads)
        for name, r in self._rows.items():  # nothing above changed the cache; from here nothing can fail
            r.data = data[name]
        self._fixed, self._high_index, self._semaphores = fixed, high, semaphores
        self.cache_layout = dataclasses.replace(self.cache_layout, batch=index.numel())

    def _check_capturable(self, t: object) -> None:
        if self.check_finite == "eager" and isinstance(t, torch.Tensor) and _capturing(t):
            raise RuntimeError(
                "check_finite='eager' reads inputs back to the host, which a CUDA graph cannot "
                "capture; capture with PNMixCache(..., check_finite=True) (checked on the device) "
                "or False"
            )

    # -- deferred input checks (check_finite=True) --------------------------------------

    def _watch(self, **inputs: torch.Tensor) -> None:
        """The deferred checks of these inputs (`reference.channels.deferred.watch`), where check_finite is True."""
        if self._flags is not None:
            deferred.watch(self._flags, **inputs)

    def _judge(self, worst: list[float], where: str) -> None:
        """Raise the first problem the flags read back show (`reference.channels.deferred.problem`)."""
        found = deferred.problem(worst, self.config, where)
        if found is not None:
            self._failure = f"{found} (check_finite='eager' rejects bad input before it is used)"
            raise ValueError(self._failure)

    def _refuse_if_failed(self) -> None:
        if self._failure is not None:
            raise ValueError(self._failure)

    def check(self) -> None:
        """Report the deferred input checks (check_finite=True): one device->host read, which
        waits for the calls so far. Raises ValueError naming the first bad argument given to
        `append` or `attend` since prefill (see the class docstring); with check_finite "eager"
        or False there is nothing deferred and nothing is read."""
        check_caches([self], "check()")

    def _store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        step = self.cache_layout.plan(self.length, k.shape[2])
        r, s = self._rows, step.to_sink
        if self._page is not None and not s and k.shape[2] == 1:
            self._static_step(k, v, step)
            return
        if not s and not step.flush and not step.value_flush:
            # The decode path: one launch, which also moves the device count. Keys and values
            # then share their residual rows (a sliding value window quantizes nothing yet).
            rk, rv = r["residual_key"], r["residual_value"]
            if not rk.static and _capturing(k):
                raise RuntimeError(
                    "CUDA-graph capture needs a preallocated cache (max_cache_len): "
                    "a dynamic cache reallocates its buffers as it grows"
                )
            n_old = rk.used
            old_k, old_v = rk.extend(k.shape[2]), rv.extend(k.shape[2])
            old = (old_k, old_v, n_old) if old_k is not None and n_old else None
            append_rows(k, v, rk.data, rv.data, self._counts, old)
            self.length = step.after.length
            return
        if _capturing(k):
            raise RuntimeError(
                "this append writes sinks or quantizes tokens (completes a residual page, or moves a "
                "sliding value window), which runs eagerly and cannot be captured in a CUDA graph; "
                "capture a decode step that does neither"
            )
        if s:
            r["sink_key"].grow(s).copy_(k[:, :, :s])
            r["sink_value"].grow(s).copy_(v[:, :, :s])
        k, v = k[:, :, s:], v[:, :, s:]
        first = r["value_scale"].used  # the first token a flush quantizes (values flush with keys in fragment order)
        for name, new, flush, quantize in (
            ("key", k, step.flush, self._flush_keys),
            ("value", v, step.value_flush, self._flush_values),
        ):
            rows = r[f"residual_{name}"]
            if not flush:
                if new.shape[2]:
                    rows.grow(new.shape[2]).copy_(new)
                continue
            queue = torch.cat([rows.view(), new], dim=2)
            quantize(queue[:, :, :flush].contiguous())
            if rows.static:  # overwrites the held rows: they are the head of the queue
                for cp in self._open:
                    cp.overwritten.append((rows, rows.data, queue[:, :, : rows.used]))
            rows.replace(queue[:, :, flush:])
        if self.code_order == "fragment" and step.flush:
            self._reorder({name: self._page_rows(name, first, step.flush) for name in REORDERED})
        self.length = step.after.length
        # The host decided these counts: a host->device copy, which does not wait on the GPU.
        self._counts[:LAYOUT_COUNTS].copy_(
            torch.tensor(self.layout[:LAYOUT_COUNTS], dtype=torch.int32), non_blocking=True
        )

    def _page_work(self, pages: int) -> _PageWork:
        cfg, lay, r = self.config, self.cache_layout, self._rows
        channel = self._spans(0, 1)[0][2]
        scratch = {
            c.name: torch.empty(lay.batch, lay.kv_heads, c.rows_per_page, c.columns, dtype=c.dtype, device=self._device)
            for c in lay.components
            if c.region == "quantized" and c.name in r
        }
        n = cfg.residual_length
        return _PageWork(
            pages,
            torch.where(channel, cfg.b_high, cfg.b_low).to(torch.int32),
            spec_packing.salient_channel_index(channel, lay.n_high_channels).to(torch.int32).contiguous(),
            scratch,
            torch.tensor([n, -n, n], dtype=torch.int32, device=self._device),
        )

    def _static_step(self, k: torch.Tensor, v: torch.Tensor, step) -> None:
        """A one-token decode step of a capturable cache: the append, then the page completion,
        launched whether or not the page completes (`_PageWork`); the host mirrors follow the plan."""
        r, page, cfg = self._rows, self._page, self.config
        rk, rv = r["residual_key"], r["residual_value"]
        if rk.used + 1 > rk.data.shape[2]:
            raise AssertionError("a full residual was completed by the step that filled it")
        append_rows(k, v, rk.data, rv.data, self._counts)
        n, g, sc = cfg.residual_length, cfg.group_size, page.scratch
        keys, values = rk.data[:, :, :n], rv.data[:, :, :n]
        midpoint = cfg.one_bit == "midpoint"
        group_params(keys, g, "tokens", page.bits, sc["key_scale"], sc["key_zero"], midpoint)
        encode_pack(keys, g, "tokens", page.bits, sc["key_scale"], sc["key_zero"], sc["key_low"], field_bits=cfg.b_low)
        if cfg.b_high > cfg.b_low:
            encode_pack(
                keys,
                g,
                "tokens",
                page.bits,
                sc["key_scale"],
                sc["key_zero"],
                sc["key_high"],
                field_bits=cfg.b_high - cfg.b_low,
                shift=cfg.b_low,
                colmap=page.index,
            )
        if cfg.values_quantized:
            vg = cfg.value_group(values.shape[-1])
            group_params(values, vg, "channels", cfg.value_bits, sc["value_scale"], sc["value_zero"], midpoint)
            encode_pack(
                values,
                vg,
                "channels",
                cfg.value_bits,
                sc["value_scale"],
                sc["value_zero"],
                sc["value_payload"],
                field_bits=cfg.value_bits,
            )
        else:
            sc["value_payload"].copy_(values)
        if self.code_order == "fragment":
            self._reorder(sc)
        full = self._counts[2:3] == n
        at = torch.clamp(self._counts[1:2] // n, max=page.pages - 1).long()
        for name, new in sc.items():
            held = r[name].data.unflatten(2, (page.pages, -1))
            held.index_copy_(2, at, torch.where(full.view(1, 1, 1, 1, 1), new.unsqueeze(2), held.index_select(2, at)))
        self._counts[1:4].add_(page.delta * full)
        if step.flush:
            for name in sc:
                r[name].extend(sc[name].shape[2])
            rk.used = rv.used = 0
        else:
            rk.extend(1), rv.extend(1)
        self.length = step.after.length

    def sync_length(self) -> int:
        """Read the token counts back from the device into the host mirror `length` (one
        device->host sync) and return the length.

        Eager calls keep `length` exact. Replaying a captured decode step moves only the device
        counts, so call this after replays, before anything that reads `length` (append, attend,
        storage, the layout). A captured step may be replayed only while no residual page
        completes (n_residual stays below residual_length), unless the cache is capturable
        (then up to the capacity); past that this raises RuntimeError.
        With check_finite=True the same read brings the deferred checks' flags back, and bad
        input since prefill raises ValueError as `check()` does, before `length` moves.
        """
        self._require_prefill()
        self._refuse_if_failed()
        counts = self._counts[:LAYOUT_COUNTS]
        if self._flags is None:
            counts = tuple(counts.tolist())
        else:  # one read: the counts and the flags' bits
            read = torch.cat([counts, self._flags[1].view(torch.int32)]).tolist()
            counts, bits = tuple(read[:LAYOUT_COUNTS]), read[LAYOUT_COUNTS:]
            self._judge(list(struct.unpack(f"{len(bits)}f", struct.pack(f"{len(bits)}i", *bits))), "sync_length()")
        layout = token_layout(self.config, sum(counts[:3]))
        if self._page is not None:  # pages complete on the device: any continuation up to the capacity
            if counts != layout[:LAYOUT_COUNTS] or counts[0] != self.layout[0] or layout.length > self.capacity:
                raise RuntimeError(
                    f"the device token counts {counts} do not continue the cache's layout "
                    f"{tuple(self.layout)}: a captured decode step was replayed past the capacity "
                    f"max_cache_len={self.capacity}"
                )
            for c in self.cache_layout.components:
                if c.name in self._rows:
                    self._rows[c.name].used = c.rows(layout, self.config.residual_length)
        elif counts != layout[:LAYOUT_COUNTS] or counts[:2] != self.layout[:2] or counts[3] != self.layout[3]:
            raise RuntimeError(
                f"the device token counts {counts} do not continue the cache's layout {tuple(self.layout)}: "
                "a captured decode step was replayed past the end of the residual page (or the sliding value "
                "window), whose flush only an eager append (or a capturable cache) carries out"
            )
        else:
            self._rows["residual_key"].used = layout.n_residual
            self._rows["residual_value"].used = layout.n_value_residual
        self.length = layout.length
        return self.length

    def _metadata(self) -> torch.Tensor:
        """The selection metadata as held (pair mask, page ranks, or empty)."""
        return self._fixed["mask"] if "mask" in self._fixed else self._rows["mask"].data

    def _spans(self, first: int, count: int) -> list[tuple[int, int, torch.Tensor]]:
        """(start, end, channel mask) of the token spans of key groups first .. first + count - 1
        that share one selection, tokens counted from the first quantized token."""
        g, sel = self.config.group_size, self.cache_layout.selection
        masks = sel.group_masks(self._metadata(), self.config, self.cache_layout.head_dim, first + count)
        if not sel.per_group:
            return [(first * g, (first + count) * g, masks[:, :, 0])] if count else []
        return [(p * g, (p + 1) * g, masks[:, :, p]) for p in range(first, first + count)]

    def _flush_keys(self, k: torch.Tensor) -> None:
        """Quantize and pack whole pages of keys [B, H_kv, n * N, d] onto the quantized region."""
        cfg, n, r = self.config, k.shape[2], self._rows
        g, midpoint = cfg.group_size, cfg.one_bit == "midpoint"
        w_lo, w_hi = cfg.b_low, cfg.b_high - cfg.b_low  # bits, so bytes per 8 tokens
        n_high = self.cache_layout.n_high_channels
        chosen = self.cache_layout.selection.for_groups(k, cfg)  # Kitty: each page's channels from its keys
        if chosen is not None:
            r["mask"].grow(chosen.shape[2]).copy_(chosen)
            self.saliency_computations += chosen.shape[2]
        first = r["key_scale"].used
        scale, zero = r["key_scale"].grow(n // g), r["key_zero"].grow(n // g)
        low, high = r["key_low"].grow(n * w_lo // 8), r["key_high"].grow(n * w_hi // 8)
        for a, b, channel in self._spans(first, n // g):
            a, b = a - first * g, b - first * g
            bits = torch.where(channel, cfg.b_high, cfg.b_low).to(torch.int32)
            # The count is the layout's (no read of the mask back to the host: a page flush never waits on the device).
            index = spec_packing.salient_channel_index(channel, n_high).to(torch.int32).contiguous()
            kp, sp, zp = k[:, :, a:b], scale[:, :, a // g : b // g], zero[:, :, a // g : b // g]
            group_params(kp, g, "tokens", bits, sp, zp, midpoint)
            encode_pack(kp, g, "tokens", bits, sp, zp, low[:, :, a * w_lo // 8 : b * w_lo // 8], field_bits=cfg.b_low)
            if cfg.b_high > cfg.b_low:
                encode_pack(
                    kp,
                    g,
                    "tokens",
                    bits,
                    sp,
                    zp,
                    high[:, :, a * w_hi // 8 : b * w_hi // 8],
                    field_bits=cfg.b_high - cfg.b_low,
                    shift=cfg.b_low,
                    colmap=index,
                )

    def _flush_values(self, v: torch.Tensor) -> None:
        """Quantize and pack values [B, H_kv, n, d] (per token, so any n) onto the quantized region."""
        cfg, n, r = self.config, v.shape[2], self._rows
        midpoint = cfg.one_bit == "midpoint"
        if cfg.values_quantized:
            vg = cfg.value_group(v.shape[-1])
            vs, vz = r["value_scale"].grow(n), r["value_zero"].grow(n)
            group_params(v, vg, "channels", cfg.value_bits, vs, vz, midpoint)
            payload = r["value_payload"].grow(n)
            encode_pack(v, vg, "channels", cfg.value_bits, vs, vz, payload, field_bits=cfg.value_bits)
        else:
            r["value_payload"].grow(n).copy_(v)
            r["value_scale"].grow(n)
            r["value_zero"].grow(n)

    # -- reading ------------------------------------------------------------------------

    @property
    def _device(self) -> torch.device:
        return self._rows["sink_key"].data.device

    @property
    def layout(self) -> TokenLayout:
        """Where the tokens held live (`reference.channels.layout.TokenLayout`)."""
        return token_layout(self.config, self.length)

    @property
    def pair_mask(self) -> torch.Tensor:
        self._require_prefill()
        return self.cache_layout.selection.pair_mask(self._metadata(), self.cache_layout.head_dim)

    @property
    def channel_mask(self) -> torch.Tensor:
        return saliency.channel_mask_from_pairs(self.pair_mask, self.config.pair_layout)

    def _page_rows(self, name: str, first: int, n: int) -> torch.Tensor:
        """The rows of component `name` holding quantized tokens first .. first + n - 1 (a view)."""
        per_page, page = self.cache_layout.component(name).rows_per_page, self.config.residual_length
        return self._rows[name].data[:, :, first * per_page // page : (first + n) * per_page // page]

    def packed(self) -> dict[str, torch.Tensor]:
        """The used part of the packed quantized region, in the `reference.equations.packing` layouts. In the
        spec's code order, views of the cache's own buffers, not copies (read them, never write them); in fragment
        order, the codes put back in the spec's order (new tensors)."""
        self._require_prefill()
        held = {c.name: self._rows[c.name].view() for c in self.cache_layout.components if c.region == "quantized"}
        if self.code_order == "fragment":
            held |= dict(zip(REORDERED, fragment.to_spec_order(*(held[n] for n in REORDERED)), strict=True))
        return held

    def _unpack(self, codes: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        cfg, lay = self.config, self.cache_layout
        b, h, d = lay.batch, lay.kv_heads, lay.head_dim
        n_groups = self._rows["key_scale"].used
        dtype = torch.uint8 if codes else torch.float32
        p = self.packed()
        keys = torch.empty(b, h, n_groups * cfg.group_size, d, dtype=dtype, device=self._device)
        g, w_lo, w_hi = cfg.group_size, cfg.b_low, cfg.b_high - cfg.b_low
        for a, e, channel in self._spans(0, n_groups):
            slot = spec_packing.high_plane_columns(channel)
            dequantize_plane(
                p["key_low"][:, :, a * w_lo // 8 : e * w_lo // 8],
                p["key_scale"][:, :, a // g : e // g],
                p["key_zero"][:, :, a // g : e // g],
                keys[:, :, a:e],
                group=g,
                along="tokens",
                low_bits=cfg.b_low,
                high=p["key_high"][:, :, a * w_hi // 8 : e * w_hi // 8],
                high_bits=cfg.b_high - cfg.b_low,
                slot=slot,
                codes=codes,
            )
        if not cfg.values_quantized:
            return keys, None if codes else p["value_payload"].float()
        values = torch.empty(b, h, self._rows["value_scale"].used, d, dtype=dtype, device=self._device)
        dequantize_plane(
            p["value_payload"],
            p["value_scale"],
            p["value_zero"],
            values,
            group=cfg.value_group(d),
            along="channels",
            low_bits=cfg.value_bits,
            codes=codes,
        )
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
        return self._rows["sink_key"].view().clone(), self._rows["sink_value"].view().clone()

    def residual(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._require_prefill()
        return self._rows["residual_key"].view().clone(), self._rows["residual_value"].view().clone()

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All cached keys and values, float32 [B, H_kv, T, d] (for fidelity studies and debugging)."""
        self._require_prefill()
        k_q, v_q = self._unpack(codes=False)
        (sk, sv), (rk, rv) = self.sinks(), self.residual()
        return torch.cat([sk.float(), k_q, rk.float()], dim=2), torch.cat([sv.float(), v_q, rv.float()], dim=2)

    def region(self) -> PackedRegion:
        """What decode attention reads: every buffer as held, and the tokens in each region."""
        self._require_prefill()
        tensors = {name: rows.data for name, rows in self._rows.items()} | self._fixed
        return PackedRegion(tensors, self.layout, counts=self._counts[:LAYOUT_COUNTS], capacity=self.capacity)

    def _decode(self, q: torch.Tensor, num_splits: int | None, scale: float | None) -> torch.Tensor:
        region, lay = self.region(), self.cache_layout
        if self.code_order != "fragment":
            return decode_attention(q, region, lay, num_splits=num_splits, scale=scale)
        if fragment_attention.covers(q, lay):
            return fragment_attention.decode(
                q,
                region,
                lay,
                self._high_index,
                self.fragment_path[0],
                num_splits=num_splits,
                scale=scale,
                semaphores=self._semaphores,
            )
        # what the loop does not cover reads the whole buffers put back in the spec's order (whole pages: in order)
        spec = fragment.to_spec_order(*(region.tensors[n] for n in REORDERED))
        tensors = dict(region.tensors) | dict(zip(REORDERED, spec, strict=True))
        spec_region = PackedRegion(tensors, region.tokens, region.counts, region.capacity)
        return decode_attention(q, spec_region, lay, num_splits=num_splits, scale=scale)

    def attend(
        self,
        q: torch.Tensor,
        *,
        num_splits: int | None = None,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Causal decode attention of q [B, H, T_new, d] (the last T_new positions) -> [B, H, T_new, d].

        scale: of the logits, 1/sqrt(d) by default. softcap (logit softcapping) is not in the
        kernel: anything but None raises ValueError naming it (`reference.ReferenceCache` has it)."""
        self._require_prefill()
        self._refuse_if_failed()
        if softcap is not None:
            raise ValueError(
                f"softcap={softcap!r}: the Triton decode kernel does not apply attention logit "
                "softcapping; use the reference backend"
            )
        if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0):
            raise ValueError(f"scale must be a positive number or None, got {scale!r}")
        if num_splits is not None and (type(num_splits) is not int or num_splits < 1):
            raise ValueError(f"num_splits must be a positive int or None (chosen for the device), got {num_splits!r}")
        lay = self.cache_layout
        self._check_capturable(q)
        validation.check_query(
            q,
            lay.batch,
            lay.kv_heads,
            lay.head_dim,
            lay.dtype,
            self._device,
            self.length,
            values=self.check_finite == "eager",
        )
        self._watch(q=q)
        if q.requires_grad and torch.is_grad_enabled():  # the spec's output keeps the graph: so does this one
            return _NoBackward.apply(q, lambda q: self._decode(q, num_splits, scale))
        return self._decode(q, num_splits, scale)

    def attend_stepwise(
        self,
        q: torch.Tensor,
        exact_keys: torch.Tensor,
        exact_values: torch.Tensor,
        *,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """What `attend` gives each of the newest T_new tokens had they been appended one at a time
        (teacher forcing over chunks): the spec's rule (`reference.channels.stepwise`) over this cache's
        own dequantized codes, so a chunk reads what this implementation's token-by-token decoding
        stores. One token is the decode kernel itself (`attend`). Arguments as
        `reference.ReferenceCache.attend_stepwise`."""
        if q.shape[2] == 1 and softcap is None:
            return self.attend(q, scale=scale)
        self._require_prefill()
        self._refuse_if_failed()
        lay = self.cache_layout
        validation.check_query(q, lay.batch, lay.kv_heads, lay.head_dim, lay.dtype, self._device, self.length)
        k_hat, v_hat = self.dequantize()
        return stepwise_attention(self.config, q, k_hat, v_hat, exact_keys, exact_values, scale=scale, softcap=softcap)

    def storage(self) -> StorageReport:
        """Bytes of every buffer this cache holds (allocated, so capacity counts when preallocated)."""
        self._require_prefill()
        return measure(self.region().tensors)

    def _require_prefill(self) -> None:
        if self.cache_layout is None:
            raise RuntimeError("the cache is empty: call prefill(q, k, v) first")
