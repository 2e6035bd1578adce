"""Progress bars written a piece at a time: whatever the appends cut (inside a frame, between a ``\\r`` and its
``\\n``), the tail hands over every complete frame and line once, in order, at its own byte offset, and the
progress reader's latest step is the latest complete frame's."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activities.logs.progress import find_progress
from activities.logs.tail import LogTail

_EOL = re.compile(rb"\r\n|\r|\n")

# What a trainer's output holds: bar frames drawn with a leading \r, log lines ending in \n or \r\n.
SEGMENTS = st.one_of(
    st.integers(1, 999).map(lambda n: f"\r 10%|#  | {n}/1000 [00:01<00:09, 9.00it/s]".encode()),
    st.sampled_from([b"step=3 loss=1.0\n", b"{'loss': 0.5, 'epoch': 0.1}\r\n", b"warning: slow\n", b"\n"]),
)


def _complete_lines(data: bytes) -> list[tuple[int, bytes]]:
    """The lines of ``data`` a reader can hand over: terminated, and not by a final ``\\r`` (maybe half a CRLF)."""
    lines, pos = [], 0
    for m in _EOL.finditer(data):
        if m.end() == len(data) and m.group() == b"\r":
            break
        if m.start() > pos:
            lines.append((pos, data[pos : m.start()]))
        pos = m.end()
    return lines


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segments=st.lists(SEGMENTS, min_size=1, max_size=40), cuts=st.lists(st.integers(0, 4000), max_size=8))
def test_appends_cut_anywhere_give_each_frame_once(tmp_path: Path, segments: list[bytes], cuts: list[int]) -> None:
    data = b"".join(segments)
    log = tmp_path / "slurm-9.out"
    log.write_bytes(b"")
    tail = LogTail([str(log)])
    offsets: dict[str, int] = {}
    seen = []
    written = 0
    for cut in [*sorted(c for c in cuts if c < len(data)), len(data)]:
        if cut > written:
            with open(log, "ab") as f:
                f.write(data[written:cut])
            written = cut
        lines, offsets = tail.read_new(offsets)
        seen += lines
    assert [(line.offset, line.text.encode()) for line in seen] == _complete_lines(data)
    found = find_progress(seen)
    frames = [int(m.group(1)) for m in re.finditer(rb"\| (\d+)/1000 \[", b"".join(t for _, t in _complete_lines(data)))]
    last_bar = frames[-1] if frames else None
    bars = [line for line in seen if "/1000 [" in line.text]
    if bars:
        assert found is not None and found.last is not None
        # The latest complete step line is a bar frame or the plain "step=3" line, whichever came last.
        last = max((line for line in seen if "/1000 [" in line.text or "step=" in line.text), key=lambda x: x.offset)
        assert found.last.offset == last.offset
        if found.last.rule == "tqdm_bar":
            assert found.last.step == last_bar
    log.unlink()
