"""Root-cause diagnosis over whole logs: selection rules, multi-line context, bounds, and the CLI's contract."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from activities.logs.diagnose import MAX_EVIDENCE, Diagnoser, diagnose_text
from activities.logs.diagnosis import Diagnosis, normalize_gpu
from activities.logs.signature_types import Category, Role
from activities.logs.streams import file_rank, read_lines
from workers import cli
from workflows.domain.incident import FailureClass

C = Category
REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "logs"


def _watchdog(rank: int) -> str:
    return (
        f"[rank{rank}]:[E1201 09:12:44.101 2201 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective"
        " operation timeout: WorkNCCL(SeqNum=4411, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran"
        " for 600311 milliseconds before timing out."
    )


# ----- root-cause selection -------------------------------------------------------------------------------------


def test_one_culprit_beats_sixty_three_victims_even_when_it_is_logged_last() -> None:
    lines = [_watchdog(r) for r in range(64) if r != 17]
    lines += [
        "[rank17]: Traceback (most recent call last):",
        '[rank17]:   File "/opt/train.py", line 9, in step',
        "[rank17]: RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    d = diagnose_text("\n".join(lines), path="job.log")
    assert (d.category, d.failure_class, d.restartable) == (C.CUDA_ILLEGAL_ADDRESS, FailureClass.UNKNOWN, True)
    assert d.primary is not None and d.primary.rank == 17 and d.primary.role is Role.CULPRIT
    victims = next(f for f in d.findings if f.category is C.NCCL_TIMEOUT)
    assert victims.lines == 63 and len(victims.ranks) == 63 and victims.role is Role.VICTIM
    assert [f.category for f in d.findings][:2] == [C.CUDA_ILLEGAL_ADDRESS, C.NCCL_TIMEOUT]
    assert str(d.primary.evidence[0]).startswith("job.log:66: [rank17]: RuntimeError: CUDA error")


def test_hardware_evidence_beats_the_cuda_error_it_causes() -> None:
    d = diagnose_text(
        "3: [rank3]: RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
        "Dec 01 11:02:03 gpu-c12 kernel: NVRM: Xid (PCI:0000:4e:00): 48, pid=3301, name=python, An uncorrectable"
        " double bit error (DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 1."
    )
    assert d.category is C.XID and d.primary is not None
    assert (d.primary.xid, d.primary.gpu, d.primary.host) == (48, "0000:4e:00.0", "gpu-c12")
    assert "Double Bit ECC" in d.primary.detail
    assert {f.category for f in d.findings} == {C.XID, C.CUDA_ECC}


def test_xid_79_is_a_gpu_off_the_bus_and_an_informational_xid_is_context() -> None:
    fell = diagnose_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.")
    assert (fell.category, fell.restartable) == (C.GPU_FELL_OFF_BUS, True)
    remap = diagnose_text("NVRM: Xid (PCI:0000:3b:00): 63, pid=1, name=python, Row Remapper: New row marked")
    assert remap.category is C.NONE and remap.primary is None
    assert [f.category for f in remap.findings] == [C.NONE]


def test_the_earliest_culprit_wins_among_equals() -> None:
    d = diagnose_text(
        "[rank4]: ValueError: batch is empty\n[rank1]: KeyError: 'labels'\n[rank4]: KeyError: 'labels'",
    )
    assert d.category is C.USER_EXCEPTION and d.primary is not None
    assert (d.primary.rank, d.primary.exception) == (4, "ValueError")
    assert d.primary.ranks == (1, 4)


def test_a_specific_row_beats_a_catch_all_of_the_same_tier() -> None:
    d = diagnose_text(
        "botocore.exceptions.NoCredentialsError: no credentials\nModuleNotFoundError: No module named 'x'"
    )
    assert d.primary is not None and d.primary.exception == "ModuleNotFoundError" and not d.primary.weak


def test_summaries_count_only_when_nothing_more_specific_is_there() -> None:
    summary = [
        "E1201 10:40:05.000000 1 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1)"
        " local_rank: 0 (pid: 4120) of binary: /usr/bin/python3",
        "srun: error: n7: task 0: Exited with exit code 1",
    ]
    only = diagnose_text("\n".join(summary))
    assert only.category is C.ELASTIC_CHILD_FAILED  # torchrun's summary is closer to the process than srun's
    assert only.primary is not None and only.primary.exit_code == 1
    srun_only = diagnose_text(summary[1])
    assert srun_only.category is C.SLURM_TASK_EXIT and srun_only.primary is not None
    assert (srun_only.primary.rank, srun_only.primary.host, srun_only.primary.exit_code) == (0, "n7", 1)
    real = diagnose_text("FileNotFoundError: [Errno 2] No such file or directory: '/data/train'\n" + "\n".join(summary))
    assert real.category is C.USER_EXCEPTION
    # the summaries say what became of that process: exit 1 on n7
    assert real.primary is not None and (real.primary.exit_code, real.primary.host) == (1, "n7")


def test_nothing_found_is_none() -> None:
    healthy = diagnose_text(
        "gpu-a01:1:1 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.1<0>\n"
        "steps: 100%|██████████| 10/10 [00:10<00:00, 1.00it/s, loss=1.23]\n"
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768"
    )
    assert (healthy.category, healthy.failure_class, healthy.restartable, healthy.findings) == (C.NONE, None, None, ())
    assert not healthy.failed and healthy.lines_read == 3
    empty = diagnose_text("")
    assert empty.category is C.NONE and empty.lines_read == 0


def test_a_cancel_or_requeue_with_terminated_tasks_is_not_a_failure() -> None:
    d = diagnose_text(
        "slurmstepd: error: *** JOB 1201 ON n3 CANCELLED AT 2025-12-02T03:00:00 DUE TO JOB REQUEUE ***\n"
        "srun: error: n3: tasks 0-1: Terminated"
    )
    assert d.category is C.NONE
    assert {f.category for f in d.findings} == {C.NONE, C.SLURM_TASK_EXIT}
    limit = diagnose_text(
        "slurmstepd: error: *** JOB 5 ON gpu-h01 CANCELLED AT 2025-12-02T00:00:01 DUE TO TIME LIMIT ***\n"
        "srun: error: gpu-h01: tasks 0-7: Terminated"
    )
    assert limit.category is C.SLURM_TIME_LIMIT and limit.primary is not None and limit.primary.host == "gpu-h01"


# ----- multi-line context ---------------------------------------------------------------------------------------


def test_a_destructors_ignored_exception_is_not_the_jobs_error() -> None:
    ignored = [
        "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f11c2a3e8b0>",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py", line 1478, in __del__',
        "    self._shutdown_workers()",
        "AttributeError: '_MultiProcessingDataLoaderIter' object has no attribute '_workers_status'",
    ]
    assert diagnose_text("\n".join(ignored + ["epoch 2 loss 1.1"])).category is C.NONE
    # The same exception outside such a block is a bug; a CUDA error inside one is still the device's.
    assert diagnose_text("\n".join(ignored[1:])).category is C.USER_EXCEPTION
    cuda = ignored[:4] + ["RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert diagnose_text("\n".join(cuda)).category is C.CUDA_ILLEGAL_ADDRESS


def test_ignored_exceptions_are_tracked_per_rank_in_interleaved_logs() -> None:
    d = diagnose_text(
        "[rank0]: Exception ignored in: <function Foo.__del__ at 0x1>\n"
        "[rank1]: KeyError: 'x'\n"
        "[rank0]: Traceback (most recent call last):\n"
        "[rank0]: AttributeError: 'Foo' object has no attribute 'y'"
    )
    assert d.primary is not None and (d.category, d.primary.rank, d.primary.lines) == (C.USER_EXCEPTION, 1, 1)


def test_traceback_source_lines_are_code_not_messages() -> None:
    d = diagnose_text(
        "Traceback (most recent call last):\n"
        '  File "/opt/lib/trainer.py", line 40, in step\n'
        "    except torch.cuda.OutOfMemoryError:\n"
        '  File "/opt/lib/trainer.py", line 41, in step\n'
        '    raise ValueError("bad batch")\n'
        "ValueError: bad batch"
    )
    assert [f.category for f in d.findings] == [C.USER_EXCEPTION] and d.findings[0].lines == 1


def test_torchrun_root_cause_block_names_rank_host_and_exit_code() -> None:
    block = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2025-12-01_16:00:05",
        "  host      : gpu-f05.cluster",
        "  rank      : 10 (local_rank: 2)",
        "  exitcode  : -9 (pid: 812)",
        "  error_file: <N/A>",
        "  traceback : Signal 9 (SIGKILL) received by PID 812",
        "============================================================",
    ]
    d = diagnose_text("\n".join(block))
    assert d.category is C.ELASTIC_CHILD_FAILED and d.primary is not None
    assert (d.primary.rank, d.primary.host, d.primary.exit_code, d.primary.signal) == (10, "gpu-f05.cluster", -9, 9)
    segv = [line.replace("-9 (pid", "-11 (pid").replace("Signal 9 (SIGKILL)", "Signal 11 (SIGSEGV)") for line in block]
    s = diagnose_text("\n".join(segv))
    assert s.category is C.SEGFAULT and s.primary is not None and (s.primary.rank, s.primary.signal) == (10, 11)
    # Two agents' summaries: the earliest failure (by its time) is the root cause, whatever the print order.
    earlier = [line.replace("16:00:05", "15:59:00").replace("rank      : 10", "rank      : 3") for line in block]
    two = diagnose_text("\n".join(block + earlier))
    assert two.primary is not None and two.primary.rank == 3


def test_per_rank_files_name_their_rank_node_and_gpu() -> None:
    d = Diagnoser()
    with (DATA / "demo-crash-rank-0.log").open("rb") as f:
        d.feed(str(DATA / "demo-crash-rank-0.log"), read_lines(f))
    with (DATA / "demo-crash-rank-1.log").open("rb") as f:
        d.feed(str(DATA / "demo-crash-rank-1.log"), read_lines(f))
    r = d.result()
    assert len(r.sources) == 2 and r.lines_read > 10
    # rank 0 only lost its gloo peer; rank 1 announced its own exit (13) and nothing more specific
    assert r.category is C.GLOO_ERROR and r.primary is not None and r.primary.rank == 0
    exit_finding = next(f for f in r.findings if f.category is C.SLURM_TASK_EXIT)
    assert (exit_finding.rank, exit_finding.host, exit_finding.exit_code) == (1, "n2", 13)


def test_demo_gpu_fault_and_user_bug_logs() -> None:
    def read(name: str) -> Diagnosis:
        d = Diagnoser()
        with (DATA / name).open("rb") as f:
            d.feed(name, read_lines(f))
        return d.result()

    gpu = read("demo-gpu-fault-rank-1.log")
    assert gpu.category is C.CUDA_LAUNCH_FAILURE and gpu.primary is not None
    assert (gpu.primary.rank, gpu.primary.failure_class) == (1, FailureClass.HARDWARE)
    bug = read("demo-user-bug-rank-1.log")
    assert (bug.category, bug.restartable) == (C.USER_EXCEPTION, False)
    assert read("lab-requeue-batch.log").category is C.NONE


def test_the_root_cause_is_named_among_what_the_live_attribution_rests_on() -> None:
    """``rebound diagnose`` runs the live recovery's attribution on the logs and names its root cause among the
    findings that attribution rests on: a CUDA error beats the code's exception logged before it, as live."""
    d = diagnose_text(
        "[rank1]: FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/step-9'\n"
        "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "srun: error: n2: task 3: Exited with exit code 1"
    )
    assert d.attribution is not None and d.attribution.cause == "cuda-error"
    assert d.attribution.implicated_ranks == (3,)
    # "n2: task 3" names a Slurm task: rank 3 only under srun per rank, which logs alone cannot tell (under
    # torchrun task 3 is the fourth node's launcher). Without the job's rank map, rank 3's node is unknown.
    assert d.attribution.implicated_nodes == () and "rank 3: node unknown" in d.attribution.explanation
    assert d.category is C.CUDA_ILLEGAL_ADDRESS and d.primary is not None and d.primary.rank == 3
    # The demo's crash: rank 1 exited on its own, rank 0 only lost its peer. Live, rank 1's node is blamed; the
    # category stays the more specific report, since an exit says that a process ended, not why.
    demo = Diagnoser()
    for name in ("demo-crash-rank-0.log", "demo-crash-rank-1.log"):
        with (DATA / name).open("rb") as f:
            demo.feed(str(DATA / name), read_lines(f))
    r = demo.result()
    assert r.attribution is not None and (r.attribution.implicated_ranks, r.attribution.implicated_nodes) == (
        (1,),
        ("n2",),
    )
    assert diagnose_text("step 1 loss 2.0").attribution is None


# ----- bounds and reading ---------------------------------------------------------------------------------------


def test_evidence_and_memory_stay_bounded_on_a_long_log() -> None:
    lines = (
        f"[rank{i // 100 % 512}]: KeyError: 'k{i}'" if i % 100 == 0 else f"step {i} loss 1.0" for i in range(200_000)
    )
    d = Diagnoser()
    d.feed("big.log", lines)
    r = d.result()
    # No wall-clock bound here (it failed under a loaded CI machine); speed belongs to the detection benchmark.
    assert r.lines_read == 200_000 and r.primary is not None
    assert r.primary.lines == 2000 and len(r.primary.evidence) == MAX_EVIDENCE and len(r.primary.ranks) == 512


def test_read_lines_splits_endings_and_caps_line_length() -> None:
    data = b"a\r\nb\rc\n\n" + b"x" * 25 + b"\nlast-without-newline\xff"
    assert list(read_lines(io.BytesIO(data), max_line=10)) == [
        "a",
        "b",
        "c",
        "x" * 10,
        "x" * 10,
        "x" * 5,
        "last-witho",
        "ut-newline",
        "\ufffd",
    ]
    assert list(read_lines(io.BytesIO(b"only\r"))) == ["only"]


def test_helpers() -> None:
    assert [normalize_gpu(g) for g in ("3", 3, "0000:3B:00", "00000000:3B:00.0", "PCI:0000:3b:00.0")] == [
        3,
        3,
        "0000:3b:00.0",
        "0000:3b:00.0",
        "0000:3b:00.0",
    ]
    assert [
        file_rank(p) for p in ("/l/job-rank-3.log", "/l/rank_12.out", "/l/local_rank-1.log", "/l/slurm-99.out")
    ] == [
        3,
        12,
        None,
        None,
    ]


def test_a_diagnosis_round_trips_through_json() -> None:
    d = diagnose_text(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n[rank2]: KeyError: 'x'"
    )
    assert Diagnosis.model_validate_json(d.model_dump_json()) == d


# ----- the CLI --------------------------------------------------------------------------------------------------


def test_cli_exit_codes_and_human_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "train-rank-2.log"
    bad.write_text(
        "step 1 loss 2.0\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79 GiB\n"
    )
    good = tmp_path / "ok.log"
    good.write_text("step 1 loss 2.0\nstep 2 loss 1.9\n")
    assert cli.main(["diagnose", str(good)]) == 0
    assert "no failure found (2 lines read)" in capsys.readouterr().out
    assert cli.main(["diagnose", str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert "root cause: cuda_oom  (class user, restart helps: no" in out
    assert "implicated: rank 2, GPU 1" in out and f"{bad}:2: torch.OutOfMemoryError" in out
    # An unreadable file: said on stderr, the others still read, exit 2.
    assert cli.main(["diagnose", str(tmp_path / "missing.log"), str(bad)]) == 2
    captured = capsys.readouterr()
    assert "cannot read" in captured.err and "missing.log" in captured.err
    assert "root cause: cuda_oom" in captured.out
    assert cli.main(["diagnose", str(tmp_path)]) == 2  # a directory is not a log
    capsys.readouterr()


def test_cli_json_and_stdin(tmp_path: Path) -> None:
    log = (
        "slurmstepd: error: Detected 1 oom_kill event in StepId=9.0. Some of the step tasks have been OOM Killed.\n"
        "srun: error: cpu-h11: task 2: Out Of Memory\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "workers.cli", "diagnose", "--json", "-"],
        input=log.encode(),
        capture_output=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    data = json.loads(run.stdout)
    assert (data["category"], data["failure_class"], data["restartable"]) == ("host_oom", "user", False)
    assert (data["primary"]["host"], data["primary"]["rank"], data["unreadable"]) == ("cpu-h11", 2, [])
    assert data["primary"]["evidence"][0] == {
        "path": "-",
        "line": 1,
        "text": log.splitlines()[0],
    }
    usage = subprocess.run(
        [sys.executable, "-m", "workers.cli", "diagnose"], capture_output=True, cwd=REPO, timeout=60, check=False
    )
    assert usage.returncode == 2 and b"PATH" in usage.stderr
