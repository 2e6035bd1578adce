"""The pure stack comparison: signatures, odd ranks, the human summary."""

from __future__ import annotations

import pytest

from workflows.domain.procs import RankStack
from workflows.policy.stacks import describe_stacks, normalise_frame, odd_ranks, rank_ranges, stack_signature

COLLECTIVE = (
    "wait (threading.py:320)",
    "wait (threading.py:622)",
    "all_reduce (torch/distributed/distributed_c10d.py:2501)",
    "train_step (train.py:88)",
    "main (train.py:140)",
    "<module> (train.py:160)",
)
SLEEPER = (
    "load_next_batch (train.py:40)",
    "train_step (train.py:80)",
    "main (train.py:140)",
    "<module> (train.py:160)",
)


def stack(rank: int, frames: tuple[str, ...] = COLLECTIVE, error: str = "") -> RankStack:
    return RankStack(rank=rank, pid=1000 + rank, node="n1", main_frames=frames, error=error)


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("all_reduce (torch/distributed/distributed_c10d.py:2501)", "all_reduce (distributed_c10d.py)"),
        ("f (/nodeA/venv/lib/x.py:12)", "f (x.py)"),
        ("f (x.py)", "f (x.py)"),
        ("  f   (x.py:1)  ", "f (x.py)"),
        ('File "/a/b/x.py", line 12, in step', "step (x.py)"),
        ("0x7f3a2b10c0de (libc.so.6)", "0x? (libc.so.6)"),
        ("<lambda> (<frozen importlib._bootstrap>:241)", "<lambda> (<frozen importlib._bootstrap>)"),
        ("run (Thread-12:3)", "run (Thread-?)"),
        ("handler tid=4711 (h.py:3)", "handler tid=? (h.py)"),
        ("f", "f"),
    ],
)
def test_normalise_frame(raw: str, normal: str) -> None:
    assert normalise_frame(raw) == normal


def test_signature_ignores_lines_addresses_and_directories() -> None:
    a = ("f (/x/a.py:1)", "g 0xdeadbeef (b.so)")
    b = ("f (/y/a.py:99)", "g 0x1234 (b.so)")
    assert stack_signature(a) == stack_signature(b) == "f (a.py) <- g 0x? (b.so)"
    assert stack_signature(("f (a.py:1)",)) != stack_signature(("h (a.py:1)",))
    assert stack_signature(()) == ""


def test_the_sleeper_is_odd_among_ranks_in_the_collective() -> None:
    stacks = [stack(0), stack(1, SLEEPER), stack(2), stack(3)]
    assert odd_ranks(stacks) == [1]


def test_line_numbers_do_not_make_a_rank_odd() -> None:
    shifted = tuple(f.replace(":", ":1") for f in COLLECTIVE)
    assert odd_ranks([stack(0), stack(1, shifted), stack(2)]) == []


def test_no_majority_means_no_odd_rank() -> None:
    assert odd_ranks([stack(0), stack(1, SLEEPER)]) == []  # one against one
    other = ("barrier (c10d.py:1)",)
    assert odd_ranks([stack(0), stack(1), stack(2, SLEEPER), stack(3, other)]) == []  # 2 of 4 is not a majority
    assert odd_ranks([stack(0), stack(1), stack(2), stack(3, SLEEPER), stack(4, other)]) == [3, 4]


def test_all_agree_or_too_few_means_none() -> None:
    assert odd_ranks([stack(i) for i in range(8)]) == []
    assert odd_ranks([stack(0)]) == []
    assert odd_ranks([]) == []


def test_ranks_without_a_stack_are_neither_counted_nor_odd() -> None:
    failed = stack(5, (), error="process 1005 exited before its stack was read")
    assert odd_ranks([stack(0), stack(1, SLEEPER), stack(2), failed]) == [1]
    # Failures do not create a majority: two ranks that disagree stay undecided.
    assert odd_ranks([stack(0), stack(1, SLEEPER), failed, stack(6, (), error="x")]) == []


def test_a_repeated_rank_counts_once() -> None:
    assert odd_ranks([stack(0, SLEEPER), stack(0, SLEEPER), stack(0, SLEEPER), stack(1), stack(2)]) == [0]


def test_rank_ranges() -> None:
    assert rank_ranges([8, 0, 1, 2, 5, 7, 2]) == "0-2,5,7-8"
    assert rank_ranges([]) == ""


def test_describe_groups_marks_the_odd_and_lists_failures() -> None:
    stacks = [stack(r) for r in (0, 2, 3)] + [stack(1, SLEEPER), stack(4, (), error="permission denied")]
    assert describe_stacks(stacks).splitlines() == [
        "4 ranks with stacks, 2 shapes; odd: rank 1",
        "ranks 0,2-3: wait (threading.py) <- wait (threading.py) <- all_reduce (distributed_c10d.py) <- ...",
        "rank 1 [odd]: load_next_batch (train.py) <- train_step (train.py) <- main (train.py) <- ...",
        "rank 4: no stack (permission denied)",
    ]


def test_describe_marks_odd_ranks_inside_a_group_with_the_same_top_frames() -> None:
    from_eval = (*COLLECTIVE[:3], "evaluate (train.py:99)", *COLLECTIVE[4:])
    text = describe_stacks([stack(0), stack(1), stack(2, from_eval)], top=2)
    assert text.splitlines()[1] == "ranks 0-2 [odd: 2]: wait (threading.py) <- wait (threading.py) <- ..."


def test_describe_without_majority_and_when_bounded() -> None:
    assert describe_stacks([stack(0), stack(1, SLEEPER)]).splitlines()[0] == (
        "2 ranks with stacks, 2 shapes; no majority shape"
    )
    many = [stack(i, (f"f{i} (x.py:1)",)) for i in range(20)] + [stack(100 + i, (), error="e") for i in range(9)]
    lines = describe_stacks(many).splitlines()
    assert "... 12 more groups" in lines and "... 4 more ranks without a stack" in lines
    assert len(lines) < 20
