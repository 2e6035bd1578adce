from __future__ import annotations

import time

from activities.logs.crash import classify
from activities.logs.line import LogLine
from activities.logs.terminal import strip_terminal_codes


def test_colour_cursor_and_hyperlink_codes_are_stripped() -> None:
    # loguru's colorized level (issue #26), tqdm's cursor-up between stacked bars, a 256-colour level, an OSC 8
    # hyperlink as rich writes one around a file name (ended by ESC \ or by BEL).
    assert strip_terminal_codes("\x1b[31m\x1b[1mERROR   \x1b[0m | x") == "ERROR    | x"
    assert strip_terminal_codes("\x1b[A 45%|####5     | 45/100") == " 45%|####5     | 45/100"
    assert strip_terminal_codes("\x1b[1;38;5;196mERROR\x1b[0m") == "ERROR"
    assert strip_terminal_codes("\x1b]8;id=1;file:///a/train.py\x1b\\train.py\x1b]8;;\x1b\\:42") == "train.py:42"
    assert strip_terminal_codes("\x1b]8;;file:///a\x07a\x1b]8;;\x07") == "a"
    assert strip_terminal_codes("\x1b(Bplain") == "plain"


def test_a_line_without_codes_is_returned_as_is() -> None:
    text = "RuntimeError: CUDA error: misaligned address [1;31m"  # brackets without ESC are text
    assert strip_terminal_codes(text) is text


def test_long_junk_is_stripped_in_linear_time() -> None:
    for junk in ("\x1b[" + "1;" * 200_000, "\x1b]" + "x" * 400_000, "\x1b" * 400_000, "\x1b[1m" * 100_000):
        started = time.perf_counter()
        strip_terminal_codes(junk)
        assert time.perf_counter() - started < 0.5, junk[:8]


def test_evidence_shows_a_coloured_line_without_its_colours() -> None:
    text = "2: \x1b[1;31mtorch.AcceleratorError: \x1b[0mCUDA error: an illegal memory access was encountered"
    [finding] = classify(LogLine(path="/logs/r.log", rank=None, text=text, offset=0))
    assert finding.rank == 2
    assert finding.text == "2: torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
