package store

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"syscall"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// Names in a store directory besides the kind directories.
const (
	GenerationFile = ".generation"
	LostAndFound   = "lost+found"
)

// The generation file (docs/FORMAT.md §7) is a header naming its epoch — 16 random
// bytes chosen when the file was made — followed by one mark byte per publication
// since. Under the lock, a writer that finds it absent, without a valid header, or at
// generationBound bytes replaces it by a fresh file with a new epoch (compaction)
// before it publishes. So within one epoch the file only grows, and a reader tells a
// compaction (or any replacement) from growth by the epoch and the inode, never by the
// length alone.
//
// generationBound is 64 KiB: 65,481 publications per epoch, so a compaction (two
// fsyncs) costs less than one fsync per 30,000 publications, and the one re-list or
// re-plan it forces on each reader holding an older state is as rare. It is also the
// most a tail read (changedKinds) ever reads.
const generationBound = 64 << 10

var (
	errGenerationReplaced = errors.New("replaced while the store lock was held")
	errGenerationNotReady = errors.New("publication without a ready generation file")
)

// generationMagic starts the header: generationMagic, 32 lower-case hex digits (the
// epoch), "\n" — 55 bytes.
const generationMagic = "sealbridge-generation "

const generationHeaderLen = len(generationMagic) + 32 + 1

// generation is the state of the generation file a stamp or a plan remembers. The
// zero value is an absent file. Two states are of one file if dev, ino and epoch are
// equal (epoch is zero for a file without a valid header, which the next publication
// replaces); of one file, the longer is the later.
type generation struct {
	dev, ino uint64
	epoch    [16]byte
	size     int64
}

// sameFile reports whether a and b are states of one generation file, so the bytes
// between their sizes are the marks of the publications between them.
func (a generation) sameFile(b generation) bool {
	return a.dev == b.dev && a.ino == b.ino && a.epoch == b.epoch
}

// generationHeader returns the header of a file of the given epoch.
func generationHeader(epoch [16]byte) []byte {
	h := make([]byte, 0, generationHeaderLen)
	h = append(h, generationMagic...)
	h = hex.AppendEncode(h, epoch[:])
	return append(h, '\n')
}

// parseGenerationHeader returns the epoch of a file that starts with h, or false.
func parseGenerationHeader(h []byte) ([16]byte, bool) {
	var epoch [16]byte
	if len(h) < generationHeaderLen || !bytes.HasPrefix(h, []byte(generationMagic)) || h[generationHeaderLen-1] != '\n' {
		return epoch, false
	}
	digits := h[len(generationMagic) : generationHeaderLen-1]
	for _, c := range digits {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return epoch, false
		}
	}
	if _, err := hex.Decode(epoch[:], digits); err != nil {
		return epoch, false
	}
	return epoch, true
}

// openGeneration opens the generation file with flag (a read or read-write mode) and
// returns it with its state: the identity and size from the open file, and the epoch
// from its header, so they belong to one file even if it is replaced meanwhile. An
// absent file is (nil, zero state, nil).
func (s *Store) openGeneration(flag int) (fsx.File, generation, error) {
	var f fsx.File
	var info fsx.Info
	for attempt := 1; ; attempt++ {
		var err error
		f, err = s.fs.OpenFile(generationName, flag|syscall.O_NONBLOCK, 0)
		if fsx.IsNotExist(err) {
			return nil, generation{}, nil
		}
		if err != nil {
			return nil, generation{}, invalidAt(generationName, err)
		}
		info, err = f.Stat()
		if err == nil && info.Nlink == 0 && info.IsRegular() && attempt < maxReplacedReads {
			// Another process compacted (replaced) the file between our open and
			// fstat: open the new one.
			f.Close()
			continue
		}
		if err == nil {
			err = fsx.CheckPrivateFile(generationName, info)
		}
		if err != nil {
			f.Close()
			return nil, generation{}, invalidAt(generationName, err)
		}
		break
	}
	g := generation{dev: info.Dev, ino: info.Ino, size: info.Size}
	var h [generationHeaderLen]byte
	if n, _ := f.ReadAt(h[:], 0); n == len(h) {
		g.epoch, _ = parseGenerationHeader(h[:])
	}
	return f, g, nil
}

// generation returns the current state of the generation file.
func (s *Store) generation() (generation, error) {
	f, g, err := s.openGeneration(syscall.O_RDONLY)
	if f != nil {
		f.Close()
	}
	return g, err
}

// changedKinds returns the kinds published to between generation states from and to.
// When it cannot tell — they are not states of one file (a compaction, a replacement,
// a file that appeared or is gone), to is shorter, the file now open is no longer the
// one to names, or a byte is not a kind mark — it returns every kind.
func (s *Store) changedKinds(from, to generation) map[record.Kind]bool {
	all := map[record.Kind]bool{}
	for _, k := range record.Kinds {
		all[k] = true
	}
	switch {
	case to == from:
		return map[record.Kind]bool{}
	case !from.sameFile(to) || to.size < from.size || to.size-from.size > generationBound:
		return all
	}
	f, now, err := s.openGeneration(syscall.O_RDONLY)
	if f == nil || err != nil {
		return all
	}
	defer f.Close()
	if !now.sameFile(to) || now.size < to.size {
		return all
	}
	buf := make([]byte, to.size-from.size)
	if n, err := f.ReadAt(buf, from.size); err != nil || n != len(buf) {
		return all
	}
	changed := map[record.Kind]bool{}
	for _, b := range buf {
		k, ok := markKind[b]
		if !ok {
			return all
		}
		changed[k] = true
	}
	return changed
}

// readyGeneration makes the generation file ready for tx's next mark, before the
// publication it marks: it opens the file once per transaction and, if the file is
// absent, has no valid header or has reached generationBound bytes, or a publication
// of this process is still unmarked (unmarkedPublication), compacts it. A failure
// here comes before the rename, so nothing is published without its mark.
func (tx *Tx) readyGeneration() error {
	if tx.gen == nil && !tx.genOpen {
		f, g, err := tx.s.openGeneration(syscall.O_RDWR | syscall.O_APPEND)
		if err != nil {
			return err
		}
		tx.gen, tx.genState, tx.genOpen = f, g, true
	}
	unmarked := tx.s.hasUnmarked()
	if tx.gen != nil && tx.genState.epoch != [16]byte{} && tx.genState.size < generationBound && !unmarked {
		return nil
	}
	if err := tx.compactGeneration(); err != nil {
		return err
	}
	if unmarked {
		tx.s.clearUnmarked()
	}
	return nil
}

// unmarkedPublication handles a publication of kind k whose rename or unlink is done
// but whose generation mark failed. No stamp or plan of any process can show that
// change, so the generation file is replaced (compactGeneration) or, if that fails
// too (a full disk), removed: either way no state any process remembers matches it
// any more, so every reader lists again and every plan is stale. This process's
// listing and index of k are dropped, to be rebuilt from the directory. Only if the
// file can be neither replaced nor removed does k stay unmarked: this process then
// reconciles k in full at every read, and its next publication replaces the file
// before it publishes (readyGeneration); other processes cannot learn of the change
// before that.
func (tx *Tx) unmarkedPublication(k record.Kind) {
	s := tx.s
	s.mu.Lock()
	delete(s.listings, k)
	delete(s.indexes, k)
	s.mu.Unlock()
	if tx.compactGeneration() == nil || tx.removeGeneration() == nil {
		s.endPublication(k)
		return
	}
	s.failPublication(k)
}

// removeGeneration removes the generation file (not durably: marks are never
// durable) and moves this process's current caches to the absent state, which no
// other process's stamp of the removed file matches. The next publication makes a new
// file of a fresh epoch.
func (tx *Tx) removeGeneration() error {
	if tx.gen != nil {
		_ = tx.gen.Close()
		tx.gen = nil
	}
	tx.genOpen = false
	if err := tx.s.fs.Remove(generationName); err != nil && !fsx.IsNotExist(err) {
		return writeError(generationName, err)
	}
	old := tx.genState
	tx.genState = generation{}
	tx.s.adoptGeneration(old, generation{})
	return nil
}

// compactGeneration replaces the generation file, durably (fsx.WriteFile: temp, fsync,
// rename, directory fsync), by a header of a fresh epoch and no marks. The new file is
// a new inode of a new epoch: every state taken of the old one compares unequal to
// every state of it, so readers re-list and plans re-plan. This process's cached
// listings and indexes at the old state move to the new one: no directory changed.
func (tx *Tx) compactGeneration() error {
	var epoch [16]byte
	if _, err := rand.Read(epoch[:]); err != nil {
		return unwritable(generationName, err)
	}
	if err := fsx.WriteFile(tx.s.fs, ".", generationName, generationHeader(epoch)); err != nil {
		return writeError(generationName, err)
	}
	old := tx.genState
	if tx.gen != nil {
		_ = tx.gen.Close()
		tx.gen = nil
	}
	f, g, err := tx.s.openGeneration(syscall.O_RDWR | syscall.O_APPEND)
	if err == nil && (f == nil || g.epoch != epoch) {
		if f != nil {
			f.Close()
		}
		err = invalidAt(generationName, errGenerationReplaced)
	}
	if err != nil {
		return err
	}
	tx.gen, tx.genState = f, g
	tx.s.adoptGeneration(old, g)
	return nil
}

// bumpGeneration appends k's mark to the generation file readyGeneration opened.
func (tx *Tx) bumpGeneration(k record.Kind) (oldGen, newGen generation, err error) {
	if tx.gen == nil {
		return generation{}, generation{}, unwritable(generationName, errGenerationNotReady)
	}
	if _, err := tx.gen.Write([]byte{kindMark[k]}); err != nil {
		return generation{}, generation{}, writeError(generationName, err)
	}
	oldGen = tx.genState
	tx.genState.size++
	return oldGen, tx.genState, nil
}
