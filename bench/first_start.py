"""How long the window's engine takes to become usable, against a plain llama-cpp-python load.

Each start runs in a fresh Python process, timed from before the imports to a usable model:
- ``first_start_s``: the engine as the window opens it (``measure_kernels_later``), with an empty
  cache folder: no crash-check verdict and no kernel measurement yet (the crash check runs; the
  measurement is left for idle time);
- ``later_start_s``: the same again, with what the first start cached;
- ``llamacpp_load_s``: ``llama_cpp.Llama(model_path=...)``, the usual alternative's load (after
  loading the CPU backend for this CPU, as the engine does, when the build has one per level).
The ratio ``first_start_vs_llamacpp_load`` is first_start_s / llamacpp_load_s (medians).

`python -m bench.first_start [--repeats 3] [--model PATH]`; `make bench` runs it too.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OURS = """
import time; t0 = time.perf_counter()
from app.engine import Engine, EngineConfig
e = Engine(EngineConfig(model_path={path!r}), measure_kernels_later=True)
t = time.perf_counter() - t0
import json; print(json.dumps({{"s": t, "kernels": e.kernels.how, "crash_check": e.cpu_kernels.probe}}))
e.close()
"""
THEIRS = """
import time; t0 = time.perf_counter()
import llama_cpp
from pathlib import Path
from app.cpu_backends import load_cpu_backend  # a multi-level build loads no CPU backend itself
load_cpu_backend(Path(llama_cpp.llama_cpp._lib._name).resolve().parent)
m = llama_cpp.Llama(model_path={path!r}, verbose=False)
t = time.perf_counter() - t0
import json; print(json.dumps({{"s": t}}))
"""


def _timed(code: str, cache_home: Path) -> dict:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    env.pop("KVPRIMER_FLASH_ATTN", None)  # "auto", as a user starts
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError((r.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(model_path: str | None = None, repeats: int = 3) -> dict:
    if model_path is None:
        from app.engine import default_model_path

        model_path = str(default_model_path())
    first, later, theirs, notes = [], [], [], {}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="kvprimer-first-start-") as tmp:
            got = _timed(OURS.format(path=model_path), Path(tmp))  # nothing cached yet
            first.append(got["s"])
            notes = {"kernels_at_first_start": got["kernels"], "crash_check": got["crash_check"]}
            later.append(_timed(OURS.format(path=model_path), Path(tmp))["s"])
        with tempfile.TemporaryDirectory(prefix="kvprimer-first-start-") as tmp:
            theirs.append(_timed(THEIRS.format(path=model_path), Path(tmp))["s"])
    med = statistics.median
    return {"model": model_path, "repeats": repeats, "first_start_s": round(med(first), 3),
            "later_start_s": round(med(later), 3), "llamacpp_load_s": round(med(theirs), 3),
            "first_start_vs_llamacpp_load": round(med(first) / med(theirs), 3),
            "later_start_vs_llamacpp_load": round(med(later) / med(theirs), 3),
            "samples": {"first": first, "later": later, "llamacpp": theirs}, **notes}


def format_line(r: dict) -> str:
    return (f"first start {r['first_start_s']:.2f} s (later {r['later_start_s']:.2f} s) against "
            f"llama_cpp.Llama load {r['llamacpp_load_s']:.2f} s: "
            f"{r['first_start_vs_llamacpp_load']:.2f}x; kernels at first start: "
            f"{r.get('kernels_at_first_start')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.first_start", description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", help="GGUF file (default: the default model)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON")
    args = ap.parse_args(argv)
    r = run(args.model, args.repeats)
    print(format_line(r))
    if args.out:
        args.out.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
