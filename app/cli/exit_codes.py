"""The exit codes of `kvprimer`, defined once (the README lists them).

| code | meaning |
| 0 | done; every run that should be exact was |
| 1 | runs differ: a prefix or chain warm run diverged from its cold run, or forked rows'
      tokens differ from the same rows run one by one (compose is approximate by design and
      never counts) |
| 2 | bad input or usage: one line on stderr, nothing run |
| 3 | some benchmark rows failed (each row's error is in the table and the JSON); the others ran |
| 130 | interrupted (Ctrl+C; a benchmark first prints the rows it finished) |

When rows failed and others differed, 3 wins: the failed rows were not judged at all.
"""
from __future__ import annotations

from enum import IntEnum

from ..engine import EXACT_REUSE_MODES


class ExitCode(IntEnum):
    OK = 0
    RUNS_DIFFER = 1
    BAD_INPUT = 2
    ROWS_FAILED = 3
    INTERRUPTED = 130


def verdicts_code(verdicts, failed_rows: int = 0) -> ExitCode:
    """The exit code for runs judged: ``verdicts`` are (reuse mode, Verdict or None) pairs."""
    if failed_rows:
        return ExitCode.ROWS_FAILED
    if any(v is not None and v.equivalence == "diverged" and mode in EXACT_REUSE_MODES
           for mode, v in verdicts):
        return ExitCode.RUNS_DIFFER
    return ExitCode.OK
