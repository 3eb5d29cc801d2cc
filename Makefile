# The two commands of the README: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL_DIR ?= models/digits
HOST ?= 127.0.0.1
PORT ?= 8000
FORTUNES_CONFIGURATIONS := sensing0; sensing1(n=150); sensing1(n=150) [C=3]; sensing2(n_words=150); linear; sensing1(n=150) + linear

.DEFAULT_GOAL := help
.PHONY: help setup train run serve test lint bench bench-text bench-search report report-fortunes report-fortunes-search clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-22s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

setup: $(VENV)/.installed  ## create .venv and install the project with its dev tools

train: setup  ## train the default digits model, its search model and catalogue unless there
	$(BIN)/python -m training fit --data digits --out $(MODEL_DIR) --if-missing
	$(BIN)/python -m training dictionary --model $(MODEL_DIR) --if-missing
	$(BIN)/python -m training index --model $(MODEL_DIR) --if-missing

run: train  ## set up, train the default model if missing, serve it on $(HOST):$(PORT)
	MODEL_DIR=$(MODEL_DIR) HOST=$(HOST) PORT=$(PORT) $(BIN)/python -m service.api

serve: setup  ## serve $(MODEL_DIR) without training
	MODEL_DIR=$(MODEL_DIR) HOST=$(HOST) PORT=$(PORT) $(BIN)/python -m service.api

test: setup  ## set up and run the whole test suite
	$(BIN)/python -m pytest

bench: train  ## the prediction and grid-kernel benchmarks (medians and ratios)
	$(BIN)/python benchmarks/bench_classify.py --http
	$(BIN)/python benchmarks/bench_grid_kernels.py --hog

bench-text: setup  ## the sensing-kernel and text /classify benchmark (needs the fortunes packages)
	$(BIN)/python benchmarks/bench_sensing.py

bench-search: setup  ## /search at N = 1,000,000: the kernel against numpy and FAISS, then HTTP
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python benchmarks/bench_search.py
	$(BIN)/python benchmarks/bench_search_http.py

report: train  ## rebuild the digits report and its search evaluation in docs/reports/digits (6 min)
	$(BIN)/python -m training report --out docs/reports/digits
	$(BIN)/python -m training evaluate-search --model $(MODEL_DIR) --out docs/reports/digits/search

report-fortunes: setup  ## rebuild the text report in docs/reports/fortunes (about 40 min)
	$(BIN)/python -m training report --data fortunes --configurations "$(FORTUNES_CONFIGURATIONS)" \
	    --basis-sizes 25,250 --strategies index --normalizations besvm --folds 2 --repeats 3 \
	    --out docs/reports/fortunes
	$(MAKE) report-fortunes-search

report-fortunes-search: setup  ## mAP against sparsity on fortunes (sensing1 features, 25 per class)
	$(BIN)/python -m training fit --data fortunes --similarity 'sensing1(n=150)' \
	    --basis-per-class 25 --out models/fortunes-25 --if-missing --quiet
	$(BIN)/python -m training evaluate-search --model models/fortunes-25 \
	    --out docs/reports/fortunes/search

lint: setup  ## ruff: lint and formatting
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:  ## remove the virtual environment, trained models and caches
	rm -rf $(VENV) models .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
