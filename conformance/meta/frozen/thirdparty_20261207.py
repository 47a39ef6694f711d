"""A third party's implementation, as a user plugs one in from the README ("Plug in your
implementation"): the plain-PyTorch KIVI-style cache of `conformance/impls/template.py` (uniform
b-bit keys per channel in groups of G tokens, values per token, one bit width), under its own
name and claims. The tests time it beside the built-in methods and check its conformance:

    pytest conformance --impl reports.tests.thirdparty:make
    pytest benchmarks/suites --impl reports.tests.thirdparty:make

`make_cuda_only` and `make_bfloat16_only` claim less, so that the points they do not cover are
skipped with the reason.
"""

from __future__ import annotations

import dataclasses

import torch

from conformance.impls.template import TemplateImplementation

__version__ = "0.1.0"


class ThirdPartyKivi(TemplateImplementation):
    name = "thirdparty-kivi"
    version = __version__

    def __init__(self, **claims) -> None:
        # an instance attribute: each variant claims less without touching the class's claims
        self.capabilities = dataclasses.replace(TemplateImplementation.capabilities, **claims)


def make() -> ThirdPartyKivi:
    return ThirdPartyKivi()


def make_twin() -> ThirdPartyKivi:
    """The same implementation under a second factory: its name clashes with `make`'s."""
    return ThirdPartyKivi()


def make_cuda_only() -> ThirdPartyKivi:
    impl = ThirdPartyKivi(devices=("cuda",))
    impl.name = "thirdparty-kivi-cuda"  # results are filed by name: a variant has its own
    return impl


def make_bfloat16_only() -> ThirdPartyKivi:
    impl = ThirdPartyKivi(dtypes=(torch.bfloat16,))
    impl.name = "thirdparty-kivi-bf16"
    return impl
