package store

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// refreshIndex brings k's index, as the snapshot from describes it, up to date with the
// stamp now taken before, and reports whether the result was installed. It updates
// only the entries that changed when it can tell which (refreshChanged); otherwise — no
// index yet, a kind with an unmarked publication (from.fullScan), a replaced directory
// or generation file, a file system that cannot list inode numbers, or more changes
// than it can attribute — it reconciles every entry.
func (s *Store) refreshIndex(ctx context.Context, k record.Kind, now Stamp, from indexSnapshot) (*index, bool, error) {
	if !from.fullScan && from.index != nil {
		installed, handled, err := s.refreshChanged(ctx, k, now, from)
		if err != nil || handled {
			if !installed {
				return nil, false, err
			}
			return from.index, true, err
		}
	}
	ids, lst, err := s.list(k)
	if err != nil {
		return nil, false, err
	}
	fresh, err := s.reconcile(ctx, k, lst, ids, from.index)
	if err != nil {
		return nil, false, err
	}
	// fresh is installed under lst, taken before its scan, and only over the index it
	// started from, unpatched: a publication of this process patched in meanwhile
	// (its version moved) may be missing from fresh, and installing fresh then would
	// let a reader that already found the old index current read a scan older than
	// what it saw. Such a round is repeated. The caller answers from the index
	// returned, never from s.indexes[k] afterwards.
	s.mu.Lock()
	installed := false
	if cur := s.indexes[k]; cur == nil || cur == from.index && cur.version == from.version {
		if cur != nil {
			fresh.version = cur.version + 1
		}
		s.indexes[k] = fresh
		installed = true
	}
	s.mu.Unlock()
	return fresh, installed, nil
}

// refreshChanged updates from.index in place for the entries of k that changed since
// its stamp, without an lstat of the others. handled false means it cannot tell which
// changed and the caller must reconcile every entry; handled true with installed false
// means the index was patched meanwhile and the round is to be repeated.
//
// Which entries changed is found from one directory listing with inode numbers
// (fsx.InoLister) and the generation marks. Every sealbridge publication renames a
// freshly created file over the name or unlinks it, under the store lock, then appends
// its kind's mark. So a publication to a name changes its presence or its inode
// number — except that two or more to one name can restore both (inode numbers are
// reused). The names whose presence or inode number differ from the index are the
// detected changes. The marks of k since the index's stamp, read after the listing,
// less the publications this process already patched in (ownMarks), count every
// publication that can be visible in the listing, except at most one in flight (the
// lock admits one publisher, which renames before it marks). If that count equals the
// number of detected changes, each detected name had exactly one publication and
// every other name none (an undetected changed name needs two publications, one more
// than the slack): only the detected names are read and verified again. An entry
// whose fingerprint is still racy is not read again either: racy matters where a
// change is judged by comparing fingerprints (reconcile), and here it is judged by the
// inode number and the marks, which no store publication can leave both unchanged.
// (A file rewritten in place, bypassing the store, makes no mark and keeps its inode;
// no refresh can see it, racy or not, and its signature still guards every read of
// the record itself.) Otherwise the caller reconciles every entry.
//
// If this process had a publication in flight (from.inFlight) when now was taken,
// that id is read again and left out of the count, whose mark may or may not be among
// the marks: then the result is installed only if that publication is still not
// adopted (version unchanged), so this process held the lock throughout, no other
// process was publishing, and the one mark of slack is this publication's.
//
// The result is installed under now (taken before the listing): marks appended while
// the listing was read are counted again by the next refresh, which then reconciles.
func (s *Store) refreshChanged(ctx context.Context, k record.Kind, now Stamp, from indexSnapshot) (installed, handled bool, err error) {
	old, then := from.index, from.stamp
	lister, ok := s.fs.(fsx.InoLister)
	if !ok || now.absent || then.absent || then.Dir.Dev != now.Dir.Dev || then.Dir.Ino != now.Dir.Ino {
		return false, false, nil
	}
	clock := s.now()
	ents, err := lister.ReadDirInos(string(k))
	if fsx.IsNotExist(err) {
		return false, false, nil
	}
	if err != nil {
		return false, false, invalidAt(string(k), err)
	}
	gen, err := s.generation()
	if err != nil {
		return false, false, err
	}
	marks, known := s.kindMarks(then.gen, gen, k)
	if !known {
		return false, false, nil
	}
	slices.SortFunc(ents, func(a, b fsx.DirInode) int { return strings.Compare(a.Name, b.Name) })
	ids := make([]string, 0, len(ents))
	inos := make([]uint64, 0, len(ents))
	for _, e := range ents {
		if fsx.IsTempName(e.Name) {
			continue
		}
		id, ok := strings.CutSuffix(e.Name, ".json")
		if !ok || !record.ValidID(k, id) {
			return false, false, invalidAt(string(k)+"/"+e.Name, errors.New("unknown file in a record directory"))
		}
		ids, inos = append(ids, id), append(inos, e.Ino)
	}

	flying := from.inFlight != ""
	var changed, reread, removed []string
	s.mu.Lock()
	if s.indexes[k] != old || old.version != from.version {
		s.mu.Unlock()
		return false, true, nil
	}
	found := 0
	for i, id := range ids {
		fp, present := old.fps[id]
		if present {
			found++
		}
		switch {
		case flying && id == from.inFlight:
		case !present || fp.Ino != inos[i]:
			changed = append(changed, id)
		}
	}
	_, flownIndexed := old.fps[from.inFlight]
	gone := len(old.fps) - found
	if _, listed := slices.BinarySearch(ids, from.inFlight); flying && flownIndexed && !listed {
		gone-- // the publication in flight removed it: read again below, not counted
	}
	slack := marks - from.ownMarks - (len(changed) + gone)
	attributed := slack == 0 || flying && slack == 1
	if gone > 0 && attributed {
		for id := range old.fps {
			if _, ok := slices.BinarySearch(ids, id); !ok && !(flying && id == from.inFlight) {
				removed = append(removed, id)
			}
		}
	}
	s.listings[k] = &listing{stamp: now, racy: s.stampRacyAt(clock, now), ids: ids}
	s.mu.Unlock()
	if !attributed {
		return false, false, nil
	}
	if flying {
		reread = append(reread, from.inFlight)
	}

	type read struct {
		id   string
		rec  record.Record
		fp   fsx.Fingerprint
		racy bool
	}
	reads := make([]read, 0, len(changed)+len(reread))
	for _, id := range append(changed, reread...) {
		if err := ctx.Err(); err != nil {
			return false, true, err
		}
		at := s.now() // before the read: what is read then is racy or not as of at
		r, fp, err := s.readFP(k, id)
		if err != nil {
			return false, true, err
		}
		reads = append(reads, read{id: id, rec: r, fp: fp, racy: r != nil && s.racyAt(at, fp.CtimeNs)})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.indexes[k] != old || old.version != from.version {
		return false, true, nil
	}
	for _, id := range removed {
		old.apply(id, nil, fsx.Fingerprint{}, false)
	}
	for _, r := range reads {
		old.apply(r.id, r.rec, r.fp, r.racy)
	}
	old.stamp, old.ownMarks = now, 0
	old.version++
	return true, true, nil
}

// kindMarks returns how many marks of kind k the generation file grew by between
// states from and to, or false when that cannot be told (see markCounts).
func (s *Store) kindMarks(from, to generation, k record.Kind) (int, bool) {
	counts, known := s.markCounts(from, to)
	return counts[k], known
}
