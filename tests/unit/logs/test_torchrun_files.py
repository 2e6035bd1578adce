"""torchrun's per-worker files (``--log-dir`` with ``--redirects``/``--tee``): a file names a local rank, never the
job's rank; only the newest ``attempt_<n>`` of a run directory counts (``activities.logs.patterns``)."""

from __future__ import annotations

from pathlib import Path

from activities.logs.patterns import FileIdentity, LogPattern, superseded, torchrun_local_rank
from activities.logs.tail import LogTail


def _torchrun_dirs(log_dir: Path, attempts: int, local_ranks: int) -> Path:
    """The directories torch's ``DefaultLogsSpecs.reify`` makes (torch 2.13, read from its source and run once):
    ``<log_dir>/<rdzv_run_id>_<mkdtemp suffix>/attempt_<TORCHELASTIC_RESTART_COUNT>/<local_rank>/``; the
    workers' redirected streams then create ``stdout.log``/``stderr.log`` (and ``error.json``) in them."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std

    specs = DefaultLogsSpecs(log_dir=str(log_dir), redirects=Std.ALL, tee=Std.ALL)
    for attempt in range(attempts):
        env = {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": str(attempt)}
        specs.reify({rank: dict(env) for rank in range(local_ranks)})
    (run,) = log_dir.iterdir()
    return run


def _write(path: Path, *lines: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.writelines(line + "\n" for line in lines)


def test_the_layout_torch_makes_names_local_ranks(tmp_path: Path) -> None:
    run = _torchrun_dirs(tmp_path / "n2", attempts=1, local_ranks=2)
    assert run.name.startswith("none_")
    for local in (0, 1):
        _write(run / "attempt_0" / str(local) / "stderr.log", f"[rank{2 + local}]: RuntimeError: boom")
    tail = LogTail([str(tmp_path / "%N" / "*" / "attempt_*" / "%t" / "stderr.log")])
    identities = tail.identities()
    # %t is the local-rank directory here: never taken as the job's rank (it would put ranks 0-1 on every node).
    assert sorted(identities.values()) == [FileIdentity(None, "n2", 0), FileIdentity(None, "n2", 1)]
    lines, _ = tail.read_new({})
    assert sorted((line.rank, line.node) for line in lines) == [(2, "n2"), (3, "n2")]  # from [rankN]: prefixes


def test_a_line_without_a_rank_prefix_keeps_its_rank_unknown(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "none_x1y2z3" / "attempt_0" / "3" / "stderr.log"
    _write(path, "Traceback (most recent call last):", "RuntimeError: CUDA error: an illegal memory access")
    lines, _ = LogTail([str(tmp_path / "logs" / "**" / "*.log")]).read_new({})
    assert [line.rank for line in lines] == [None, None]  # local rank 3 is not rank 3
    assert torchrun_local_rank(str(path)) == 3


def test_the_node_comes_from_a_directory_named_after_one_of_the_jobs_nodes(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "gpu-07" / "none_abc" / "attempt_0" / "1" / "stdout.log"
    _write(path, "step 10 loss 2.0")
    pattern = str(tmp_path / "logs" / "*" / "*" / "attempt_*" / "*" / "stdout.log")
    assert LogTail([pattern], hosts=("gpu-06", "gpu-07")).identities() == {str(path): FileIdentity(None, "gpu-07", 1)}
    assert LogTail([pattern]).identities() == {str(path): FileIdentity(None, None, 1)}  # the job's nodes unknown


def test_only_the_newest_attempt_of_a_run_directory_is_read(tmp_path: Path) -> None:
    run = _torchrun_dirs(tmp_path, attempts=2, local_ranks=1)
    _write(run / "attempt_0" / "0" / "stderr.log", "RuntimeError: the first attempt's crash")
    _write(run / "attempt_1" / "0" / "stderr.log", "step 3 loss 1.0")
    lines, _ = LogTail([str(tmp_path / "**" / "stderr.log")]).read_new({})
    assert [line.text for line in lines] == ["step 3 loss 1.0"]


def test_superseded_files() -> None:
    run = "/logs/none_k3j2/"
    paths = [
        run + "attempt_0/0/stderr.log",
        run + "attempt_2/0/stderr.log",
        run + "attempt_2/filtered_stderr.log",  # a copy of some ranks' output: the per-rank files are read
        run + "attempt_10/0/stdout.log",  # numbers, not names: 10 is newer than 2
        "/logs/none_other/attempt_0/0/stderr.log",  # another run directory: its own newest
        "/logs/none_solo/attempt_0/filtered_stdout.log",  # no per-rank file of its attempt matches: read
        "/logs/attempt_1/train.log",  # not torchrun's
    ]
    assert superseded(paths) == {run + "attempt_0/0/stderr.log", run + "attempt_2/0/stderr.log", paths[2]}


def test_a_rank_named_file_outside_torchruns_layout_keeps_its_rank() -> None:
    assert LogPattern("/logs/job-%t.log").identity("/logs/job-5.log") == FileIdentity(5, None)
    assert LogPattern("/logs/*/%t/stderr.log").identity("/logs/x/5/stderr.log") == FileIdentity(5, None)
