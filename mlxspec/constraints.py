"""Structured output: a grammar (JSON, or a JSON schema) that masks the target's distribution.

    grammar = format_grammar({"type": "object", ...})          # or "json"; FormatError if invalid
    constraint = Constraint(engine.grammar_tokenizer(), grammar)
    masks = constraint.masks(drafts)     # (k+1, V) bool: row i = tokens allowed after drafts[:i]
    constraint.commit(emitted_tokens)    # the matcher follows what was emitted

The engine is llguidance (measured here: ~76 us per mask over SmolLM2's 49k vocabulary on the 2-core
CI machine; it rolls back, which speculation needs). Verification masks every row it scores with
the grammar state after the drafts before it, so greedy output is exactly the constrained target's,
and rejection sampling against masked target probabilities stays exact in distribution: a draft
the grammar forbids has target probability 0 and is always rejected.
"""

from __future__ import annotations

import json

import numpy as np

from .errors import MlxspecError


class FormatError(MlxspecError, ValueError):
    """A `format` / `response_format` that is not a valid grammar: the caller's mistake (400)."""


ANY_JSON = {"type": "object"}  # Ollama's format "json": a JSON object, any shape
# Whitespace between JSON tokens as llama.cpp's schema grammars allow it (so Ollama's): one space, or
# one or two newlines and an indent of up to 20; bounded, so no model can pad forever.
WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})?"


def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
        import llguidance.numpy  # noqa: F401
    except ImportError as e:  # a dependency of mlxspec; missing only in a broken install
        raise FormatError("structured output needs llguidance: pip install llguidance") from e
    return llguidance


def format_grammar(fmt) -> str:
    """Ollama's `format` ("json" or a JSON schema object) -> an llguidance grammar (checked)."""
    llg = _llguidance()
    if fmt == "json":
        fmt = ANY_JSON
    if not isinstance(fmt, dict):
        raise FormatError('format must be "json" or a JSON schema object')
    fmt = {"x-guidance": {"whitespace_pattern": WHITESPACE}, **fmt}  # a schema's own x-guidance wins
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(fmt))
    except Exception as e:  # llguidance reports schema errors as exceptions of its own
        raise FormatError(f"invalid JSON schema in format: {e}") from None
    problem = llg.LLMatcher.validate_grammar(grammar)
    if problem:
        raise FormatError(f"invalid JSON schema in format: {problem}")
    return grammar


def grammar_tokenizer(hf_tokenizer, vocab_size: int, eos_ids: list[int]):
    """llguidance's view of a tokenizer (about a second to build: the engine keeps one)."""
    llg = _llguidance()
    return llg.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=list(eos_ids))


class Constraint:
    """One request's grammar state over the target's vocabulary."""

    def __init__(self, tokenizer, grammar: str):
        llg = _llguidance()
        self._np = llg.numpy
        self.matcher = llg.LLMatcher(tokenizer, grammar)
        self.vocab = tokenizer.vocab_size
        self._bits = self._np.allocate_token_bitmask(1, self.vocab)

    def _mask(self, matcher=None) -> np.ndarray:
        self._np.fill_next_token_bitmask(self.matcher if matcher is None else matcher, self._bits, 0)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.vocab].astype(bool)

    def masks(self, drafts: list[int]) -> np.ndarray:
        """(len(drafts) + 1, V): row i allows what may follow drafts[:i]. Rows past a draft the
        grammar refuses repeat the refusing row's mask (they are never used: that draft is rejected).
        The drafts are walked on a copy of the matcher (a microsecond), never consumed and rolled back: a
        matcher stopped at the grammar's end takes an EOS draft without counting it, so rolling back the
        validated count went one token too far (before tokens already emitted)."""
        if not drafts:
            return self._mask()[None]
        walk = self.matcher.deep_copy()
        valid = walk.validate_tokens(drafts)  # (consuming a refused token would stop the matcher for good)
        rows = []
        for i in range(valid + 1):
            rows.append(self._mask(walk))
            if i < valid:
                walk.consume_token(drafts[i])
        rows += [rows[-1]] * (len(drafts) + 1 - len(rows))
        return np.stack(rows)

    def commit(self, tokens: list[int]) -> None:
        """Advance past emitted tokens (each one allowed by the mask it was chosen under)."""
        for t in tokens:
            if self.matcher.is_stopped():
                return
            self.matcher.consume_token(t)
