"""The token sequences every path is given: the RAG example's prefix and filled rows.

Everything is tokenized once, by our engine's tokenizer, and every path (ours and
llama-cpp-python's) is fed these exact id lists, so all of them evaluate the same suffix tokens.
The boundary of a row is where its tokens leave the prefix state's tokens (the last prefix token
can merge with a value's first characters), capped so at least one token is evaluated. Its marks
are where the prompt's later segments start (prompt_segments): a chain-mode run starts a batch
there; prefix-mode runs, and every path here, evaluate the suffix in n_batch batches.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.engine import Engine, Template, read_rows
from app.engine.llama.batch_policy import batch_starts
from app.engine.prompts.prompt_tokens import common_prefix
from app.engine.prompts.prompt_segments import prompt_segments
from app.resources_path import examples_dir

# A prompt unrelated to the template, evaluated between warm runs so that a context does not
# already hold the prefix (llama-cpp-python would otherwise reuse it in place).
UNRELATED_TEXT = "Write a haiku about autumn leaves falling on a quiet pond."


@dataclass(frozen=True)
class RowTokens:
    number: int  # the row as the user sees it in the CSV (header is row 1)
    tokens: list[int]
    boundary: int  # tokens[:boundary] come from the prefix state
    marks: tuple[int, ...] = ()  # where later segments start (absolute positions > boundary)
    values: dict | None = None  # the row's values (the reuse section runs them through the engine)

    @property
    def suffix(self) -> list[int]:
        return self.tokens[self.boundary:]

    def suffix_starts(self, n_batch: int) -> list[int]:
        """Where the suffix's decode batches start: as a warm run of the app in prefix mode
        evaluates it (n_batch batches)."""
        return batch_starts(self.boundary, len(self.tokens), n_batch)


@dataclass(frozen=True)
class Workload:
    template: Template
    prefix: list[int]  # the static prefix's tokens, as primed
    rows: list[RowTokens]
    unrelated: list[int]


def boundary_of(prefix: list[int], tokens: list[int]) -> int:
    return min(common_prefix(prefix, tokens), len(tokens) - 1)


def load_workload(engine: Engine, n_rows: int, template_path: Path | None = None,
                  rows_path: Path | None = None) -> Workload:
    ex = examples_dir()
    tpl = Template.parse((template_path or ex / "rag.tmpl").read_text(encoding="utf-8"))
    rows = read_rows(rows_path or ex / "rag-rows.csv", tpl.placeholders)[:n_rows]
    prefix = engine.tokenize(tpl.prefix_prompt())
    out = []
    for row in rows:
        toks = engine.tokenize(tpl.fill(row.values))
        segs = prompt_segments(engine.tokenize, tpl, row.values, toks)
        b = min(boundary_of(prefix, toks), segs[0].end)
        marks = tuple(s.start for s in segs if s.start > b)
        out.append(RowTokens(row.number, toks, b, marks, dict(row.values)))
    unrelated = engine.model.tokenize(UNRELATED_TEXT)
    if unrelated[:1] == prefix[:1]:  # it must differ from the first token on
        raise ValueError("the unrelated prompt starts like the prefix; change UNRELATED_TEXT")
    return Workload(tpl, prefix, out, unrelated)


def truncated(prefix: list[int], row: RowTokens, n: int) -> RowTokens:
    """The row's suffix after only the first ``n`` prefix tokens: the sweep's prompts."""
    shift = n - row.boundary
    return RowTokens(row.number, prefix[:n] + row.suffix, n, tuple(m + shift for m in row.marks))
