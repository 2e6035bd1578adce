"""Crash rules: every rule with verbatim lines, culprit versus victim, and the demo's real fault logs."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from activities.logs import crash
from activities.logs.crash import (
    _LOAD_HINT,
    _LOAD_WORDS,
    CRASH_RULES,
    CrashFinding,
    LineReader,
    _load_hint,
    classify,
    scan,
    to_evidence,
    to_findings,
)
from activities.logs.line import LogLine, rank_token, split_prefix
from activities.logs.signature_types import Role
from activities.logs.tail import LogTail
from workflows.domain.findings import FindingKind
from workflows.domain.incident import EvidenceSource, FailureClass

DATA = Path(__file__).resolve().parents[2] / "data" / "logs"
HW, INFRA, USER, UNKNOWN = FailureClass.HARDWARE, FailureClass.INFRASTRUCTURE, FailureClass.USER, FailureClass.UNKNOWN


def _line(text: str, *, rank: int | None = None, path: str = "/logs/job-5-batch.log") -> LogLine:
    return LogLine(path=path, rank=rank, text=text, offset=0)


def _as_read(text: str) -> LogLine:
    """The line as LogTail would return it from a file without a rank in its name."""
    prefix = split_prefix(text)
    rank = next((r for r in (prefix.label, prefix.torch_rank, rank_token(prefix.body)) if r is not None), None)
    return LogLine(path="/logs/all.log", rank=rank, text=text, offset=0, at=prefix.at)


def _read(*names: str) -> list[LogLine]:
    lines, _ = LogTail([str(DATA / name) for name in names]).read_new({})
    return lines


# (line, rule, fields the finding must have). Verbatim where a real system prints it.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    # srun, in the batch log
    ("srun: error: n1: task 1: Exited with exit code 13", "srun_task_exit", {"rank": 1, "node": "n1", "exit_code": 13}),
    ("srun: error: n2: task 3: Killed", "srun_task_killed", {"rank": 3, "node": "n2", "signal": 9}),
    ("srun: error: n1: task 0: Segmentation fault (core dumped)", "srun_task_segfault", {"rank": 0, "signal": 11}),
    ("srun: error: n1: task 0: Bus error", "srun_task_bus_error", {"rank": 0, "signal": 7}),
    ("srun: error: gpu-a01: task 2: Aborted (core dumped)", "srun_task_signal", {"node": "gpu-a01", "signal": 6}),
    ("srun: error: gpu-a01.cluster: task 5: Out Of Memory", "srun_task_oom", {"rank": 5, "node": "gpu-a01.cluster"}),
    ("srun: error: n2: task 3: Terminated", "srun_task_terminated", {"rank": 3, "signal": 15}),
    ("srun: error: Node failure on n2", "srun_node_failure", {"node": "n2", "rank": None}),
    (
        "srun: error: Task launch for StepId=5.0 failed on node n3: Communication connection failure",
        "srun_launch_failed",
        {"node": "n3"},
    ),
    # slurmstepd: the node in "ON n1" is where the message comes from, not the node that failed
    (
        "slurmstepd: error: *** JOB 5 ON n1 CANCELLED AT 2026-11-30T03:40:01 DUE TO NODE FAILURE, SEE SLURMCTLD LOG"
        " FOR DETAILS ***",
        "stepd_node_failure",
        {"node": None, "at": datetime(2026, 11, 30, 3, 40, 1, tzinfo=UTC)},
    ),
    (
        "slurmstepd-n1: error: *** STEP 5.0 ON n1 CANCELLED AT 2026-11-30T03:40:01 DUE TO NODE FAILURE ***",
        "stepd_node_failure",
        {"node": None},
    ),  # noqa: E501
    ("JobId=5 JobName=train JobState=NODE_FAIL Reason=NodeDown", "node_fail_state", {"node": None}),
    (
        "slurmstepd-n1: error: *** STEP 1.0 ON n1 CANCELLED AT 2026-11-30T03:47:28 DUE TO JOB REQUEUE ***",
        "stepd_requeue",
        {"node": "n1", "message": "JOB REQUEUE", "at": datetime(2026, 11, 30, 3, 47, 28, tzinfo=UTC)},
    ),
    (
        "slurmstepd: error: *** JOB 5 ON n4 CANCELLED AT 2026-11-30T03:47:28 DUE TO PREEMPTION ***",
        "stepd_preempted",
        {},
    ),
    ("slurmstepd-n1: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-30T03:49:43 ***", "stepd_cancelled", {"node": "n1"}),
    (
        "slurmstepd: error: *** JOB 5 ON n1 CANCELLED AT 2026-11-30T03:40:01 DUE TO TIME LIMIT ***",
        "stepd_time_limit",
        {"message": "TIME LIMIT"},
    ),
    # GPU
    (
        "[Mon Nov 30 03:40:01 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        "nvrm_xid",
        {"xid": 79},
    ),
    (
        "NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE)"
        " has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "nvrm_xid",
        {"xid": 48},
    ),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of"
        " 79.15 GiB of which 1.12 GiB is free.",
        "cuda_oom",
        {"exception": "torch.OutOfMemoryError"},
    ),
    ("RuntimeError: CUDA error: out of memory", "cuda_oom", {"exception": "RuntimeError"}),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_device_assert", {}),
    (
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "cuda_illegal_address",
        {"exception": "RuntimeError", "message": "an illegal memory access was encountered"},
    ),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "cuda_ecc", {}),
    ("RuntimeError: CUDA error: unknown error", "cuda_unknown_error", {}),
    ("RuntimeError: CUDA error: operation not supported", "cuda_error", {"message": "operation not supported"}),
    (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970,"
        " unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
        "nccl_unhandled_cuda",
        {"exception": "torch.distributed.DistBackendError"},
    ),
    # a peer died or hung
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
        " [127.0.0.1]:12345",
        "peer_lost",
        {"exception": "RuntimeError"},
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error [10.0.0.2]:47530:"
        " Connection reset by peer",
        "peer_lost",
        {},
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms"
        " for recv operation to complete",
        "gloo_timeout",
        {},
    ),
    (
        "[rank1]:[E1130 03:40:01.123456 1234 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:616] [Rank 1]"
        " Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1,"
        " NumelOut=1, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.",
        "nccl_watchdog_timeout",
        {"rank": 1},
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1275, remote process exited or there was a network error, NCCL version 2.18.1",
        "nccl_remote_error",
        {},
    ),
    (
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        "nccl_remote_error",
        {},
    ),
    (
        "gpu-a01:1234:5678 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<59732> with error 12, opcode"
        " 32767, len 0, vendor err 129 (Recv)",
        "ib_completion_error",
        {},
    ),
    (
        "torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms while trying to"
        " connect to (10.0.0.1, 29500).",
        "c10d_error",
        {"exception": "torch.distributed.DistNetworkError"},
    ),
    (
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
        "c10d_error",
        {},
    ),
    (
        "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error",
        "gloo_error",
        {},
    ),
    ("RuntimeError: ProcessGroupGloo::allreduce: operation timed out", "gloo_timeout", {}),
    # death by signal
    ("Fatal Python error: Segmentation fault", "segfault", {"signal": 11}),
    ("  traceback : Signal 11 (SIGSEGV) received by PID 4321", "segfault", {"signal": 11}),
    (
        "/var/spool/slurmd/job00005/slurm_script: line 12:  4321 Segmentation fault      (core dumped) python x.py",
        "segfault",
        {},
    ),
    ("Fatal Python error: Bus error", "bus_error", {"signal": 7}),
    ("Fatal Python error: Aborted", "abort", {"signal": 6}),
    (
        "slurmstepd: error: Detected 1 oom_kill event in StepId=5.0. Some of the step tasks have been OOM Killed.",
        "oom_kill",
        {"signal": 9},
    ),
    ("[123456.789] Out of memory: Killed process 4321 (python) total-vm:1234kB", "oom_kill", {}),
    # torchrun
    (
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -11) local_rank: 1 (pid: 4321) of"
        " binary: /usr/bin/python3",
        "torchrun_failed",
        {"exit_code": -11, "signal": 11, "rank": None},
    ),
    ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "torchrun_child_failed", {}),
    # the program's own error
    (
        "ValueError: shape mismatch: expected inputs of shape [batch, 32] and matching targets, got inputs [32, 31]",
        "python_exception",
        {
            "exception": "ValueError",
            "message": "shape mismatch: expected inputs of shape [batch, 32] and matching targets, got inputs [32, 31]",
        },
    ),
    ("KeyError: 'input_ids'", "python_exception", {"exception": "KeyError", "message": "'input_ids'"}),
    ("AssertionError", "python_exception", {"exception": "AssertionError", "message": ""}),
    ("3: ZeroDivisionError: division by zero", "python_exception", {"rank": 3, "exception": "ZeroDivisionError"}),
    ("[rank2]: RuntimeError: Expected all tensors to be on the same device", "user_runtime_error", {"rank": 2}),
    # the demo trainer's own crash line
    (
        "2026-11-30T04:04:27.343Z [ERROR] rank=1/2 node=n2 step=7 fatal error (fault crash-000b0e1c47): exiting"
        " with code 13",
        "exit_code",
        {"rank": 1, "node": "n2", "exit_code": 13, "at": datetime(2026, 11, 30, 4, 4, 27, 343000, UTC)},
    ),
]


@pytest.mark.parametrize(("text", "rule", "fields"), CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_rule(text: str, rule: str, fields: dict[str, Any]) -> None:
    (finding,) = classify(_as_read(text))
    assert finding.rule == rule
    by_name = {r.name: r for r in CRASH_RULES}
    # An informational row has no class; the detector's findings always carry one.
    assert (finding.kind, finding.failure_class, finding.role) == (
        by_name[rule].kind,
        by_name[rule].failure_class or UNKNOWN,
        by_name[rule].role,
    )
    assert finding.culprit is (finding.role is Role.CULPRIT)
    assert finding.text == text.strip()
    for name, value in fields.items():
        assert getattr(finding, name) == value, name


def test_every_rule_is_tested_and_extracts_only_known_fields() -> None:
    # The rows live in the signature library now; its own tests cover each row the detector did not have.
    from tests.unit.logs.test_signatures import SIGNATURE_CASES

    tested = {rule for _, rule, _ in CASES} | {row for _, row, _, _ in SIGNATURE_CASES}
    assert tested == {r.name for r in CRASH_RULES}
    assert len({r.name for r in CRASH_RULES}) == len(CRASH_RULES)
    known = {
        "ranks",
        "rank",
        "host",
        "gpu",
        "peer_rank",
        "exit_code",
        "signal",
        "exception",
        "message",
        "xid",
        "at",
        "checkpoint",
        "checkpoint_file",
    }
    for rule in CRASH_RULES:
        assert set(rule.fields) <= known, rule.name


@pytest.mark.parametrize(
    ("kind", "role"),
    [
        (FindingKind.CUDA_ERROR, Role.CULPRIT),
        (FindingKind.XID, Role.CULPRIT),
        (FindingKind.SEGFAULT, Role.CULPRIT),
        (FindingKind.RANK_EXIT, Role.CULPRIT),
        (FindingKind.COMM_ERROR, Role.VICTIM),
        (FindingKind.NODE_FAILURE, Role.CULPRIT),
        (FindingKind.PYTHON_EXCEPTION, Role.CULPRIT),
        (FindingKind.REQUEUE, Role.INFO),
        (FindingKind.CANCELLED, Role.INFO),
    ],
)
def test_the_table_keeps_the_agreed_role_of_each_kind(kind: FindingKind, role: Role) -> None:
    # torchrun's summary block (ChildFailedError, its Root Cause header, "Signal 9 ... received") only points at a
    # failure reported elsewhere.
    exempt = {"torchrun_child_failed", "elastic_root_cause", "elastic_exitcode", "signal_received"}
    rules = [r for r in CRASH_RULES if r.kind is kind and r.name not in exempt]
    assert rules and all(r.role is role for r in rules)


def test_only_the_programs_own_gpu_errors_are_user_class() -> None:
    """Attribution calls a GPU-kind finding a hardware fault unless its class is user."""
    gpu_kinds = (FindingKind.CUDA_ERROR, FindingKind.XID)
    user = {r.name for r in CRASH_RULES if r.kind in gpu_kinds and r.failure_class is USER}
    assert user == {"cuda_oom", "cuda_device_assert"}
    assert all(r.failure_class is not None for r in CRASH_RULES if r.kind in gpu_kinds)


@pytest.mark.parametrize(
    "text",
    [
        "Traceback (most recent call last):",
        '  File "/work/main/deploy/demo/train.py", line 190, in allreduce_gradients',
        "    raise ValueError(",
        "During handling of the above exception, another exception occurred:",
        "Search for `cudaErrorLaunchFailure' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"
        " for more information.",
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might"
        " be incorrect.",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.",
        "srun: forcing job termination",
        "srun: launch/slurm: _step_signal: Terminating StepId=1.0",
        "[W ProcessGroupGloo.cpp:721] Warning: Unable to resolve hostname to a (local) address. Using the loopback"
        " address as fallback.",
        "2026-11-30T03:47:27.001Z [INFO] rank=0/4 node=n1 step=1 loss=0.5890 step_time=0.120s",
        "2026-11-30T03:47:28.006Z [INFO] rank=0/4 node=n1 saved checkpoint step_000010 (step 10, 20557 bytes)",
        "2026-11-30T03:47:20.243Z [INFO] batch job_id=1 restart=0 nodes=n[1-2] ntasks=4 batch_host=n1 gpus=0,1",
        "process exited with code 0",
        "",
    ],
)
def test_ordinary_lines_are_not_crashes(text: str) -> None:
    assert classify(_line(text)) == []


def test_case_insensitive_rules_stay_case_insensitive() -> None:
    assert [f.rule for f in classify(_line("kernel: python invoked OOM-KILLER: gfp_mask=0x100cca"))] == ["oom_kill"]
    assert [f.exit_code for f in classify(_line("Worker Exited With Exit Code 3"))] == [3]
    assert classify(_line("SRUN: ERROR: n1: task 1: Killed")) == []  # srun's own lines are exact


def test_a_task_list_yields_one_finding_per_rank() -> None:
    findings = classify(_line("srun: error: n2: tasks 0,2-3: Exited with exit code 1"))
    assert [(f.rank, f.node, f.exit_code) for f in findings] == [(0, "n2", 1), (2, "n2", 1), (3, "n2", 1)]
    (huge,) = classify(_line("srun: error: n2: tasks 0-99999: Terminated"))
    assert huge.rank is None


def test_user_bug_vs_dead_peer_vs_gpu_fault() -> None:
    """The three RuntimeError/ValueError lines a traceback ends with mean three different things."""
    user, peer, gpu = (
        classify(_line(text, rank=1))[0]
        for text in (
            "ValueError: shape mismatch: expected inputs of shape [batch, 32]",
            "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed"
            " by peer [127.0.0.1]:34707. This is typically caused by a remote worker crashing.",
            "RuntimeError: CUDA error: unspecified launch failure",
        )
    )
    assert (user.kind, user.failure_class, user.culprit) == (FindingKind.PYTHON_EXCEPTION, USER, True)
    assert (peer.kind, peer.role, peer.culprit, peer.exception) == (
        FindingKind.COMM_ERROR,
        Role.VICTIM,
        False,
        "RuntimeError",
    )
    assert (gpu.kind, gpu.failure_class, gpu.culprit, gpu.exception) == (
        FindingKind.CUDA_ERROR,
        HW,
        True,
        "RuntimeError",
    )


def _summary(findings: list[CrashFinding]) -> list[tuple[str, int | None, Role]]:
    return [(f.rule, f.rank, f.role) for f in findings]


def test_demo_crash_culprit_and_its_victim() -> None:
    findings = scan(_read("demo-crash-rank-%t.log"))
    assert _summary(findings) == [("peer_lost", 0, Role.VICTIM), ("exit_code", 1, Role.CULPRIT)]
    assert findings[1].exit_code == 13 and findings[1].node == "n2"
    assert findings[0].at is None  # a traceback line has no timestamp of its own


def test_demo_gpu_fault_is_hardware_on_its_rank() -> None:
    (finding,) = scan(_read("demo-gpu-fault-rank-%t.log"))
    assert (finding.rule, finding.rank, finding.failure_class) == ("cuda_launch_failure", 1, HW)
    assert finding.message == "unspecified launch failure"


def test_demo_user_bug_and_segfault() -> None:
    (bug,) = scan(_read("demo-user-bug-rank-%t.log"))
    assert (bug.rule, bug.rank, bug.exception, bug.failure_class) == ("python_exception", 1, "ValueError", USER)
    (segv,) = scan(_read("demo-segv-rank-%t.log"))
    assert (segv.rule, segv.rank, segv.signal) == ("segfault", 1, 11)


def test_lab_requeue_is_information_only() -> None:
    findings = scan(_read("lab-requeue-*.log"))
    assert findings and not any(f.culprit for f in findings)
    assert {f.kind for f in findings} == {FindingKind.REQUEUE, FindingKind.CANCELLED, FindingKind.TERMINATED}
    terminated = [(f.rank, f.node) for f in findings if f.kind is FindingKind.TERMINATED]
    assert terminated[:4] == [(2, "n2"), (3, "n2"), (0, "n1"), (1, "n1")]


def test_text_is_stripped_and_clipped() -> None:
    (finding,) = classify(_line("ValueError: " + "x" * 1000 + " \t "))
    assert len(finding.text) == crash.MAX_TEXT and finding.text.startswith("ValueError: xxx")
    assert finding.text.endswith("…") and len(finding.message) == crash.MAX_TEXT


def test_to_evidence() -> None:
    (finding,) = classify(
        LogLine(
            path="/l/rank-1.log",
            rank=1,
            node="n2",
            text="RuntimeError: CUDA error: x",
            offset=7,
            at=datetime(2026, 11, 30, tzinfo=UTC),
        )
    )
    evidence = to_evidence(finding)
    assert (evidence.source, evidence.text, evidence.node, evidence.rank, evidence.at) == (
        EvidenceSource.LOGS,
        "RuntimeError: CUDA error: x",
        "n2",
        1,
        datetime(2026, 11, 30, tzinfo=UTC),
    )
    assert to_evidence(classify(_line("Fatal Python error: Aborted"))[0]).node == ""


def test_findings_round_trip_through_json() -> None:
    for finding in scan(_read("demo-*.log", "lab-requeue-*.log")):
        assert CrashFinding.model_validate_json(finding.model_dump_json()) == finding


def test_rule_regexes_are_linear_on_long_junk() -> None:
    # A megabyte line of near-misses must not take catastrophic backtracking time.
    junk = "srun: error: n1: tasks 1-2,3" + " Connection " * 5000 + "CUDA " * 5000 + "a.b." * 50000
    assert classify(_line(junk)) == []
    assert all(isinstance(r.pattern, re.Pattern) for r in CRASH_RULES)


def test_public_api() -> None:
    assert sorted(crash.__all__) == list(crash.__all__)
    for name in crash.__all__:
        assert hasattr(crash, name), name


def test_the_reader_keeps_a_tracebacks_context_per_file_and_rank() -> None:
    """One reader for the watch, the attribution activity and ``rebound diagnose``: a destructor's ignored exception
    and a traceback's source lines are not crashes, for any of them."""
    ignored = [
        "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f11c2a3e8b0>",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py", line 1478, in __del__',
        "    self._shutdown_workers()",
        "AttributeError: '_MultiProcessingDataLoaderIter' object has no attribute '_workers_status'",
    ]
    assert scan([_line(text) for text in ignored]) == []
    assert [f.exception for f in scan([_line(text) for text in ignored[1:]])] == ["AttributeError"]
    # Another rank's lines in between keep their own context.
    other = _line("KeyError: 'x'", rank=1)
    found = scan([_line(ignored[0], rank=0), other, *(_line(t, rank=0) for t in ignored[1:])])
    assert [(f.rank, f.exception) for f in found] == [(1, "KeyError")]
    # Read across two batches by one reader, the context carries over.
    reader = LineReader()
    assert reader.scan([_line(t) for t in ignored[:2]]) == [] and reader.scan([_line(t) for t in ignored[2:]]) == []


def test_to_findings_drops_context_and_numbers_in_reading_order() -> None:
    found = scan(
        [
            _line("slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-11-30T03:47:28 DUE TO JOB REQUEUE ***"),
            _line("srun: error: n2: tasks 0-1: Exited with exit code 1"),
        ]
    )
    findings = to_findings(found, start_order=5)
    assert [(f.kind, f.rank, f.node, f.order) for f in findings] == [
        (FindingKind.RANK_EXIT, 0, "n2", 5),
        (FindingKind.RANK_EXIT, 1, "n2", 6),
    ]


def test_findings_keep_the_slurm_task_apart_from_the_rank(tmp_path: Path) -> None:
    log = tmp_path / "slurm-5.out"
    log.write_text(
        "1: [rank2]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "0: Traceback (most recent call last):\n"
        "srun: error: n2: task 1: Exited with exit code 1\n"
    )
    lines, _ = LogTail([str(log)]).read_new({})
    found = [(f.kind, f.rank, f.task, f.rank_is_task) for f in to_findings(scan(lines))]
    assert (FindingKind.CUDA_ERROR, 2, 1, False) in found  # the torch prefix is the rank, the label the task
    assert any(rank == 1 and task == 1 and is_task for _, rank, task, is_task in found)  # srun's task list


def test_load_hint_words_are_the_hint_regex_lower_cased() -> None:
    """The cheap test for load lines agrees with the regex on ASCII lines and leaves other lines to it."""
    assert tuple(w.lower() for w in _LOAD_HINT.pattern.split("|")) == _LOAD_WORDS
    for body in ["Loaded CHECKPOINT x", "resuming Training From out", "LOADING model from a", "step=3", "ſtep", "é"]:
        assert _load_hint(body) == (_LOAD_HINT.search(body) is not None), body
