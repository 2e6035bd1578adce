"""The /proc reader on a fake tree: stat parsing, environments, races, rights."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from activities.procs.activities import ProcsActivities
from activities.procs.proc import (
    boot_time,
    bounded_cmdline,
    is_alive,
    parse_cmdline,
    parse_environ,
    parse_stat,
    scan_job_processes,
)
from tests.unit.procs.fakeproc import BTIME, CLK_TCK, PAGE_SIZE, FakeProc, slurm_env, stat_line
from workflows.domain.procs import MAX_CMDLINE_CHARS, state_meaning

JOB = 777


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def test_parse_stat_reads_the_fields_in_kernel_units() -> None:
    s = parse_stat(stat_line(42, "python3", "D", ppid=7, utime=250, stime=50, threads=12, start=9000, rss=300))
    assert (s.pid, s.comm, s.state, s.ppid) == (42, "python3", "D", 7)
    assert (s.utime_ticks, s.stime_ticks, s.threads, s.start_ticks, s.rss_pages) == (250, 50, 12, 9000, 300)


@pytest.mark.parametrize("comm", ["my prog", "a) b (c", "x)", "((", ") S 1 2 3", ""])
def test_parse_stat_comm_with_spaces_and_parentheses(comm: str) -> None:
    s = parse_stat(stat_line(5, comm, "R", ppid=3, threads=4))
    assert (s.comm, s.state, s.ppid, s.threads) == (comm, "R", 3, 4)


def test_parse_stat_real_line() -> None:
    # Copied from this machine's /proc/<pid>/stat for a sleeping python.
    line = (
        "4986 (python) S 4984 4984 517 0 -1 4194304 1419 0 0 0 0 0 0 0 20 0 2 0 1089223 89960448 2740 "
        "18446744073709551615 94656527142912 94656527143253 140726228872592 0 0 0 0 16781318 0 0 0 0 17 0 0 0 0 0 "
        "0 94656527154608 94656527155224 94657032757248 140726228880040 140726228880084 140726228880084 "
        "140726228881372 0\n"
    )
    s = parse_stat(line)
    assert (s.pid, s.comm, s.state, s.ppid, s.threads, s.start_ticks, s.rss_pages) == (
        4986,
        "python",
        "S",
        4984,
        2,
        1089223,
        2740,
    )


@pytest.mark.parametrize(
    "line",
    [
        "",
        "garbage",
        "12 python S 1 2 3",  # no parentheses
        "12 (python S 1 2 3",  # no closing parenthesis
        "12 (python) S 1 2 3",  # truncated
        "x12 (python) " + " ".join(["0"] * 50),  # pid not a number
        stat_line(12, "python").replace(" 1 ", " one ", 1),  # ppid not a number
    ],
)
def test_parse_stat_rejects_malformed_lines(line: str) -> None:
    with pytest.raises(ValueError):
        parse_stat(line)


def test_parse_environ_and_cmdline() -> None:
    assert parse_environ(b"A=1\0B=x=y\0NOEQ\0=v\0C=\0") == {"A": "1", "B": "x=y", "C": ""}
    assert parse_environ(b"") == {}
    assert parse_environ(b"K=\xff\0") == {"K": "\ufffd"}
    assert parse_cmdline(b"python\0-m\0x y\0") == ("python", "-m", "x y")
    assert parse_cmdline(b"") == ()


def test_bounded_cmdline_never_exceeds_the_model_limit() -> None:
    long = ("python", "x" * 5000)
    text = bounded_cmdline(long)
    assert len(text) == MAX_CMDLINE_CHARS and text.endswith(" ...")
    assert bounded_cmdline(("a", "b")) == "a b"


def test_state_meanings() -> None:
    assert state_meaning("D").startswith("uninterruptible")
    assert state_meaning("T") == "stopped by a signal"
    assert state_meaning("Q") == "unknown state 'Q'"


def test_scan_finds_the_job_and_ignores_others(fake: FakeProc) -> None:
    fake.add(100, env=slurm_env(JOB, 0), state="S")
    fake.add(101, env=slurm_env(JOB, 1), state="R")
    fake.add(200, env=slurm_env(JOB + 1, 0))  # another job
    fake.add(300, env={"PATH": "/bin"})  # not a job process
    fake.add(2, env=None, comm="kthreadd", exe=None)  # kernel thread: empty environ
    fake.add(102, env={"SLURM_JOB_ID": str(JOB)})  # in the job, but no rank (srun's helper, e.g.)
    scan = scan_job_processes(JOB, fake.root)
    assert [(p.pid, p.rank, p.rank_source, p.stat.state) for p in scan.processes] == [
        (100, 0, "SLURM_PROCID", "S"),
        (101, 1, "SLURM_PROCID", "R"),
    ]
    assert scan.unreadable == 0 and scan.notes == []


def test_rank_wins_over_slurm_procid_and_local_rank_over_localid(fake: FakeProc) -> None:
    fake.add(100, env=slurm_env(JOB, 1, 0, RANK="9", LOCAL_RANK="3"))
    fake.add(101, env=slurm_env(JOB, 1, 0, RANK="oops"))
    fake.add(102, env={"SLURM_JOBID": str(JOB), "SLURM_STEPID": "4", "RANK": "5"})  # older variable names
    scan = scan_job_processes(JOB, fake.root)
    got = [(p.pid, p.rank, p.rank_source, p.local_rank, p.step_id) for p in scan.processes]
    assert got == [(100, 9, "RANK", 3, "0"), (101, 1, "SLURM_PROCID", 0, "0"), (102, 5, "RANK", None, "4")]
    assert scan.notes == ["pid 101: RANK='oops' is not a number; ignored"]


def test_malformed_stat_is_noted_not_raised(fake: FakeProc) -> None:
    fake.add(100, env=slurm_env(JOB, 0), stat="100 (python S 1\n")
    fake.add(101, env=slurm_env(JOB, 1))
    scan = scan_job_processes(JOB, fake.root)
    assert [p.pid for p in scan.processes] == [101]
    assert len(scan.notes) == 1 and scan.notes[0].startswith("pid 100: malformed stat")


def test_vanished_pids_are_skipped(fake: FakeProc) -> None:
    gone_before_stat = fake.add(100, env=slurm_env(JOB, 0))
    (gone_before_stat / "stat").unlink()  # exited between the environ and the stat read
    fake.add(101, env=slurm_env(JOB, 1))
    (fake.root / "102").mkdir()  # exited while the directory was listed: nothing left inside
    scan = scan_job_processes(JOB, fake.root)
    assert [p.pid for p in scan.processes] == [101]
    assert scan.notes == [] and scan.unreadable == 0


def test_unreadable_environ_is_counted(fake: FakeProc, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add(100, env=slurm_env(JOB, 0))
    fake.add(101, env=slurm_env(JOB, 1))
    fake.add(102, env=slurm_env(JOB, 2))
    # Root ignores file modes, so the kernel's EACCES on another user's environ is simulated at the read.
    real_read = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "environ" and self.parent.name in ("101", "102"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    scan = scan_job_processes(JOB, fake.root)
    assert [p.pid for p in scan.processes] == [100]
    assert scan.unreadable == 2


def test_unreadable_optional_files_leave_fields_empty(fake: FakeProc) -> None:
    d = fake.add(100, env=slurm_env(JOB, 0), exe=None, wchan="0")
    (d / "cmdline").unlink()
    (p,) = scan_job_processes(JOB, fake.root).processes
    assert (p.exe, p.wchan, p.argv) == ("", "", ())


def test_excluded_pids_are_never_reported(fake: FakeProc) -> None:
    fake.add(100, env=slurm_env(JOB, 0))
    assert scan_job_processes(JOB, fake.root, exclude=frozenset({100})).processes == []


def test_missing_proc_root_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        scan_job_processes(JOB, tmp_path / "nope")


def test_boot_time_and_liveness(fake: FakeProc, tmp_path: Path) -> None:
    assert boot_time(fake.root) == BTIME
    assert boot_time(tmp_path) is None
    fake.add(100, env=slurm_env(JOB, 0))
    fake.add(101, env=slurm_env(JOB, 1), state="Z")
    assert is_alive(100, fake.root) and not is_alive(101, fake.root) and not is_alive(102, fake.root)
    shutil.rmtree(fake.root / "100")
    assert not is_alive(100, fake.root)


def test_python_detection(fake: FakeProc) -> None:
    fake.add(100, env=slurm_env(JOB, 0), comm="pt_main_thread", exe=None, argv=("./launch",))
    fake.add(101, env=slurm_env(JOB, 1), comm="train", exe="/opt/conda/bin/python3.11")
    fake.add(102, env=slurm_env(JOB, 2), comm="bash", exe="/usr/bin/bash", argv=("bash", "-c", "x"))
    fake.add(103, env=slurm_env(JOB, 3), comm="torchrun", exe=None, argv=("/venv/bin/python3", "-m", "x"))
    flags = [p.is_python for p in scan_job_processes(JOB, fake.root).processes]
    assert flags == [True, True, False, True]


async def test_listing_converts_kernel_units(fake: FakeProc) -> None:
    fake.add(
        100,
        env=slurm_env(JOB, 3, 1, step="2"),
        argv=("python", "train.py", "--lr", "0.1"),
        state="D",
        ppid=50,
        utime=250,
        stime=50,
        threads=7,
        start=12_345,
        rss=1000,
        wchan="io_schedule",
    )
    acts = ProcsActivities("n9", proc_root=fake.root, clock_ticks_per_s=CLK_TCK, page_size=PAGE_SIZE)
    result = acts._list(JOB)
    (p,) = result.processes
    assert (p.pid, p.rank, p.local_rank, p.step_id, p.job_id, p.node, p.ppid) == (100, 3, 1, "2", JOB, "n9", 50)
    assert (p.state, p.state_meaning, p.wchan) == ("D", state_meaning("D"), "io_schedule")
    assert p.cpu_time_s == pytest.approx(3.0)
    assert (p.threads, p.rss_bytes) == (7, 1000 * PAGE_SIZE)
    assert p.started_at == datetime.fromtimestamp(BTIME + 123.45, tz=UTC)
    assert p.cmdline == "python train.py --lr 0.1"
    assert result.error == "" and result.node == "n9"


def test_listing_an_unreadable_root_is_an_error_not_a_raise(tmp_path: Path) -> None:
    result = ProcsActivities("n1", proc_root=tmp_path / "nope")._list(JOB)
    assert result.processes == () and result.error.startswith(f"cannot list {tmp_path / 'nope'}")


def test_another_nodes_or_clusters_job_with_the_same_id_is_not_ours(fake: FakeProc) -> None:
    # Two labs on one host: both have a node n2 and a job with this id.
    fake.add(100, env=slurm_env(JOB, 0, SLURMD_NODENAME="n2", SLURM_CLUSTER_NAME="lab"))
    fake.add(101, env=slurm_env(JOB, 1, SLURMD_NODENAME="n2", SLURM_CLUSTER_NAME="labtest"))
    fake.add(102, env=slurm_env(JOB, 2, SLURMD_NODENAME="n3", SLURM_CLUSTER_NAME="lab"))
    fake.add(103, env=slurm_env(JOB, 3))  # no such variables: kept (older Slurm, a torchrun child)
    got = [p.pid for p in scan_job_processes(JOB, fake.root, node="n2", cluster="lab").processes]
    assert got == [100, 103]
    assert [p.pid for p in scan_job_processes(JOB, fake.root, node="n2").processes] == [100, 101, 103]
    assert len(scan_job_processes(JOB, fake.root).processes) == 4
