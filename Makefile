# entropyd + sigmatrain. `make` builds both programs into build/.
# `make test` runs every test, `make bench` every benchmark, `make demo` the
# main job. `make test SANITIZE=address,undefined` builds into build/san and
# runs the whole suite under the sanitizers.

CC      ?= cc
SANITIZE ?=
ifeq ($(SANITIZE),)
BUILD   ?= build
OPT     ?= -O2
else
BUILD   ?= build/san
OPT     ?= -O1
endif

# Flags from pkg-config.  The goals that install packages first (demo, test,
# bench, experiments, stress) run scripts/deps.sh and then a second make, which
# reads these flags only after the packages exist (a fresh machine has no
# pkg-config and no libraries when this make starts).  Every other goal that
# compiles needs them now, and says so if they are missing.
PKGS       := libmicrohttpd libcjson sqlite3 openblas libcurl libzstd zlib
PKG_CONFIG ?= pkg-config
DEPS       ?= scripts/deps.sh
NO_BUILD_GOALS := deps demo test bench experiments stress clean format
BUILD_GOALS    := $(filter-out $(NO_BUILD_GOALS),$(or $(MAKECMDGOALS),all))
ifneq ($(BUILD_GOALS),)
PKG_CFLAGS := $(shell $(PKG_CONFIG) --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell $(PKG_CONFIG) --libs $(PKGS) 2>/dev/null)
ifeq ($(PKG_LIBS),)
$(error missing build dependencies: pkg-config cannot find $(PKGS); run `make deps` as root (or `make demo`, which installs what it needs first))
endif
endif

CFLAGS  += -std=c11 $(OPT) -g -Wall -Wextra -Werror -Wno-unused-parameter \
           -D_GNU_SOURCE -pthread -MMD -MP $(PKG_CFLAGS)
# libsnappy (remote write) ships no pkg-config file
LDLIBS  += $(PKG_LIBS) -lsnappy -llapacke -lpthread -lm
# The trainer's elementwise kernels want vectorization for this CPU; without
# errno, sqrtf needs no branch and Adam's update loop vectorizes.
ifeq ($(SANITIZE),)
TRAINER_OPT ?= -O3 -march=native -fno-math-errno
endif
$(BUILD)/trainer/%.o: CFLAGS += $(TRAINER_OPT)
ifneq ($(SANITIZE),)
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif

# MPI: build/sigmatrain-mpi, the same trainer with trainer/dist.c
# compiled by mpicc with -DDIST_MPI.  Built when mpicc exists (MPI=1 demands
# it, MPI=0 turns it off); build/sigmatrain itself never links MPI.
MPICC ?= $(if $(BUILD_GOALS),$(shell command -v mpicc 2>/dev/null))
MPI   ?= $(if $(MPICC),1,0)
ifeq ($(MPI),1)
ifeq ($(MPICC),)
$(error MPI=1 but mpicc was not found: make deps installs libopenmpi-dev and openmpi-bin)
endif
MPI_BIN := $(BUILD)/sigmatrain-mpi
endif

DAEMON_SRC  := $(filter-out daemon/main.c,$(wildcard daemon/*.c))
# proto/: the protocol's one home, libproto.a: linked by the daemon and the
# trainer, and carried inside the client library (an installed
# libentropyd_telemetry.a must stand alone)
PROTO_SRC   := $(wildcard proto/*.c)
TRAINER_SRC := $(filter-out trainer/main.c,$(wildcard trainer/*.c))
# common/: below the protocol, shared by every layer: the clocks (now.h),
# HOST:PORT parsing and resolving (net.c, also in the client library) and
# the flag table both programs' mains parse with (flags.c, not in the library)
COMMON_SRC  := $(wildcard common/*.c)
COMMON_NET  := common/net.c
TEST_SRC    := $(wildcard tests/test_*.c)
BENCH_SRC   := $(wildcard bench/*.c)
WEB_FILES   := $(shell find web -type f 2>/dev/null | sort)

DAEMON_OBJ  := $(DAEMON_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/migrations.o $(BUILD)/gen/webassets.o \
              $(BUILD)/gen/default_rules.o
PROTO_OBJ   := $(PROTO_SRC:%.c=$(BUILD)/%.o)
TRAINER_OBJ := $(TRAINER_SRC:%.c=$(BUILD)/%.o)
COMMON_OBJ  := $(COMMON_SRC:%.c=$(BUILD)/%.o)
TELEMETRY_SRC := $(wildcard telemetry/*.c) $(PROTO_SRC) $(COMMON_NET)
TELEMETRY_OBJ := $(TELEMETRY_SRC:%.c=$(BUILD)/%.o)
TELEMETRY_PIC := $(TELEMETRY_SRC:%.c=$(BUILD)/pic/%.o)
TELEMETRY_LIB := $(BUILD)/libentropyd_telemetry.a $(BUILD)/libentropyd_telemetry.so
TESTS       := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCHES     := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all programs install deps test bench demo clean experiments fuzz fuzz-build stress format
.SECONDARY:
PROGRAMS := $(BUILD)/entropyd $(BUILD)/sigmatrain $(MPI_BIN)
all: $(PROGRAMS) $(TELEMETRY_LIB) $(BUILD)/examples/stream_steps $(TESTS) $(BENCHES)
programs: $(PROGRAMS) $(TELEMETRY_LIB)

# `make deps` installs everything any goal needs; each goal below installs
# only what it needs (scripts/deps.sh PROFILE), then builds by a second make.
deps:
	@$(DEPS) all

# $(call deps_then_make,PROFILE,GOAL): install PROFILE's packages, then make
# GOAL in a new make.  One recipe, run line by line, so `-j` cannot start the
# build before the packages are there.
define deps_then_make
	@$(DEPS) $(1)
	@$(MAKE) --no-print-directory $(2)
endef

# Each layer sees only the headers it may include (the -I list of the
# folder a file is in): common/ itself; proto/ itself and common/; telemetry/
# itself, proto/ and common/; the trainer the client library's public header
# alone (the copy under $(BUILD)/include), proto/ and common/; the daemon
# itself, proto/ and common/. Tests and benchmarks see every folder.
INC_common    := -Icommon
INC_proto     := -Iproto -Icommon
INC_telemetry := -Itelemetry -Iproto -Icommon
INC_trainer   := -Itrainer -I$(BUILD)/include/entropyd -Iproto -Icommon
INC_daemon    := -Idaemon -Iproto -Icommon
INC_gen       := -Idaemon
INC_tests     := -Idaemon -Itrainer -Itelemetry -Iproto -Icommon
INC_bench     := $(INC_tests)
INC_examples  := -I$(BUILD)/include
# the folder of the file an object is built from: build/pic/proto/x.o -> proto
layer = $(firstword $(subst /, ,$(patsubst $(BUILD)/%,%,$(patsubst $(BUILD)/pic/%,%,$(patsubst $(BUILD)/mpi/%,%,$(1))))))
INC = $(INC_$(call layer,$@))
TRAINER_ALL_OBJ := $(TRAINER_OBJ) $(BUILD)/trainer/main.o $(BUILD)/mpi/trainer/dist.o
$(TRAINER_ALL_OBJ): | $(BUILD)/include/entropyd/telemetry.h

# One version for both programs: the VERSION file, compiled into their mains.
VERSION := $(shell cat VERSION)
$(BUILD)/daemon/main.o $(BUILD)/trainer/main.o: CFLAGS += -DPROJECT_VERSION='"$(VERSION)"'
$(BUILD)/daemon/main.o $(BUILD)/trainer/main.o: VERSION

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) -c $< -o $@

# Build-time embedding: SQL migrations and the web page become C arrays, so the
# daemon is one self-contained binary.
$(BUILD)/tools/embed: scripts/embed.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -Wall -Wextra -Werror $< -o $@ -lz
$(BUILD)/gen/migrations.c: $(BUILD)/tools/embed $(sort $(wildcard schema/*.sql))
	@mkdir -p $(dir $@)
	$(BUILD)/tools/embed migrations schema $(sort $(wildcard schema/*.sql)) > $@
$(BUILD)/gen/webassets.c: $(BUILD)/tools/embed $(WEB_FILES)
	@mkdir -p $(dir $@)
	$(BUILD)/tools/embed -z webassets web $(WEB_FILES) > $@
$(BUILD)/gen/default_rules.c: $(BUILD)/tools/embed schema/default_rules.json
	@mkdir -p $(dir $@)
	$(BUILD)/tools/embed default_rules schema schema/default_rules.json > $@
$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	$(CC) $(CFLAGS) $(INC_gen) -Wno-overlength-strings -c $< -o $@

$(BUILD)/libdaemon.a: $(DAEMON_OBJ)
	@rm -f $@; ar rcs $@ $^
$(BUILD)/libtrainer.a: $(TRAINER_OBJ)
	@rm -f $@; ar rcs $@ $(if $^,$^,)
$(BUILD)/libproto.a: $(PROTO_OBJ)
	@rm -f $@; ar rcs $@ $^
$(BUILD)/libcommon.a: $(COMMON_OBJ)
	@rm -f $@; ar rcs $@ $^

# The client library (telemetry/): what any program links to stream
# to entropyd.  Static, shared (position-independent objects of their own)
# and a pkg-config file; `make install PREFIX=...` puts them, the header and
# the Python package under PREFIX.  Its only dependencies: libcjson, pthread.
TELEMETRY_VERSION := $(VERSION)
TELEMETRY_LIBS    := $(shell $(PKG_CONFIG) --libs libcjson 2>/dev/null) -lpthread -lm
$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) -fPIC -c $< -o $@
$(BUILD)/libentropyd_telemetry.a: $(TELEMETRY_OBJ)
	@rm -f $@; ar rcs $@ $^
# The shared library exports telemetry.h's functions and nothing else
# (telemetry/libentropyd_telemetry.map): proto_* and net_* stay out of the
# programs that load it (tests/e2e_exports.py checks with nm -D).
TELEMETRY_MAP := telemetry/libentropyd_telemetry.map
$(BUILD)/libentropyd_telemetry.so: $(TELEMETRY_PIC) $(TELEMETRY_MAP)
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libentropyd_telemetry.so.1 -Wl,--no-undefined -Wl,--version-script=$(TELEMETRY_MAP) \
		$(TELEMETRY_PIC) $(TELEMETRY_LIBS) -o $@
# The example, built here against the tree (the tests also build it from an
# install prefix through pkg-config, as a program outside the repo would).
$(BUILD)/include/entropyd/telemetry.h: telemetry/telemetry.h
	@mkdir -p $(dir $@)
	cp $< $@
$(BUILD)/examples/stream_steps: examples/stream_steps.c $(BUILD)/libentropyd_telemetry.a $(BUILD)/include/entropyd/telemetry.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC_examples) $< $(BUILD)/libentropyd_telemetry.a $(TELEMETRY_LIBS) -o $@

PREFIX  ?= /usr/local
DESTDIR ?=
# The Python package goes where the system's python3 finds it: Debian's
# /usr/bin/python3 (the one python3-torch is for; a pyenv python3 earlier
# on PATH has no torch), its site directory under PREFIX when it has one
# (PREFIX=/usr/local: /usr/local/lib/python3.11/dist-packages), else
# PREFIX/lib/python3.X/site-packages, which needs PYTHONPATH
# (scripts/python_site.py; the last line of `make install` says which).
PYTHON ?= $(if $(wildcard /usr/bin/python3),/usr/bin/python3,python3)
PYTHON_SITE ?= $(shell $(PYTHON) scripts/python_site.py '$(PREFIX)')
install: $(TELEMETRY_LIB)
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include/entropyd $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(BUILD)/libentropyd_telemetry.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libentropyd_telemetry.so $(DESTDIR)$(PREFIX)/lib/libentropyd_telemetry.so.1
	ln -sf libentropyd_telemetry.so.1 $(DESTDIR)$(PREFIX)/lib/libentropyd_telemetry.so
	install -m 644 telemetry/telemetry.h $(DESTDIR)$(PREFIX)/include/entropyd/telemetry.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(TELEMETRY_VERSION)|' telemetry/entropyd_telemetry.pc.in \
		> $(DESTDIR)$(PREFIX)/lib/pkgconfig/entropyd_telemetry.pc
	install -d $(DESTDIR)$(PYTHON_SITE)/entropyd
	install -m 644 python/entropyd/*.py $(DESTDIR)$(PYTHON_SITE)/entropyd/
	printf 'LIBRARY = "%s"\n' '$(PREFIX)/lib/libentropyd_telemetry.so.1' > $(DESTDIR)$(PYTHON_SITE)/entropyd/_installed.py
	$(if $(wildcard $(BUILD)/entropyd),install -m 755 $(BUILD)/entropyd $(DESTDIR)$(PREFIX)/bin/)
	$(if $(wildcard $(BUILD)/sigmatrain),install -m 755 $(BUILD)/sigmatrain $(DESTDIR)$(PREFIX)/bin/)
	@echo "entropyd: C library in $(PREFIX)/lib (programs linked with pkg-config entropyd_telemetry find it through their rpath)"
	@$(PYTHON) scripts/python_site.py --say '$(PYTHON_SITE)'

$(BUILD)/entropyd: $(BUILD)/daemon/main.o $(BUILD)/libdaemon.a $(BUILD)/libproto.a $(BUILD)/libcommon.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@
$(BUILD)/sigmatrain: $(BUILD)/trainer/main.o $(BUILD)/libtrainer.a $(BUILD)/libentropyd_telemetry.a $(BUILD)/libproto.a \
                     $(BUILD)/libcommon.a
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# The MPI variant: dist.c again, by mpicc; linked before libtrainer.a so the
# archive's single-process dist.o is never pulled in.
$(BUILD)/mpi/trainer/dist.o: trainer/dist.c
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) $(INC) $(TRAINER_OPT) -DDIST_MPI -c $< -o $@
$(BUILD)/sigmatrain-mpi: $(BUILD)/trainer/main.o $(BUILD)/mpi/trainer/dist.o $(BUILD)/libtrainer.a $(BUILD)/libentropyd_telemetry.a \
                         $(BUILD)/libproto.a $(BUILD)/libcommon.a
	$(MPICC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# Every test and benchmark links every library (daemon, trainer, client,
# proto, common); the linker keeps only the objects it needs.
ALL_LIBS := $(BUILD)/libdaemon.a $(BUILD)/libtrainer.a $(BUILD)/libentropyd_telemetry.a $(BUILD)/libproto.a $(BUILD)/libcommon.a
$(BUILD)/tests/%: $(BUILD)/tests/%.o $(ALL_LIBS)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcmocka -o $@
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(ALL_LIBS)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

test:
	$(call deps_then_make,test,all)
	@BUILD=$(BUILD) SANITIZE=$(SANITIZE) scripts/run-tests.sh

bench:
	$(call deps_then_make,bench,all SANITIZE=)
	@BUILD=build scripts/run-bench.sh

demo:
	$(call deps_then_make,demo,programs MPI=0)
	@BUILD=$(BUILD) scripts/demo.sh

# research/experiments.py: the collapse-risk study (288 runs of the broad
# sweep of research/sweep.py, tuned on one half, judged on the other:
# docs/collapse-risk.md, ~26 min on a shared 2-core machine), then the
# learning-rate sweep of docs/experiments.md; two trainers at a time.
# EXPERIMENTS_ARGS passes options on (--resume: keep the collapse-risk runs
# already recorded; --part predict|sweep: one part only; --quick: the CI subset).
experiments:
	$(call deps_then_make,experiments,programs MPI=0)
	@BUILD=$(BUILD) python3 research/experiments.py $(EXPERIMENTS_ARGS)

clean:
	rm -rf build

# Fuzzing: libFuzzer harnesses tests/fuzz/fuzz_*.c, each linked with
# every daemon module (a harness that #includes a module's .c, like
# fuzz_http_params with http.c, leaves it out). `make fuzz` runs each for
# FUZZ_SECONDS (default 60) on its corpus tests/fuzz/corpus/NAME/.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SRC     := $(wildcard tests/fuzz/fuzz_*.c)
FUZZERS      := $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)
FUZZ_CFLAGS  := -std=c11 -O1 -g -Wall -Wextra -Werror -Wno-unused-parameter -D_GNU_SOURCE -pthread \
                -Idaemon -Iproto -Icommon $(PKG_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
FUZZ_OBJ     := $(DAEMON_SRC:%.c=build/fuzz/obj/%.o) $(PROTO_SRC:%.c=build/fuzz/obj/%.o) $(COMMON_NET:%.c=build/fuzz/obj/%.o) \
                build/fuzz/obj/gen/migrations.o build/fuzz/obj/gen/webassets.o \
                build/fuzz/obj/gen/default_rules.o
build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Wno-string-concatenation -MMD -MP -c $< -o $@
build/fuzz/obj/gen/%.o: build/gen/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Wno-overlength-strings -c $< -o $@
build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Wno-string-concatenation -MMD -MP $< \
		$(filter-out $(patsubst %.c,build/fuzz/obj/%.o,$(shell sed -n 's|^#include "\.\./\.\./\(daemon/.*\.c\)"|\1|p' $<)),$(FUZZ_OBJ)) \
		$(LDLIBS) -o $@
fuzz-build: $(FUZZERS)
fuzz: $(FUZZERS)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/run-fuzz.sh
# `make stress`: the long reliability runs and their table (scripts/run-stress.sh).
# Rewrite every tracked C file to .clang-format; the suite's `format` test
# fails on any file that differs.
format:
	scripts/check-format.sh --fix

stress:
	$(call deps_then_make,test,all SANITIZE=)
	@BUILD=build FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/run-stress.sh

ifneq ($(BUILD_GOALS),)
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
endif
