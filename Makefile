# The two commands of the README. Both set up .venv on first use (scripts/setup.sh).
.PHONY: setup demo test gpu-test
setup:
	@bash scripts/setup.sh
demo: setup
	.venv/bin/hot demo
test: setup
	.venv/bin/python -m pytest -q
gpu-test: setup
	.venv/bin/python -m pytest -q -m gpu tests/fast
