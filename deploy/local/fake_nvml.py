"""Building the fake ``libnvidia-ml.so.1`` (``deploy/local/fake_nvml/fake_nvml.c``) against NVIDIA's real header.

The header ships in the ``nvidia-nvml-dev`` wheel under NVIDIA's proprietary licence, so it is found in the
installed package at build time and never copied into the repo. The lab builds the library once into
``LabLayout.fake_nvml_lib_dir`` and starts each node agent with ``LD_LIBRARY_PATH`` pointing there and
``FAKE_NVML_STATE`` naming that node's state file (see ``deploy/local/fake_nvml_state.py``).

    python -m deploy.local.fake_nvml OUT_DIR [--old-driver]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = [
    "FAKE_NVML_SOURCE",
    "LIBRARY_NAME",
    "FakeNvmlBuildError",
    "build_fake_nvml",
    "fake_gpu_uuid",
    "fake_pci_bus_id",
    "find_nvml_header",
    "main",
]

FAKE_NVML_SOURCE = Path(__file__).resolve().parent / "fake_nvml" / "fake_nvml.c"
LIBRARY_NAME = "libnvidia-ml.so.1"

# The exact flags the fake is verified with: -Werror turns any signature drift from nvml.h into a build error,
# the soname lets pynvml's CDLL("libnvidia-ml.so.1") match an already-loaded copy, --no-undefined catches a
# missing libc/pthread symbol at build time instead of at dlopen.
_CFLAGS = ["-std=c11", "-D_GNU_SOURCE", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror"]
_LDFLAGS = ["-Wl,-soname," + LIBRARY_NAME, "-Wl,--no-undefined"]
_GCC_TIMEOUT_S = 120


class FakeNvmlBuildError(RuntimeError):
    """The fake library could not be built (no header, no compiler, or the compiler rejected the source)."""


def find_nvml_header() -> Path:
    """Locate ``nvml.h`` from the installed ``nvidia-nvml-dev`` wheel.

    Returns:
        The header's path (the newest CUDA flavour when several are installed).

    Raises:
        FakeNvmlBuildError: The wheel is not installed.
    """
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    headers = sorted(h for root in roots for h in Path(root).glob("*/include/nvml.h"))
    if not headers:
        raise FakeNvmlBuildError(
            "nvml.h not found: install NVIDIA's header with `pip install nvidia-nvml-dev` "
            "(a test/dev dependency; the header is proprietary and is never committed)"
        )
    return headers[-1]


def _flags(old_driver: bool) -> list[str]:
    return [*_CFLAGS, *(["-DFAKE_NVML_OLD_DRIVER"] if old_driver else [])]


def _is_fresh(output: Path, stamp: Path, inputs: list[Path], stamp_text: str) -> bool:
    if not output.exists() or not stamp.exists() or stamp.read_text() != stamp_text:
        return False
    built = output.stat().st_mtime_ns
    return all(p.stat().st_mtime_ns <= built for p in inputs)


def build_fake_nvml(out_dir: Path, *, old_driver: bool = False, source: Path = FAKE_NVML_SOURCE) -> Path:
    """Compile the fake NVML into ``out_dir/libnvidia-ml.so.1``, unless it is already up to date.

    A rebuild happens when the source or the header is newer than the library, or when the flags differ from
    the last build (a stamp file next to the library records them, so switching ``old_driver`` in the same
    directory is noticed). The library is written to a temporary name and renamed into place, so a process
    that already mapped the old copy keeps a consistent file and concurrent builders never see half a library.

    Args:
        out_dir: Directory for the library; created if missing.
        old_driver: Build the variant without ``nvmlDeviceGetCurrentClocksEventReasons`` and
            ``nvmlDeviceGetTemperatureV``, like drivers that predate them.
        source: The C source; tests pass a modified copy to check that ABI drift fails the build.

    Returns:
        The absolute path of the built library.

    Raises:
        FakeNvmlBuildError: No header, no gcc, or gcc failed (its stderr is in the message).
    """
    header = find_nvml_header()
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FakeNvmlBuildError("gcc not found on PATH: install it (e.g. `apt-get install gcc`)")
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / LIBRARY_NAME
    stamp = out_dir / (LIBRARY_NAME + ".build")
    flags = _flags(old_driver)
    stamp_text = " ".join([*flags, str(source.resolve()), str(header)]) + "\n"
    if _is_fresh(output, stamp, [source, header], stamp_text):
        return output
    tmp = out_dir / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
    cmd = [gcc, *flags, f"-I{header.parent}", *_LDFLAGS, "-o", str(tmp), str(source), "-lpthread"]
    try:
        # LC_ALL=C: plain-ASCII diagnostics, the same on every machine (gcc localises its quotes).
        env = dict(os.environ, LC_ALL="C")
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=_GCC_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise FakeNvmlBuildError(
                f"gcc failed building the fake NVML (exit {result.returncode}): {' '.join(cmd)}\n{result.stderr}"
            )
        os.replace(tmp, output)
    except subprocess.TimeoutExpired as exc:
        raise FakeNvmlBuildError(f"gcc ran past {_GCC_TIMEOUT_S}s building the fake NVML") from exc
    finally:
        tmp.unlink(missing_ok=True)
    stamp.write_text(stamp_text)
    return output


def _host_hash(host: str) -> int:
    # Bit for bit the C fake's host_hash() (FNV-1a 64, then fmix64): lets the lab predict UUIDs and bus ids.
    mask = 0xFFFFFFFFFFFFFFFF
    h = 0xCBF29CE484222325
    for byte in host.encode():
        h = ((h ^ byte) * 0x100000001B3) & mask
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & mask
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & mask
    return h ^ (h >> 33)


def fake_gpu_uuid(host: str, index: int) -> str:
    """The UUID the fake reports for GPU ``index`` of a node whose state says ``host NAME``."""
    h = _host_hash(host)
    return f"GPU-{h >> 32:08x}-{(h >> 16) & 0xFFFF:04x}-{h & 0xFFFF:04x}-fa4e-{index:012x}"


def fake_pci_bus_id(host: str, index: int) -> str:
    """The PCI bus id (``nvmlPciInfo_t.busId``) the fake reports for GPU ``index`` of ``host``."""
    domain = (_host_hash(host) >> 24) & 0xFFFF
    bus = (0x18 + 0x0D * index) & 0xFF
    return f"{domain:08X}:{bus:02X}:00.0"


def main(argv: list[str] | None = None) -> int:
    """Build the fake into the directory given on the command line and print the library's path."""
    parser = argparse.ArgumentParser(
        prog="python -m deploy.local.fake_nvml", description="Build the fake libnvidia-ml.so.1."
    )
    parser.add_argument("out_dir", type=Path, help="directory to write libnvidia-ml.so.1 into")
    parser.add_argument("--old-driver", action="store_true", help="omit ClocksEventReasons and TemperatureV")
    args = parser.parse_args(argv)
    try:
        path = build_fake_nvml(args.out_dir, old_driver=args.old_driver)
    except FakeNvmlBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
