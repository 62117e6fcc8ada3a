package relay

// Wakeups is how many held fetches were woken so far.
func (r *Relay) Wakeups() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waits.wakes
}

// AddressKey is addressKey: what the per-address bound of held fetches counts.
var AddressKey = addressKey

// RecipientDir is recipientDir: the directory name of a DID.
var RecipientDir = recipientDir
