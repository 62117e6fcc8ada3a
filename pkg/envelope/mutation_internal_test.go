package envelope

import "testing"

// TestBodyInfoOneAllocation: bodyInfo sizes its buffer for the whole info string
// (two UUIDs, two did:key names of one length, four separators), so building it
// allocates once, never growing the buffer.
func TestBodyInfoOneAllocation(t *testing.T) {
	env, _ := iMessage(t, nil)
	var info []byte
	allocs := testing.AllocsPerRun(50, func() { info = bodyInfo(&env.p) })
	if allocs != 1 {
		t.Errorf("bodyInfo: %v allocations, want 1", allocs)
	}
	if len(info) != cap(info) {
		t.Errorf("bodyInfo: length %d, capacity %d: the size computation is off", len(info), cap(info))
	}
}
