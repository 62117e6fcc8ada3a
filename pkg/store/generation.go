package store

import (
	"bytes"
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

// changedKinds returns the kinds published to between generation states from and to,
// or every kind when that cannot be told (see markCounts).
func (s *Store) changedKinds(from, to generation) map[record.Kind]bool {
	changed := map[record.Kind]bool{}
	counts, known := s.markCounts(from, to)
	for _, k := range record.Kinds {
		if !known || counts[k] > 0 {
			changed[k] = true
		}
	}
	return changed
}

// markCounts returns how many marks of each kind the generation file grew by between
// states from and to. It cannot tell (false) when they are not states of one file (a
// compaction, a replacement, a file that appeared or is gone), to is shorter, the file
// now open is no longer the one to names, or a byte is not a kind mark.
func (s *Store) markCounts(from, to generation) (map[record.Kind]int, bool) {
	switch {
	case to == from:
		return nil, true
	case !from.sameFile(to) || to.size < from.size || to.size-from.size > generationBound:
		return nil, false
	}
	f, now, err := s.openGeneration(syscall.O_RDONLY)
	if f == nil || err != nil {
		return nil, false
	}
	defer f.Close()
	if !now.sameFile(to) || now.size < to.size {
		return nil, false
	}
	return countMarks(f, from, to)
}

// countMarks counts the marks of each kind in f, the generation file of states from
// and to (of one file, to not shorter), between their sizes.
func countMarks(f fsx.File, from, to generation) (map[record.Kind]int, bool) {
	if to.size-from.size > generationBound {
		return nil, false
	}
	buf := make([]byte, to.size-from.size)
	if n, err := f.ReadAt(buf, from.size); err != nil || n != len(buf) {
		return nil, false
	}
	counts := map[record.Kind]int{}
	for _, b := range buf {
		k, ok := markKind[b]
		if !ok {
			return nil, false
		}
		counts[k]++
	}
	return counts, true
}
