// Package dataroot knows the layout of a sealbridge data root: the names of its
// directories, where one identity's daemon keeps its pid-file lock and its socket,
// and (in check.go) the rules every directory from the data root down must keep.
//
//	<root>/identities/<name>.key          an identity's key (0600)
//	<root>/delivery/<hex sha256(did)>/    the identity's store (0700)
//	<root>/witness/<hex sha256(did)>.head the local witness of the store's head (0600)
//	<root>/run/<short id>.pid             the daemon's pid-file lock (never removed)
//	<root>/run/<short id>.sock            its socket, unless $XDG_RUNTIME_DIR is set:
//	$XDG_RUNTIME_DIR/sealbridge/<short id>.sock
//
// The short id is the first 16 hex digits of sha256(did), so that the socket path
// fits a unix socket address under any reasonable data root.
package dataroot

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// The directories directly under the data root.
const (
	DeliveryDir   = "delivery"
	IdentitiesDir = "identities"
	RunDir        = "run"
)

// RuntimeSubdir is the directory under $XDG_RUNTIME_DIR that holds the sockets.
const RuntimeSubdir = "sealbridge"

// MaxSocketPath is the longest path a unix socket address holds on Linux (108
// bytes of sun_path including the terminating NUL).
const MaxSocketPath = 107

// ShortID is the first 16 hex digits of sha256(did): the name of the identity's
// files in the run directories.
func ShortID(did string) string {
	sum := sha256.Sum256([]byte(did))
	return hex.EncodeToString(sum[:8])
}

// PIDFile returns the daemon's pid-file lock for did under the data root root.
func PIDFile(root, did string) string {
	return filepath.Join(root, RunDir, ShortID(did)+".pid")
}

// SocketPaths returns where the daemon of did listens, in order of preference:
// $XDG_RUNTIME_DIR/sealbridge/<short id>.sock when XDG_RUNTIME_DIR is an absolute
// path, then <root>/run/<short id>.sock. The daemon binds the first; a client
// dials the first that exists.
func SocketPaths(root, did string) []string {
	name := ShortID(did) + ".sock"
	var paths []string
	if rt := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(rt) {
		paths = append(paths, filepath.Join(rt, RuntimeSubdir, name))
	}
	return append(paths, filepath.Join(root, RunDir, name))
}

// Resolve returns the absolute data root: home if set, else $SEALBRIDGE_HOME, else
// $XDG_STATE_HOME/sealbridge, else ~/.local/state/sealbridge. It reads the
// environment and nothing on disk.
func Resolve(home string) (string, error) {
	switch {
	case home != "":
	case os.Getenv("SEALBRIDGE_HOME") != "":
		home = os.Getenv("SEALBRIDGE_HOME")
	case os.Getenv("XDG_STATE_HOME") != "":
		home = filepath.Join(os.Getenv("XDG_STATE_HOME"), "sealbridge")
	default:
		h, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no data root: set --home or SEALBRIDGE_HOME: %w", err)
		}
		home = filepath.Join(h, ".local", "state", "sealbridge")
	}
	return filepath.Abs(home)
}

// StoreDir returns the store directory of did under the data root root:
// <root>/delivery/<hex sha256(did)>.
func StoreDir(root, did string) string {
	sum := sha256.Sum256([]byte(did))
	return filepath.Join(root, DeliveryDir, hex.EncodeToString(sum[:]))
}

// WitnessDir is the directory under the data root that holds the local witnesses of
// the stores' heads (DESIGN §5, "The head").
const WitnessDir = "witness"

// WitnessFile returns where the local witness of did's store head is kept under the
// data root root: <root>/witness/<hex sha256(did)>.head. It is outside the store
// directory, so that a store directory restored alone from an older copy is behind
// it.
func WitnessFile(root, did string) string {
	sum := sha256.Sum256([]byte(did))
	return filepath.Join(root, WitnessDir, hex.EncodeToString(sum[:])+".head")
}
