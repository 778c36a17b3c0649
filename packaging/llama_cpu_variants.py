"""Choose which CPU variants llama.cpp's build compiles (run by the Makefile on the unpacked sdist).

llama.cpp's release set-up (`GGML_BACKEND_DL=ON GGML_CPU_ALL_VARIANTS=ON`) compiles its CPU
backend once per instruction-set level and loads the best one for the CPU at run time. On x86
it compiles fourteen levels, among them `sapphirerapids`, which enables AMX: GCC 12 miscompiles
ggml's AMX tile set-up and every batch of two or more tokens then crashes (llama.cpp issue
20824). This keeps only the levels named on the command line, so the build costs a few
variants instead of fourteen and AMX stays out.

    python packaging/llama_cpu_variants.py LLAMA_CPP_SOURCE_DIR haswell alderlake skylakex ...

It edits `ggml/src/CMakeLists.txt` in place and fails, changing nothing, when the x86 variant
list is not where this llama.cpp version keeps it or a named variant is not in it.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

_BLOCK = re.compile(r'(if \(GGML_SYSTEM_ARCH STREQUAL "x86"\)\n)(.*?)(\n\s*elseif ?\(GGML_SYSTEM_ARCH STREQUAL "ARM"\))',
                    re.S)
_VARIANT = re.compile(r"^\s*ggml_add_cpu_backend_variant\((\w+)[^)]*\)\s*$", re.M)


def keep_variants(cmake_text: str, wanted: list[str]) -> str:
    """The CMake text with only the ``wanted`` x86 variants, in llama.cpp's own order."""
    m = _BLOCK.search(cmake_text, cmake_text.find("if (GGML_CPU_ALL_VARIANTS)"))
    if cmake_text.find("if (GGML_CPU_ALL_VARIANTS)") < 0 or m is None:
        raise SystemExit("llama_cpu_variants: no x86 variant list in this llama.cpp's "
                         "ggml/src/CMakeLists.txt; update the Makefile's CPU_VARIANTS set-up")
    lines = {v.group(1): v.group(0).strip() for v in _VARIANT.finditer(m.group(2))}
    missing = [w for w in wanted if w not in lines]
    if missing:
        raise SystemExit(f"llama_cpu_variants: {', '.join(missing)} not among this llama.cpp's "
                         f"x86 variants ({', '.join(lines)})")
    kept = "\n".join(f"        {lines[name]}" for name in lines if name in wanted)
    return cmake_text[:m.start(2)] + kept + cmake_text[m.end(2):]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit("usage: llama_cpu_variants.py LLAMA_CPP_SOURCE_DIR VARIANT...")
    path = Path(argv[0]) / "ggml" / "src" / "CMakeLists.txt"
    path.write_text(keep_variants(path.read_text(), argv[1:]))
    print(f"llama.cpp CPU variants: {' '.join(argv[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
