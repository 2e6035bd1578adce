"""The node check's tool parsers on real outputs posted in public issues (tests/data/node_check/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.node_check.tools import parse_dcgmi_diag, parse_ibstat, parse_nccl_all_reduce

DATA = Path(__file__).resolve().parents[2] / "data" / "node_check"


def _read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    "name", ["dcgmi_diag_r3_pass_dcgm3.txt", "dcgmi_diag_r2_dcgm331.txt", "dcgmi_diag_dcgm423.txt"]
)
def test_dcgmi_diag_tables_that_pass(name: str) -> None:
    result = parse_dcgmi_diag(_read(name))
    assert result.ok, result
    assert "pass" in result.detail


def test_dcgmi_diag_counts_per_gpu_rows_of_dcgm4() -> None:
    assert parse_dcgmi_diag(_read("dcgmi_diag_dcgm423.txt")).detail.startswith(
        "6 result(s)"
    )  # software, 4 GPUs, memory


def test_dcgmi_diag_fail_row_fails_and_names_the_gpu() -> None:
    # The DCGM 4.2.3 table with one GPU row changed to Fail (no failing table was posted as text: README).
    text = _read("dcgmi_diag_dcgm423.txt").replace("| GPU2: Pass  ", "| GPU2: Fail  ")
    result = parse_dcgmi_diag(text)
    assert not result.ok and "software GPU2" in result.detail, result


def test_dcgmi_that_did_not_run_fails() -> None:
    result = parse_dcgmi_diag("Error: unable to establish a connection to the specified host: localhost\n")
    assert not result.ok and "did not run" in result.detail


def test_nccl_all_reduce_ok_summary() -> None:
    result = parse_nccl_all_reduce(_read("nccl_all_reduce_ok.txt"))
    assert result.ok and "84.8558" in result.detail and "6 sizes" in result.detail, result


def test_nccl_all_reduce_bandwidth_floor() -> None:
    assert not parse_nccl_all_reduce(_read("nccl_all_reduce_ok.txt"), min_busbw_gbps=90).ok


def test_nccl_all_reduce_out_of_bounds_failed() -> None:
    # The summary line posted in https://github.com/NVIDIA/nccl-tests/issues/7 after the real rows above.
    text = _read("nccl_all_reduce_ok.txt").replace(
        "# Out of bounds values : 0 OK", "# Out of bounds values : 248 FAILED"
    )
    result = parse_nccl_all_reduce(text)
    assert not result.ok and "248 out of bounds" in result.detail


@pytest.mark.parametrize("name", ["nccl_all_reduce_header.txt", "nccl_all_reduce_wrong.txt"])
def test_nccl_all_reduce_without_summary_did_not_finish(name: str) -> None:
    result = parse_nccl_all_reduce(_read(name))
    assert not result.ok and "did not finish" in result.detail


def test_nccl_wrong_column_counts() -> None:
    text = _read("nccl_all_reduce_ok.txt").replace("95.75      0   2556.2", "95.75      3   2556.2")
    result = parse_nccl_all_reduce(text)
    assert not result.ok and "#wrong 3" in result.detail


def test_ibstat_down_port_without_ethernet_link_layer_fails() -> None:
    result = parse_ibstat(_read("ibstat_active_and_down.txt"))
    assert not result.ok and "mlx5_10 port 1 Down/Disabled" in result.detail, result
    assert "mlx5_0" not in result.detail


def test_ibstat_active_ports_pass() -> None:
    text = _read("ibstat_active_and_down.txt").split("CA 'mlx5_10'")[0]
    assert parse_ibstat(text).ok


def test_ibstat_tab_indented_and_ibpanic() -> None:
    result = parse_ibstat(_read("ibstat_infiniband_ibpanic.txt"))
    assert not result.ok and "mlx5_8" in result.detail
    ok = parse_ibstat(_read("ibstat_infiniband_ibpanic.txt").split("ibpanic")[0])
    assert ok.ok and ok.detail == "1 port(s) active"


def test_ibstat_no_ports() -> None:
    assert not parse_ibstat("").ok
