"""Phrase banks: the text of generated prompts. Each workflow's vocabulary (topics, subjects, verbs,
objects in ``workflows.json``) makes a bank of every subject-verb-object sentence; a prompt's body is
sentences drawn from it, cut to the words its length asks for.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Bank:
    """All subject-verb-object sentences of one workflow, with their word counts."""

    topics: tuple[str, ...]
    sentences: np.ndarray  # object array of str
    words: np.ndarray  # int array, words per sentence
    mean_words: float


def make_bank(vocab: dict) -> Bank:
    sentences = [f"{s} {v} {o}." for s, v, o in itertools.product(vocab["subjects"], vocab["verbs"], vocab["objects"])]
    words = np.array([len(s.split()) for s in sentences], dtype=np.int64)
    return Bank(tuple(vocab["topics"]), np.array(sentences, dtype=object), words, float(words.mean()))


def bank_text(bank: Bank, n_words: int, rng: np.random.Generator) -> str:
    """About ``n_words`` words of sentences drawn from the bank."""
    if n_words <= 0:
        return ""
    parts: list[str] = []
    need = n_words
    while need > 0:
        idx = rng.integers(0, len(bank.sentences), size=int(need / bank.mean_words * 1.25) + 2)
        cum = np.cumsum(bank.words[idx])
        cut = int(np.searchsorted(cum, need))
        if cut == len(idx):
            parts.extend(bank.sentences[idx].tolist())
            need -= int(cum[-1])
            continue
        chosen = bank.sentences[idx[: cut + 1]].tolist()
        excess = int(cum[cut]) - need
        if excess:
            last = chosen[-1].split()
            chosen[-1] = " ".join(last[: len(last) - excess])
        parts.extend(chosen)
        need = 0
    return " ".join(parts)


def cut_words(text: str, tokens: int, keep: int) -> str:
    """The first ``keep / tokens`` of ``text``'s words (an output shortened to fit the context)."""
    if keep >= tokens:
        return text
    words = text.split()
    return " ".join(words[: max(1, len(words) * keep // max(tokens, 1))])


SHARED_WORDS = (
    "the",
    "agent",
    "reads",
    "each",
    "file",
    "before",
    "it",
    "edits",
    "and",
    "runs",
    "tests",
    "after",
    "every",
    "change",
    "keeps",
    "notes",
    "on",
    "what",
    "failed",
    "why",
)


def shared_text(name: str, tokens: int) -> str:
    """The text a ``shared`` context segment stands for: about ``tokens`` words, the same for the same
    name and length wherever it appears (a system prompt, a document), so that an engine's prefix
    cache sees one text."""
    rng = np.random.default_rng(zlib.crc32(name.encode("utf-8")))
    words = rng.choice(len(SHARED_WORDS), size=max(int(tokens), 1))
    return f"[{name}] " + " ".join(SHARED_WORDS[w] for w in words) + "\n"
