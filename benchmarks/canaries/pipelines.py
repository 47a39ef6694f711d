"""Canaries of the transformers integration and of the tools' own pipelines, on the tiny models of
`workloads.LAYOUTS`.

- `hf(layout, name)`: the method `name` through `pnmix.hf.PNMixHFCache` (the reference backend, as every
  CPU tool runs it) on the tiny model of `layout`: a seeded prompt, then greedy decoding token by token.
  Exact: the chosen tokens; floats: the logits of every step.
- `long_output()`: `benchmarks.fidelity.long_output.measure_sequence` (teacher forcing over chunks,
  stepwise attention, FP16 through transformers' own cache) on the tiny Llama with PN-Mix.
- `fidelity()`: the trace analyses of `benchmarks.fidelity.analyses.analyse_prompt` (Table 9, Fig. 4, Fig. 5,
  Table 11) on seeded query and key traces.
- `equal_bits()`: `benchmarks.fidelity.equal_bits` matching each channel design to its budgets and measuring
  what its cache gives back (`matched`, `stored_kv`, `attention_errors`) on the seeded workload.
- `role_calibration()`: `benchmarks.fidelity.role_calibration.calibrate` and `allocations` on seeded captures.
- `task_accuracy()`: the lm-eval model of `benchmarks.accuracy.lm_eval_model` (the FP16 method, so that
  the tool's own path is what this canary stands for: tokenising, shared contexts, scoring, greedy
  generation) on the tiny Llama saved with a character tokenizer, scoring fixed items and generating.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from benchmarks.canaries import workloads
from benchmarks.canaries.outcome import outcome, summary
from reference.methods import config as method_config
from reference.tokens.config import TokenPrecisionConfig

PROMPT, DECODE = 36, 12


@torch.no_grad()
def hf(layout: str, name: str) -> dict:
    import pnmix.hf as pnmix_hf  # deferred: transformers takes seconds to import

    model, exact = workloads.tiny_model(layout)
    head_dim = model.config.head_dim
    config = workloads.small_pages(method_config(name), head_dim)
    extra = {}
    if isinstance(config, TokenPrecisionConfig):
        extra["token_bits"] = workloads.token_bits(config, PROMPT, seed=4)
    cache = pnmix_hf.PNMixHFCache(model.config, config, backend="reference", **extra)
    model.set_attn_implementation(pnmix_hf.ATTENTION)
    ids = workloads.token_ids(seed=5, tokens=PROMPT)
    argument = pnmix_hf.cache_argument(model)
    logits, chosen = [], []
    step = ids
    for _ in range(DECODE):
        last = model(input_ids=step, use_cache=True, **{argument: cache}).logits[0, -1]
        logits.append(last)
        step = last.argmax()[None, None]
        chosen.append(int(step))
    model.set_attn_implementation(exact)
    return outcome({"tokens": chosen}, {"logits": summary(torch.stack(logits))})


@torch.no_grad()
def long_output() -> dict:
    import pnmix.hf  # noqa: F401  # deferred: transformers takes seconds to import; registers the "pnmix" attention
    from benchmarks.fidelity.long_output import measure_sequence  # deferred: imports transformers

    model, _ = workloads.tiny_model("llama")
    ids = workloads.token_ids(seed=6, tokens=PROMPT + 2 * DECODE)
    configs = {"PN-Mix": workloads.small_pages(method_config("PN-Mix"), model.config.head_dim)}
    out = measure_sequence(model, ids, PROMPT, configs, chunk=5)
    per = out["PN-Mix"]
    return outcome(
        {"top1": [int(v) for v in per["top1"]]},
        {"kl": per["kl"], "nll": per["nll"], "FP16 nll": out["FP16"]["nll"]},
    )


#: The task-accuracy canary's characters (a character-level tokenizer: no training, the same on every machine).
CHARACTERS = " abcdefghijklmnopqrstuvwxyz0123456789.,?:"
#: (context, continuation) items scored, two sharing a context, and a generation request.
ITEMS = (
    ("the quick brown fox jumps over the lazy dog. question: what jumps?", " fox"),
    ("the quick brown fox jumps over the lazy dog. question: what jumps?", " dog"),
    ("a document about trains, boats and planes: 4213. passkey:", " 4213"),
)
GENERATE = ("numbers 0123 and 4567, then", {"until": ["."], "max_gen_toks": 8, "do_sample": False})


def save_tiny(folder: Path) -> Path:
    """The tiny Llama and a character tokenizer (BOS added), saved as a model folder."""
    import safetensors.torch
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2} | {c: i + 3 for i, c in enumerate(CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(folder)
    model, _ = workloads.tiny_model("llama")
    model.config.bos_token_id, model.config.eos_token_id = 0, 1
    # written directly: under a multi-process launch model.save_pretrained writes on rank 0 only, and every
    # process runs its own canaries
    model.config.save_pretrained(folder)
    safetensors.torch.save_model(model, str(folder / "model.safetensors"))
    return folder


def task_accuracy() -> dict:
    from lm_eval.api.instance import Instance

    from benchmarks.accuracy.lm_eval_model import PNMixLM  # deferred: lm-eval takes seconds to import

    # this process's own copy of the tiny model (every process of a launch runs its canaries), removed after
    with tempfile.TemporaryDirectory(prefix="pnmix-canary-") as folder:
        lm = PNMixLM(pretrained=str(save_tiny(Path(folder))), method="FP16", chunk=4)
        scored = lm.loglikelihood(
            [Instance("loglikelihood", {}, item, i, metadata=("canary", i, 1)) for i, item in enumerate(ITEMS)],
            disable_tqdm=True,
        )
        generated = lm.generate_until(
            [Instance("generate_until", {}, GENERATE, 0, metadata=("canary", 0, 1))], disable_tqdm=True
        )
    return outcome(
        {
            "greedy": [bool(g) for _, g in scored],
            "generated": generated,
            "chosen": max(range(2), key=lambda i: scored[i][0]),  # of the two answers to one context
        },
        {"loglikelihood": [float(s) for s, _ in scored]},
    )


#: The method an implementation's canary hands it (2-bit keys and values, as the sweep runs quanto).
IMPLEMENTATION_METHOD = "KIVI-2"


@torch.no_grad()
def implementation(name: str) -> dict:
    """An implementation loaded as the tools load it (`benchmarks.efficiency.plugins.load`), through
    `PNMixHFCache(impl=...)` on the tiny Llama, as `hf` runs a method."""
    import pnmix.hf as pnmix_hf  # deferred: transformers takes seconds to import
    from benchmarks.efficiency.plugins import load  # deferred: only for a plug-in canary

    plugin = load([name])[name]
    model, exact = workloads.tiny_model("llama")
    # 2-bit keys and values (as the sweep runs quanto, whose keys take 2 or 4 bits), mapped onto the
    # implementation's method by its preset (`Capabilities.configured`), small pages
    config = plugin.capabilities.configured(workloads.small_pages(method_config(IMPLEMENTATION_METHOD)))
    cache = pnmix_hf.PNMixHFCache(model.config, config, impl=plugin.impl)
    model.set_attn_implementation(pnmix_hf.ATTENTION)
    argument = pnmix_hf.cache_argument(model)
    logits, chosen, step = [], [], workloads.token_ids(seed=5, tokens=PROMPT)
    try:
        for _ in range(DECODE):
            last = model(input_ids=step, use_cache=True, **{argument: cache}).logits[0, -1]
            logits.append(last)
            step = last.argmax()[None, None]
            chosen.append(int(step))
    finally:
        model.set_attn_implementation(exact)
    return outcome({"tokens": chosen}, {"logits": summary(torch.stack(logits))})


def _numbers(tree, prefix: str = "") -> dict[str, list[float]]:
    """Every number of a nested result, by its path (keys sorted): {path: [values]}."""
    out: dict[str, list[float]] = {}
    if isinstance(tree, dict):
        for key in sorted(tree, key=str):
            out |= _numbers(tree[key], f"{prefix}/{key}")
    elif isinstance(tree, (list, tuple)) and tree and all(isinstance(x, (int, float)) for x in tree):
        out[prefix] = [float(x) for x in tree]
    elif isinstance(tree, (list, tuple)):
        for i, x in enumerate(tree):
            out |= _numbers(x, f"{prefix}/{i}")
    elif isinstance(tree, (int, float)):
        out[prefix] = [float(tree)]
    return out


@torch.no_grad()
def fidelity() -> dict:
    from benchmarks.fidelity.analyses import analyse_prompt  # deferred: imports the fidelity tool

    q, k, _ = workloads.qkv(seed=7, tokens=workloads.PROMPT + workloads.APPENDS)
    traces = [(q[0], k[0])]  # one layer: q [H, T, d], k [H_kv, T, d]
    numbers = _numbers(analyse_prompt(traces, workloads.PROMPT, {**workloads.PAGES, "n_sink": workloads.SINKS}))
    return outcome({"analyses": sorted(numbers)}, numbers)


#: Long enough that each candidate's pages (G up to 128, 32 sinks) quantize.
EQUAL_BITS_TOKENS = 224


@torch.no_grad()
def equal_bits() -> dict:
    from benchmarks.fidelity import equal_bits as tool  # deferred: imports transformers

    q, k, v = workloads.qkv(seed=8, tokens=EQUAL_BITS_TOKENS)
    q = q[:, : k.shape[1]]  # one query head per key head
    head_dim = k.shape[-1]
    chosen, numbers = [], {"bits": [], "attention kl": [], "output mse": []}
    for design in tool.CHANNEL_METHODS:
        for budget in tool.DEFAULT_BUDGETS:
            config, bits = tool.matched(design, budget, head_dim, "split")
            chosen.append(tool.describe(config))
            k_hat, v_hat = tool.stored_kv(design, config, q, k, v, None)
            kl, mse = tool.attention_errors(q, k, v, k_hat, v_hat, EQUAL_BITS_TOKENS // 2, head_dim**-0.5)
            for key, value in zip(numbers, (bits, kl, mse), strict=True):
                numbers[key].append(value)
    return outcome({"configurations": chosen}, numbers)


#: The role-calibration canary's budgets (average key + value bits per element).
ROLE_BUDGETS = (3.25, 3.5, 4.0)


@torch.no_grad()
def role_calibration() -> dict:
    """`benchmarks.fidelity.role_calibration.calibrate` (per-tag distortion at each precision) on two requests
    of seeded queries, keys, values and tags captured from one layer, then `allocations` at ROLE_BUDGETS."""
    from benchmarks.fidelity import role_calibration as tool  # deferred: imports transformers
    from reference.tokens.roles import ALL_TAGS  # deferred: only for the role calibration canary

    config = TokenPrecisionConfig()
    captured = []
    for seed in (9, 10):
        q, k, v = workloads.qkv(seed=seed, tokens=2 * config.group_size)
        g = torch.Generator().manual_seed(seed)
        tags = [ALL_TAGS[i] for i in torch.randint(0, 6, (k.shape[2],), generator=g).tolist()]
        captured.append(([], tags, {0: (q[0], k[0], v[0], k.shape[-1] ** -0.5)}))  # [H, T, d] as captured
    calibration = tool.calibrate(None, None, None, [0], config, captured=captured)
    chosen = tool.allocations(calibration, ROLE_BUDGETS, config)
    return outcome(
        {"tags": calibration["tags"], "tokens": calibration["tokens"], "bits": [a["bits"] for a in chosen]},
        {
            "distortion": [x for row in calibration["distortion"] for x in row],
            "average bits": [a["average_bits"] for a in chosen],
        },
    )
