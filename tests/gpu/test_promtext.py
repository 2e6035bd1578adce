"""The exposition-format parser: HELP/TYPE, label escapes and blanks, special values, strictness.

``prometheus_client``'s parser (a dev dependency) is the reference it is checked against on every fixture page.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from activities.gpu.promtext import ExpositionError, parse_exposition
from tests.gpu.exporter import DATA


def _one(line: str) -> tuple[str, dict[str, str], float]:
    (s,) = parse_exposition(line).samples
    return s.name, dict(s.labels), s.value


def test_help_and_type_lines_and_samples() -> None:
    page = parse_exposition(
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 51\n'
        "# a plain comment\n"
        "\n"
        "# HELP TEST_METRIC \n"  # dcgm-exporter writes an empty help like this
        "# TYPE TEST_METRIC counter\n"
        "TEST_METRIC 7 1712345678901\n"
    )
    assert page.types == {"DCGM_FI_DEV_GPU_TEMP": "gauge", "TEST_METRIC": "counter"}
    assert page.helps == {"DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).", "TEST_METRIC": ""}
    assert [(s.name, dict(s.labels), s.value, s.timestamp_ms) for s in page.samples] == [
        ("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "UUID": "GPU-a"}, 51, None),
        ("TEST_METRIC", {}, 7, 1712345678901),
    ]


def test_help_escapes() -> None:
    page = parse_exposition("# HELP m a\\\\b\\nc \\t stays\n")
    assert page.helps["m"] == "a\\b\nc \\t stays"


def test_label_value_escapes() -> None:
    name, labels, _ = _one('m{err_msg="said \\"hi\\"",path="C:\\\\gpu",multi="a\\nb",empty=""} 1')
    assert labels == {"err_msg": 'said "hi"', "path": "C:\\gpu", "multi": "a\nb", "empty": ""}
    assert name == "m"


def test_blanks_around_labels_and_a_trailing_comma() -> None:
    # dcgm-exporter's README shows `{gpu="0", UUID="..."}`; Prometheus accepts a trailing comma too.
    assert _one('m{ gpu = "0" , UUID="GPU-1", } 2')[1] == {"gpu": "0", "UUID": "GPU-1"}
    assert _one("m{} 3") == ("m", {}, 3)
    assert _one("  m 4  ") == ("m", {}, 4)


def test_special_and_exact_values() -> None:
    assert math.isnan(_one("m NaN")[2])
    assert _one("m +Inf")[2] == math.inf and _one("m -Inf")[2] == -math.inf
    assert _one("m 598.250000")[2] == 598.25
    assert _one("m 1.5e+06")[2] == 1.5e6 and _one("m -.5")[2] == -0.5
    big = _one("m 9223372036854775794")[2]  # DCGM_INT64_NOT_SUPPORTED: only exact as an int
    assert isinstance(big, int) and big == 0x7FFFFFFFFFFFFFF2


def test_crlf_line_ends() -> None:
    assert [s.value for s in parse_exposition("# TYPE m gauge\r\nm 1\r\nm 2\r\n").samples] == [1, 2]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("<!DOCTYPE html>", "expected a metric name"),
        ('{"gpu": 0}', "expected a metric name"),
        ("m", "expected a value"),
        ("m 1 2 3", "expected a value and an optional timestamp"),
        ("m one", "value 'one' is not a number"),
        ("m 1_000", "is not a number"),  # Python's float() would take it; Prometheus does not
        ("m 0x10", "is not a number"),
        ("m 1 12.5", "timestamp '12.5' is not an integer"),
        ('m{gpu="0" 1', "expected ',' or '}' after label gpu"),
        ('m{gpu="0} 1', "unterminated value of label gpu"),
        ("m{gpu=0} 1", "expected '\"' to open the value of label gpu"),
        ('m{9gpu="0"} 1', "expected a label name or '}'"),
        ('m{gpu="a\\x"} 1', "invalid escape '\\x' in label gpu"),
        ('m{gpu="0",gpu="1"} 1', "label gpu given twice"),
        ('m{gpu="0"}1', "expected a blank"),
        ("# TYPE m gauge\n# TYPE m counter", "second TYPE for m"),
        ("# TYPE m histogramm", "unknown metric type 'histogramm'"),
        ("# HELP", "HELP without a valid metric name"),
    ],
)
def test_garbage_names_the_line_and_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ExpositionError) as caught:
        parse_exposition("# HELP ok fine\nok 1\n" + text)
    lineno = 3 + text.count("\n")  # the last line of `text` is the bad one
    assert caught.value.lineno == lineno
    assert problem in str(caught.value)
    assert str(caught.value).startswith(f"line {lineno}: ")


def test_a_repeated_identical_type_is_accepted() -> None:
    # dcgm-exporter renders the GPU and the per-link block of one field separately, each with HELP and TYPE.
    page = parse_exposition('# TYPE m counter\nm 1\n# TYPE m counter\nm{nvlink="0"} 2\n')
    assert [s.value for s in page.samples] == [1, 2]


def test_long_lines_are_shortened_in_the_message() -> None:
    with pytest.raises(ExpositionError) as caught:
        parse_exposition("m " + "9" * 5000 + "x")
    assert len(str(caught.value)) < 200 and str(caught.value).endswith("...'")


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.prom")))
def test_every_fixture_page_matches_the_reference_parser(name: str) -> None:
    text = (DATA / name).read_text()
    ours = [(s.name, dict(s.labels), s.value) for s in parse_exposition(text).samples]
    # prometheus_client renames counter samples (`X_TOTAL` -> `X_TOTAL_total`): compare on the family name.
    theirs = [
        (family.name if family.type != "counter" else s.name.removesuffix("_total"), dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]
    assert len(ours) == len(theirs) > 0
    for (n1, l1, v1), (n2, l2, v2) in zip(ours, theirs, strict=True):
        assert (n1, l1) == (n2, l2)
        assert (v1, type(v1)) == (v2, type(v2)) or (math.isnan(v1) and math.isnan(v2))


_label_values = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)  # utf-8: no lone surrogates


@given(values=st.lists(_label_values, min_size=1, max_size=4), value=st.integers(-(2**70), 2**70))
def test_any_label_value_round_trips(values: list[str], value: int) -> None:
    def escape(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    labels = ",".join(f'l{i}="{escape(v)}"' for i, v in enumerate(values))
    (sample,) = parse_exposition(f"metric_x{{{labels}}} {value}\n").samples
    assert dict(sample.labels) == {f"l{i}": v for i, v in enumerate(values)}
    assert sample.value == value
