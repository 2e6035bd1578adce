"""The node check's verdict from what its ranks printed (pure; ADR 018).

A check job's ranks each print one ``RankReport`` line. While the job runs, the verdict may come early: one
failed probe fails the node at once (the job is then cancelled: a rank stuck in the all-reduce would otherwise
hold it to the timeout); every rank reporting success passes it. Once the job ended, or Rebound's own timeout
passed, a rank that never reported fails the node: a check that cannot finish is a failed check.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

from workflows.domain.node_check import RANK_REPORT_PREFIX, CheckOutcome, RankReport

__all__ = ["judge_check", "read_reports"]

_MAX_DETAIL = 240


def read_reports(lines: Iterable[str], node: str) -> tuple[RankReport, ...]:
    """The rank reports in the job's output, one per rank (the first wins); lines that are not reports, or
    reports of another node, are ignored (srun's own messages share the file)."""
    found: dict[int, RankReport] = {}
    for line in lines:
        at = line.find(RANK_REPORT_PREFIX)
        if at < 0:
            continue
        try:
            report = RankReport.model_validate_json(line[at + len(RANK_REPORT_PREFIX) :])
        except ValidationError:
            continue
        if report.node in ("", node):
            found.setdefault(report.rank, report)
    return tuple(found[r] for r in sorted(found))


def judge_check(
    reports: tuple[RankReport, ...], ranks: int, job_id: int, *, ended: str = "", timed_out_s: float | None = None
) -> tuple[CheckOutcome, str] | None:
    """The verdict on the check job ``job_id`` of ``ranks`` ranks; None: not decided yet (keep waiting).

    Args:
        reports: What the ranks printed so far.
        ranks: How many ranks the job was given.
        job_id: Named in every detail (the evidence an operator looks up).
        ended: The job's final state when it ended ("" while it runs).
        timed_out_s: Set when Rebound's own timeout passed (the job is cancelled).
    """
    failures = [f"rank {r.rank} {p.name}: {p.detail}" for r in reports for p in r.probes if not p.ok and not p.skipped]
    if failures:
        return CheckOutcome.FAILED, _cut(f"check job {job_id}: {'; '.join(failures)}")
    if len(reports) >= ranks and ranks > 0:
        ran = sorted({f"{p.name} ({p.detail})" for r in reports for p in r.probes if not p.skipped and r.rank == 0})
        skipped = sorted({p.name for r in reports for p in r.probes if p.skipped})
        extra = f"; not on the node: {', '.join(skipped)}" if skipped else ""
        return CheckOutcome.PASSED, _cut(f"check job {job_id} passed: {', '.join(ran)}{extra}")
    missing = ranks - len(reports)
    if timed_out_s is not None:
        return CheckOutcome.FAILED, _cut(
            f"check job {job_id} did not finish within {timed_out_s:g} s ({missing} of {ranks} ranks never "
            "reported): cancelled"
        )
    if ended:
        return CheckOutcome.FAILED, _cut(f"check job {job_id} ended {ended} with {missing} of {ranks} ranks silent")
    return None


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."
