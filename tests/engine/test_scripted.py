"""The scripted answers' rules (``justitia.engine.scripted``), without an engine: which rule answers a
prompt, what a script file must hold, and which answer lengths a request may ask for. The engine
follows them in ``tests/server/test_harnesses.py``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from justitia.engine.scripted import ANSWER_TOKENS_KEY, ScriptedAnswers, load_script, pick
from justitia.lab.live.harnesses import MARK, SCRIPT, SUBDONE, SUBTASK


def test_the_rule_that_matches_latest_in_the_prompt_answers():
    rules = [(__import__("re").compile(r["match"]), r["answer"]) for r in SCRIPT]
    ask = "user: Please run the echo tool."
    assert pick(rules, ask).startswith("<tool_call>") and '"Bash"' in pick(rules, ask)
    assert pick(rules, ask + f"\ntool: {MARK}\n") == "The tool printed the marker."  # its result follows
    assert pick(rules, ask + f"\ntool: {MARK}\nuser: Now say hello.") == "Hello."  # a later turn
    assert pick(rules, f"user: Answer the subagent task {SUBTASK}.") == SUBDONE
    assert pick(rules, "nothing a rule names") is None  # the model is left alone


def test_a_script_file_must_be_a_list_of_match_and_answer(tmp_path):
    path = tmp_path / "script.json"
    for bad in ({"match": "a", "answer": "b"}, [{"match": "a"}], [{"match": 1, "answer": "b"}]):
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="script.json"):
            load_script(str(path))
    path.write_text(json.dumps([{"match": "a+", "answer": "b"}]))
    assert [(p.pattern, a) for p, a in load_script(str(path))] == [("a+", "b")]


@pytest.mark.parametrize("value", [0, -3, True, 1.5, "7", 1 << 21])
def test_an_answer_length_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match=ANSWER_TOKENS_KEY):
        ScriptedAnswers.validate_params(SimpleNamespace(extra_args={ANSWER_TOKENS_KEY: value}))


def test_requests_without_the_key_pass():
    for extra in (None, {}, {"agent_id": "a"}, {ANSWER_TOKENS_KEY: 12}):
        ScriptedAnswers.validate_params(SimpleNamespace(extra_args=extra))
