"""Derived state: tensors a cache computes from what it stores, to read it faster."""

from __future__ import annotations


class Derived(dict):
    """Tensors by name that a cache computes from its stored tensors to read them faster (each quantized
    page read back from its packed bytes once, when it is stored): no stored state. The storage report
    leaves them out, and so does the conformance suite's count of the bytes a cache holds
    (`conformance.harness.held_bytes`); a cache that lost them could compute them again. An
    implementation marks its own such state with it (`reference.contract.Derived`)."""
