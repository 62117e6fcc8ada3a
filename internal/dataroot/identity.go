package dataroot

import (
	"fmt"
	"path/filepath"
	"regexp"
)

// DefaultIdentity is the identity name used when none is given.
const DefaultIdentity = "default"

var identityName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$`)

// CheckIdentityName returns an error if name cannot name an identity: letters,
// digits, '.', '_' and '-', not starting with '.' or '-', at most 64 characters.
func CheckIdentityName(name string) error {
	if !identityName.MatchString(name) {
		return fmt.Errorf("identity name %q: use letters, digits, '.', '_' and '-'", name)
	}
	return nil
}

// KeyFile returns the key file of identity name under the data root root:
// <root>/identities/<name>.key.
func KeyFile(root, name string) string {
	return filepath.Join(root, IdentitiesDir, name+".key")
}
