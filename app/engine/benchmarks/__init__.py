"""Benchmark flows: a template's rows warm against cold (``bench_rows``), forked batches against
one-by-one runs (``forked_bench``), the prefix-length sweep (``prefix_sweep``), a server's
prompt cache with the same rows (``server_bench``), and writing results out (``bench_export``).
The window and the CLI call them through the session flows; ``bench/`` at the top of the
repository is the project's own harness (``make bench``), which measures the engine itself."""
