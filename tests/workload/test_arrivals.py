"""Arrival processes: Mooncake trace replay and gamma renewal arrivals."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from justitia.workload import WorkloadError
from justitia.workload.arrivals import MOONCAKE_ARRIVALS, synthetic_arrivals, trace_arrivals

SHARED_TRACE = Path(__file__).resolve().parents[3] / "shared/traces/mooncake_conversation_trace.jsonl"


def _trace(tmp_path, lines: list[str]):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_package_ships_the_mooncake_arrivals_and_nothing_else_of_the_trace():
    lines = gzip.decompress(MOONCAKE_ARRIVALS.read_bytes()).decode().splitlines()
    assert len(lines) == 12031 and MOONCAKE_ARRIVALS.stat().st_size < 50_000
    assert all(set(json.loads(line)) == {"timestamp"} for line in lines)
    times = trace_arrivals(MOONCAKE_ARRIVALS, 300)
    assert len(times) == 300 and times[0] == 0.0
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert 90.0 < times[-1] < 115.0  # the first 300 requests span about 102 s
    doubled = trace_arrivals(MOONCAKE_ARRIVALS, 300, density=2.0)
    assert np.allclose(doubled, np.asarray(times) / 2.0)
    assert "Apache" in (MOONCAKE_ARRIVALS.parent / "NOTICE").read_text()
    if SHARED_TRACE.is_file():  # beside the repository (CI has it): the shipped times are the trace's
        assert trace_arrivals(MOONCAKE_ARRIVALS, 12031) == trace_arrivals(SHARED_TRACE, 12031)


def test_timestamps_are_shifted_and_scaled(tmp_path):
    path = _trace(tmp_path, [json.dumps({"timestamp": t, "input_length": 5}) for t in (1000, 1500, 1500, 4000)])
    assert trace_arrivals(path, 4) == [0.0, 0.5, 0.5, 3.0]
    assert trace_arrivals(path, 2, density=0.5) == [0.0, 1.0]


def test_blank_lines_are_skipped_and_lines_after_n_are_not_read(tmp_path):
    path = _trace(tmp_path, ['{"timestamp": 0}', "", '{"timestamp": 250}', "not json at all"])
    assert trace_arrivals(path, 2) == [0.0, 0.25]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"trace\.jsonl:2: not valid JSON"),
        ("[1, 2]", r"trace\.jsonl:2: expected a JSON object"),
        ('{"input_length": 3}', r"trace\.jsonl:2: field 'timestamp' is missing"),
        ('{"timestamp": -5}', r"trace\.jsonl:2: field 'timestamp' must be a number of milliseconds >= 0, got -5"),
        ('{"timestamp": "12"}', r"trace\.jsonl:2: field 'timestamp' must be a number"),
        ('{"timestamp": true}', r"trace\.jsonl:2: field 'timestamp' must be a number"),
        ('{"timestamp": 50}', r"trace\.jsonl:2: field 'timestamp' is 50, earlier than 100(\.0)? on line 1"),
    ],
)
def test_bad_trace_lines_name_file_line_and_field(tmp_path, line, message):
    path = _trace(tmp_path, ['{"timestamp": 100}', line, '{"timestamp": 900}'])
    with pytest.raises(WorkloadError, match=message):
        trace_arrivals(path, 3)


def test_short_or_missing_trace(tmp_path):
    path = _trace(tmp_path, ['{"timestamp": 0}', '{"timestamp": 10}', '{"timestamp": 20}'])
    with pytest.raises(WorkloadError, match="asked for 5 arrivals but the trace holds only 3 records"):
        trace_arrivals(path, 5)
    with pytest.raises(WorkloadError, match="no such trace file"):
        trace_arrivals(tmp_path / "absent.jsonl", 1)


def test_bad_arguments(tmp_path):
    path = _trace(tmp_path, ['{"timestamp": 0}'])
    for density in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="density"):
            trace_arrivals(path, 1, density=density)
    with pytest.raises(ValueError, match="n must be"):
        trace_arrivals(path, 0)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="rate_per_s"):
        synthetic_arrivals(5, rng, rate_per_s=0.0)
    with pytest.raises(ValueError, match="cv"):
        synthetic_arrivals(5, rng, rate_per_s=1.0, cv=0.0)
    with pytest.raises(ValueError, match="n must be"):
        synthetic_arrivals(0, rng, rate_per_s=1.0)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_synthetic_arrivals_have_the_asked_rate_and_burstiness(cv):
    times = np.asarray(synthetic_arrivals(20000, np.random.default_rng(4), rate_per_s=2.5, cv=cv))
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    gaps = np.diff(times)
    assert abs(gaps.mean() - 1 / 2.5) < 0.05 / 2.5
    assert abs(gaps.std() / gaps.mean() - cv) < 0.1 * cv


def test_synthetic_arrivals_are_deterministic():
    a = synthetic_arrivals(50, np.random.default_rng(12), rate_per_s=1.0, cv=1.5)
    b = synthetic_arrivals(50, np.random.default_rng(12), rate_per_s=1.0, cv=1.5)
    assert a == b and len(a) == 50
