"""`make bench`: KV Primer's warm path against cold, against llama-cpp-python's own caches and
against the least any warm path can cost (the prefix already resident, nothing restored).

Run it with ``python -m bench`` (``--quick`` for a short development run). The engine under test
is ``app.engine``; nothing here is imported by the app or the tests' engine code.
"""
