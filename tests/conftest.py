"""A skipped test fails the run: a missing dependency (vLLM, openai, the MiniLM wheel) must not
pass silently. Set JUSTITIA_ALLOW_SKIPS=1 to run a partial suite on purpose."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the shared factories (helpers.py) and drivers, for every folder
# modules that start vLLM engines, Ray, servers on loopback or the npm harnesses (docs/testing.md,
# "Tests that start engines"): ``make test-fast`` leaves them out (``-m "not engine"``)
ENGINE_MODULES = frozenset(
    {
        "test_vllm_plugin",
        "test_server",
        "test_vllm_flags",
        "test_vllm_openai_server",
        "test_harnesses",
        "test_upstream",
        "test_ray",
        "test_replay",
        "test_profile_predictors",
        "test_smollm2",
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in ENGINE_MODULES:
            item.add_marker(pytest.mark.engine)


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if skipped and not os.environ.get("JUSTITIA_ALLOW_SKIPS") and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = terminalreporter.stats.get("skipped", [])
    if skipped and not os.environ.get("JUSTITIA_ALLOW_SKIPS"):
        terminalreporter.write_line(
            f"FAILED: {len(skipped)} test(s) skipped; every test must run (install what "
            "they need: make setup), or set JUSTITIA_ALLOW_SKIPS=1 for a partial run.",
            red=True,
        )
