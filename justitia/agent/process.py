"""One agent's life, written once: the process every engine drives (``drive``: on asyncio).

NOTE: an agent runs its stages in order and the tasks of a stage in parallel, beside the stage's
branches (subagents: chains of stages of their own), each stage after its pause. When it arrives its
predictor prices it (the cost the policies order it by); every request carries the agent's
``RequestMeta``; when its last task is answered, the predictor observes what it really cost.
``AgentProcess`` holds that logic and nothing about time, in the spirit of a SimPy process: the
simulator drives it on simulated time (``start``, then ``answered`` as tasks finish), and
``drive`` runs it with asyncio on a real engine (the bench runner, the server).

States of an ``AgentProcess`` (``state``):
    new       created; ``predict()`` prices it (once), ``start()`` returns the first stage's calls
    running   top-level stage ``stage`` is out; ``answered(call, answer)`` for each of its calls; the
              last answer of a stage (of any chain) returns its chain's next stage's calls, prompts
              filled from earlier answers, each call with the pause its driver waits before sending it
    done      every stage answered; the predictor has observed the agent's true cost
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from justitia.agent.calls import AgentResult, Answer, Call, Render
from justitia.core import KV, CostDist, CostModel, RequestMeta
from justitia.predictors import Predictor
from justitia.workload import Agent, shared_text

PRICINGS = ("first-stage", "all-stages")
BURSTS = ("turn", "pause")  # what a session's flow is priced and tagged by (docs/sessions.md)
SUBAGENTS = ("share", "flows")  # a session's subagents share its flow, or are flows of their own


@dataclass(frozen=True)
class Options:
    """How an engine runs its agents' processes (``AgentProcess``'s arguments of the same names)."""

    pricing: str = "first-stage"
    burst: str = "turn"
    subagents: str = "share"

    def process(self, agent: Agent, predictor: Predictor, cost: CostModel) -> "AgentProcess":
        return AgentProcess(agent, predictor, cost, pricing=self.pricing, burst=self.burst, subagents=self.subagents)


class AgentProcess:
    """The life of one agent; see the module's docstring for its states."""

    def __init__(
        self,
        agent: Agent,
        predictor: Predictor,
        cost: CostModel = KV,
        *,
        tasks: Sequence[Sequence[Any]] | None = None,
        request_prefix: str = "",
        render: Render | None = None,
        pricing: str = "first-stage",
        burst: str = "turn",
        subagents: str = "share",
    ):
        """``agent`` is what the predictor sees (its id, type and stages with the lengths known at
        arrival); ``tasks`` are the stages' tasks to hand the engine (default: ``agent.stages``);
        ``render`` fills a prompt's placeholders from earlier answers (default: prompts as given).
        ``pricing``: ``first-stage``, the predictor's agent cost (it reads the first stage: the
        paper's rule, and all an engine that sees only requests can do), or ``all-stages``, for an
        agent submitted whole: at least the sum of its requests' predicted costs over every stage,
        so that a cheap first stage cannot hide heavy later ones. A session (``docs/sessions.md``):
        ``burst``, what its flow is priced and tagged by (``turn``: a user turn; ``pause``: the calls
        between two pauses); ``subagents``, whether its subagents share its flow (``share``) or are
        flows of their own (``flows``: their calls carry ``Call.flow``)."""
        for name, value, allowed in (
            ("pricing", pricing, PRICINGS),
            ("burst", burst, BURSTS),
            ("subagents", subagents, SUBAGENTS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got '{value}'.")
        self.burst = burst
        self.subagents = subagents
        self.ended_flows: list[str] = []  # subagents as flows: those whose chain has ended, for the engine to retire
        self.agent = agent
        self.predictor = predictor
        self.cost = cost
        self.tasks = agent.stages if tasks is None else tasks
        self.request_prefix = request_prefix
        self.render = render
        self.pricing = pricing
        self.state = "new"
        self.stage = -1
        self.predicted_cost: float | None = None
        self.predicted_dist: CostDist | None = None  # the price as a distribution, if the predictor gives one
        self._so_far = 0.0  # what its answered calls have cost (the cost model's unit)
        # a stage's calls: its own tasks, then its branches' (depth first); answers by that index
        self._layout = [_Node.of(stage, 0) for stage in self.tasks]
        self.answers: list[list[Answer | None]] = [[None] * node.size for node in self._layout]
        turns, turn = [], 0
        for stage in self.tasks:
            turn = turn if getattr(stage, "turn", None) is None else stage.turn
            turns.append(turn)
        self._turns = turns  # top-level stage -> its user turn
        self._open: dict[int, int] = {}  # id(chain) -> calls and branches of its stage still out
        self._chains: dict[tuple[int, int], _Chain] = {}  # (stage, call index) -> the chain the call is in
        self._top: _Chain | None = None
        self.turn_times: dict[int, list[float]] = {}  # turn -> [first call sent, last answer] (``sent``, ``answered``)
        self.in_flight = 0  # calls sent and not answered
        self._texts: dict[tuple[str, str], str] = {}  # (task id, "in" | "out") -> its prompt as sent, its answer
        self._turn_sent = -1  # the turn of the calls sent last
        self.turn_predicted: dict[int, float] = {}  # a session's turns: predicted cost as each started
        self.turn_dists: dict[int, CostDist] = {}  # ... and as a distribution, if the predictor gives one
        self.turn_true: dict[int, float] = {}  # ... and what its answered calls cost (the cost model's unit)
        self._turn_released = 0  # the latest turn whose calls were handed out
        # [sent at, true KV cost of its answered calls]: the work as it came, a burst started whenever a
        # call is sent with nothing in flight (whatever unit prices it)
        self.bursts: list[list[float]] = []
        self._burst_of: dict[tuple[int, int], int] = {}

    @property
    def done(self) -> bool:
        """Whether every stage has been answered."""
        return self.state == "done"

    def predict(self, bounds: tuple[float, float] | None = None) -> float:
        """The agent's predicted total cost (the predictor runs once). The process is its price's one
        owner: ``bounds`` (``low, high``), what a server knows of it, holds the price (each value of a
        distribution) within ``[low, high]`` (``high`` wins), after the floor of its requests' own
        prices under ``all-stages`` pricing."""
        if self.predicted_cost is None:
            dist = None if self.agent.is_session else self.predictor.agent_dist(self.agent, self.cost)
            if dist is None:
                cost = float(self.predictor.agent_cost(self.agent, self.cost))
            if self.pricing == "all-stages":
                p, a, m = self.predictor, self.agent, self.cost
                floor = sum(
                    float(p.request_cost(a, s, i, m))
                    for s, st in enumerate(a.stages)
                    for i in range(len(st.all_tasks()))
                )
                if dist is not None:  # no value below what every stage's requests will cost
                    dist = CostDist.from_weighted([(max(v, floor), q) for v, q in zip(dist.values, dist.probs)])
                else:
                    cost = max(cost, floor)
            if bounds is not None:
                low, high = bounds
                if dist is not None:
                    dist = CostDist.from_weighted(
                        [(min(max(v, low), high), q) for v, q in zip(dist.values, dist.probs)]
                    )
                else:
                    cost = min(max(cost, low), high)
            if dist is not None:
                self.predicted_dist = dist
                cost = dist.index(0.0)
            self.predicted_cost = cost
        return self.predicted_cost

    def keep_price(self, cost: float) -> None:
        """The point price it had before a restart (the journal's), which it keeps: a restarted
        server prices it again (its distribution), but places it at what it was registered with."""
        self.predicted_cost = float(cost)

    def start(self) -> list[Call]:
        """Predict (if not yet done) and return the first stage's calls."""
        if self.state != "new":
            raise RuntimeError(f"agent '{self.agent.agent_id}' has already started.")
        self.predict()
        self.state = "running"
        self._top = _Chain(None, [(s, node) for s, node in enumerate(self._layout)], None)
        return self._enter(self._top, 0, 0.0)

    def resume(self, answers: list[list[Answer | None]]) -> list[Call]:
        """Start after what ``answers`` holds (a restarted server): the stages answered in full, then
        perhaps one answered in part (None where a task is not). Predict (if not yet done) and return
        the calls still to make: the part stage's missing tasks, or the next stage's (none if every
        stage is answered), each after its stage's pause (waited again by a stage answered in part)."""
        if self.state != "new":
            raise RuntimeError(f"agent '{self.agent.agent_id}' has already started.")
        if any(node.branches for node in self._layout):
            raise ValueError(f"agent '{self.agent.agent_id}': only agents without branches resume.")
        self.predict()
        self.state = "running"
        self._top = _Chain(None, [(s, node) for s, node in enumerate(self._layout)], None)
        full = 0
        while full < len(answers) and len(answers[full]) == len(self.tasks[full]) and None not in answers[full]:
            self.answers[full] = list(answers[full])
            full += 1
        if full >= len(self.tasks):
            self.state = "done"
            return []
        calls = self._enter(self._top, full, 0.0)
        if full < len(answers):  # answered in part: its answered tasks are kept, the rest run
            kept = list(answers[full]) + [None] * (len(self.tasks[full]) - len(answers[full]))
            self.answers[full] = kept
            calls = [c for c in calls if kept[c.index] is None]
            self._open[id(self._top)] = len(calls)
        return calls

    def answered(self, call: Call, answer: Answer, now_s: float | None = None) -> list[Call]:
        """Record ``answer`` (at ``now_s``, for turn times); the calls it releases: its chain's next
        stage's if it completes its stage (and, through the chains that hold it, theirs)."""
        if (
            self.state != "running"
            or call.stage != self.stage
            or call.index >= len(self.answers[call.stage])
            or self.answers[call.stage][call.index] is not None
        ):
            raise RuntimeError(f"request '{call.request_id}' was not expected now.")
        self.answers[call.stage][call.index] = answer
        if getattr(call.task, "id", None) is not None:
            self._texts[(call.task.id, "out")] = answer.text
        self.in_flight = max(0, self.in_flight - 1)
        burst = self._burst_of.pop((call.stage, call.index), None)
        if burst is not None:
            self.bursts[burst][1] += KV.request_cost(answer.prompt_tokens, answer.output_tokens)
        if self.agent.is_session:
            self.turn_true[call.turn] = self.turn_true.get(call.turn, 0.0) + self.cost.request_cost(
                answer.prompt_tokens, answer.output_tokens
            )
            self.predictor.observe_call(self.agent.type, answer.prompt_tokens, answer.output_tokens)
            self.predictor.progress(self.agent, self.turn_true[call.turn], call.turn)
        else:
            self._so_far += self.cost.request_cost(answer.prompt_tokens, answer.output_tokens)
            self.predictor.progress(self.agent, self._so_far)
        if now_s is not None and (times := self.turn_times.get(call.turn)) is not None:
            times[1] = max(times[1], now_s)
        chain = self._chains.pop((call.stage, call.index))
        calls: list[Call] = []
        while True:
            self._open[id(chain)] -= 1
            if self._open[id(chain)]:
                return calls
            if chain.pos + 1 < len(chain.stages):
                if chain.parent is None and self._turns[chain.pos + 1] != self._turns[chain.pos]:
                    self._turn_over(self._turns[chain.pos])
                return calls + self._enter(chain, chain.pos + 1, 0.0)
            del self._open[id(chain)]
            if chain.parent is None:
                break
            if chain.flow != chain.parent.flow:
                self.ended_flows.append(chain.flow)
            chain = chain.parent
        self.state = "done"
        self._turn_over(call.turn)
        true = self.true_cost(self.cost)
        self.predictor.observe(self.agent.type, self.predicted_cost, true, self.agent.tenant)
        if not self.agent.is_session:
            self.predictor.learn(self.agent, true)
        return []

    def _turn_over(self, turn: int) -> None:
        """A session's turn is answered whole: its predictor learns what it cost."""
        if turn in self.turn_predicted:
            self.predictor.observe_turn(
                self.agent.type,
                turn,
                self.turn_predicted[turn],
                self.turn_true.get(turn, 0.0),
                self.turn_true.get(turn - 1),
            )
            self.predictor.learn(self.agent, self.turn_true.get(turn, 0.0), turn, self._earlier(turn))

    def sent(self, calls: Sequence[Call], now_s: float) -> None:
        """The driver sent ``calls`` at ``now_s`` (after their pause): a turn starts at its first."""
        if not self.in_flight:  # the work as it came: the GPS reference's arrivals (docs/sessions.md)
            self.bursts.append([now_s, 0.0])
        self._turn_sent = max(self._turn_sent, max((c.turn for c in calls), default=self._turn_sent))
        self.in_flight += len(calls)
        for c in calls:
            self._burst_of[(c.stage, c.index)] = len(self.bursts) - 1
            self.turn_times.setdefault(c.turn, [now_s, now_s])

    @property
    def paused(self) -> bool:
        """Whether the session is between two bursts, with nothing in flight: it leaves the engines
        and arrives again with its next burst. A burst is a user turn (``burst="turn"``: a tool
        pause inside a turn keeps its place) or the calls between two pauses of any kind."""
        return (
            self.state == "running"
            and self.in_flight == 0
            and (self.burst == "pause" or self._turn_released > self._turn_sent)
        )

    def opens_burst(self, calls: Sequence[Call]) -> bool:
        """Whether sending ``calls`` now starts a burst (the agent's first calls, or a session's next)."""
        return not self.in_flight and (
            self._turn_sent < 0
            or any(c.turn > self._turn_sent for c in calls)
            or (self.burst == "pause" and any(c.pause_s > 0 for c in calls))
        )

    def burst_cost(self, calls: Sequence[Call]) -> float:
        """A burst's predicted cost when ``calls`` open it: their request costs (``burst="pause"``),
        or those of every call of their turn (``"turn"``: the turn is priced whole, as the paper
        prices an agent)."""
        if self.burst == "pause":
            return sum(c.meta.request_cost for c in calls)
        return self._predict_turn(max(c.turn for c in calls))

    def flow_cost(self, call: Call) -> float:
        """A subagent's flow's predicted cost when its first call is sent (``subagents="flows"``):
        its chain's calls' request costs (its own subagents' aside, which are flows of their own)."""
        a = self.agent
        chain = self._chains[(call.stage, call.index)]
        return sum(
            float(self.predictor.request_cost(a, s, i, self.cost))
            for s, node in chain.stages
            for i in range(node.offset, node.offset + node.own)
        )

    def burst_dist(self, calls: Sequence[Call]) -> CostDist | None:
        """A burst's predicted cost as a distribution, when ``calls`` open it (``burst_cost``), if
        the predictor gives one for a turn (``burst="turn"``, subagents sharing its flow)."""
        if self.burst == "pause" or self.subagents == "flows":
            return None
        turn = max(c.turn for c in calls)
        self._predict_turn(turn)
        return self.turn_dists.get(turn)

    def _earlier(self, turn: int) -> list[float]:
        return [self.turn_true.get(t, 0.0) for t in sorted(self.turn_predicted) if t < turn]

    def _predict_turn(self, turn: int) -> float:
        if turn not in self.turn_predicted:
            earlier = self._earlier(turn)
            dist = None if self.subagents == "flows" else self.predictor.turn_dist(self.agent, turn, earlier, self.cost)
            if dist is not None:
                self.turn_dists[turn] = dist
                self.turn_predicted[turn] = dist.index(0.0)
            elif self.subagents == "flows":  # the turn's own calls: its subagents are priced in their flows
                a = self.agent
                self.turn_predicted[turn] = sum(
                    float(self.predictor.request_cost(a, s, i, self.cost))
                    for s, i in a.turn_calls(turn)
                    if i < len(a.stages[s])
                )
            else:
                self.turn_predicted[turn] = float(self.predictor.turn_cost(self.agent, turn, earlier, self.cost))
        return self.turn_predicted[turn]

    def turns(self) -> list[float]:
        """Each turn's time, first call sent to last answer, in turn order (turns seen so far)."""
        return [end - start for _, (start, end) in sorted(self.turn_times.items())]

    def _segment_text(self, seg: Any) -> str:
        """A context segment as text: a shared block's (``workload.shared_text``, by its name), or an
        earlier task's prompt as sent or its answer as received."""
        if seg.kind == "shared":
            return shared_text(seg.ref, seg.tokens)
        return self._texts[(seg.ref, "in" if seg.kind == "prompt_of" else "out")]

    def runs(self, call: Call) -> tuple[tuple[Any, int], ...]:
        """What the call's prompt and output hold, as runs (``Agent.runs``): an engine with a prefix
        cache hashes them into block keys."""
        return self.agent.runs(call.stage, call.index)

    def true_cost(self, cost: CostModel) -> float:
        """What the answered requests cost, in ``cost``'s unit."""
        return sum(cost.request_cost(a.prompt_tokens, a.output_tokens) for stage in self.answers for a in stage if a)

    def result(self, arrival_s: float, finish_s: float) -> AgentResult:
        """The outcome of a finished agent that arrived at ``arrival_s`` and finished at ``finish_s``."""
        return AgentResult(
            self.agent.agent_id,
            self.agent.type,
            arrival_s,
            finish_s,
            finish_s - arrival_s,
            self.true_cost(KV),
            self.predicted_cost,
            *(
                (
                    self.turns(),
                    self.bursts,
                    [[self.turn_predicted[t], self.turn_true.get(t, 0.0)] for t in sorted(self.turn_predicted)] or None,
                )
                if self.agent.is_session
                else (None, None, None)
            ),
        )

    def _enter(self, chain: "_Chain", pos: int, delay_s: float) -> list[Call]:
        """Start stage ``pos`` of ``chain``, ``delay_s`` from now plus its pause: its calls, and its
        branches' first stages'."""
        chain.pos = pos
        s, node = chain.stages[pos]
        if chain.parent is None:
            self.stage = s
        delay_s += node.pause_s
        texts = [[a.text for a in answers] for answers in self.answers[:s]]
        last = s == len(self.tasks) - 1
        a = self.agent
        calls = []
        for i in range(node.offset, node.offset + node.own):
            task = node.stage[i - node.offset]
            prompt = task.prompt if self.render is None else self.render(task.prompt, s, texts)
            context = getattr(task, "context", ())
            if context:  # what the prompt begins with, as text: the same text wherever it is shared
                prompt = "".join(self._segment_text(seg) for seg in context) + prompt
            if getattr(task, "id", None) is not None:
                self._texts[(task.id, "in")] = prompt
            meta = RequestMeta(
                a.agent_id,
                a.type,
                self.predicted_cost,
                float(self.predictor.request_cost(a, s, i, self.cost)),
                last,
                None if a.weight == 1 else a.weight,
                a.tenant,
                session=a.is_session,
            )
            calls.append(
                Call(
                    f"{self.request_prefix}{a.agent_id}/{s}/{i}",
                    s,
                    i,
                    task,
                    prompt,
                    meta,
                    delay_s,
                    self._turns[s],
                    chain.flow,
                )
            )
            self._chains[(s, i)] = chain
        self._turn_released = max(self._turn_released, self._turns[s])
        self._open[id(chain)] = node.own + len(node.branches)
        for branch in node.branches:
            sub = _Chain(chain, [(s, n) for n in branch], None)
            if self.subagents == "flows":
                sub.flow = f"{chain.flow or self.agent.agent_id}/{s}.{node.branches.index(branch)}"
            else:
                sub.flow = chain.flow
            calls += self._enter(sub, 0, delay_s)
        return calls


@dataclass
class _Node:
    """A stage laid out among its top-level stage's calls: its own tasks at ``offset``, then its
    branches' stages (depth first)."""

    stage: Any
    offset: int
    own: int
    pause_s: float
    branches: list[list["_Node"]]
    size: int  # its calls and its branches'

    @classmethod
    def of(cls, stage: Any, offset: int) -> "_Node":
        branches, at = [], offset + len(stage)
        for chain in getattr(stage, "branches", ()):
            nodes = []
            for st in chain:
                node = cls.of(st, at)
                at += node.size
                nodes.append(node)
            branches.append(nodes)
        return cls(stage, offset, len(stage), getattr(stage, "pause_s", 0.0), branches, at - offset)


@dataclass(eq=False)
class _Chain:
    """A chain of stages running: the agent's own (no parent), or a branch of a stage."""

    parent: "_Chain | None"
    stages: list[tuple[int, _Node]]  # (its top-level stage, the node)
    pos: int | None
    flow: str | None = None  # the flow its calls are served in (None: the agent's)
