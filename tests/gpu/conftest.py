"""GPU test fixtures: the fake NVML compiled from C against NVIDIA's real nvml.h, and one state file per test.

pynvml loads ``libnvidia-ml.so.1`` once per process and never unloads it. Loading the fake by absolute path
with RTLD_GLOBAL before the first ``nvmlInit()`` makes pynvml's ``CDLL("libnvidia-ml.so.1")`` resolve to it
by soname; anything that needs a different library (old driver, none at all) runs in a subprocess.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from activities.gpu.nvml import NvmlSource
from deploy.local.fake_nvml import build_fake_nvml
from deploy.local.fake_nvml_state import write_initial_state
from tests.gpu.exporter import Exporter, running_exporter

HOST = "n1"
GPU_COUNT = 4
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the fake (about 0.3 s) and load it process-wide before any test can call nvmlInit."""
    lib = build_fake_nvml(tmp_path_factory.mktemp("fake_nvml"))
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return lib


@pytest.fixture(scope="session")
def old_driver_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The variant without ClocksEventReasons/TemperatureV, in its own directory (for LD_LIBRARY_PATH)."""
    return build_fake_nvml(tmp_path_factory.mktemp("fake_nvml_old"), old_driver=True)


@dataclass(frozen=True)
class FakeNvml:
    """One test's fake node: its state file (re-read by the fake on every call) and its call trace."""

    state: Path
    trace: Path
    host: str = HOST

    def append(self, *lines: str) -> None:
        """Append directives in ONE write, so the fake sees all of them or none (O_APPEND, short write)."""
        with self.state.open("a") as f:
            f.write("".join(line + "\n" for line in lines))

    def reset(self, *lines: str) -> None:
        """Replace the state with a healthy node plus ``lines`` (atomic rename: a new event log)."""
        write_initial_state(self.state, self.host, GPU_COUNT)
        if lines:
            self.append(*lines)

    def calls(self) -> list[str]:
        """Trace lines so far (``function [gpu=N] rc=R``)."""
        return self.trace.read_text().splitlines() if self.trace.exists() else []

    def count(self, prefix: str) -> int:
        """How many trace lines start with ``prefix``."""
        return sum(1 for line in self.calls() if line.startswith(prefix))

    def assert_balanced(self) -> None:
        """Every successful nvmlInit was matched by an nvmlShutdown: sources leave no NVML session behind."""
        assert self.count("nvmlInitWithFlags rc=0") == self.count("nvmlShutdown rc=0")


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """A healthy 4-GPU node ``n1``. monkeypatch.setenv calls putenv, so the C side's getenv sees it."""
    fake = FakeNvml(state=tmp_path / f"{HOST}.state", trace=tmp_path / "nvml.trace")
    write_initial_state(fake.state, HOST, GPU_COUNT)
    monkeypatch.setenv("FAKE_NVML_STATE", str(fake.state))
    monkeypatch.setenv("FAKE_NVML_TRACE", str(fake.trace))
    return fake


@pytest.fixture
def source(fake_nvml: FakeNvml) -> Iterator[NvmlSource]:
    """A closed NvmlSource with a short event poll; closed (and checked for a leaked session) afterwards."""
    src = NvmlSource(HOST, event_poll_ms=20)
    yield src
    src.close()
    fake_nvml.assert_balanced()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    """A stand-in dcgm-exporter on a free 127.0.0.1 port, serving nothing until the test says what."""
    with running_exporter() as running:
        yield running


def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` every 5 ms; fail after ``timeout_s`` (a bound, not a sleep: fast paths return early)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.005)


def run_python(code: str, *, ld_library_path: Path, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter whose loader path is ``ld_library_path`` (read only at exec)."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(ld_library_path), PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=timeout_s,
        check=False,
    )
