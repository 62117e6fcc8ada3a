package identity

import (
	"encoding/binary"
	"testing"
)

// TestKeyMemoBound fills the memo of valid keys past its bound: it must never hold
// more than maxValidKeys keys, and it starts over with the key that overflowed it.
func TestKeyMemoBound(t *testing.T) {
	m := &keyMemo{keys: map[[32]byte]struct{}{}}
	key := func(i int) (k [32]byte) {
		binary.BigEndian.PutUint64(k[:], uint64(i))
		return k
	}
	for i := range maxValidKeys {
		m.add(key(i))
	}
	if n := len(m.keys); n != maxValidKeys {
		t.Fatalf("after %d adds the memo holds %d keys, want %d", maxValidKeys, n, maxValidKeys)
	}
	last := key(maxValidKeys)
	m.add(last)
	if n := len(m.keys); n != 1 {
		t.Fatalf("one add past the bound: the memo holds %d keys, want 1 (it starts over)", n)
	}
	if !m.has(last) || m.has(key(0)) {
		t.Fatalf("after starting over the memo must hold exactly the newest key")
	}
}
