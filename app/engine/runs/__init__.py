"""Runs: warm and cold paths, compose, generation, the verdict, benchmarks, sweeps."""
