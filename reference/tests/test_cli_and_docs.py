"""The storage CLI prints numbers from the analytic model; docstring examples run."""

import doctest
import importlib
import re

import pytest
import torch

from reference import PNMixConfig, bit_widths, methods, storage_model
from reference.cli import main
from reference.tokens import config as tokens


def test_cli_prints_the_worked_example_and_model_bytes(capsys):
    assert main(["--model", "Qwen3-8B", "--batch", "32", "--length", "8333"]) == 0
    out = capsys.readouterr().out
    assert "| this config: H3(50%)L1 G128 V2 |     2.2634 |" in out
    gib = 36 * storage_model(PNMixConfig(), 32, 8, 128, 8333).total / 1024**3
    assert f"{gib:.3f}" in out
    assert f"{2 * 36 * 32 * 8 * 8333 * 128 * 2 / 1024**3:.3f}" in out


def test_cli_sweep_lists_other_bit_widths(capsys):
    main(["--sweep", "--head-dim", "64"])
    out = capsys.readouterr().out
    assert "H4(50%)L2" in out and "H2(50%)L1" in out
    assert f"{bit_widths(PNMixConfig(b_high=4, b_low=2), 64).key_effective:.4f}" in out


def test_cli_rejects_bad_config_with_the_config_message(capsys):
    with pytest.raises(SystemExit):
        main(["--ratio", "2"])
    assert "ratio must be in [0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "module", ["reference.equations.quant", "reference.equations.packing", "reference.channels.storage"]
)
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0


def test_cli_lists_every_method_from_the_same_accounting(capsys):
    from reference.methods import METHODS

    main(["--methods"])
    out = capsys.readouterr().out
    for name, make in METHODS.items():
        line = next(row for row in out.splitlines() if row.startswith(f"| {name} "))
        assert f"{bit_widths(make(), 128).key_effective:.4f}" in line
    assert "| FP16 " in out and "16.0000" in out


def test_cli_lists_every_registered_method(capsys):
    """--methods lists every method of the registry, the per-token ones at their share of low tokens, with
    their bits and bytes from their own accounting (here every token low: 3 bits and the class map)."""
    assert main(["--methods", "--model", "Qwen3-8B", "--batch", "32", "--length", "8333"]) == 0
    out = capsys.readouterr().out
    rows = [row for row in out.splitlines() if row.startswith("| ")]
    for name in methods.names():
        assert [row for row in rows if re.match(rf"\| {re.escape(name)},? ", row)], f"{name} is not listed"
    for name in methods.names(precision=methods.TOKENS):
        cfg = methods.config(name)
        low = tokens.bits_per_element(cfg, 128, torch.full((32768,), cfg.low_bits), kv_heads=8)
        (row,) = [row for row in rows if re.match(rf"\| {re.escape(name)} +\| 100% ", row)]
        assert f"{low.average:.4f}" in row and f"{low.key_metadata:.4f}" in row
        held = tokens.storage_model(cfg, 32, 8, 128, torch.full((8333,), cfg.low_bits))
        (row,) = [row for row in rows if row.startswith(f"| {name}, 100% low ")]
        assert f"{36 * sum(held.values()) / 1024**3:.3f}" in row


def test_cli_help_names_every_method(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help at hyphens too
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    said = capsys.readouterr().out
    assert [name for name in methods.names() if name not in said] == []


def test_cli_methods_at_a_head_dim_the_per_token_methods_cannot_hold_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--methods", "--head-dim", "48"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    (said,) = [line for line in err.splitlines() if "error" in line]
    assert said.startswith("python -m reference: error: --methods: the per-token methods (TriAxialKV, role-aware")
    assert "cannot hold --head-dim: head_dim (48) must be a multiple of group_size (32)" in said


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--batch", "0"], "argument --batch: must be >= 1, got 0"),
        (["--batch", "-1"], "argument --batch: must be >= 1, got -1"),
        (["--length", "0"], "argument --length: must be >= 1, got 0"),
        (["--n-quantized", "0"], "argument --n-quantized: must be >= 1, got 0"),
        (["--batch", "two"], "argument --batch: must be an integer >= 1, got 'two'"),
    ],
)
def test_cli_refuses_counts_below_one_on_one_line(capsys, argv, says):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    assert [line for line in err.splitlines() if "error" in line] == [f"python -m reference: error: {says}"]
