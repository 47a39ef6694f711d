"""The model_args of the "pnmix" lm-eval model (`benchmarks.accuracy.lm_eval_model`), checked before anything
loads: the options and their types, the method's configuration with its overrides, the per-token methods'
allocation files (role-calibration results: the bits of each tag at a budget), the model file, the chat
template, and, from the model's config alone, its RoPE pair layout, head_dim and context against the
configuration and an implementation's claims. Each refusal is one line naming the argument (`ModelArgsError`).
What each option means: the model's module doc.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import typing
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.commands import preflight
from benchmarks.efficiency.plugins import load, unclaimed
from benchmarks.models import source as model_source
from conformance.loader import check_in_child
from reference import PNMixConfig, methods
from reference.channels.config import check_head_dim
from reference.methods import TOKEN_METHODS
from reference.tokens.config import TokenPrecisionConfig
from reference.tokens.roles import CHATML, USER, Tag, tag_tokens

log = logging.getLogger(__name__)

#: chat_template= values that are no file: the model's own template, or none at all.
MODEL_TEMPLATE, NO_TEMPLATE = "model", "none"
RESULTS = Path(__file__).parents[1] / "results"
ALLOCATIONS = "role-calibration-*.json"
#: The tag of a plain-text context's tokens (module doc, "Per-token bits").
PLAIN_TEXT = Tag(0, 0, USER)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ModelArgsError(ValueError):
    """A model_args value refused before anything loads; the message is one line naming it."""


@dataclass(frozen=True)
class Options:
    """The model_args of "pnmix" that are not fields of the method's configuration (module doc)."""

    pretrained: str = model_source.DEFAULT
    method: str = "PN-Mix"
    impl: str | None = None
    allocation: str | None = None
    budget: float | None = None
    chat_template: str | None = MODEL_TEMPLATE
    max_length: int | None = None
    dtype: str | None = None
    device: str | None = None
    chunk: int = 256
    batch_size: int | str = 1  # contexts per forward (`rows_per_batch`), or "auto"
    max_batch_size: int | None = None  # lm-eval's --max_batch_size: where batch_size=auto starts
    trust_remote_code: bool = False  # lm-eval passes it; nothing remote is ever loaded


#: Options lm-eval passes on its own (its --max_batch_size, --trust_remote_code), not the user's model_args.
LM_EVAL_PASSES = ("max_batch_size", "trust_remote_code")
#: Options left out of a request cache's key (`cache_path`): they change no score, or (device) as given, where
#: the device it names (lm-eval's default cuda:0 is the CPU without CUDA) is in the key.
UNSCORED = frozenset(("batch_size", "device", *LM_EVAL_PASSES))


# -- model_args: types and values ------------------------------------------------------------------


def _describe(hint) -> str:
    names = {
        int: "an int",
        float: "a number",
        str: "a string",
        bool: "a bool",
        type(None): "None",
        torch.dtype: f"a dtype name ({', '.join(DTYPES)})",
    }
    return " or ".join(names.get(a, str(a)) for a in (typing.get_args(hint) or (hint,)))


def _accepts(kind, value) -> tuple[bool, object]:
    """(whether `value` is of `kind`, the value as the field takes it)."""
    if kind is type(None) or kind is bool:
        return (value is None if kind is type(None) else isinstance(value, bool)), value
    if isinstance(value, bool):
        return False, value
    if kind is float:
        return isinstance(value, (int, float)), float(value) if isinstance(value, (int, float)) else value
    if kind is torch.dtype:
        return (value in DTYPES or isinstance(value, torch.dtype)), DTYPES.get(value, value)
    return isinstance(value, kind), value


def typed(cls, values: dict) -> dict:
    """`values` checked against the annotations of dataclass `cls` (ints for ints, numbers for floats, a
    dtype's name for a dtype, None where a field is optional), as the fields take them."""
    hints = typing.get_type_hints(cls)
    out = {}
    for name, value in values.items():
        kinds = typing.get_args(hints[name]) or (hints[name],)
        for kind in kinds:
            ok, converted = _accepts(kind, value)
            if ok:
                out[name] = converted
                break
        else:
            raise ModelArgsError(f"model_args {name}={value!r}: expected {_describe(hints[name])}")
    return out


def model_args_config(method: str, overrides: dict, impl=None) -> PNMixConfig | TokenPrecisionConfig:
    """The registry's configuration of `method` with the model_args `overrides` (strings) typed and applied
    (unknown names and wrong types refused), as `impl` runs it when one is given (`Capabilities.configured`)."""
    if method not in methods.REGISTRY:
        raise ModelArgsError(
            f"model_args method={method!r}: not a method of reference.methods; choose from {list(methods.REGISTRY)}"
        )
    cls = PNMixConfig if methods.method(method).precision == methods.CHANNELS else TokenPrecisionConfig
    make = methods.method(method).config
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ModelArgsError(
            f"model_args {unknown[0]}={overrides[unknown[0]]!r}: neither an option of the pnmix "
            f"model ({', '.join(f.name for f in dataclasses.fields(Options))}) nor a field of "
            f"{cls.__name__} ({', '.join(sorted(fields))})"
        )
    values = typed(cls, overrides)
    try:
        config = make(**values)
        if impl is not None:
            config = impl.capabilities.configured(config)
    except (ValueError, TypeError) as error:
        given = ",".join(f"{k}={v}" for k, v in overrides.items()) or "its defaults"
        raise ModelArgsError(f"model_args method={method} with {given}: {error}") from None
    return config


# -- the per-token methods' bits -------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """The bits of each tag at one budget of a role-calibration result."""

    path: str
    budget: float
    bits: dict[str, int]  # str(Tag) -> bits
    model: dict  # the calibrated model, as the result names it

    def describe(self) -> dict:
        return {"path": self.path, "budget": self.budget, "bits": self.bits, "model": self.model}


def newest_allocation() -> Path:
    found = sorted(RESULTS.glob(ALLOCATIONS))  # the names end in a sortable UTC stamp
    if not found:
        raise ModelArgsError(
            f"model_args allocation: no {RESULTS / ALLOCATIONS}; run python -m "
            "benchmarks.fidelity.role_calibration or give allocation=PATH"
        )
    return found[-1]


def load_allocation(path: str | None, budget: float | None, config: TokenPrecisionConfig) -> Allocation:
    file = newest_allocation() if path is None else Path(path).expanduser()
    try:
        data = json.loads(file.read_text())
        budgets = {float(a["budget"]): a["bits"] for a in data["allocations"]}
        tags, group_size = data["calibration"]["tags"], data["group_size"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ModelArgsError(
            f"model_args allocation={file}: not a readable role-calibration result ({error})"
        ) from None
    if budget is None or not any(math.isclose(budget, b) for b in budgets):
        raise ModelArgsError(
            f"model_args budget={budget}: {file.name} allocates bits at budgets {sorted(budgets)} "
            "(average key + value bits per element); give one of them"
        )
    if group_size != config.group_size:
        raise ModelArgsError(
            f"model_args group_size={config.group_size}: {file.name} was calibrated at group_size="
            f"{group_size}; its bits do not carry over"
        )
    bits = next(b for k, b in budgets.items() if math.isclose(budget, k))
    return Allocation(str(file), budget, dict(zip(tags, bits, strict=True)), data.get("model", {}))


def context_tags(tokenizer, text: str, n: int, special: dict) -> list[Tag]:
    """The tags of the n tokens of a context (module doc, "Per-token bits")."""
    if CHATML.start not in text:
        return [PLAIN_TEXT] * n
    enc = tokenizer(text, return_offsets_mapping=True, **special)
    if len(enc["input_ids"]) != n:
        raise RuntimeError(f"the tokenizer's offsets cover {len(enc['input_ids'])} tokens of a {n}-token context")
    return tag_tokens(text, enc["offset_mapping"])


# -- checks before the model loads -----------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What `check` made of the model_args."""

    options: Options
    source: model_source.ModelSource
    config: PNMixConfig | TokenPrecisionConfig
    overrides: dict
    plugin: object | None  # benchmarks.efficiency.plugins.Plugin
    allocation: Allocation | None
    template: str | None  # a chat template's text (chat_template=FILE), else None
    dtype: torch.dtype
    device: torch.device

    @property
    def per_token(self) -> bool:
        return isinstance(self.config, TokenPrecisionConfig)


def _device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ModelArgsError(f"model_args device={name!r}: not a torch device") from None
    if device.type == "meta":
        raise ModelArgsError(f"model_args device={name!r}: no data lives on the meta device; give cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():  # lm-eval's default is cuda:0 wherever it runs
        log.warning("device=%s: CUDA is not available; running on the CPU (as lm-eval's HFLM does)", name)
        return torch.device("cpu")
    return device


def _source(pretrained: str) -> model_source.ModelSource:
    """The model pretrained= names, its file checked as it will load (`preflight.model_problem`)."""
    try:
        source = model_source.resolve(pretrained)
    except ValueError as error:
        raise ModelArgsError(
            f"model_args pretrained={pretrained}: {str(error).removeprefix(f'--model {pretrained}: ')}"
        ) from None
    problem = preflight.model_problem(source)
    if problem is not None:
        raise ModelArgsError(f"model_args pretrained={pretrained}: {problem}")
    return source


def _template(value: str | None) -> str | None:
    if value is None or value.lower() in (MODEL_TEMPLATE, NO_TEMPLATE):
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise ModelArgsError(f"model_args chat_template={value}: no such file (a Jinja template, 'none' or 'model')")
    return path.read_text()


#: batch_size=auto: detected on CUDA (`PNMixLM` halves from max_batch_size until a batch of max_length fits).
AUTO = "auto"
#: Where batch_size=auto starts without --max_batch_size (lm-eval's HFLM starts there too).
AUTO_START = 64


def rows_per_batch(options: Options) -> int | str:
    """model_args batch_size as lm-eval gives it (an int, its text, or "auto"): a positive int, or AUTO."""
    value = options.batch_size
    if options.max_batch_size is not None and options.max_batch_size < 1:
        raise ModelArgsError(f"max_batch_size={options.max_batch_size}: expected a positive int")
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, int) and not isinstance(text, bool) and text >= 1:
        return text
    if isinstance(text, str) and text.isdigit() and int(text) >= 1:
        return int(text)
    raise ModelArgsError(
        f"model_args batch_size={value!r}: expected a positive int or 'auto' (lm-eval's auto:N, detected again N "
        "times over a run, is not taken: give auto or a number)"
    )


def check(model_args: dict) -> Settings:
    """Every model_args check that needs no weights (module doc); ModelArgsError otherwise."""
    names = {f.name for f in dataclasses.fields(Options)}
    options = Options(**typed(Options, {k: v for k, v in model_args.items() if k in names}))
    overrides = {k: v for k, v in model_args.items() if k not in names}
    rows_per_batch(options)
    for name in ("chunk", "max_length"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise ModelArgsError(f"model_args {name}={value}: expected a positive int")
    device = _device(options.device)
    if options.dtype is not None and options.dtype not in DTYPES:
        raise ModelArgsError(f"model_args dtype={options.dtype!r}: expected one of {', '.join(DTYPES)}")
    dtype = DTYPES[options.dtype or ("float32" if device.type == "cpu" else "bfloat16")]
    plugin = _plugin(options) if options.impl is not None else None
    config = model_args_config(options.method, overrides, plugin)
    per_token = isinstance(config, TokenPrecisionConfig)
    if not per_token and (options.budget is not None or options.allocation is not None):
        raise ModelArgsError(
            f"model_args budget/allocation with method={options.method}: only the per-token methods "
            f"({', '.join(TOKEN_METHODS)}) take them"
        )
    allocation = load_allocation(options.allocation, options.budget, config) if per_token else None
    source = _source(options.pretrained)
    return Settings(
        options, source, config, overrides, plugin, allocation, _template(options.chat_template), dtype, device
    )


def _plugin(options: Options):
    if options.method in TOKEN_METHODS:
        raise ModelArgsError(
            f"model_args impl={options.impl} with method={options.method}: implementations go in "
            "through the protocol's create(config), which takes the channel family's "
            "configuration (PNMixConfig) only"
        )
    try:
        check_in_child(options.impl)  # a plug-in that exits the process says so, not this process's silent end
        return load([options.impl])[options.impl]
    except ValueError as error:
        raise ModelArgsError(f"model_args impl={options.impl}: {error}") from None


def check_chat(settings: Settings) -> None:
    """A chat template is asked for (lm-eval's --apply_chat_template): refuse where there is none, reading
    a GGUF's metadata or a folder's tokenizer files, not the weights."""
    value = settings.options.chat_template
    if settings.template is not None:
        return
    if value is not None and value.lower() == NO_TEMPLATE:
        raise ModelArgsError("--apply_chat_template with model_args chat_template=none: no template to apply")
    try:
        has = preflight.has_chat_template(settings.source)
    except ValueError as error:  # a tokenizer_config.json that is no JSON object
        raise ModelArgsError(f"--apply_chat_template: {error}") from None
    if not has:
        raise ModelArgsError(
            f"--apply_chat_template: {settings.source.name} ships no chat template; give "
            "model_args chat_template=FILE (a Jinja template)"
        )


def check_model(settings: Settings, model_config) -> tuple[PNMixConfig | TokenPrecisionConfig, int]:
    """The configuration with the model's RoPE pair layout, and max_length, checked against the model's
    config (not its weights): its pair layout, head_dim, context, and an implementation's claims."""
    from pnmix.hf import detect_pair_layout, has_rope, head_dim  # deferred: transformers takes seconds to import

    config, opts = settings.config, settings.options
    if has_rope(model_config) is False:
        raise ModelArgsError(
            f"model_args pretrained={opts.pretrained}: {settings.source.name} has no rotary position embedding "
            "(RoPE); PN-Mix's pairs are the channel pairs RoPE rotates together"
        )
    layout = detect_pair_layout(model_config)
    if layout is None:
        layout = settings.overrides.get("pair_layout")
        if layout is None:
            raise ModelArgsError(
                f"model_args pair_layout: cannot tell the RoPE pair layout of {settings.source.name}; "
                "give pair_layout=split (rotate_half) or adjacent"
            )
    elif settings.overrides.get("pair_layout", layout) != layout:
        raise ModelArgsError(
            f"model_args pair_layout={settings.overrides['pair_layout']}: this model's RoPE pairs are {layout!r}"
        )
    config = dataclasses.replace(config, pair_layout=layout)
    d = head_dim(model_config)
    try:
        config.check_head_dim(d) if settings.per_token else check_head_dim(config, d)
    except ValueError as error:
        raise ModelArgsError(f"model_args method={opts.method} on {settings.source.name}: {error}") from None
    context = getattr(model_config.get_text_config(decoder=True), "max_position_embeddings", None)
    max_length = opts.max_length or context
    if max_length is None:
        raise ModelArgsError(f"model_args max_length: {settings.source.name} names no max_position_embeddings; give it")
    if context is not None and max_length > context:
        raise ModelArgsError(f"model_args max_length={max_length}: past the model's max_position_embeddings {context}")
    if settings.plugin is not None:
        missing = unclaimed(
            settings.plugin.capabilities,
            config,
            device=settings.device.type,
            dtype=settings.dtype,
            head_dim=d,
            sizes=(1,),
        )
        if missing:
            raise ModelArgsError(
                f"model_args impl={opts.impl}: it does not claim what this run needs: {'; '.join(missing)}"
            )
    return config, max_length


def check_source(settings: Settings) -> tuple[PNMixConfig | TokenPrecisionConfig, int]:
    """`check_model` on the model's config as transformers reads it (not its weights): a config it cannot
    read, or a model with no causal-LM class (an encoder such as BERT's is refused by `check_model` as
    having no RoPE), is one line naming pretrained=."""
    name = f"model_args pretrained={settings.options.pretrained}"
    try:
        model_config = settings.source.config()
    except Exception as error:  # transformers' own refusal of the files: one line, not its traceback
        raise ModelArgsError(f"{name}: transformers cannot read its config ({_one_line(error)})") from None
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(model_config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelArgsError(
            f"{name}: {settings.source.name} (model_type={getattr(model_config, 'model_type', None)!r}) is not a "
            "causal language model transformers can load (AutoModelForCausalLM); give a decoder-only model"
        )
    return check_model(settings, model_config)


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__
