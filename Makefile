# The two front-door commands: `make demo` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Pinned so pip takes the CPU wheel here and never resolves a CUDA build by accident.
# GPU users: make demo TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH  ?= torch==2.13.0

.PHONY: demo test install bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/mtbert sweep run sweeps/smoke.yaml
	$(BIN)/mtbert leaderboard --experiment smoke
	@echo "Browse every run: $(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db"

# Workers for the suite (pytest-xdist): its slow tests are mostly processes waiting on one
# another (Ray starting, a server coming back), so a 2-core runner keeps 3 busy; tests that
# share a costly fixture stay on one worker, slow ones start first (tests/conftest.py).
# TEST_WORKERS=0: one process, as before.
TEST_WORKERS ?= 3
# Tests marked solo start Ray heads of their own: beside the parallel pass, a job's driver on
# one head was seen joining another Ray on the machine, so they run after it, one at a time.
test: install
	@start=$$(date +%s); \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not solo"; rc=$$?; \
	$(BIN)/python -m pytest -q -m solo; solo=$$?; [ $$rc -ne 0 ] || rc=$$solo; \
	took=$$(( $$(date +%s) - start )); echo "make test: $$((took / 60)) min $$((took % 60)) s"; exit $$rc

bench: install
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/orchestration.py

clean:
	rm -rf runs .mtbert_cache mlflow.db
