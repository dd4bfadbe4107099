"""vLLM's own OpenAI server with the plug-in: agent metadata arrives through ``vllm_xargs``."""

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from justitia.engine.models import tiny_model

    model = str(tiny_model())
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = dict(
        os.environ,
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
        JUSTITIA_POLICY="justitia",
        JUSTITIA_LOG_AGENTS="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="0-1",
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                model,
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
                "--scheduling-policy",
                "priority",
                "--scheduler-cls",
                "justitia.vllm.plugin.JustitiaScheduler",
                "--num-gpu-blocks-override",
                "16",
                "--max-model-len",
                "1024",
                "--enforce-eager",
                "--dtype",
                "float32",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120)
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, log.read_text()[-4000:]
        try:
            client.models.list()
            break
        except openai.APIConnectionError:
            assert time.monotonic() < deadline, "server did not start in 300 s:\n" + log.read_text()[-4000:]
            time.sleep(2)
    yield client, model, log
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_requests_with_vllm_xargs_join_their_agent_and_the_agent_is_released(server):
    client, model, log = server
    for i in range(3):
        out = client.completions.create(
            model=model,
            prompt=f"Verify claim {i} about the transit plan.",
            max_tokens=8,
            extra_body={
                "ignore_eos": True,
                "vllm_xargs": {
                    "agent_id": "fv-agent-7",
                    "agent_type": "fv",
                    "agent_cost": 12345.0,
                    "request_cost": 4000.0,
                    "agent_done": int(i == 2),
                },
            },
        )
        assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 8
    text = log.read_text()
    arrivals = re.findall(r"justitia: agent (\S+) arrived: type='(\w*)' predicted_cost=(\S+)", text)
    mine = [a for a in arrivals if a[0] == "fv-agent-7"]
    assert len(mine) == 1 and mine[0][1] == "fv"  # one agent, three requests
    # vLLM's server without Justitia's door: a client's own price is not read (justitia.vllm.general);
    # the plug-in prices the request by its prompt and max_tokens
    assert mine[0][2] != "12345" and 0 < float(mine[0][2]) < 12345
    assert "justitia: agent fv-agent-7 released" in text


def test_a_request_without_metadata_is_served_as_its_own_agent(server):
    client, model, log = server
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert out.usage.completion_tokens == 4
    text = log.read_text()
    assert re.search(r"justitia: agent \S+ arrived: type=''", text)
    assert not [line for line in text.splitlines() if "ERROR" in line]


def test_bad_costs_in_vllm_xargs_are_logged_and_replaced_and_the_server_keeps_serving(server):
    client, model, log = server
    for i, bad in enumerate(["lots", -5, "1e999"]):
        out = client.completions.create(
            model=model,
            prompt="Check this.",
            max_tokens=4,
            extra_body={"ignore_eos": True, "vllm_xargs": {"agent_id": f"bad-{i}", "agent_cost": bad, "agent_done": 1}},
        )
        assert out.usage.completion_tokens == 4
    text = log.read_text()
    assert text.count("is not a finite number >= 0") == 3
    assert client.models.list().data
