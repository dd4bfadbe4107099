"""A tenant's pampering schedule, for the hierarchical clock (``clock.VirtualClock``): the tenant's
share spent on its agents one after another in inner-tag order, from which its agents' root keys
are read (docs/design.md, "Tenants: hierarchical GPS"). Work in cost units, time in root V.
"""

from __future__ import annotations

import bisect
import math


class OrderedSums:
    """Keys in order, each with a value, and the sum of the values up to a key: a sorted list cut
    into blocks, each with its sum (O(√n) per operation, with small constants; no dependency)."""

    BLOCK = 256

    def __init__(self) -> None:
        self._blocks: list[list[tuple]] = []
        self._sums: list[float] = []
        self._value: dict[tuple, float] = {}

    def __len__(self) -> int:
        return len(self._value)

    def _find(self, key: tuple) -> int:
        blocks = self._blocks
        lo, hi = 0, len(blocks)
        while lo < hi:  # the first block whose last key is >= key
            mid = (lo + hi) // 2
            if blocks[mid][-1] < key:
                lo = mid + 1
            else:
                hi = mid
        return min(lo, len(blocks) - 1)

    def add(self, key: tuple, value: float) -> None:
        """Insert a new key."""
        self._value[key] = value
        if not self._blocks:
            self._blocks.append([key])
            self._sums.append(value)
            return
        i = self._find(key)
        block = self._blocks[i]
        bisect.insort(block, key)
        self._sums[i] += value
        if len(block) > 2 * self.BLOCK:
            half = len(block) // 2
            self._blocks[i : i + 1] = [block[:half], block[half:]]
            self._sums[i : i + 1] = [
                sum(self._value[k] for k in block[:half]),
                sum(self._value[k] for k in block[half:]),
            ]

    def remove(self, key: tuple) -> None:
        """Take a key out."""
        value = self._value.pop(key)
        i = self._find(key)
        block = self._blocks[i]
        del block[bisect.bisect_left(block, key)]
        if block:
            self._sums[i] = sum(self._value[k] for k in block) if len(block) < 8 else self._sums[i] - value
        else:
            del self._blocks[i], self._sums[i]

    def first(self) -> tuple | None:
        """The smallest key, or None."""
        return self._blocks[0][0] if self._blocks else None

    def get(self, key: tuple) -> float:
        return self._value[key]

    def set(self, key: tuple, value: float) -> None:
        """Change a key's value."""
        self._sums[self._find(key)] += value - self._value[key]
        self._value[key] = value

    def upto(self, key: tuple) -> float:
        """The sum of the values of the keys up to ``key``, itself included."""
        if not self._blocks:
            return 0.0
        i = self._find(key)
        block = self._blocks[i]
        head = sum(self._sums[:i])
        return head + sum(self._value[k] for k in block[: bisect.bisect_right(block, key)])


class Pampering:
    """A tenant's share spent on its agents one after another in inner-tag order (preemptive, fluid):
    the schedule its agents' root keys are read from. Work in cost units, time in root V."""

    def __init__(self, v: float):
        self.v = v  # the root V it was last moved to
        self.total = 0.0  # work left, all agents
        self._left = OrderedSums()  # (order, seq) of the agents with work left -> their work left
        self._at: dict[str, tuple[float, int]] = {}  # agents with work left -> their key there
        self._by_key: dict[tuple[float, int], str] = {}
        self._work: dict[str, float] = {}  # agents known -> the work they were stamped with
        self._order: dict[str, float] = {}  # agents known -> their place in the order
        self._done_at: dict[str, float] = {}  # agents whose work is done -> the root V when it was
        self._gone: set[str] = set()  # agents that left the engine with work left here: forgotten when done
        self._seq = 0

    def advance(self, v: float, weight: float) -> None:
        """The tenant was served ``weight`` per unit of root V from ``self.v`` to ``v`` (while it had work)."""
        amount, self.v = (v - self.v) * weight, v
        work = self._left
        while amount > 0 and len(work):
            key = work.first()
            left = work.get(key)
            if left > amount:
                work.set(key, left - amount)
                self.total -= amount
                return
            amount -= left
            work.remove(key)
            agent = self._by_key.pop(key)
            del self._at[agent]
            if agent in self._gone:
                self._gone.discard(agent)
                self.forget(agent)
            else:
                self._done_at[agent] = v - amount / weight
        if not self._at:
            self.total = 0.0

    def put(self, agent: str, order: float, left: float, work: float) -> None:
        """The agent has ``left`` work to do, at ``order`` (its inner tag, or its arrival), ``work`` in all."""
        old = self._at.pop(agent, None)
        if old is not None:
            self.total -= self._left.get(old)
            self._left.remove(old)
            del self._by_key[old]
        self._work[agent] = work
        self._order[agent] = order
        if left > 0:
            self._done_at.pop(agent, None)
            key = (order, self._seq)
            self._seq += 1
            self._left.add(key, left)
            self._at[agent] = key
            self._by_key[key] = agent
            self.total += left
        else:
            self._done_at.setdefault(agent, self.v)

    def left(self, agent: str) -> float:
        key = self._at.get(agent)
        return 0.0 if key is None else self._left.get(key)

    def order(self, agent: str) -> float:
        """The agent's place in the order (its inner tag, or its arrival under ``chained``)."""
        return self._order.get(agent, math.inf)

    def work(self, agent: str) -> float:
        return self._work.get(agent, 0.0)

    def forget(self, agent: str) -> None:
        """The agent left the engine: drop it now, or once its work here is done."""
        if agent in self._at:
            self._gone.add(agent)
            return
        self._work.pop(agent, None)
        self._order.pop(agent, None)
        self._done_at.pop(agent, None)

    def key(self, agent: str, weight: float) -> float:
        """The root V at which the agent's work is done, if the tenant gets no more: V + the work left
        of it and of the agents ahead of it, over the tenant's weight."""
        at = self._at.get(agent)
        if at is None:
            return self._done_at.get(agent, self.v)
        return self.v + self._left.upto(at) / weight

    def head_key(self, weight: float) -> float:
        """The root V at which the first agent in the order is done if the tenant gets no more work."""
        first = self._left.first()
        return self.v if first is None else self.v + self._left.get(first) / weight
