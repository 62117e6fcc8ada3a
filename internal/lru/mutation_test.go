package lru

import (
	"runtime"
	"testing"
	"weak"
)

// TestDroppedValuesAreFreed: once Purge, Remove or an eviction drops an entry, the
// cache keeps no reference to its value, so the collector frees it.
func TestDroppedValuesAreFreed(t *testing.T) {
	type blob struct{ b [1 << 10]byte }
	c := New[int, *blob](2, 0)
	add := func(k int) weak.Pointer[blob] {
		v := &blob{}
		c.Add(k, v, 1)
		return weak.Make(v)
	}
	removed, evicted := add(1), add(2)
	c.Remove(1)
	older := add(3) // evicts 2, the least recently used
	purged := add(4)
	if c.Len() != 2 {
		t.Fatalf("Len = %d, want 2", c.Len())
	}
	c.Purge()
	freed := func(p weak.Pointer[blob]) bool {
		// A full collection frees anything unreachable; a few rounds make room for
		// cleanups queued by the runtime.
		for range 10 {
			if p.Value() == nil {
				return true
			}
			runtime.GC()
		}
		return false
	}
	for name, p := range map[string]weak.Pointer[blob]{"removed": removed, "evicted": evicted, "purged (older)": older, "purged (newer)": purged} {
		if !freed(p) {
			t.Errorf("the %s value is still reachable", name)
		}
	}
	runtime.KeepAlive(c)
}
