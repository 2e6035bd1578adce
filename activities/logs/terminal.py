"""Terminal escape codes in log lines: the one place that strips them, for the progress and signature rules alike.

A job whose logger thinks it writes to a terminal (``colorize=True`` or ``FORCE_COLOR``, a rich console, a logger
that colours stderr unconditionally) leaves the codes in the file Slurm writes: loguru writes
``\\x1b[32m2018-12-27 14:04:17.103\\x1b[0m | \\x1b[31m\\x1b[1mERROR   \\x1b[0m | ...``, torchtitan colours its step line
(``\\x1b[31mstep: 10  \\x1b[32mloss: ...``), rich colours the numbers inside a message and tqdm moves the cursor
between stacked bars (``\\x1b[A``). Left in, they split the words and numbers the rules read (``allocate
\\x1b[1;36m20.00\\x1b[0m MiB``) and hide the prefixes ``activities.logs.line`` peels off.
"""

from __future__ import annotations

import re

__all__ = ["strip_terminal_codes"]

# CSI (colours, cursor moves: ESC [ parameters, intermediates, final letter), OSC (hyperlinks, titles: ESC ] ...
# ended by BEL or ESC \), character-set selection (ESC ( B) and the one-character controls (ESC =, ESC 7, ...).
# Every branch is a bounded or single-class run, so a long line is stripped in linear time.
_TERMINAL_CODE = re.compile(
    r"\x1b\[[0-9;:?<=>]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[()][A-Za-z0-9]"
    r"|\x1b[=>78MDEc]"
)


def strip_terminal_codes(text: str) -> str:
    """``text`` without terminal colour, cursor and hyperlink codes (unchanged, and fast, when it has none).

    Args:
        text: One log line as written.

    Returns:
        The line as a terminal would show its characters.
    """
    return _TERMINAL_CODE.sub("", text) if "\x1b" in text else text
