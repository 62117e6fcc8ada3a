# sealbridge contributor recipes. Each is a thin wrapper of a plain `go` command that
# README.md also shows, so nobody needs `just` to work.

# run the unit tests (what CI runs)
test:
    go test ./...

# the race detector over every package with concurrency
race:
    go test -race ./pkg/... ./internal/fsx ./internal/lockfile ./internal/lru

# static checks
vet:
    go vet ./...
    gofmt -l .

# fuzz the parsers (each target for the given time)
fuzz time="30s":
    go test -fuzz=FuzzParseDID -fuzztime={{time}} ./pkg/identity/

# store benchmarks
bench:
    go test -run '^$' -bench . -benchtime 1s ./pkg/store/

# the crash proof: every crash state, every injected fault, and 5,000 real SIGKILLs
crash kills="5000":
    go test -count=1 -v -timeout 60m -run 'Crash|Fault|SIGKILL|Short|Fsync|EXDEV' ./internal/crashtest -crash.kills={{kills}}

# everything CI does
ci:
    bash .ci/run
