package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/identity"
)

// DefaultIdentity is the identity name used when none is given.
const DefaultIdentity = dataroot.DefaultIdentity

// IdentityPath returns the key file of identity name under the data root home:
// <home>/identities/<name>.key (a PKCS#8 PEM file, mode 0600). An empty name is
// DefaultIdentity.
func IdentityPath(home, name string) string {
	if name == "" {
		name = DefaultIdentity
	}
	return dataroot.KeyFile(home, name)
}

// keyPath returns the key file of identity name under the data root home, once the
// data root keeps the data-root rules (dataroot.CheckRoot).
func keyPath(home, name string) (string, error) {
	if name == "" {
		name = DefaultIdentity
	}
	if err := dataroot.CheckIdentityName(name); err != nil {
		return "", &OptionError{Option: "--identity", Err: err}
	}
	root, err := dataroot.Resolve(home)
	if err != nil {
		return "", err
	}
	if err := dataroot.CheckRoot(root); err != nil {
		return "", err
	}
	return IdentityPath(root, name), nil
}

// InitIdentity creates a new identity name under the data root home (resolved like
// dataroot.Resolve; directories are created with mode 0700). It fails if the identity
// exists, or if the data root breaks the data-root rules (a *dataroot.Violation,
// with its fix as hint).
func InitIdentity(home, name string) (*identity.Identity, error) {
	path, err := keyPath(home, name)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(path); err == nil {
		return nil, fmt.Errorf("identity %s already exists (%s)", nameOr(name), path)
	}
	id, err := identity.Generate()
	if err != nil {
		return nil, err
	}
	if err := identity.WriteKeyFile(path, id); err != nil {
		if errors.Is(err, identity.ErrKeyFileExists) {
			return nil, fmt.Errorf("identity %s already exists (%s)", nameOr(name), path)
		}
		return nil, err
	}
	return id, nil
}

// LoadIdentity loads identity name from the data root home. Like InitIdentity it
// refuses a data root that breaks the data-root rules. A missing key file is an
// error wrapping os.ErrNotExist that names the identity and the path once (the
// commands add the hint to create it, with their flags); an invalid name is an
// *OptionError for --identity.
func LoadIdentity(home, name string) (*identity.Identity, error) {
	path, err := keyPath(home, name)
	if err != nil {
		return nil, err
	}
	id, err := identity.LoadKeyFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.Is(err, os.ErrNotExist) && errors.As(err, &pe) {
			return nil, fmt.Errorf("no identity %s at %s: %w", nameOr(name), path, pe.Err)
		}
		return nil, err
	}
	return id, nil
}

func nameOr(name string) string {
	if name == "" {
		return DefaultIdentity
	}
	return name
}
