"""KV Primer's window (PySide6): thin views over app.engine.

The window makes millions of calls into Qt over a long session (the KV dock alone renames 64
sequence entries on every refresh), so it needs bindings that keep reference counts right.
PySide6 6.12.0 does not: every call of a C++ method that returns nothing drops a reference to
``None``, and every ``Signal.emit()`` one to ``True``; on Python 3.11, where neither is
immortal, the interpreter then aborts ("Fatal Python error: none_dealloc" or "bool_dealloc")
in the middle of a session. pyproject.toml pins a release without the bug, and
tests/ui/test_gui_soak.py drives the real window through thousands of refreshes and a benchmark
to check that the counts of ``None``, ``True`` and ``False`` stay flat.
"""
