"""Result records: atomic writes that never overwrite unasked, kinds read from content, one environment."""

import dataclasses
import json
import os
import platform
import re

import pytest
import torch

from reference import methods, records

ISO_UTC_SECONDS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")


def test_bytes_and_text_share_the_atomic_path(tmp_path):
    png = bytes(range(256))
    records.write_bytes_atomic(tmp_path / "a.png", png)
    records.write_atomic(tmp_path / "b.md", "zürich\n")
    records.write_json(tmp_path / "c.json", {"b": 1, "a": [2]})
    assert (tmp_path / "a.png").read_bytes() == png
    assert (tmp_path / "b.md").read_bytes() == "zürich\n".encode()
    assert json.loads((tmp_path / "c.json").read_text()) == {"a": [2], "b": 1}
    with pytest.raises(FileExistsError, match=r"a\.png exists"):
        records.write_bytes_atomic(tmp_path / "a.png", b"other")
    assert (tmp_path / "a.png").read_bytes() == png
    records.write_bytes_atomic(tmp_path / "a.png", b"other", overwrite=True)
    assert (tmp_path / "a.png").read_bytes() == b"other"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.md", "c.json"]  # no temporary files left


def test_a_failed_write_leaves_neither_the_file_nor_a_part_of_it(tmp_path, monkeypatch):
    def disk_full(fd):
        raise OSError("no space left on device")

    monkeypatch.setattr(records.os, "fsync", disk_full)
    with pytest.raises(OSError, match="no space"):
        records.write_atomic(tmp_path / "r.json", "x" * 10_000)
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_appears_while_writing_is_not_overwritten(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    mkstemp = records.tempfile.mkstemp

    def rival_writes_first(*args, **kwargs):
        target.write_text("theirs")  # after the existence check, before the final link
        return mkstemp(*args, **kwargs)

    monkeypatch.setattr(records.tempfile, "mkstemp", rival_writes_first)
    with pytest.raises(FileExistsError):
        records.write_atomic(target, "ours")
    assert target.read_text() == "theirs" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.parametrize("kind", sorted(records.TAGS))
def test_a_record_is_stamped_with_its_kind_and_read_back_as_it(kind):
    data = json.loads(json.dumps(records.record(kind, "cpu", figures=[1, 2])))
    assert data[records.KIND] == records.TAGS[kind] and data["figures"] == [1, 2]
    assert records.kind_of(data) == kind


def test_pytest_benchmark_json_is_told_by_its_own_keys():
    assert records.kind_of({"benchmarks": [], "machine_info": {}, "datetime": "x"}) == records.BENCHMARK


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"kind": "something-else"}, "kind 'something-else'"),
        ([1, 2], "no 'kind' key"),
        ({"benchmarks": []}, "no 'kind' key"),
        ("text", "no 'kind' key"),
    ],
)
def test_unknown_content_is_rejected_saying_what_was_found_and_expected(data, says):
    with pytest.raises(ValueError) as err:
        records.kind_of(data)
    assert says in str(err.value) and "'pnmix-conformance'" in str(err.value) and "pytest-benchmark" in str(err.value)


def test_record_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="kind must be one of"):
        records.record("pnmix-conformance")  # the tag, not the kind


def test_environment_names_the_device_used_and_dates_in_one_format():
    env = records.environment(torch.device("cpu"), command="python -m x --smoke")
    assert env["device"] == f"cpu ({platform.machine()})"
    assert ISO_UTC_SECONDS.fullmatch(env["date_utc"]) and ISO_UTC_SECONDS.fullmatch(records.now_utc())
    assert env["command"] == "python -m x --smoke"
    assert {"python", "torch", "triton", "transformers"} <= set(env["versions"])
    assert set(env["machine"]) == {"platform", "cpu", "memory", "gpu", "cuda", "TRITON_INTERPRET"}
    assert env["machine"]["TRITON_INTERPRET"].startswith(os.environ.get("TRITON_INTERPRET", "unset") + ":")


def test_a_cuda_device_is_named_by_its_gpu(monkeypatch):
    monkeypatch.setattr(records.torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert records.device_name(torch.device("cuda", 0)) == "NVIDIA H200"
    assert records.device_name("cuda") == "NVIDIA H200"
    monkeypatch.setattr(records.torch.cuda, "is_available", lambda: False)
    assert records.device_name() == f"cpu ({platform.machine()})"  # the default device


def test_the_command_is_the_one_typed(monkeypatch):
    monkeypatch.setattr(records.sys, "argv", ["/venv/bin/pytest", "benchmarks", "-k", "a b"])
    assert records.command_line() == "pytest benchmarks -k 'a b'"
    monkeypatch.setattr(records.sys, "argv", ["/repo/benchmarks/gpu_check.py", "--tiny"])
    monkeypatch.setattr(records.sys, "orig_argv", ["/usr/bin/python3", "-m", "benchmarks.gpu_check", "--tiny"])
    assert records.command_line() == "python -m benchmarks.gpu_check --tiny"
    # a console script by its name, not the interpreter and the script's path in the venv
    monkeypatch.setattr(records.sys, "argv", ["/venv/bin/pnmix-long-output", "--tokens", "2048"])
    monkeypatch.setattr(
        records.sys, "orig_argv", ["/venv/bin/python3", "/venv/bin/pnmix-long-output", "--tokens", "2048"]
    )
    assert records.command_line() == "pnmix-long-output --tokens 2048"


def test_atomic_writes_get_the_modes_the_umask_gives(tmp_path):
    import os

    old = os.umask(0o027)
    try:
        path = records.write_bytes_atomic(tmp_path / "r.json", b"{}")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640


# -- the code a result measured ---------------------------------------------------------------


def test_a_fingerprint_names_every_file_of_its_targets_by_content(tmp_path, monkeypatch):
    pkg = tmp_path / "plugpkg"
    (pkg / "tests").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cache.py").write_text("X = 1\n")
    (pkg / "tests" / "test_cache.py").write_text("")  # tests are not the measured code
    monkeypatch.syspath_prepend(str(tmp_path))
    code = records.code_fingerprint("plugpkg")
    assert sorted(code["files"]) == ["site:plugpkg/__init__.py", "site:plugpkg/cache.py"]
    assert records.code_path("site:plugpkg/cache.py") == pkg / "cache.py"
    before = code["digest"]
    (pkg / "cache.py").write_text("X = 2\n")
    after = records.code_fingerprint("plugpkg")
    assert (
        after["digest"] != before
        and after["files"]["site:plugpkg/__init__.py"] == code["files"]["site:plugpkg/__init__.py"]
    )


def test_a_fingerprint_refuses_a_target_that_is_not_there():
    with pytest.raises(ValueError, match="'no_such_package_xyz' is neither"):
        records.code_fingerprint("no_such_package_xyz")


def test_files_of_this_checkout_are_named_relative_to_it():
    code = records.code_fingerprint("reference.equations.quant")
    assert list(code["files"]) == ["reference/equations/quant.py"]
    assert records.code_path("reference/equations/quant.py") == records.ROOT / "reference" / "equations" / "quant.py"
    assert code["commit"] is None or len(code["commit"]) == 40


@pytest.mark.parametrize(
    ("module", "targets"),
    [
        ("pnmix.protocol", ("pnmix", "reference")),
        ("reference.contract.implementation", ("reference",)),
        ("conformance.impls.template", ("conformance.impls.template", "reference")),
        ("tabulate", ("tabulate",)),
    ],
)
def test_an_implementation_is_its_package_and_the_spec_it_builds_on(module, targets):
    assert records.implementation_targets(module) == targets


def test_a_record_carries_the_modules_the_process_loaded():
    import reference.equations.quant  # noqa: F401  (loaded: part of what a result computed with)

    code = records.record("fidelity", "cpu")["code"]
    assert "reference/equations/quant.py" in code["files"]
    assert "reference/records.py" not in code["files"]  # bookkeeping: it measures nothing
    assert "reference/records.py" not in records.code_fingerprint("reference")["files"]
    assert not any("/tests/" in f for f in code["files"])
    assert records.record("fidelity", "cpu", code={"files": {"x": "y"}})["code"] == {"files": {"x": "y"}}


@pytest.mark.parametrize(
    "value, cuda, says",
    [
        (None, False, "unset: Triton kernels run on the interpreter"),
        (None, True, "unset: compiled"),
        ("1", False, "1: Triton kernels run on the interpreter"),
        ("0", True, "0: compiled"),
    ],
)
def test_the_machine_record_says_whether_triton_kernels_ran_on_the_interpreter(monkeypatch, value, cuda, says):
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    monkeypatch.setattr(records.torch.cuda, "is_available", lambda: cuda)
    assert records.triton_mode().startswith(says)


@pytest.mark.parametrize("name", methods.NAMES)
def test_a_configuration_recorded_as_data_reads_back_equal(name):
    config = methods.config(name)
    record = records.config_record(config)
    assert json.loads(json.dumps(record)) == record  # plain JSON: no repr to parse back
    assert records.config_from_record(record) == config
    other = dataclasses.replace(config, scale_dtype=torch.bfloat16)
    assert records.config_from_record(records.config_record(other)) == other


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"family": "OtherConfig"}, "family"),
        ({"future_field": 1}, "future_field"),
        ({"scale_dtype": "float99"}, "scale_dtype"),
        ({"b_high": 99}, "refused by PNMixConfig"),
    ],
)
def test_a_configuration_record_this_tree_cannot_build_is_refused_by_name(change, named):
    record = {**records.config_record(methods.config("PN-Mix")), **change}
    with pytest.raises(ValueError, match=named):
        records.config_from_record(record)
