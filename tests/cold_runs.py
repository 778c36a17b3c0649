"""What the run-cost, kept-cold-run and late-verify tests share: one small template with two
passages, its values, short generation, and a spy that lists every cold-reference evaluation."""
from __future__ import annotations

import pytest

from app.engine import GenerationConfig, Template
from app.engine.runs.cold_reference import ColdReference

TPL = Template.parse("<|im_start|>system\nyou are a helpful assistant. the context is:\n"
                     + "hello world of the answer and question. " * 3
                     + "\n<c1>\n<c2>\n<|im_end|>\n<|im_start|>user\n<question><|im_end|>\n")
VALS = {"c1": "the world is a question", "c2": "hello answer of the context", "question": "why?"}
GEN = GenerationConfig(max_tokens=4)


@pytest.fixture
def evaluations(monkeypatch):
    """The modes of every cold-reference evaluation ("cold", "oneshot"), in order."""
    seen: list[str] = []
    real = ColdReference.run

    def spy(self, tokens, marks, gen, max_new, task, mode, keep_logits):
        seen.append(mode)
        return real(self, tokens, marks, gen, max_new, task, mode, keep_logits)

    monkeypatch.setattr(ColdReference, "run", spy)
    return seen
