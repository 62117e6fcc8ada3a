module github.com/sealbridge/sealbridge

go 1.26.8

require (
	filippo.io/edwards25519 v1.2.0
	github.com/gofrs/flock v0.13.2
	github.com/google/uuid v1.6.0
	github.com/mr-tron/base58 v1.3.0
	golang.org/x/sys v0.50.0
)
