"""A checkpoint the job cannot read: its own finding kind, the checkpoint it names, and an attribution that blames
neither the code nor a node."""

from __future__ import annotations

import pytest

from activities.logs.crash import scan, to_findings
from activities.logs.line import LogLine, split_prefix
from workflows.domain.findings import Cause, FindingKind
from workflows.domain.incident import FailureClass
from workflows.policy.attribution import AttributionFacts, attribute, deciding_findings


def _lines(*texts: str, path: str = "/logs/slurm-7.out") -> list[LogLine]:
    return [
        LogLine(path=path, rank=split_prefix(t).torch_rank, text=t, offset=i, at=split_prefix(t).at)
        for i, t in enumerate(texts)
    ]


# (log, the checkpoint the finding names)
LOADS: list[tuple[list[str], str | None]] = [
    # Lightning names the file before torch fails on it (torch's message names none).
    (
        [
            "Restoring states from the checkpoint path at /ckpt/run4/last.ckpt",
            "Traceback (most recent call last):",
            '  File "/opt/conda/lib/python3.11/site-packages/torch/serialization.py", line 1072, in load',
            "    with _open_zipfile_reader(opened_file) as opened_zipfile:",
            "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
        ],
        "/ckpt/run4/last.ckpt",
    ),
    # A DCP directory without its .metadata names itself (https://github.com/axolotl-ai-cloud/axolotl/issues/554).
    (
        [
            '  File ".../torch/distributed/checkpoint/filesystem.py", line 511, in read_metadata',
            '    with (self.path / ".metadata").open("rb") as metadata_file:',
            "FileNotFoundError: [Errno 2] No such file or directory: "
            "'completed-model/checkpoint-600/pytorch_model_0/.metadata'",
        ],
        "completed-model/checkpoint-600/pytorch_model_0/.metadata",
    ),
    # HF's get_last_checkpoint picked an unfinished checkpoint-N.
    (["ValueError: Can't find a valid checkpoint at /out/checkpoint-180"], "/out/checkpoint-180"),
    # Megatron names the directory; the failing rank is the one that says so.
    (
        [
            "[rank3]:  loading distributed checkpoint from /ckpt/gpt at iteration 1000",
            "[rank2]:  loading distributed checkpoint from /ckpt/other at iteration 900",
            "[rank3]: EOFError: Ran out of input",
        ],
        "/ckpt/gpt",
    ),
    # Nothing names it.
    (["safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer"], None),
]


@pytest.mark.parametrize(("texts", "checkpoint"), LOADS)
def test_a_failed_load_is_its_own_finding_and_names_the_checkpoint(texts: list[str], checkpoint: str | None) -> None:
    found = [f for f in scan(_lines(*texts)) if f.kind is FindingKind.CHECKPOINT_LOAD]
    assert len(found) == 1
    assert found[0].checkpoint == checkpoint and found[0].culprit
    assert to_findings(found)[0].checkpoint == (checkpoint or "")


def test_a_load_line_of_another_file_names_nothing() -> None:
    lines = _lines("loading checkpoint from /ckpt/a at iteration 10", path="/logs/rank-0.log")
    lines += _lines("EOFError: Ran out of input", path="/logs/rank-1.log")
    (finding,) = scan(lines)
    assert finding.kind is FindingKind.CHECKPOINT_LOAD and finding.checkpoint is None


def test_attribution_blames_the_checkpoint_not_the_code_or_a_node() -> None:
    log = [
        "Restoring states from the checkpoint path at /ckpt/run4/last.ckpt",
        "[rank1]: RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
        "srun: error: n2: task 1: Exited with exit code 1",
        "srun: error: n1: task 0: Exited with exit code 1",
    ]
    findings = to_findings(scan(_lines(*log)))
    facts = AttributionFacts.from_findings(["n1", "n2"], 2, findings)
    verdict = attribute(facts)
    assert verdict.cause == Cause.CHECKPOINT_UNREADABLE
    assert verdict.failure_class is FailureClass.INFRASTRUCTURE  # not the user's bug
    assert verdict.implicated_nodes == ()  # and no node drained for it
    assert not verdict.retryable  # as it stands a restart loads it again; policy may say otherwise
    assert "/ckpt/run4/last.ckpt" in verdict.explanation
    assert [f.kind for f in deciding_findings(facts)] == [FindingKind.CHECKPOINT_LOAD]
    assert verdict.action == "nothing"  # the action ladder: no node to exclude or drain


def test_a_gpu_error_still_comes_first() -> None:
    findings = to_findings(
        scan(_lines("RuntimeError: CUDA error: an illegal memory access was encountered", "EOFError: Ran out of input"))
    )
    verdict = attribute(AttributionFacts.from_findings(["n1"], 1, findings))
    assert verdict.cause == Cause.CUDA_ERROR


def test_a_write_failure_is_not_a_load_failure() -> None:
    (finding,) = scan(_lines("OSError: [Errno 28] No space left on device"))
    assert finding.kind is FindingKind.PYTHON_EXCEPTION and finding.checkpoint is None
