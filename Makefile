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

test: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/orchestration.py

clean:
	rm -rf runs .mtbert_cache mlflow.db
