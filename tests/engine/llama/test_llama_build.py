"""The llama.cpp that llama_cpp loads is portable, and its faster CPU levels are used safely.

The Makefile builds llama.cpp's CPU backend once per instruction-set level (CPU_VARIANTS) and
app/cpu_backends.py loads the best one for the CPU. What must hold:
- the libraries every CPU loads (libllama, libggml, libggml-base) and the baseline level
  (`haswell`, x86-64-v3: AVX2, FMA, F16C, BMI2) contain no AVX-512 and no AMX instruction: an
  AVX-512 instruction dies with SIGILL on most desktop CPUs;
- no level contains AMX: built by GCC 12 it crashes on the CPUs that have it (llama.cpp issue
  20824);
- the level loaded is one this CPU has every feature of, and its system info says which.
A llama-cpp-python built elsewhere with one CPU backend linked in is held to the baseline.

The check disassembles the libraries themselves (objdump), so it holds whatever flags a
future Makefile passes; tests/project/test_packaging.py runs it on the bundle's copies too.
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None,
    reason="an x86-64 check that needs objdump (binutils)")

# AT&T syntax, as objdump prints it. AVX-512 needs EVEX, which shows as zmm registers, xmm/ymm
# 16-31, mask registers (k0-k7, {%k1} merging, {z} zeroing), embedded broadcast ({1to16}) or a
# mnemonic that only EVEX encodes; AMX shows as tmm registers and the tile instructions.
_EVEX_ONLY = (r"vpternlog[dq]|vperm[it]2\w+|vpcompress\w|vcompressp[sd]|vpexpand\w|vexpandp[sd]|"
              r"vpconflict[dq]|vplzcnt[dq]|vrndscale\w+|vscalef\w+|vgetexp\w+|vgetmant\w+|"
              r"vfixupimm\w+|vrange\w+|vreduce\w+|vfpclass\w+|valign[dq]|vdbpsadbw|"
              r"vpmultishiftqb|vpopcnt[bwdq]|vpshl?dv?[wdq]|vpshrdv?[wdq]|vpmov[dq]?[bwdq]2m|"
              r"vpmovm2[bwdq]|vpbroadcastm\w+|vcvt\w*2u\w+|vcvtu\w+2\w+|vdpbf16ps|vcvtne2ps2bf16|"
              r"vpermw|vpermb|vpsravw|vpsrlvw|vpsllvw|k(?:mov|and|andn|or|xor|xnor|not|test|"
              r"ortest|shiftl|shiftr|add|unpck)[bwdq]")
_AMX = r"ldtilecfg|sttilecfg|tilerelease|tilezero|tileloadd\w*|tilestored|tdp\w+"
_BAD = re.compile(rf"%zmm\d|%[xy]mm(?:1[6-9]|2\d|3[01])\b|%k[0-7]\b|\{{z\}}|\{{1to\d+\}}|%tmm\d"
                  rf"|\t(?:{_EVEX_ONLY}|{_AMX})\b")
_AMX_ONLY = re.compile(rf"%tmm\d|\t(?:{_AMX})\b")
BASELINE_LEVEL = "haswell"  # the Makefile's portable level: what a CPU without newer levels loads


def loaded_llama_libraries() -> list[Path]:
    """The llama.cpp libraries mapped into this process once llama_cpp is imported."""
    import llama_cpp  # noqa: F401  (loads libllama and, through it, libggml*)
    from app.engine.llama.cpu_kernels import library_dir

    folder = library_dir()
    mapped = {Path(line.split()[-1]) for line in Path("/proc/self/maps").read_text().splitlines()
              if line.count(" ") >= 5 and "/" in line}
    libs = sorted(p for p in mapped if p.parent == folder and p.name.startswith(("libllama", "libggml")))
    return libs


def beyond_baseline(lib: Path, limit: int = 5, pattern: re.Pattern = _BAD) -> list[str]:
    """Up to ``limit`` disassembled lines of ``lib`` that use AVX-512 or AMX (or what
    ``pattern`` matches), with their function."""
    r = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    found, last = [], -1
    for m in pattern.finditer(r.stdout):
        start = r.stdout.rfind("\n", 0, m.start()) + 1
        if start == last:  # several matches on one line
            continue
        last = start
        head = r.stdout.rfind(">:\n", 0, start)
        function = r.stdout[r.stdout.rfind("<", 0, head) + 1:head] if head > 0 else "?"
        found.append(f"{function}: {r.stdout[start:r.stdout.find(chr(10), m.end())].strip()}")
        if len(found) >= limit:
            break
    return found


def baseline_libraries(folder: Path) -> list[Path]:
    """The libraries any CPU loads: llama, ggml, ggml-base and the CPU backend's baseline level
    (or the one CPU backend of a build without levels)."""
    names = ("libllama", "libggml", "libggml-base", "libggml-cpu", f"libggml-cpu-{BASELINE_LEVEL}")
    # versioned names (libggml-base.so.0) are links to, or copies of, the same library
    return sorted({p.resolve() for p in folder.iterdir() if ".so" in p.name
                   and p.name.split(".so")[0] in names})


def level_libraries(folder: Path) -> list[Path]:
    """The CPU backend's levels beyond the baseline (empty for a build without levels)."""
    return sorted(p for p in folder.glob("libggml-cpu-*.so") if p.name != f"libggml-cpu-{BASELINE_LEVEL}.so")


def check_libraries(libs: list[Path], pattern: re.Pattern = _BAD) -> dict[str, list[str]]:
    """{library name: offending lines} for the libraries with instructions ``pattern`` matches
    (by default: past the baseline)."""
    with ThreadPoolExecutor(max_workers=4) as pool:  # objdump runs in parallel processes
        results = dict(zip((p.name for p in libs), pool.map(lambda p: beyond_baseline(p, pattern=pattern), libs)))
    return {name: lines for name, lines in results.items() if lines}


def check_folder(folder: Path) -> dict[str, list[str]]:
    """Every rule of the module docstring for the llama.cpp libraries in ``folder``."""
    base = baseline_libraries(folder)
    assert {p.name.split(".so")[0] for p in base} >= {"libllama", "libggml-base"}, base
    assert any(p.name.startswith("libggml-cpu") for p in base), f"no baseline CPU backend in {folder}"
    return {**check_libraries(base), **check_libraries(level_libraries(folder), _AMX_ONLY)}


def test_the_patterns_catch_avx512_and_amx_and_pass_avx2():
    # lines as objdump prints them (checked against a -march=native build of ggml on an AMX Xeon)
    bad = ["  1c:\tvmovups %zmm0,(%rdi)", "  2a:\tvpaddd %ymm17,%ymm1,%ymm2",
           "  30:\tkmovw  %k1,%eax", "  38:\tvaddps %ymm1,%ymm2,%ymm3{%k1}{z}",
           "  40:\tvpternlogd $0xff,%ymm1,%ymm1,%ymm1", "  48:\tldtilecfg (%rsp)",
           "  50:\ttdpbssd %tmm2,%tmm1,%tmm0", "  58:\tvbroadcastss (%rax){1to16},%zmm1",
           "  60:\tvpmovb2m %xmm1,%k2"]
    good = ["  1c:\tvmovups %ymm0,(%rdi)", "  2a:\tvfmadd231ps %ymm15,%ymm1,%ymm2",
            "  30:\tvpmaddubsw %ymm1,%ymm2,%ymm3", "  40:\tvcvtph2ps %xmm1,%ymm2",
            "  48:\tshlx %rax,%rbx,%rcx", "  50:\tmovq %xmm1,%rax", "  58:\tvpermd %ymm1,%ymm2,%ymm3",
            "  60:\tcall 1030 <kmalloc@plt>"]
    assert all(_BAD.search(line) for line in bad), [x for x in bad if not _BAD.search(x)]
    assert not any(_BAD.search(line) for line in good), [x for x in good if _BAD.search(x)]


def test_the_amx_pattern_passes_avx512():
    assert _AMX_ONLY.search("  50:\ttdpbssd %tmm2,%tmm1,%tmm0")
    assert not _AMX_ONLY.search("  1c:\tvmovups %zmm0,(%rdi)")


def test_llama_cpp_libraries_keep_the_baseline_portable_and_amx_out():
    import llama_cpp  # noqa: F401
    from app.engine.llama.cpu_kernels import library_dir

    bad = check_folder(library_dir())
    assert not bad, ("llama.cpp was compiled past the portable baseline, or with AMX (rebuild it "
                     f"with the Makefile's flags: `make setup`): {bad}")


def test_the_loaded_cpu_level_is_one_this_cpu_has():
    from app.engine.llama.cpu_kernels import build_facts, cpu_facts
    from app.engine.llama.llama_backend import cpu_backend

    backend = cpu_backend()
    features = set(build_facts().features)
    assert {"AVX", "AVX2", "FMA", "F16C", "BMI2"} <= features, features
    assert "AMX_INT8" not in features
    flags = cpu_facts().flags
    if not flags:
        pytest.skip("no CPU flags to compare with (/proc/cpuinfo)")
    needs = {"AVX512": "avx512f", "AVX512_VNNI": "avx512_vnni", "AVX512_VBMI": "avx512vbmi",
             "AVX512_BF16": "avx512_bf16", "AVX_VNNI": "avx_vnni", "AVX2": "avx2", "FMA": "fma"}
    missing = [f for f, flag in needs.items() if f in features and flag not in flags]
    assert not missing, f"{backend.describe()} uses {missing}, which this CPU lacks"
    if backend.built:  # a build of levels: the one in use is mapped and named
        assert backend.variant in backend.built, backend
        libs = loaded_llama_libraries()
        assert f"libggml-cpu-{backend.variant}.so" in {p.name for p in libs}, libs
        if "avx512f" in flags and "avx512vbmi" in flags and "avx512_vnni" in flags:
            assert "AVX512" in features, f"an AVX-512 CPU runs {backend.describe()}"
