"""The llama.cpp that llama_cpp loads targets the portable baseline the Makefile builds for
(x86-64-v3: AVX2, FMA, F16C, BMI2): no AVX-512 and no AMX instruction anywhere in its code, and
its system info reports neither. An AVX-512 instruction would die with SIGILL on most desktop
CPUs; AMX built by GCC 12 crashes on the CPUs that have it (llama.cpp issue 20824).

The check disassembles the libraries themselves (objdump), so it holds whatever flags a
future Makefile passes; tests/test_packaging.py runs it on the bundle's copies too.
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


def loaded_llama_libraries() -> list[Path]:
    """The llama.cpp libraries mapped into this process once llama_cpp is imported."""
    import llama_cpp  # noqa: F401  (loads libllama and, through it, libggml*)
    from app.engine.llama.cpu_kernels import library_dir

    folder = library_dir()
    mapped = {Path(line.split()[-1]) for line in Path("/proc/self/maps").read_text().splitlines()
              if line.count(" ") >= 5 and "/" in line}
    libs = sorted(p for p in mapped if p.parent == folder and p.name.startswith(("libllama", "libggml")))
    return libs


def beyond_baseline(lib: Path, limit: int = 5) -> list[str]:
    """Up to ``limit`` disassembled lines of ``lib`` that use AVX-512 or AMX, with their function."""
    r = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    found, last = [], -1
    for m in _BAD.finditer(r.stdout):
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


def check_libraries(libs: list[Path]) -> dict[str, list[str]]:
    """{library name: offending lines} for the libraries that go past the baseline."""
    with ThreadPoolExecutor(max_workers=4) as pool:  # objdump runs in parallel processes
        results = dict(zip((p.name for p in libs), pool.map(beyond_baseline, libs)))
    return {name: lines for name, lines in results.items() if lines}


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


def test_loaded_llama_cpp_uses_nothing_past_x86_64_v3():
    libs = loaded_llama_libraries()
    names = {p.name.split(".so")[0] for p in libs}
    assert {"libllama", "libggml-cpu"} <= names, names  # the CPU kernels are what matters
    bad = check_libraries(libs)
    assert not bad, ("llama.cpp was compiled past the portable baseline (rebuild it with the "
                     f"Makefile's flags: `make setup`): {bad}")


def test_system_info_reports_the_baseline_and_no_amx():
    from app.engine.llama.cpu_kernels import build_facts

    features = set(build_facts().features)
    assert {"AVX", "AVX2", "FMA", "F16C", "BMI2"} <= features, features
    assert not features & {"AMX_INT8", "AVX512", "AVX512_VNNI", "AVX512_VBMI", "AVX512_BF16",
                           "AVX_VNNI"}, features
