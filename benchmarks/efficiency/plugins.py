"""Implementations timed beside the built-in methods: `pytest benchmarks --impl NAME`.

NAME is whatever the conformance suite accepts (`conformance.loader.load`: an installed plug-in's
name, or an import path 'package.module:factory'), repeatable, or PNMIX_IMPL=a,b when no --impl
is given. Each one runs the points of the built-in `BASE_METHOD` in the kernel, Fig. 7 and
Fig. 6c suites, on the same workloads and device, with that method's configuration mapped by
its `capabilities.preset` (`Plugin.config`). It is reached through the protocol of
`reference.contract` alone (`create`, `prefill`, `append`, `attend`, `storage`, `length`), so its
cache is not preallocated (the static protocol is not part of the protocol), its finite-value
checks are its own, and the decode step of a model is not captured in a CUDA graph. A point
whose needs its claims do not cover is skipped with the reason (`unclaimed`). The memory suite
(Fig. 6a/6b) measures the built-in methods only: its points are the static protocol's
preallocated caches.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from conformance import loader
from reference import PNMixConfig, methods
from reference.contract import Capabilities
from reference.methods import FP16
from reference.records import implementation_targets

#: The built-in method whose points, and whose configuration, a plug-in takes.
BASE_METHOD = "PN-Mix"
#: FP16 runs transformers' StaticCache read by torch's SDPA, which is no plug-in of the conformance
#: suite (its `fp16` is the spec's cache): results name it by this.
FP16_IMPLEMENTATION = "fp16-sdpa"
#: The code each built-in method runs in the suites, by its conformance name.
BUILTIN_IMPLEMENTATIONS = {
    name: FP16_IMPLEMENTATION if name == FP16 else methods.design(methods.method(name).design).triton
    for name in methods.names(precision=methods.CHANNELS)
}
#: The benchmark code every result names beside the implementation's (the suite module is added).
HARNESS_MODULES = ("benchmarks.efficiency.harness", "benchmarks.efficiency.workloads")
#: What puts a plug-in's cache inside the model at the model-level points.
MODEL_ADAPTER = "pnmix.hf"
ENV = "PNMIX_IMPL"


def requested(option: Sequence[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """The implementations to time, each once: --impl's values, else PNMIX_IMPL's comma-separated
    names (the conformance suite reads both the same way)."""
    names = list(option) or [n.strip() for n in environ.get(ENV, "").split(",") if n.strip()]
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class Plugin:
    """One implementation named on the command line."""

    name: str  # as given: its plug-in name or import path
    impl: object  # what `conformance.loader.load` returned
    origin: str  # `conformance.loader.origin`

    @property
    def capabilities(self) -> Capabilities:
        return self.impl.capabilities

    @property
    def version(self) -> str:
        return str(self.impl.version)

    @property
    def config(self) -> PNMixConfig:
        """BASE_METHOD's configuration, mapped onto the implementation's method by its preset, with
        the value residual of the residual policy it claims (as the conformance suite hands it one)."""
        return self.capabilities.configured(methods.config(BASE_METHOD))

    @property
    def module(self) -> str:
        return type(loader.unwrap(self.impl)).__module__


def load(names: Iterable[str]) -> dict[str, Plugin]:
    """name -> Plugin; ValueError, one line from `conformance.loader.load`, for a name that does not load."""
    return {name: Plugin(name, loader.load(name), loader.origin(name)) for name in names}


def unclaimed(
    caps: Capabilities, config: PNMixConfig, *, device: str, dtype: torch.dtype, head_dim: int, sizes: Iterable[int]
) -> list[str]:
    """What a point needs that `caps` does not claim (empty: it can run): the point's device,
    dtype and head_dim, the configuration's group size, key and value bits, pair layout and
    sinks, and its prefill and append sizes (`sizes`) as multiples of token_multiple.

    max_tokens and max_head_dim are not looked at: they bound the shapes the conformance suite
    draws (a slow backend declares small ones), not the shapes an implementation can run.
    """
    bad_sizes = sorted({n for n in sizes if n % caps.token_multiple})
    scale_ok = caps.scales_in_input_dtype or config.scale_dtype in caps.scale_dtypes
    checks = (
        (
            caps.channel_precision,
            "the per-channel cache family (PNMixConfig): per-token precision caches are not "
            "benchmarked through the protocol",
        ),
        (device in caps.devices, f"device {device}"),
        (dtype in caps.dtypes, f"dtype {str(dtype).removeprefix('torch.')}"),
        (caps.head_dims is None or head_dim in caps.head_dims, f"head_dim {head_dim}"),
        (caps.group_sizes is None or config.group_size in caps.group_sizes, f"group size {config.group_size}"),
        (
            (config.b_high, config.b_low) in caps.key_bits,
            f"key bits (b_high, b_low) = ({config.b_high}, {config.b_low})",
        ),
        (config.value_bits in caps.value_bits, f"value bits {config.value_bits}"),
        (scale_ok, f"scale dtype {str(config.scale_dtype).removeprefix('torch.')}"),
        (config.pair_layout in caps.pair_layouts, f"pair layout {config.pair_layout!r}"),
        (caps.sinks or config.n_sink == 0, f"sinks (n_sink {config.n_sink})"),
        (not bad_sizes, f"prefill/append sizes {bad_sizes} (token_multiple {caps.token_multiple})"),
    )
    return [what for ok, what in checks if not ok]


def skip_reason(plugin: Plugin, **point) -> str | None:
    """Why `plugin` does not run a point (`unclaimed`'s keywords), None when it does."""
    missing = unclaimed(plugin.capabilities, plugin.config, **point)
    if not missing:
        return None
    return f"{plugin.name} does not claim what this point needs: {'; '.join(missing)}"


def describe(method: str, plugin: Plugin | None) -> dict:
    """implementation (its own `name`, as the conformance results and the report name it),
    implementation_version and implementation_origin of a point's results; a plug-in's also
    implementation_given, the name it was given by (a plug-in name or an import path)."""
    if plugin is not None:
        return {
            "implementation": str(plugin.impl.name),
            "implementation_version": plugin.version,
            "implementation_origin": plugin.origin,
            "implementation_given": plugin.name,
        }
    if method == FP16:
        import transformers

        name, origin = FP16_IMPLEMENTATION, "transformers.StaticCache read by torch scaled_dot_product_attention"
        version = f"transformers {transformers.__version__}, torch {torch.__version__}"
    else:
        name = BUILTIN_IMPLEMENTATIONS[method]
        version, origin = str(loader.load(name).version), loader.origin(name)
    return {"implementation": name, "implementation_version": version, "implementation_origin": origin}


def plugin_targets(plugin: Plugin) -> tuple[str, ...]:
    """The code of a plug-in: the targets of its factory's module, of its class's and of its bases'
    (a subclass of another package's implementation runs that package's code too), and the modules
    themselves (a module inside a tests folder is not part of its package's code files)."""
    cls = type(loader.unwrap(plugin.impl))
    modules = [loader.factory_module(plugin.name)]
    modules += [c.__module__ for c in cls.__mro__ if c.__module__ not in ("builtins", "typing")]
    return tuple(dict.fromkeys(t for m in modules for t in (*implementation_targets(m), m)))


def code_targets(method: str, suite_module: str, *, kernel: bool, plugin: Plugin | None) -> tuple[str, ...]:
    """The code a point measured, for `reference.records.code_fingerprint`: the implementation's
    (built-in kernel points: the kernels alone; FP16: none of this repository's) and the harness."""
    harness = (*HARNESS_MODULES, suite_module)
    if plugin is not None:
        own = plugin_targets(plugin) + (() if kernel else (MODEL_ADAPTER,))
    elif method == FP16:
        own = ()
    elif kernel:
        own = ("pnmix.kernels",)
    else:
        own = implementation_targets(loader.factory_module(BUILTIN_IMPLEMENTATIONS[method]))
    return tuple(dict.fromkeys((*own, *harness)))
