"""Hostlist expansion and compression: examples from real Slurm output plus round-trip properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from activities.slurm.hostlist import MAX_HOSTS, HostlistError, compress, expand


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("", ()),
        ("  ", ()),
        ("n1", ("n1",)),
        ("n[1-2]", ("n1", "n2")),
        ("n[1-3,5]", ("n1", "n2", "n3", "n5")),
        ("n[1,4]", ("n1", "n4")),
        ("n[1-2],n4,n3", ("n1", "n2", "n4", "n3")),  # squeue --json keeps excnodelist as typed
        ("gpu-a[01-03],cpu1", ("gpu-a01", "gpu-a02", "gpu-a03", "cpu1")),
        ("n[08-10]", ("n08", "n09", "n10")),
        ("n[8-10]", ("n8", "n9", "n10")),
        ("rack1-n[1-2]", ("rack1-n1", "rack1-n2")),
        ("r[1-2]-n[1-2]", ("r1-n1", "r1-n2", "r2-n1", "r2-n2")),
        ("a[1-2]b", ("a1b", "a2b")),
        ("n1,n1,n[1-2]", ("n1", "n2")),
        ("login", ("login",)),
    ],
)
def test_expand(hostlist: str, names: tuple[str, ...]) -> None:
    assert expand(hostlist) == names


@pytest.mark.parametrize(
    ("names", "hostlist"),
    [
        ([], ""),
        (["n1"], "n1"),
        (["n2", "n1", "n3", "n5"], "n[1-3,5]"),
        (["cpu1", "gpu-a02", "gpu-a01", "gpu-a03"], "cpu1,gpu-a[01-03]"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["n08", "n09", "n10"], "n[08-10]"),
        (["n1-ib", "n2-ib"], "n[1-2]-ib"),
        (["login", "n1"], "login,n1"),
        (["n01", "n1"], "n[1,01]"),
    ],
)
def test_compress(names: list[str], hostlist: str) -> None:
    assert compress(names) == hostlist


@pytest.mark.parametrize(
    "bad",
    ["n[1-2", "n1-2]", "n[[1]]", "n[a-b]", "n[3-1]", "n[1-]", "n[]", "n1,,n2", "n[1-2],", f"n[1-{MAX_HOSTS + 5}]"],
)
def test_expand_rejects_malformed(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand(bad)


def test_expand_rejects_cartesian_blowup() -> None:
    with pytest.raises(HostlistError, match="more than"):
        expand("a[1-1000]b[1-1000]")


@pytest.mark.parametrize("bad", ["", "n[1]", "a,b", "a b"])
def test_compress_rejects_non_names(bad: str) -> None:
    with pytest.raises(HostlistError):
        compress([bad])


_prefixes = st.sampled_from(["n", "gpu-a", "rack1-n", "x", "node-", "a1b"])
_suffixes = st.sampled_from(["", "", "-ib", "b"])
_numbers = st.builds(lambda value, width: str(value).zfill(width), st.integers(0, 120), st.sampled_from([0, 0, 2, 3]))
_names = st.builds(lambda p, n, s: f"{p}{n}{s}", _prefixes, _numbers, _suffixes) | st.sampled_from(["login", "gw"])
_name_sets = st.sets(_names, max_size=40)


@given(_name_sets)
def test_compress_then_expand_gives_the_same_set(names: set[str]) -> None:
    assert set(expand(compress(names))) == names
    assert len(expand(compress(names))) == len(names)


@given(_name_sets)
def test_compress_is_canonical(names: set[str]) -> None:
    hostlist = compress(names)
    assert compress(expand(hostlist)) == hostlist
    assert compress(sorted(names, reverse=True)) == hostlist


@given(st.lists(st.tuples(_prefixes, st.integers(0, 50), st.integers(0, 5), _suffixes), max_size=6))
def test_written_ranges_round_trip(ranges: list[tuple[str, int, int, str]]) -> None:
    hostlist = ",".join(f"{prefix}[{lo}-{lo + span}]{suffix}" for prefix, lo, span, suffix in ranges)
    names = expand(hostlist)
    assert set(expand(compress(names))) == set(names)
