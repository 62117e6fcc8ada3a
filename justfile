# sealbridge contributor recipes. Each is a thin wrapper of a plain `go` command that
# README.md also shows, so nobody needs `just` to work.

# the main job: two daemons and a relay in a temp home, 100 messages, fsck (exit 0 = all relayed, clean)
demo:
    go run ./cmd/sealbridge demo

# run the unit tests (what CI runs)
test:
    go test ./...

# the race detector over every package with concurrency
race:
    go test -race ./pkg/... ./internal/fsx ./internal/lockfile ./internal/lru ./internal/conctest

# static checks
vet:
    go vet ./...
    gofmt -l .

# fuzz the parsers (each target for the given time)
fuzz time="30s":
    go test -run '^$' -fuzz=FuzzParseDID -fuzztime={{time}} ./pkg/identity/
    go test -run '^$' -fuzz=FuzzParseRecord -fuzztime={{time}} ./pkg/store/
    go test -run '^$' -fuzz=FuzzParseEnvelope -fuzztime={{time}} ./pkg/envelope/

# the benchmark report (docs/PERFORMANCE.md): floors, ours, SQLite and bbolt run
# interleaved for 5+ rounds, then a table of medians and ratios. `just bench quick` (or
# `just bench --quick`) takes a few minutes; SEALBRIDGE_BENCH_RUNS=N for more rounds.
# Every benchmark once, as CI may: go test -run '^$' -bench . -benchtime 1x ./...
bench mode="full":
    SEALBRIDGE_BENCH_REPORT=1 SEALBRIDGE_BENCH_QUICK={{ if mode =~ '^-*quick$' { "1" } else { "" } }} go test -run '^TestBenchReport$' -v -count=1 -timeout 60m ./internal/bench

# the crash proof: every crash state, every injected fault, 5,000 rounds of real SIGKILLs
# of writers and 1,000 of the operator's actions
crash kills="5000" actionkills="1000":
    go test -count=1 -v -timeout 60m -run 'Crash|Fault|SIGKILL|Short|Fsync|EXDEV' ./internal/crashtest -crash.kills={{kills}} -crash.actionkills={{actionkills}}

# the concurrency explorer, long: runs of 3 s, seeds from SEED on (0: from the clock), for
# the given time; a failing run prints the command that replays its seed (docs/TESTING.md)
explore time="10m" seed="0":
    go test -count=1 -v -timeout 24h -run '^TestExplore$' ./internal/conctest -explore.for={{time}} -explore.seed={{seed}}

# large bodies through the built binaries: a body of SIZE (default 1GiB) from alice to
# bob, its SHA-256 compared and each process's resident set growth bounded, then the
# same with the sending daemon, the relay and the receiving daemon SIGKILLed at seven
# points mid-transfer (go test ./... runs both with 64MiB)
large-body size="1GiB":
    SEALBRIDGE_E2E_BODY={{size}} go test -count=1 -v -timeout 90m -run '^TestLargeBody' ./internal/e2e

# mutation testing (gremlins, pinned, fetched by `go run`), one package at a time; fails
# when a package's efficacy is not above its threshold: 90% for pkg/record, whose
# mutator coverage must also be above 80%, and 85% for the others (docs/TESTING.md).
# Tens of minutes in all; `just mutate internal/lru` for one package.
mutate +pkgs="internal/lru pkg/identity internal/lockfile pkg/envelope internal/fsx pkg/record":
    rc=0; for p in {{pkgs}}; do case "$p" in pkg/record) th='--threshold-efficacy 90 --threshold-mcover 80';; *) th='--threshold-efficacy 85';; esac; GOFLAGS='-count=1 -short' go run github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0 unleash --workers 1 --timeout-coefficient 20 $th "./$p" || rc=1; done; exit $rc

# check (and with --repair, repair) a store offline: just fsck DIR [--json] [--repair]
fsck dir *flags:
    go run ./cmd/sealbridge-fsck {{flags}} {{dir}}

# everything CI does
ci:
    bash .ci/run

# the man pages of the four binaries, made from the same command definitions as their
# --help and completions: DIR/man1 (sealbridge and its commands) and DIR/man8 (the
# daemon, fsck and the relay); read one with: man -l DIR/man1/sealbridge-send.1
man dir="man":
    d=$(mktemp -d) && go build -o "$d/" ./cmd/... && "$d/sealbridge" __man "{{dir}}/man1" && for b in sealbridged sealbridge-fsck sealbridge-relay; do "$d/$b" __man "{{dir}}/man8" || exit 1; done; rm -rf "$d"

# the shell completions of the four binaries (bash, zsh, fish) into DIR/SHELL/; each
# binary also prints its own: sealbridge completion bash
completions dir="completions":
    d=$(mktemp -d) && go build -o "$d/" ./cmd/... && for s in bash zsh fish; do mkdir -p "{{dir}}/$s" && for b in sealbridge sealbridged sealbridge-fsck sealbridge-relay; do "$d/$b" completion $s > "{{dir}}/$s/$b" || exit 1; done; done; rm -rf "$d"
