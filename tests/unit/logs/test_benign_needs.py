"""The benign-chatter regex is run only on lines holding one of ``BENIGN_NEEDS``: proved from the regex's parse tree
(every match contains one of them, as written), and checked equal to running the regex on chatter, near misses and
the repository's own step lines."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from activities.logs.signatures import BENIGN, BENIGN_NEEDS, benign
from deploy.scale.logwriter import step_line
from tests.unit.logs.regex_proof import proved

_CHATTER = [
    "g0001:1234:1234 [0] NCCL INFO Bootstrap : Using eth0",
    "NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
    "Failed to open libibverbs.so[.1]",
    "NET/Plugin : Plugin load returned 2 : libnccl-net.so: cannot open shared object file",
    "Could not find: libnccl-net.so",
    "Could not find real path of /dev/shm",
    "mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged",
    "mlx5_core 0000:3b:00.0 ib0: Link down",
    "mlx5_ib_test_wc:290:(pid 1): Error -110 while trying to test write-combining support",
]


def test_every_benign_match_holds_one_of_its_texts() -> None:
    assert not BENIGN.flags & re.IGNORECASE  # the texts are tested as written
    assert proved(BENIGN, BENIGN_NEEDS)


def test_the_chatter_is_still_benign_and_step_lines_are_not() -> None:
    assert all(benign(text) and BENIGN.search(text) for text in _CHATTER)
    for rank in range(8):
        line = step_line(rank, 8, "g00001", 1234, 1.8e9)
        assert benign(line) is False and BENIGN.search(line) is None


@settings(max_examples=500, deadline=None)
@given(
    parts=st.lists(
        st.one_of(st.sampled_from([*_CHATTER, *BENIGN_NEEDS, "NCCL  INFO", "mlx5 core", "Link up", " "]), st.text()),
        max_size=5,
    )
)
def test_the_text_test_first_answers_what_the_regex_answers(parts: list[str]) -> None:
    body = "".join(parts)
    assert benign(body) == (BENIGN.search(body) is not None)
