# Two commands: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench fuzz fuzz-onnx fuzz-grad tables clean
N ?= 5000
TARGET ?= cpu

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev,cuda]" || $(BIN)/python -m pip install -q -e ".[dev]"
	@# PyTorch (CPU) is optional: the anchor of benchmarks and of a few comparison tests. Only a
	@# wheel already on this machine (PIP_FIND_LINKS) is used, never a multi-GB download.
	-$(BIN)/python -m pip install -q --no-index --no-deps "torch==2.13.0" 2>/dev/null && \
		$(BIN)/python -m pip install -q "torch==2.13.0"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/quickstart.py

test: $(STAMP)
	$(BIN)/ruff check tcc tests benchmarks examples
	$(BIN)/python -m pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check tcc tests benchmarks examples

# The differential fuzzer (tests/fuzz): N random programs against the reference, in worker processes.
fuzz: $(STAMP)
	PYTHONPATH=tests $(BIN)/python -m fuzz -n $(N) --target $(TARGET) --schedules 1

# The ONNX differential fuzzer (tests/fuzz/onnx): N random ONNX graphs, tcc against onnxruntime.
fuzz-onnx: $(STAMP)
	PYTHONPATH=tests $(BIN)/python -m fuzz.onnx -n $(N)

# tcc.grad against finite differences (float64), first and second order: make fuzz-grad N=2000.
fuzz-grad: $(STAMP)
	PYTHONPATH=tests $(BIN)/python -m fuzz --grad -n $(N) --orders 2

bench: $(STAMP)
	$(BIN)/python benchmarks/latency.py
	$(BIN)/python benchmarks/compile_time.py
	$(BIN)/python benchmarks/cpu.py
	$(BIN)/python benchmarks/conv.py

tables: $(STAMP)
	$(BIN)/python -c "from tcc.frontend.parser import write_tables; write_tables()"

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
