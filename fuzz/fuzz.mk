# fuzz/fuzz.mk — coverage-guided fuzzing of every parser (libFuzzer), included
# by the Makefile. One harness per parser, fuzz/fuzz_<name>.c, each built with
# clang's fuzzer runtime and AddressSanitizer + UBSan; the seeds come from
# fuzz/make_seeds.c (the project's own writers); fuzz/fuzz.sh runs them.
# docs/testing.md ("Fuzzing") says what each harness checks.
#
#   make fuzz            each harness for FUZZ_S seconds (60), corpus kept in fuzz/.build/corpus/
#   make test-fuzz       the committed regressions replayed, each harness a few seconds on its seeds,
#                        the planted bugs caught (part of make test; ~1.5 min)
#   make fuzz-pending    the inputs of fuzz/pending/ (known bugs, not fixed yet) under FUZZ_STRICT=1

## ---- fuzzing (fuzz/fuzz.mk)

FUZZ_CC ?= clang
FUZZ_S ?= 60
# 1: also the oracles of what the parsers must refuse and do not yet (fuzz/pending/)
FUZZ_STRICT ?= 0
FUZZ_HARNESSES = model model_bf16 shard tokenizer merges text safetensors eval eval_jsonl state slot calib
FUZZ_BUILD = fuzz/.build$(if $(filter 1,$(FUZZ_STRICT)),/strict)
# -fsanitize=fuzzer             libFuzzer's main and coverage instrumentation (clang's libclang_rt.fuzzer)
# -fsanitize=address,undefined  every out-of-bounds access, use after free, leak, overflow, bad shift or cast
# -fno-sanitize-recover=undefined  a UBSan report stops the run (and libFuzzer saves the input)
# -O1 -g                        fast enough, readable reports
# -DFUZZ_STRICT                 the switch above
# (no -fopenmp: one thread, so a run is reproducible from its input)
FUZZ_CFLAGS = -O1 -g -fno-omit-frame-pointer -std=c11 -Wall -Wextra -Wno-unused-function -Wno-unknown-pragmas \
	-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DFUZZ_STRICT=$(FUZZ_STRICT)
FUZZ_DEPS = train_gpt.c $(GPTC_H) fuzz/fuzz_common.h fuzz/fuzz_vocab.h
FUZZ_BINS = $(patsubst %,$(FUZZ_BUILD)/fuzz_%,$(FUZZ_HARNESSES))

$(FUZZ_BUILD)/fuzz_%: fuzz/fuzz_%.c $(FUZZ_DEPS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $< -lm -pthread

# the planted bugs make test-fuzz must catch (fuzz/fuzz.sh)
fuzz/.build/planted_oracle: fuzz/fuzz_model.c $(FUZZ_DEPS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -DFUZZ_PLANT_ORACLE -o $@ $< -lm -pthread
fuzz/.build/planted_overflow: fuzz/fuzz_shard.c $(FUZZ_DEPS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -DFUZZ_PLANT_OVERFLOW -o $@ $< -lm -pthread

# the seeds: written by the project's writers (no sanitizers needed)
fuzz/.build/make_seeds: fuzz/make_seeds.c $(FUZZ_DEPS)
	@mkdir -p $(@D)
	$(FUZZ_CC) -O1 -g -std=c11 -Wall -Wextra -Wno-unused-function -Wno-unknown-pragmas -o $@ $< -lm -pthread
fuzz/.build/seeds/.done: fuzz/.build/make_seeds
	rm -rf fuzz/.build/seeds
	fuzz/.build/make_seeds fuzz/.build/seeds
	@touch $@

# clang and its fuzzer runtime present? (Debian: clang and libclang-rt-14-dev, scripts/install_deps.sh)
FUZZ_OK = $(shell echo 'int LLVMFuzzerTestOneInput(const char* d, unsigned long n) { (void)d; (void)n; return 0; }' | \
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -x c - -o /dev/null 2>/dev/null && echo 1)
FUZZ_MISSING = $(FUZZ_CC) with libFuzzer not found (clang -fsanitize=fuzzer does not link): apt-get install clang libclang-rt-14-dev

fuzz-build: $(FUZZ_BINS) fuzz/.build/seeds/.done

## make fuzz            every parser's libFuzzer harness for FUZZ_S seconds (60) each; FUZZ_STRICT=1 adds the pending oracles
fuzz:
	@[ "$(FUZZ_OK)" = 1 ] || { echo "error: $(FUZZ_MISSING)"; exit 1; }
	@$(MAKE) --no-print-directory fuzz-build
	FUZZ_BUILD=$(FUZZ_BUILD) fuzz/fuzz.sh fuzz $(FUZZ_S) $(FUZZ_HARNESSES)

## make test-fuzz       the fuzz regressions replayed, each harness a few seconds on its seeds, planted bugs caught
test-fuzz:
	@if [ "$(FUZZ_OK)" != 1 ]; then echo "test-fuzz: SKIPPED, $(FUZZ_MISSING)"; exit 0; fi; \
	$(MAKE) --no-print-directory fuzz-build fuzz/.build/planted_oracle && \
	FUZZ_BUILD=$(FUZZ_BUILD) fuzz/fuzz.sh test $${FUZZ_TEST_S:-4} $(FUZZ_HARNESSES)

## make fuzz-pending    the known-bug inputs of fuzz/pending/ under FUZZ_STRICT=1: each fails until its bug is fixed
fuzz-pending:
	@[ "$(FUZZ_OK)" = 1 ] || { echo "error: $(FUZZ_MISSING)"; exit 1; }
	@$(MAKE) --no-print-directory fuzz-build FUZZ_STRICT=1
	FUZZ_BUILD=fuzz/.build/strict fuzz/fuzz.sh pending 0 $(FUZZ_HARNESSES)

.PHONY: fuzz fuzz-build test-fuzz fuzz-pending
