module github.com/sealbridge/sealbridge

go 1.26.8

require (
	filippo.io/edwards25519 v1.2.0
	github.com/gofrs/flock v0.13.2
	github.com/google/uuid v1.6.0
	github.com/mr-tron/base58 v1.3.0
	go.etcd.io/bbolt v1.5.0
	golang.org/x/sys v0.50.0
	modernc.org/sqlite v1.62.0
)

require (
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/prometheus/client_golang v1.23.2 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)
