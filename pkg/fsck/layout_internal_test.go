package fsck

import "testing"

// TestMovable: a move's source is inside a kind directory, or a top-level name the
// store makes; never a name the store did not make at the top, lost+found itself, or
// anything outside the store directory.
func TestMovable(t *testing.T) {
	for p, want := range map[string]bool{
		"messages/x.json": true,
		"outbox/README":   true,
		"outbox/sub/dir":  true,
		"operations":      true, // a kind name of the wrong type, or a link
		".lock":           true,
		".generation":     true,
		".head":           false, // fsck never moves the head
		".lock-6f1c1b7e-3b9e-4f0a-9c55-0d2a7c3c9f10.tmp":       true,
		".6f1c1b7e-3b9e-4f0a-9c55-0d2a7c3c9f10.tmp":            true,
		"lost+found/.6f1c1b7e-3b9e-4f0a-9c55-0d2a7c3c9f10.tmp": true,
		"lost+found":             false,
		"lost+found/x.fsck.json": false,
		"notes.txt":              false,
		"cache":                  false,
		".git":                   false,
		"identities":             false,
		".":                      false,
		"..":                     false,
		"../x":                   false,
		"/etc/passwd":            false,
		"messages/../identities": false,
		"messages":               true,
		"messages/":              false,
		"cache/messages":         false,
	} {
		if got := movable(p); got != want {
			t.Errorf("movable(%q) = %v, want %v", p, got, want)
		}
	}
}
