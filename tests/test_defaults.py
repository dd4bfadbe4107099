"""Defaults and the environment the plug-in (and the --upstream front end) read, in one place."""

import pytest

from justitia.defaults import AGENT_IDLE_S, ITERATION_S, cache_dir, policy_settings


def test_without_environment_the_defaults_hold():
    s = policy_settings({})
    assert (
        s.policy,
        s.cost,
        s.capacity_per_s,
        s.iteration_s,
        s.agent_idle_s,
        s.log_agents,
        s.measure_capacity,
        s.retag,
        s.client_prices,
    ) == ("justitia", "kv", None, ITERATION_S, AGENT_IDLE_S, False, True, True, None)


def test_the_environment_sets_each_field():
    s = policy_settings(
        {
            "JUSTITIA_POLICY": "vtc",
            "JUSTITIA_COST": "compute",
            "JUSTITIA_CAPACITY": "5e5",
            "JUSTITIA_ITERATION_S": "0.05",
            "JUSTITIA_AGENT_IDLE_S": "0",
            "JUSTITIA_LOG_AGENTS": "1",
            "JUSTITIA_MEASURE_CAPACITY": "0",
            "JUSTITIA_RETAG": "0",
            "JUSTITIA_CLIENT_PRICES": "0",
        }
    )
    assert (
        s.policy,
        s.cost,
        s.capacity_per_s,
        s.iteration_s,
        s.agent_idle_s,
        s.log_agents,
        s.measure_capacity,
        s.retag,
        s.client_prices,
    ) == ("vtc", "compute", 5e5, 0.05, 0.0, True, False, False, False)


@pytest.mark.parametrize(
    "name, value",
    [
        ("JUSTITIA_CAPACITY", "lots"),
        ("JUSTITIA_CAPACITY", "0"),
        ("JUSTITIA_ITERATION_S", "-1"),
        ("JUSTITIA_ITERATION_S", "inf"),
        ("JUSTITIA_AGENT_IDLE_S", "-5"),
        ("JUSTITIA_GUARD_SCALE", "nan"),
        ("JUSTITIA_GUARD_SCALE", "-1"),
    ],
)
def test_a_bad_value_is_one_sentence_naming_the_variable(name, value):
    with pytest.raises(ValueError, match=f"{name}='{value}': expected a finite number"):
        policy_settings({name: value})


def test_the_guard_starts_from_the_scale_a_deployment_served_before():
    assert policy_settings({}).guard_scale == 0.0
    assert policy_settings({"JUSTITIA_GUARD_SCALE": "2.5e7"}).guard_scale == 2.5e7


def test_the_cache_directory_follows_its_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("JUSTITIA_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
