"""KV Primer's engine: a Qt-free, high-level API over llama.cpp's KV cache.

    from app.engine import Engine, EngineConfig, Template, run_prompt
    engine = Engine(EngineConfig())                       # the default model
    tpl = Template.parse(open("rag.tmpl").read())
    state = engine.prime(tpl)                             # evaluate the static prefix once
    state.save("rag.kvstate")
    report = run_prompt(engine, tpl, {"question": "..."}, state=state)
    print(report.reuse_text(), report.speedup, report.verdict.describe())

This package imports no Qt: the CLI and the window both call it.
"""
from .benchmarks.bench_rows import BenchResult, BenchRow, bench_rows
from .errors import (CacheError, Cancelled, ContextError, ContextOverflowError, KvPrimerError,
                     MissingValuesError, ModelError, RowsError, StateFileError, StoreError,
                     TemplateError, TemplateSyntaxError)
from .engine_config import EngineConfig, ModelInfo
from .engine_status import EngineStatus
from .kv_engine import Engine
from .llama.model_files import default_model_path
from .states.prefix_state import PrefixState
from .runs.prompt_runs import (EXACT_REUSE_MODES, REUSE_MODES, GenerationConfig, PathResult, RunReport, TextDelta,
                          report_dict, run_prompt)
from .cache.radix_cache import CacheLimits
from .runs.verdict import Verdict
from .prompts.rows import Row, read_rows
from .task_state import Progress, TaskState
from .prompts.template import FilledPrompt, Template

__all__ = [
    "BenchResult", "BenchRow", "bench_rows", "Cancelled", "ContextError", "ContextOverflowError",
    "CacheError", "CacheLimits", "KvPrimerError", "MissingValuesError", "ModelError", "RowsError", "StateFileError",
    "StoreError", "TemplateError", "TemplateSyntaxError", "Engine", "EngineConfig", "EngineStatus",
    "ModelInfo",
    "default_model_path", "PrefixState", "EXACT_REUSE_MODES", "REUSE_MODES", "GenerationConfig",
    "PathResult", "RunReport", "TextDelta", "report_dict", "run_prompt", "Verdict", "Row", "read_rows", "Progress",
    "TaskState", "FilledPrompt", "Template",
]
