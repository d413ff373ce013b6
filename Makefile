# Thin wrapper over CMake + ctest. `make` builds; `make check` installs missing packages,
# fuzzes the parsers briefly, then builds and runs every test twice: optimised, then under
# ASan+UBSan. About 38 minutes on 2 cores in all (the last CI run; README).
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 20

.PHONY: all deps check check-fast check-asan fuzz fuzz-long demo bench bench-dp bench-parallel bench-moe bench-train bench-generate format clean

all:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

deps:
	./scripts/install-deps

# The fuzzers run first so that the last lines printed are ctest's summary.
check: deps
	./scripts/run-fuzz $(FUZZ_SECONDS)
	$(MAKE) check-fast
	$(MAKE) check-asan

check-fast: all
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

check-asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DCTITAN_SANITIZE=ON >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

fuzz:
	./scripts/run-fuzz $(FUZZ_SECONDS)

# Every target to FUZZ_EXECUTIONS executions (or an hour each), with a table at the end.
FUZZ_EXECUTIONS ?= 10000000
fuzz-long:
	./scripts/run-fuzz --executions $(FUZZ_EXECUTIONS) --max-time 3600

# The demo trains configs/debugmodel.toml from scratch on real text with the real Qwen3
# tokenizer, then plots the loss curve. A previous demo run is removed first.
DEMO_DIR ?= runs/debugmodel
demo: deps all
	./scripts/fetch-assets
	rm -rf $(DEMO_DIR)
	./$(BUILD)/ctitan train --config configs/debugmodel.toml --job.dump_folder $(DEMO_DIR)
	./$(BUILD)/ctitan plot --input $(DEMO_DIR)
	@echo
	@echo "demo outputs in $(DEMO_DIR)/:"
	@echo "  metrics.jsonl    one JSON line per logged step"
	@echo "  loss.png         the loss curve"
	@echo "  config.toml      the effective config"
	@echo "  checkpoint/      resumable checkpoints (rerun the same train command to resume)"
	@echo "  hf/              the final model as a Hugging Face folder (bf16 + tokenizer)"

bench: all
	/usr/bin/python3 bench/forward_backward.py

# MoE forward+backward (Qwen3-30B-A3B cut to 2 layers, 16 experts): the grouped and loop expert
# kernels against PyTorch, for the whole model step and for one MoE block alone.
bench-moe: all
	/usr/bin/python3 bench/moe.py --build $(BUILD)

# Data-parallel training over real OpenMPI ranks (np1 vs np2, overlap, ZeRO-1 vs replicated).
bench-train: all
	/usr/bin/python3 bench/train.py --build $(BUILD)

bench-dp: all
	/usr/bin/python3 bench/dp.py --build $(BUILD)

# Tensor parallelism against one process and FSDP (tokens/s, per-rank RSS, bytes per collective);
# MODE=cp, ep or pp: context, expert or pipeline parallelism's figures (issues 32-34).
MODE ?= tp
bench-parallel: all
	/usr/bin/python3 bench/parallel.py --build $(BUILD) --mode $(MODE)

# Generation at batch 1 on a dense flavor's geometry (GEOMETRY=0.6B, 1.7B or 4B): prefill MFU,
# decode against the memory-bandwidth bound, fp32 and bf16, with llama.cpp (node-llama-cpp's
# prebuilt CPU build, installed by bench/setup-llama) and a PyTorch eager KV-cache loop beside.
GEOMETRY ?= 0.6B
bench-generate: all
	./bench/setup-llama
	/usr/bin/python3 bench/generate.py --build $(BUILD) --bf16 --geometry $(GEOMETRY)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz
