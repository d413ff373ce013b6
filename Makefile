# Thin wrapper over CMake + ctest. `make` builds; `make check` installs missing packages,
# fuzzes the parsers briefly, then builds and runs every test twice: optimised, then under
# ASan+UBSan.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 20

.PHONY: all deps check check-fast check-asan fuzz demo bench format clean

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

demo: deps all
	@echo "make demo: training arrives with the trainer (issue 4); for now this verifies a tiny"
	@echo "model end to end. Try: ./$(BUILD)/ctitan --help"

bench: all
	/usr/bin/python3 bench/forward_backward.py

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz
