package store

import "github.com/sealbridge/sealbridge/internal/fsx"

// probeSize is the size of ProbeWrite's temporary file: about what a record takes,
// so that a disk with a few blocks left is not reported writable.
const probeSize = 64 << 10

// ProbeWrite reports whether the store can be written now: it stages a temporary
// file of probeSize bytes in the store directory through the store's file system
// (create, write, fsync: fsx.Stage, the first step of every write) and removes it,
// without the lock and publishing nothing. It returns nil if that worked or if the
// store directory does not exist yet (its first write creates it), and otherwise
// OutboxStoreUnwritable wrapping the file system's error (ENOSPC for a full disk).
// It is safe to call concurrently with anything: the temporary file has a fresh
// name that no reader lists (fsx.IsTempName). A crash between its creation and its
// removal leaves a temp that sealbridge-fsck reports as a leftover once it is old.
func (s *Store) ProbeWrite() error {
	st, err := fsx.Stage(s.fs, ".", make([]byte, probeSize))
	if err != nil {
		if fsx.IsNotExist(err) {
			return nil
		}
		return unwritable(s.dir, err)
	}
	if err := st.Cleanup(); err != nil {
		return unwritable(s.dir, err)
	}
	return nil
}
