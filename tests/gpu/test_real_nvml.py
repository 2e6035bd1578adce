"""The NVML source against a real NVIDIA driver, where one exists; skipped elsewhere.

The rest of ``tests/gpu`` loads the fake NVML into this process, so the real library is read in a fresh interpreter
with the default loader path (no fake on it). What the real driver returns (every GPU's sample, the driver version)
is kept as a fixture in ``tests/data/nvml/real/`` when ``REBOUND_NVML_CAPTURE=1``; every fixture there is then held
against the fake: each field a real GPU answers, the fake answers too, with the same type, so the fake cannot drift
from what real hardware reports without a test failing.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from activities.gpu.nvml import NvmlSource
from tests.gpu.conftest import REPO_ROOT, FakeNvml, run_python
from workflows.domain.gpu import GpuSample

FIXTURES = REPO_ROOT / "tests" / "data" / "nvml" / "real"

_REAL_SCRIPT = """
import ctypes, json
try:
    ctypes.CDLL("libnvidia-ml.so.1")
except OSError as exc:
    print(json.dumps({"skip": f"no NVIDIA driver library: {exc}"}))
    raise SystemExit(0)
import os
mapped = {line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith("libnvidia-ml.so.1")}
if any(os.path.exists(path + ".build") for path in mapped):  # build_fake_nvml's stamp sits beside the fake
    print(json.dumps({"skip": "libnvidia-ml.so.1 resolves to the fake"}))
    raise SystemExit(0)
from activities.gpu.nvml import NvmlSource
from workflows.domain.errors import ReboundError
try:
    with NvmlSource("real") as src:
        samples = src.sample()
        print(json.dumps({
            "driver": src.driver_version(),
            "samples": [s.model_dump(mode="json") for s in samples],
        }))
except ReboundError as exc:
    print(json.dumps({"skip": f"NVML did not open: {exc}"}))
"""


def _real_read(tmp_path: Path) -> dict[str, Any]:
    # The loader path as it is (a container's driver directory may be on it); the fake is only in this process.
    proc = run_python(_REAL_SCRIPT, ld_library_path=Path(os.environ.get("LD_LIBRARY_PATH") or tmp_path))
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


def test_the_nvml_source_reads_a_real_driver(tmp_path: Path) -> None:
    result = _real_read(tmp_path)
    driver: str = result["driver"]
    samples = [GpuSample.model_validate(s) for s in result["samples"]]
    assert samples, "the driver lists no GPU"
    assert [s.index for s in samples] == list(range(len(samples)))
    major = int(driver.split(".")[0])
    for s in samples:
        assert re.fullmatch(r"GPU-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}", s.uuid), s.uuid
        assert s.pci_bus_id and s.name
        assert s.errors == (), f"GPU {s.index}: reads failed other than NOT_SUPPORTED: {s.errors}"
        assert not s.lost
        assert s.temperature_c is not None and 0 < s.temperature_c < 120
        assert s.memory_total_bytes and s.sm_clock_max_mhz and s.clocks_event_reasons is not None
        assert s.ecc_uncorrected_volatile is not None or "ecc_uncorrected_volatile" in s.unsupported
        # The recovery action is a field from R570 on; before it the field answers NOT_SUPPORTED, never "none".
        if major >= 570:
            assert s.recovery_action is not None, s.unsupported
        else:
            assert s.recovery_action is not None or "recovery_action" in s.unsupported
    if os.environ.get("REBOUND_NVML_CAPTURE") == "1":
        FIXTURES.mkdir(parents=True, exist_ok=True)
        product = re.sub(r"[^A-Za-z0-9]+", "-", samples[0].name).strip("-").lower()
        out = FIXTURES / f"{product}-{driver}.json"
        out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


def _fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.json")) if FIXTURES.is_dir() else []


@pytest.mark.parametrize("fixture", _fixtures() or [None], ids=lambda p: p.name if p else "none-captured-yet")
def test_the_fake_answers_every_field_a_real_gpu_answers(
    fixture: Path | None, source: NvmlSource, fake_nvml: FakeNvml
) -> None:
    if fixture is None:
        pytest.skip(f"no real NVML capture in {FIXTURES} (run this file on a GPU with REBOUND_NVML_CAPTURE=1)")
    real = json.loads(fixture.read_text())["samples"][0]
    source.open()
    fake = source.sample()[0].model_dump(mode="json")
    skip = {"host", "index", "uuid", "pci_bus_id", "name", "observed_at", "unsupported", "errors"}
    for field, value in real.items():
        if field in skip or value is None:
            continue
        assert fake[field] is not None, f"a real GPU answers {field}={value!r}; the fake does not"
        assert type(fake[field]) is type(value), f"{field}: real {type(value).__name__}, fake {type(fake[field])}"
