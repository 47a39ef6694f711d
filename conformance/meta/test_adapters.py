"""The built-in adapters of libraries attend with the library's own arithmetic, or say they do not."""

import os
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from conformance import loader
from conformance import strategies as cs
from conformance.impls import transformers_quantized as tq
from reference import PNMixConfig
from reference.contract import ATTENTION

pytest.importorskip("optimum.quanto")


def test_every_builtin_states_whose_attention_it_runs():
    for name in loader.builtins():
        assert loader.load(name).capabilities.attention in ATTENTION


@pytest.mark.parametrize("new", [1, 3])
def test_the_transformers_adapter_attends_as_transformers_sdpa_does(new):
    """Its `attend` is torch SDPA in float16 over the states `update` returns, causal from the bottom
    right (what transformers' "sdpa" attention computes in a model), not the spec's float32 attention."""
    impl = loader.load("transformers-quanto")
    assert impl.capabilities.attention == "own"
    case = cs.Case(
        PNMixConfig(b_high=4, b_low=4, value_bits=4, group_size=8, residual_length=8, n_sink=0),
        1,
        2,
        2,
        16,
        torch.float16,
        40,
        (3,),
        5,
        "wide_range",
    ).fit(impl.capabilities)
    q, k, v = cs.prefill_tensors(case, "cpu")
    cache = impl.create(case.config)
    cache.prefill(q, k, v)
    cache.append(*cs.append_tensors(case, 0, "cpu"))
    query = cs.decode_queries(case, new, "cpu")
    k_states, v_states = (t.to(torch.float16) for t in cache.dequantize())
    length = k_states.shape[-2]
    mask = torch.arange(length) <= torch.arange(length - new, length).unsqueeze(-1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        query, k_states.repeat_interleave(2, 1), v_states.repeat_interleave(2, 1), attn_mask=mask
    )
    sdpa_function = torch.nn.functional.scaled_dot_product_attention
    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", wraps=sdpa_function) as spy:
        got = cache.attend(query)
    assert torch.equal(got, sdpa)
    # through transformers' SDPA path, on the states in their own dtype (on the CPU torch's SDPA then
    # rounds as the spec does; on a GPU its fused kernels do not)
    ((q_in, k_in, v_in), _), *others = spy.call_args_list
    assert not others and q_in.dtype == k_in.dtype == v_in.dtype == torch.float16


def test_the_quanto_adapter_names_a_stale_build_lock_and_says_when_it_compiles(tmp_path, monkeypatch):
    ext = SimpleNamespace(name="quanto_cpp", build_directory=str(tmp_path), _lib=None)
    monkeypatch.setattr(tq, "quanto_extensions", lambda: [ext])
    said = []
    tq.check_quanto_build(say=said.append)  # nothing built yet: the first use compiles
    assert len(said) == 1 and f"compiles its extension quanto_cpp on first use, in {tmp_path}" in said[0]
    lock = tmp_path / "lock"
    held = os.open(lock, os.O_CREAT | os.O_EXCL)  # as torch's FileBaton holds it while it builds
    try:
        said.clear()
        tq.check_quanto_build(say=said.append)
        assert len(said) == 1 and f"process {os.getpid()} is compiling" in said[0] and str(lock) in said[0]
    finally:
        os.close(held)
    with pytest.raises(ValueError) as error:  # the build was interrupted: its lock outlived it
        loader.load("transformers-quanto")
    message = str(error.value)
    assert "\n" not in message and "'transformers-quanto'" in message
    assert f"stale build lock {lock}" in message and "delete that file" in message
    lock.unlink()
    (tmp_path / "quanto_cpp.so").write_bytes(b"")
    said.clear()
    tq.check_quanto_build(say=said.append)  # built: nothing to say
    assert said == [] and loader.load("transformers-quanto").name == "transformers-quanto"
