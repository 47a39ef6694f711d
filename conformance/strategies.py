"""Every hypothesis strategy of the suite, bounded, in one module (imported as `cs`).

A drawn `Case` is concrete (a config, shapes, token counts, a data seed and a value kind),
so awkward sizes can be pinned with `@example(case=Case(...))`. `Case.fit(capabilities)`
maps a case onto what an implementation claims (deterministically, no filtering), so the
same draws serve every implementation.
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

from reference import PNMixConfig, records
from reference.channels.config import check_head_dim
from reference.channels.validation import quantizable_limit
from reference.contract import Capabilities
from reference.equations.saliency import CRITERIA
from reference.tokens.config import TokenPrecisionConfig

MAX_BATCH = 3
MAX_KV_HEADS = 3
MAX_REP = 8  # GQA group sizes 1..8
HEAD_DIMS = (4, 8, 12, 16, 20, 24, 32)
GROUP_SIZES = (8, 16)
RATIOS = (0.0, 0.1, 0.25, 0.3, 0.5, 0.75, 1.0)
SINKS = (0, 1, 3, 8)
FP16_MAX = 65504.0
FP16_SAFE = 30000.0  # under half of float16's largest value: even a 1-bit Eq. 2 scale (max - min) fits

#: Value kinds. "moderate" kinds keep attention logits finite in float16.
KINDS = ("normal", "constant", "near_constant", "wide_range", "extremes", "subnormal", "signed_zeros", "half_steps")
MODERATE_KINDS = ("normal", "constant", "near_constant", "wide_range")
#: The dtype's edge: entries at the largest magnitude the cache accepts (see `edge_magnitudes`).
EDGE_KIND = "edges"


@dataclasses.dataclass(frozen=True)
class Case:
    config: PNMixConfig
    batch: int
    kv_heads: int
    n_rep: int
    head_dim: int
    dtype: torch.dtype
    prompt: int  # prefill tokens
    appends: tuple[int, ...]  # tokens per later append call
    seed: int
    kind: str = "normal"

    @property
    def heads(self) -> int:
        return self.kv_heads * self.n_rep

    @property
    def total(self) -> int:
        return self.prompt + sum(self.appends)

    def fit(self, caps: Capabilities) -> Case:
        """The nearest case within `caps` (same seed and kind); DoesNotFit says what cannot be met."""
        cfg = self.config if caps.preset is None else caps.preset(self.config)
        if not caps.key_bits or not caps.value_bits:
            raise DoesNotFit("it claims no key bits or no value bits")
        key_bits = sorted(caps.key_bits, key=lambda hb: (abs(hb[0] - cfg.b_high) + abs(hb[1] - cfg.b_low), hb))[0]
        value_bits = sorted(caps.value_bits, key=lambda b: (abs(b - cfg.value_bits), b))[0]
        dtype = self.dtype if self.dtype in caps.dtypes else caps.dtypes[0]
        if caps.scales_in_input_dtype:
            scale_dtype = dtype
        else:
            scale_dtype = cfg.scale_dtype if cfg.scale_dtype in caps.scale_dtypes else caps.scale_dtypes[0]
        group, residual = cfg.group_size, cfg.residual_length
        if caps.group_sizes is not None:
            group = sorted(caps.group_sizes, key=lambda g: (abs(g - cfg.group_size), g))[0]
            residual = group * max(1, cfg.residual_length // cfg.group_size)
        cfg = dataclasses.replace(
            cfg,
            b_high=key_bits[0],
            b_low=key_bits[1],
            value_bits=value_bits,
            scale_dtype=scale_dtype,
            pair_layout=cfg.pair_layout if cfg.pair_layout in caps.pair_layouts else caps.pair_layouts[0],
            n_sink=cfg.n_sink if caps.sinks else 0,
            group_size=group,
            residual_length=residual,
        )
        cfg = caps.configured(cfg)
        head_dim = self.head_dim
        # Claiming any head_dim (head_dims None) admits the case's own, as a fixed workload's 128.
        claimed = caps.head_dims or sorted({*HEAD_DIMS, self.head_dim})
        allowed = [d for d in claimed if d <= caps.max_head_dim and _head_dim_ok(cfg, d)]
        if head_dim not in allowed:
            if not allowed and caps.group_sizes is None and (smaller := self._smaller_groups()) is not None:
                try:  # an example at groups past the claimed head_dims: the same work at smaller groups
                    return smaller.fit(caps)
                except DoesNotFit:
                    pass
            if not allowed:
                raise DoesNotFit(
                    f"no head_dim within its claims (head_dims {caps.head_dims}, max_head_dim {caps.max_head_dim}) "
                    f"suits {cfg}"
                )
            head_dim = sorted(allowed, key=lambda d: (abs(d - head_dim), d))[0]
        step = caps.token_multiple
        if step > caps.max_tokens:
            raise DoesNotFit(f"token_multiple {step} exceeds max_tokens {caps.max_tokens}")
        prompt = min(_round_up(self.prompt, step), caps.max_tokens // step * step)
        appends, room = [], caps.max_tokens - prompt
        for n in self.appends:
            n = min(_round_up(n, step), room // step * step)
            if n <= 0:
                break
            appends.append(n)
            room -= n
        return dataclasses.replace(
            self, config=cfg, head_dim=head_dim, prompt=prompt, appends=tuple(appends), dtype=dtype
        )

    def _smaller_groups(self) -> Case | None:
        """This case at half the key group size (the residual the same number of groups, a value
        group size past the new key group halved too), or None below groups of 2."""
        cfg = self.config
        group = cfg.group_size // 2
        if group < 2:
            return None
        values = cfg.value_group_size
        cfg = dataclasses.replace(
            cfg,
            group_size=group,
            residual_length=group * max(1, cfg.residual_length // cfg.group_size),
            value_group_size=values if values is None or values <= group else max(2, values // 2),
        )
        return dataclasses.replace(self, config=cfg)


#: One fixed piece of work that every implementation runs, fitted to its claims (the same seed and
#: tokens; its own bits, groups and residual), so that the report compares what each one holds and
#: how far its attention is from exact attention: 1 sequence, 2 KV heads x 2 query heads each,
#: head_dim 16, a 40-token prompt and one append of 8 (sizes the Triton interpreter claims, and
#: multiples of 8 tokens, which packing along tokens may need).
WORKLOAD = Case(
    PNMixConfig(b_high=3, b_low=1, group_size=8, residual_length=8, n_sink=2, value_bits=2),
    1,
    2,
    2,
    16,
    torch.float16,
    40,
    (8,),
    2026,
)


#: The paper's setting at a realistic length, where sinks and the exact residual are a small share
#: (32 and at most 128 of 4096 tokens; on `WORKLOAD` they dominate what is held): the paper's main
#: configuration (`PNMixConfig()`: H3(50%)L1, G = N = 128, 32 sinks, 2-bit values), mapped by each
#: implementation's preset; one sequence of 4096 tokens, a 3968-token prompt then two appends of 64
#: (the second flushes a residual); head_dim 128; 1 KV head read by 4 query heads (on the Triton
#: interpreter each of the two tests that run it then takes about 10 s); float16. Fitted with
#: `fit_fixed`: the claims of the design apply, not the bounds on drawn shapes.
REALISTIC = Case(PNMixConfig(), 1, 1, 4, 128, torch.float16, 3968, (64, 64), 2026)


def fit_fixed(case: Case | TokenCase, caps: Capabilities) -> Case | TokenCase:
    """A fixed workload fitted to `caps` as `Case.fit` does, except for max_tokens and max_head_dim:
    they bound the shapes hypothesis draws (a slow backend's cost), not what its design accepts."""
    unbounded = dataclasses.replace(
        caps, max_tokens=max(caps.max_tokens, case.total), max_head_dim=max(caps.max_head_dim, case.head_dim)
    )
    return case.fit(unbounded)


def claimed_combinations(
    caps: Capabilities,
    base: Case,
    *,
    kind: str | None = None,
    dtypes: tuple[torch.dtype, ...] | None = None,
    low_bits: tuple[int, ...] | None = None,
    widths: tuple[str, ...] = ("low", "high", "value"),
) -> list[Case]:
    """Cases that together run every claimed combination of bit width, scale dtype and input dtype:
    for each claimed input dtype and scale dtype, every key bit width of the claimed pairs (as a
    pair's low bits and as its high bits) and every claimed value width at least once. The bit
    widths' extremes are among them; kind="edges" puts the entries at the top of each dtype's range.
    The explicit examples of a property (`harness.covers_claimed_combinations`): at any profile,
    however few cases it draws, no claimed combination is left to chance.

    `base` gives the shapes, calls and data; `dtypes`, `low_bits` and `widths` (which of a key
    pair's low and high widths and the value widths to cover) narrow the combinations to those a
    property is about (its strategy's dtypes; property 2's 1-bit channels). Each case is fitted to
    `caps`; cases that fit to the same one are run once."""
    pairs = sorted(p for p in caps.key_bits if low_bits is None or p[1] in low_bits)
    in_dtypes = [d for d in caps.dtypes if dtypes is None or d in dtypes]
    if not pairs or not in_dtypes:
        return []
    keys = _covering_pairs(pairs, [role for role in widths if role != "value"])
    values = sorted(caps.value_bits) if "value" in widths else [base.config.value_bits]
    scales = ("input",) if caps.scales_in_input_dtype else caps.scale_dtypes
    out: dict[str, Case] = {}
    for dtype in in_dtypes:
        for scale in scales:
            for row in range(max(len(keys), len(values))):
                (high, low), value = keys[row % len(keys)], values[row % len(values)]
                cfg = dataclasses.replace(
                    base.config,
                    b_high=high,
                    b_low=low,
                    value_bits=value,
                    scale_dtype=dtype if scale == "input" else scale,
                )
                case = dataclasses.replace(
                    base, config=cfg, dtype=dtype, kind=kind or base.kind, seed=base.seed + len(out)
                )
                try:
                    case = case.fit(caps)
                except DoesNotFit:
                    pass  # the property drops it, saying why
                out.setdefault(compact(dataclasses.replace(case, seed=0)), case)
    return list(out.values())


def _covering_pairs(pairs: list[tuple[int, int]], roles: list[str]) -> list[tuple[int, int]]:
    """Few (b_high, b_low) pairs of `pairs` that hold each of its low widths as a low and each of
    its high widths as a high, for the `roles` given (greedy set cover; on ties a mixed pair,
    b_high > b_low, as PN-Mix's)."""
    needed = {(role, p[role == "low"]) for p in pairs for role in roles}
    chosen = [] if needed else pairs[:1]
    while needed:
        best = max(pairs, key=lambda p: (len(needed & {("high", p[0]), ("low", p[1])}), p[0] > p[1]))
        chosen.append(best)
        needed -= {("high", best[0]), ("low", best[1])}
    return chosen


def compact(obj: object) -> str:
    """A one-line repr of a case (or config) as an `@example` writes it: positional case fields,
    a config's fields only where they differ from its defaults."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return repr(obj)
    fields = dataclasses.fields(obj)
    if isinstance(obj, (Case, TokenCase)):
        return f"{type(obj).__name__}({', '.join(compact(getattr(obj, f.name)) for f in fields)})"
    changed = [f for f in fields if getattr(obj, f.name) != _default(f)]
    return f"{type(obj).__name__}({', '.join(f'{f.name}={getattr(obj, f.name)!r}' for f in changed)})"


def _default(field: dataclasses.Field) -> object:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def describe(case: Case | TokenCase) -> str:
    """What a fixed workload ran, on one line: tokens and calls, shapes, dtype and config (and for a
    per-token case the chance that a token is low)."""
    appends = f" then appends of {', '.join(map(str, case.appends))}" if case.appends else ""
    low = f", each token low with chance {case.low_share:.0%}" if isinstance(case, TokenCase) else ""
    return (
        f"{case.total} tokens (prompt {case.prompt}{appends}), batch {case.batch}, {case.kv_heads} KV head(s) "
        f"x {case.n_rep} query heads, head_dim {case.head_dim}, {str(case.dtype).removeprefix('torch.')}, "
        f"{compact(case.config)}{low}"
    )


def workload_record(case: Case | TokenCase) -> dict[str, object]:
    """What a fixed workload ran, as a result records it: its description (`describe`), its configuration as
    data (`reference.records.config_record`, read back without parsing the description) and, for a per-token
    case, the chance that a token is low."""
    out: dict[str, object] = {
        "realistic_workload": describe(case),
        "realistic_config": records.config_record(case.config),
    }
    if isinstance(case, TokenCase):
        out["realistic_low_share"] = case.low_share
    return out


class DoesNotFit(ValueError):
    """No case of this kind lies within an implementation's claims (the property is skipped)."""


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _head_dim_ok(cfg: PNMixConfig, head_dim: int) -> bool:
    try:
        check_head_dim(cfg, head_dim)
    except ValueError:
        return False
    return True


@st.composite
def configs(draw, *, n_sink: int | None = None) -> PNMixConfig:
    """Configurations of the paper's sweep (Table 14) at small group sizes."""
    b_low = draw(st.sampled_from((1, 2, 3, 4)))
    b_high = draw(st.sampled_from([b for b in (1, 2, 3, 4, 8, 5, 6, 7) if b >= b_low]))
    group = draw(st.sampled_from(GROUP_SIZES))
    return PNMixConfig(
        b_high=b_high,
        b_low=b_low,
        ratio=draw(st.sampled_from(RATIOS)),
        group_size=group,
        residual_length=group * draw(st.sampled_from((1, 2))),
        n_sink=draw(st.sampled_from(SINKS)) if n_sink is None else n_sink,
        value_bits=draw(st.sampled_from((2, 1, 4, 8, 16, 3, 6))),
        value_group_size=draw(st.sampled_from((None, 8))),
        pair_layout=draw(st.sampled_from(("split", "adjacent"))),
        scale_dtype=draw(st.sampled_from((torch.float16, torch.float32, torch.bfloat16))),
        criterion=draw(st.sampled_from(CRITERIA)),
    )


@st.composite
def cases(
    draw,
    *,
    kinds: tuple[str, ...] = MODERATE_KINDS,
    max_prompt: int = 160,
    max_appends: int = 6,
    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32),
    n_sink: int | None = None,
) -> Case:
    """A whole scenario: config, shapes, prompt length, a split of later appends, data."""
    cfg = draw(configs(n_sink=n_sink))
    head_dim = draw(st.sampled_from([d for d in HEAD_DIMS if _head_dim_ok(cfg, d)]))
    appends = draw(st.lists(st.integers(1, 2 * cfg.residual_length + 3), max_size=max_appends))
    return Case(
        config=cfg,
        batch=draw(st.integers(1, MAX_BATCH)),
        kv_heads=draw(st.integers(1, MAX_KV_HEADS)),
        n_rep=draw(st.integers(1, MAX_REP)),
        head_dim=head_dim,
        dtype=draw(st.sampled_from(dtypes)),
        prompt=draw(st.integers(1, max_prompt)),
        appends=tuple(appends),
        seed=draw(st.integers(0, 2**31 - 1)),
        kind=draw(st.sampled_from(kinds)),
    )


HALF_STEP = 2.0**-3  # the grid unit of "half_steps"


def values(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    kind: str,
    seed: int,
    *,
    levels: int = 3,
    axis: int = -2,
    edge: float = FP16_SAFE,
) -> torch.Tensor:
    """Adversarial but finite values of one kind, reproducible from the seed.

    "edges": two fifths of the entries +-edge (representable in dtype, `edge_magnitudes`), the
    rest unit normal and +-1.

    "half_steps": every run of 8 entries along `axis` (so every group of a multiple of 8 there,
    wherever it starts) spans exactly [0, levels u], and the other entries are multiples of u/2
    (u = HALF_STEP): (x - z) / s is then exactly an integer or an exact tie k + 0.5, in every
    dtype (at most 8 significant bits), for groups of `levels` steps (Eq. 2; Eq. 7 at 1 bit).
    """
    gen = torch.Generator().manual_seed(seed)
    rand = lambda: torch.randn(shape, generator=gen)  # noqa: E731
    unif = lambda: torch.rand(shape, generator=gen)  # noqa: E731
    if kind == "unit":
        x = rand()
    elif kind == "normal":
        x = rand() * float(torch.tensor([0.05, 1.0, 8.0])[seed % 3])
    elif kind == "constant":  # every key group and every value group constant
        x = torch.full(shape, float(rand().flatten()[0]) * 3)
    elif kind == "near_constant":  # a few float16 ulps around one value
        x = 1.5 + torch.randint(-2, 3, shape, generator=gen) * 2.0**-10
    elif kind == "wide_range":  # five decades; |x| < ~500 keeps float16 attention logits finite
        x = rand() * torch.pow(10.0, unif() * 5 - 3)
    elif kind == "extremes":
        choices = torch.tensor([FP16_SAFE, -FP16_SAFE, 0.0, 1.0, -1.0, 2.0**-14])
        x = choices[torch.randint(0, len(choices), shape, generator=gen)]
    elif kind == EDGE_KIND:
        choices = torch.tensor([edge, -edge, 0.0, 1.0, -1.0])
        pick = choices[torch.randint(0, len(choices), shape, generator=gen)]
        x = torch.where(pick.abs() == edge, pick, torch.where(pick == 0, rand(), pick))
    elif kind == "subnormal":  # float16 subnormals and their neighbours
        x = (torch.randint(-1023, 1024, shape, generator=gen) * 2.0**-24).where(unif() < 0.9, rand() * 2.0**-14)
    elif kind == "signed_zeros":
        x = torch.where(unif() < 0.5, torch.zeros(shape), rand())
    elif kind == "half_steps":
        top = min(2 * levels, 255)
        x = torch.randint(0, top + 1, shape, generator=gen) * (HALF_STEP / 2)
        where = torch.arange(shape[axis]).remainder(8).view(-1, *([1] * (-axis - 1)))
        x = torch.where(where == 0, 0.0, torch.where(where == 1, levels * HALF_STEP, x))
    else:
        raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")
    x = x.to(dtype)
    # -0.0 wherever a zero landed in half of the cases: bit-exact paths must keep its sign.
    if seed % 2:
        x = torch.where((x == 0) & (unif() < 0.5), torch.tensor(-0.0, dtype=dtype), x)
    return x


def prefill_tensors(case: Case, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, H, P, d], k and v [B, H_kv, P, d] of the prompt."""
    q_shape = (case.batch, case.heads, case.prompt, case.head_dim)
    q = values(q_shape, case.dtype, _q_kind(case.kind), case.seed, edge=edge_magnitudes(case)[0])
    shape = (case.batch, case.kv_heads, case.prompt, case.head_dim)
    k = values(shape, case.dtype, case.kind, case.seed + 1, **_grid(case, keys=True))
    v = values(shape, case.dtype, case.kind, case.seed + 2, **_grid(case, keys=False))
    return q.to(device), k.to(device), v.to(device)


def _grid(case: Case, keys: bool) -> dict:
    """Where "half_steps" puts its ties (key groups along tokens at b_low, values along
    channels), and the magnitude of "edges"."""
    edge = edge_magnitudes(case)[1 if keys else 2]
    if keys:
        return {"levels": 2**case.config.b_low - 1, "axis": -2, "edge": edge}
    return {"levels": 2 ** min(case.config.value_bits, 8) - 1, "axis": -1, "edge": edge}


def edge_magnitudes(case: Case) -> tuple[float, float, float]:
    """The magnitudes of "edges" for queries, keys and values: the largest the dtype holds at or
    under what the cache accepts (`reference.channels.validation.quantizable_limit` where the tensor is
    quantized), and for queries and keys at most float16's largest, 65504 (past it the scores
    q.k pass float32's range, and attention over exact keys is no longer finite either)."""
    cfg, top = case.config, torch.finfo(case.dtype).max
    v_edge = min(top, quantizable_limit(cfg, cfg.value_bits)) if cfg.values_quantized else top
    k_edge = min(top, quantizable_limit(cfg, cfg.b_low), FP16_MAX)
    return tuple(_representable_under(m, case.dtype) for m in (min(top, FP16_MAX), k_edge, v_edge))


def _representable_under(limit: float, dtype: torch.dtype) -> float:
    """The largest value of dtype at most `limit`."""
    x = torch.tensor(limit, dtype=torch.float64).to(dtype)
    if float(x) > limit:
        x = torch.nextafter(x, torch.zeros_like(x))
    return float(x)


def append_tensors(case: Case, index: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v of the index-th append call."""
    shape = (case.batch, case.kv_heads, case.appends[index], case.head_dim)
    seed = case.seed + 1000 * (index + 1)
    k = values(shape, case.dtype, case.kind, seed, **_grid(case, keys=True))
    return k.to(device), values(shape, case.dtype, case.kind, seed + 1, **_grid(case, keys=False)).to(device)


def decode_queries(case: Case, n: int, device) -> torch.Tensor:
    """n new queries [B, H, n, d]."""
    shape = (case.batch, case.heads, n, case.head_dim)
    return values(shape, case.dtype, _q_kind(case.kind), case.seed + 7, edge=edge_magnitudes(case)[0]).to(device)


def _q_kind(kind: str) -> str:
    # Queries stay moderate (unit normal): saliency needs distinct norms, and attention logits
    # must stay finite when the reference computes them in float16; at the edges they go too.
    return kind if kind == EDGE_KIND else "unit"


# Bad inputs for the error property: (what to break, expected error type, message fragment).
BAD_APPENDS = (
    ("nan_in_k", ValueError, "k contains NaN or Inf"),
    ("inf_in_v", ValueError, "v contains NaN or Inf"),
    ("wrong_kv_heads", ValueError, "kv_heads"),
    ("wrong_batch", ValueError, "batch"),
    ("wrong_head_dim", ValueError, "head_dim"),
    ("wrong_dtype", TypeError, "dtype"),
    ("k_v_mismatch", ValueError, "same shape"),
    ("no_tokens", ValueError, "at least one token"),
    ("not_a_tensor", TypeError, "torch.Tensor"),
)
BAD_PREFILLS = (
    ("odd_head_dim", ValueError, "head_dim must be even"),
    ("heads_not_multiple", ValueError, "multiple of the KV heads"),
    ("nan_in_q", ValueError, "q contains NaN or Inf"),
    ("float64", TypeError, "float16, bfloat16 or float32"),
    ("batch_mismatch", ValueError, "batch"),
    ("length_mismatch", ValueError, "same prefill tokens"),
    ("empty_batch", ValueError, r"batch \(dim 0\) is 0"),
    ("no_kv_heads", ValueError, r"KV heads \(dim 1\) is 0"),
    ("no_query_heads", ValueError, r"q heads \(dim 1\) is 0"),
)
BAD_QUERIES = (
    ("too_many_queries", ValueError, "holds only"),
    ("nan_in_q", ValueError, "q contains NaN or Inf"),
    ("wrong_head_dim", ValueError, "head_dim"),
    ("wrong_dtype", TypeError, "dtype"),
)


# -- per-token precision (property 11) ------------------------------------------------------------

TOKEN_GROUP_SIZES = (8, 16, 32)
TOKEN_BITS = ((2, 4), (1, 4), (2, 3), (3, 8))
TOKEN_KINDS = ("normal", "constant", "near_constant", "wide_range")


@dataclasses.dataclass(frozen=True)
class TokenCase:
    """A per-token precision scenario: config, shapes, calls, and the share of low tokens."""

    config: TokenPrecisionConfig
    batch: int
    kv_heads: int
    n_rep: int
    head_dim: int
    dtype: torch.dtype
    prompt: int
    appends: tuple[int, ...]
    low_share: float  # chance that a token is low (each token drawn from the seed)
    seed: int
    kind: str = "normal"

    @property
    def heads(self) -> int:
        return self.kv_heads * self.n_rep

    @property
    def calls(self) -> tuple[int, ...]:
        return (self.prompt, *self.appends)

    @property
    def total(self) -> int:
        return self.prompt + sum(self.appends)

    def fit(self, caps: Capabilities) -> TokenCase:
        """The nearest case within `caps`; DoesNotFit says what cannot be met."""
        if not caps.token_precision:
            raise DoesNotFit("it claims no per-token precision")
        cfg = self.config
        low_keys = cfg.low_keys if cfg.low_keys in caps.token_precision else sorted(caps.token_precision)[0]
        group = cfg.group_size
        while group > caps.max_head_dim and group > 8:
            group //= 2
        if group > caps.max_head_dim:
            raise DoesNotFit(f"max_head_dim {caps.max_head_dim} holds no group of 8 channels")
        head_dim = max(group, min(self.head_dim, caps.max_head_dim) // group * group)
        low = cfg.low_bits if low_keys == "channels" else max(cfg.low_bits, 2)
        high = max(cfg.high_bits, low + 1)
        if caps.scales_in_input_dtype:
            scale_dtype = self.dtype
        else:
            scale_dtype = cfg.scale_dtype if cfg.scale_dtype in caps.scale_dtypes else caps.scale_dtypes[0]
        cfg = dataclasses.replace(
            cfg,
            low_keys=low_keys,
            group_size=group,
            low_bits=low,
            high_bits=high,
            scale_dtype=scale_dtype,
            pair_layout=cfg.pair_layout if cfg.pair_layout in caps.pair_layouts else caps.pair_layouts[0],
        )
        prompt = min(self.prompt, caps.max_tokens)
        appends, room = [], caps.max_tokens - prompt
        for n in self.appends:
            if min(n, room) <= 0:
                break
            appends.append(min(n, room))
            room -= appends[-1]
        dtype = self.dtype if self.dtype in caps.dtypes else caps.dtypes[0]
        return dataclasses.replace(
            self, config=cfg, head_dim=head_dim, prompt=prompt, appends=tuple(appends), dtype=dtype
        )


#: `REALISTIC` for the per-token caches: the same tokens, calls and shapes, each method's own configuration
#: (`TokenPrecisionConfig()`, TriAxialKV's: INT4 and INT2 tokens in groups of 32; fitting gives role-aware
#: PN-Mix its pair keys), half the tokens low (the storage section's 50% row).
REALISTIC_TOKENS = TokenCase(TokenPrecisionConfig(), 1, 1, 4, 128, torch.float16, 3968, (64, 64), 0.5, 2026)


@st.composite
def token_cases(draw, *, max_prompt: int = 120, max_appends: int = 8) -> TokenCase:
    low, high = draw(st.sampled_from(TOKEN_BITS))
    low_keys = draw(st.sampled_from(("channels", "pairs") if low >= 2 else ("channels",)))
    group = draw(st.sampled_from(TOKEN_GROUP_SIZES))
    cfg = TokenPrecisionConfig(
        low_bits=low,
        high_bits=high,
        group_size=group,
        scale_dtype=draw(st.sampled_from((torch.float16, torch.float32, torch.bfloat16))),
        low_keys=low_keys,
        ratio=draw(st.sampled_from((0.25, 0.5, 1.0))),
        pair_layout=draw(st.sampled_from(("split", "adjacent"))),
    )
    return TokenCase(
        config=cfg,
        batch=draw(st.integers(1, 2)),
        kv_heads=draw(st.integers(1, 2)),
        n_rep=draw(st.integers(1, 3)),
        head_dim=group * draw(st.integers(1, 2)),
        dtype=draw(st.sampled_from((torch.float16, torch.bfloat16, torch.float32))),
        prompt=draw(st.integers(1, max_prompt)),
        appends=tuple(draw(st.lists(st.integers(1, 2 * group + 3), max_size=max_appends))),
        low_share=draw(st.sampled_from((0.0, 0.5, 0.8, 1.0))),
        seed=draw(st.integers(0, 2**31 - 1)),
        kind=draw(st.sampled_from(TOKEN_KINDS)),
    )


def token_bits(case: TokenCase, call: int) -> torch.Tensor:
    """The bits of the tokens of call `call` (0: the prompt), each low with chance case.low_share."""
    gen = torch.Generator().manual_seed(case.seed + 31 * call)
    low = torch.rand(case.calls[call], generator=gen) < case.low_share
    return torch.where(low, case.config.low_bits, case.config.high_bits)


def token_tensors(case: TokenCase, call: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v) of call `call`: q [B, H, n, d] (the prompt's queries; decode queries after), k, v [B, H_kv, n, d]."""
    n, seed = case.calls[call], case.seed + 1000 * call
    q = values((case.batch, case.heads, n, case.head_dim), case.dtype, "unit", seed)
    shape = (case.batch, case.kv_heads, n, case.head_dim)
    k = values(shape, case.dtype, case.kind, seed + 1)
    v = values(shape, case.dtype, case.kind, seed + 2)
    return q.to(device), k.to(device), v.to(device)
