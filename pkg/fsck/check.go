package fsck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// Check examines the store directory dir and reports what it finds. It changes
// nothing on disk: it only lists, lstats and reads (with O_NOFOLLOW, beneath dir), and
// tries and at once releases the lock's flock (lockfile.Inspect). Every record is
// verified with record.Parse — the store's own rules — on opts.Workers goroutines.
//
// Check may run while writers use the store; its report is then a snapshot that may
// include changes in progress. Errors: ErrNotStore, ErrDataRoot, ErrNotStoreLayout
// (checkLayout, checkForeign: a directory that is not a store is never checked),
// ErrOwner, errcode.StoreFormatNewer (the owner's .head names a newer format than
// store.FormatVersion: nothing else is read), ctx's error, or the error of a
// file-system call that made the check impossible.
func Check(ctx context.Context, dir string, opts Options) (*Report, error) {
	c, err := newChecker(dir, opts)
	if err != nil {
		return nil, err
	}
	return c.check(ctx)
}

type checker struct {
	dir      string
	fs       fsx.FS
	opts     Options
	now      time.Time
	rep      *Report
	jobs     []job
	owner    identity.DID
	ownerKey identity.PublicKey
	// present maps every record name that exists (any type) to its fingerprint.
	present map[string]fsx.Fingerprint
	// foreign lists the names at the top that the store never makes (unknownTop).
	foreign []string
	// quarantined holds the paths that an earlier repair moved into lost+found
	// (movedFrom of its entries).
	quarantined map[string]bool
	// blobFiles are the regular files in blobs/ named by a digest; blobsListed says
	// that blobs/ is a real directory that was listed.
	blobFiles   []blobFile
	blobsListed bool
	// head is what reading .head found (checkHeadFormat).
	head headRead
}

// job is one "<kind>/<id>.json" name to verify.
type job struct {
	kind record.Kind
	id   string
	path string
}

// result is what verifying one job found.
type result struct {
	vanished bool
	rec      record.Record // the record, if the store accepts its content
	fp       fsx.Fingerprint
	finding  *Finding  // the record is unusable (invalid, oversize, symlink, …)
	meta     *Finding  // a valid record with a wrong mode, owner or link count
	refs     []blobRef // the blobs a valid record names
}

func (o Options) withDefaults() Options {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.Limits == (store.Limits{}) {
		o.Limits = store.DefaultLimits()
	}
	if o.LockStale <= 0 {
		o.LockStale = lockfile.DefaultStale
	}
	if o.LockWait == 0 {
		o.LockWait = lockfile.DefaultWait
	}
	if o.Tool == "" {
		o.Tool = "sealbridge-fsck"
	}
	return o
}

func (o Options) lockOptions() lockfile.Options {
	return lockfile.Options{Wait: o.LockWait, Stale: o.LockStale, Now: o.Now}
}

func newChecker(dir string, opts Options) (*checker, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNotStore, dir, err)
	}
	opts = opts.withDefaults()
	var fsys fsx.FS = fsx.NewOS(abs)
	if opts.WrapFS != nil {
		fsys = opts.WrapFS(fsys)
	}
	return &checker{dir: abs, fs: fsys, opts: opts, now: opts.Now(),
		rep: &Report{Dir: abs, OwnerSource: OwnerNone, Lock: "absent"}, present: map[string]fsx.Fingerprint{}, quarantined: map[string]bool{}}, nil
}

func (c *checker) check(ctx context.Context) (*Report, error) {
	start := time.Now()
	if err := c.checkRoot(); err != nil {
		if c.absentStore() {
			return c.absentReport(start)
		}
		return nil, err
	}
	if err := c.checkLayout(); err != nil {
		return nil, err
	}
	if err := c.checkHeadFormat(); err != nil {
		return nil, err
	}
	if err := c.checkDataRoot(); err != nil {
		return nil, err
	}
	if err := c.checkLock(); err != nil {
		return nil, err
	}
	if err := c.walk(ctx); err != nil {
		return nil, err
	}
	if err := c.establishOwner(); err != nil {
		return nil, err
	}
	c.checkHead()
	results, err := c.verifyAll(ctx)
	if err != nil {
		return nil, err
	}
	c.relate(results)
	if err := c.checkBlobs(ctx, results); err != nil {
		return nil, err
	}
	if err := c.checkForeign(); err != nil {
		return nil, err
	}
	c.sortFindings()
	if c.rep.Findings == nil {
		c.rep.Findings = []Finding{}
	}
	c.rep.Duration = time.Since(start)
	return c.rep, nil
}

// sortFindings sorts the findings by path, then code.
func (c *checker) sortFindings() {
	sort.SliceStable(c.rep.Findings, func(i, j int) bool {
		a, b := c.rep.Findings[i], c.rep.Findings[j]
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		return a.Code < b.Code
	})
}

func (c *checker) add(f Finding) { c.rep.Findings = append(c.rep.Findings, f) }

// moveFix is the fix of a name Repair moves to lost+found.
func moveFix(phase int, bump bool, deps ...dep) *fix {
	return &fix{kind: fixMove, phase: phase, bump: bump, deps: deps}
}

const actionMove = "move to lost+found"

// problem returns a repairable problem finding (or not repairable when fx is nil,
// with action as the advice).
func problem(code Code, p, explanation, action string, fx *fix) Finding {
	return Finding{Code: code, Severity: Problem, Path: p, Explanation: explanation, Action: action,
		Repairable: fx != nil, fix: fx}
}

func note(code Code, p, explanation string) Finding {
	return Finding{Code: code, Severity: Note, Path: p, Explanation: explanation, Action: "none"}
}

// absentStore reports whether the store directory does not exist and Options say that
// this means a store with nothing in it yet (Options.MayBeAbsent): the directory is
// the one its owner's store would have in its data root.
func (c *checker) absentStore() bool {
	if !c.opts.MayBeAbsent || c.opts.Owner == "" {
		return false
	}
	if _, err := c.fs.Lstat("."); !fsx.IsNotExist(err) {
		return false
	}
	root := filepath.Dir(filepath.Dir(c.dir))
	return c.dir == dataroot.StoreDir(root, string(c.opts.Owner))
}

// absentReport is the report of an absent store (absentStore): the data root's
// rules, and the note that nothing is stored yet.
func (c *checker) absentReport(start time.Time) (*Report, error) {
	c.rep.Owner, c.rep.OwnerSource = c.opts.Owner, OwnerGiven
	if err := c.checkDataRoot(); err != nil {
		return nil, err
	}
	c.add(note(CodeStoreAbsent, ".", "the store directory does not exist: its owner has stored nothing yet (the store is made at the first write), so there is nothing to check"))
	c.sortFindings()
	c.rep.Duration = time.Since(start)
	return c.rep, nil
}

// checkRoot checks the store directory itself.
func (c *checker) checkRoot() error {
	info, err := c.fs.Lstat(".")
	if err != nil {
		switch fsx.Errno(err) {
		case syscall.ENOENT:
			return fmt.Errorf("%w: %s does not exist", ErrNotStore, c.dir)
		case syscall.ENOTDIR, syscall.ELOOP:
			return fmt.Errorf("%w: %s is not a directory (symbolic links are not followed)", ErrNotStore, c.dir)
		}
		return fmt.Errorf("%w: %s: %s", ErrNotStore, c.dir, errnoText(err))
	}
	if !info.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", ErrNotStore, c.dir)
	}
	if int(info.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s belongs to uid %d; run sealbridge-fsck as that user", ErrNotStore, c.dir, info.Uid)
	}
	c.rep.root = info.Fingerprint()
	if err := fsx.CheckPrivateDir(".", info); err != nil {
		c.add(c.dirMetadata(".", "the store directory", info))
	}
	return nil
}

// checkDataRoot applies the data-root rules (internal/dataroot) to the data root
// above the store directory, when the store sits in one: <root>/delivery/<hex>.
func (c *checker) checkDataRoot() error {
	parent := filepath.Dir(c.dir)
	if filepath.Base(parent) != dataroot.DeliveryDir || !record.ValidID(record.KindIdempotency, filepath.Base(c.dir)) {
		return nil
	}
	vs, err := dataroot.RootViolations(filepath.Dir(parent))
	if err != nil {
		return fmt.Errorf("fsck: checking the data root of %s: %w", c.dir, err)
	}
	for _, v := range vs {
		c.add(problem(CodeDataRootUnsafe, v.Path, v.Rule+"; every sealbridge binary refuses this data root until it is fixed",
			"none: "+v.Fix, nil))
	}
	return nil
}

// dirMetadata is the finding of a directory that fsx.CheckPrivateDir refused.
func (c *checker) dirMetadata(p, what string, info fsx.Info) Finding {
	code, why := metadataProblem(info, 0o700)
	if code == CodeBadOwner {
		return problem(code, p, what+" is "+why, "none: give it back to the store's owner (chown), then run again", nil)
	}
	return problem(code, p, what+" has "+why, "set mode 0700",
		&fix{kind: fixChmod, phase: phaseRoot, perm: 0o700, dir: true, deps: []dep{{path: p, fp: info.Fingerprint(), dir: true}}})
}

// checkLock inspects ".lock" and the lock temps.
func (c *checker) checkLock() error {
	st, err := lockfile.Inspect(c.fs, c.opts.lockOptions())
	switch {
	case errors.Is(err, lockfile.ErrInvalid):
		c.rep.Lock = "invalid"
		why := ".lock is " + typeName(st.Info.Mode)
		if st.Info.IsRegular() {
			why = fmt.Sprintf(".lock is owned by uid %d", st.Info.Uid)
		}
		c.add(problem(CodeLockInvalid, lockfile.LockName, why+"; every writer refuses the store while it is there",
			actionMove, moveFix(phaseLockFile, false, dep{path: lockfile.LockName, fp: st.Info.Fingerprint()})))
	case err != nil:
		return fmt.Errorf("fsck: inspecting the lock of %s: %w", c.dir, err)
	case !st.Present:
	case st.Live:
		c.rep.Lock = "live"
		f := note(CodeLockLive, lockfile.LockName, "a running writer holds the store lock; this check may see its changes in progress, and repair refuses to run")
		f.Holder = holderOf(st.Holder)
		c.add(f)
	case st.Stale:
		c.rep.Lock = "stale"
		f := problem(CodeLockStale, lockfile.LockName, "a lock left by a holder that is gone (stale): no writer holds the store, and the next one would break it",
			"remove the stale lock", &fix{kind: fixBreakLock, phase: phaseLockFile, deps: []dep{{path: lockfile.LockName, fp: st.Info.Fingerprint()}}})
		f.Holder = holderOf(st.Holder)
		f.AgeSeconds = c.ageOf(st.Info.MtimeNs, st.Holder)
		c.add(f)
	default:
		c.rep.Lock = "held"
		f := note(CodeLockHeld, lockfile.LockName, fmt.Sprintf("a lock without a running holder that is not stale yet (stale after %s); repair refuses to run until then", c.opts.LockStale))
		f.Holder = holderOf(st.Holder)
		c.add(f)
	}
	for _, name := range st.Orphans {
		info, err := c.fs.Lstat(name)
		if err != nil {
			continue // gone since the listing
		}
		switch {
		case info.IsSymlink():
			c.add(problem(CodeSymlink, name, "a lock temp name that is a symbolic link", actionMove,
				moveFix(phaseRoot, false, dep{path: name, fp: info.Fingerprint()})))
		case !info.IsRegular():
			c.add(problem(CodeWrongType, name, "a lock temp name that is "+typeName(info.Mode), actionMove,
				moveFix(phaseRoot, false, dep{path: name, fp: info.Fingerprint()})))
		default:
			age := c.now.Sub(time.Unix(0, info.MtimeNs))
			var f Finding
			if age > c.opts.LockStale {
				f = problem(CodeLockTempLeftover, name, fmt.Sprintf("a lock being taken when a writer crashed (older than %s)", c.opts.LockStale),
					"remove it", &fix{kind: fixCleanLockTemps, phase: phaseTemps, deps: []dep{{path: name, fp: info.Fingerprint()}}})
			} else {
				f = note(CodeLockTempRecent, name, "a lock being taken right now, or a crash leftover younger than the stale bound")
			}
			f.AgeSeconds = int64(age / time.Second)
			c.add(f)
		}
	}
	return nil
}

func holderOf(h *lockfile.Holder) *LockHolder {
	if h == nil {
		return nil
	}
	return &LockHolder{Pid: h.Pid, Host: h.Host, Time: h.Time}
}

func (c *checker) ageOf(mtimeNs int64, h *lockfile.Holder) int64 {
	ref := time.Unix(0, mtimeNs)
	if h != nil && !h.Time.IsZero() {
		ref = h.Time
	}
	return int64(c.now.Sub(ref) / time.Second)
}

// walk lists the store directory and every kind directory, checks every name that is
// not a record, and collects the record names to verify.
func (c *checker) walk(ctx context.Context) error {
	ents, err := c.fs.ReadDir(".")
	if err != nil {
		return fmt.Errorf("fsck: listing %s: %w", c.dir, err)
	}
	sortEntries(ents)
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := e.Name
		switch {
		case name == lockfile.LockName || lockfile.IsTempName(name):
			// checkLock
		case name == store.GenerationFile:
			c.checkGeneration()
		case name == store.HeadFile:
			// checkHead
		case record.Kind(name).Valid():
			if err := c.checkKind(record.Kind(name)); err != nil {
				return err
			}
		case name == store.LostAndFound:
			c.checkLostFound()
		case name == blobsDir:
			if err := c.checkBlobsDir(); err != nil {
				return err
			}
		case fsx.IsTempName(name):
			c.checkTemp(name)
		default:
			c.unknownTop(name)
		}
	}
	return nil
}

func sortEntries(ents []fsx.DirEntry) {
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name < ents[j].Name })
}

// unknown reports a name that is not part of the layout. bump: it is in a kind
// directory, whose listing the store refuses while it is there.
func (c *checker) unknown(p string, bump bool) {
	info, err := c.fs.Lstat(p)
	if err != nil {
		return // gone since the listing
	}
	d := dep{path: p, fp: info.Fingerprint()}
	switch {
	case info.IsSymlink():
		c.add(problem(CodeSymlink, p, "a symbolic link that is not part of the store's layout (never followed)", actionMove, moveFix(phaseRecords, bump, d)))
	case info.IsDir():
		d.dir = true
		c.add(problem(CodeUnknownFile, p, "a directory that is not part of the store's layout", actionMove+" (with its contents)", moveFix(phaseRecords, bump, d)))
	default:
		why := typeName(info.Mode) + " that is not part of the store's layout"
		if bump {
			why += "; the store refuses to list its directory while it is there"
		}
		c.add(problem(CodeUnknownFile, p, why, actionMove, moveFix(phaseRecords, bump, d)))
	}
}

// unknownTop notes a name at the top of the store directory that is not part of the
// layout. The store never opens it, and Repair never moves it: nothing at the top of
// the store directory that the store did not make is moved (see movable).
func (c *checker) unknownTop(name string) {
	info, err := c.fs.Lstat(name)
	if err != nil {
		return // gone since the listing
	}
	c.foreign = append(c.foreign, name)
	what := typeName(info.Mode)
	if info.IsDir() {
		what = "a directory"
	}
	c.add(note(CodeUnknownTop, name, what+" that is not part of the store's layout; the store ignores it and repair leaves it (look at it, then move it out by hand)"))
}

// checkGeneration checks ".generation": a private regular file with one link. Its
// bytes are not checked (any byte means "some kind changed").
func (c *checker) checkGeneration() {
	p := store.GenerationFile
	info, err := c.fs.Lstat(p)
	if err != nil {
		return
	}
	d := dep{path: p, fp: info.Fingerprint()}
	if info.IsSymlink() || !info.IsRegular() {
		c.add(problem(CodeGenerationInvalid, p, ".generation is "+typeName(info.Mode)+", not a regular file; every writer fails until it is gone",
			actionMove+" (the store makes a new one at its next write)", moveFix(phaseRoot, false, d)))
		return
	}
	if err := fsx.CheckPrivateFile(p, info); err != nil {
		c.add(c.fileMetadata(p, ".generation", info, ""))
	}
}

// fileMetadata is the finding of a file we keep (a valid record, or the generation
// file) that fsx.CheckPrivateFile refused.
func (c *checker) fileMetadata(p, what string, info fsx.Info, kind record.Kind) Finding {
	code, why := metadataProblem(info, 0o600)
	d := dep{path: p, fp: info.Fingerprint()}
	if code == CodeBadMode {
		return problem(code, p, what+" has "+why, "set mode 0600",
			&fix{kind: fixChmod, phase: phaseMetadata, perm: 0o600, deps: []dep{d}})
	}
	verb := "is "
	if code == CodeHardLink {
		verb = ""
	}
	return problem(code, p, what+" "+verb+why, "rewrite it as a private file with the same bytes",
		&fix{kind: fixRewrite, phase: phaseMetadata, record: kind, bump: true, deps: []dep{d}})
}

// checkLostFound checks the lost+found directory and counts what it holds.
func (c *checker) checkLostFound() {
	p := store.LostAndFound
	info, err := c.fs.Lstat(p)
	if err != nil {
		return
	}
	if !info.IsDir() {
		c.add(problem(CodeLostFoundInvalid, p, "lost+found is "+typeName(info.Mode)+", not a directory; repair cannot move anything there",
			"none: rename or remove it by hand, then run the repair again", nil))
		return
	}
	if err := fsx.CheckPrivateDir(p, info); err != nil {
		c.add(c.dirMetadata(p, "lost+found", info))
	}
	ents, err := c.fs.ReadDir(p)
	if err != nil {
		return
	}
	names := map[string]bool{}
	for _, e := range ents {
		names[e.Name] = true
	}
	for _, e := range ents {
		entry, isNote := strings.CutSuffix(e.Name, noteSuffix)
		switch {
		case fsx.IsTempName(e.Name):
			c.checkTemp(path.Join(p, e.Name)) // a note being written
		case isNote && !names[entry]:
			np := path.Join(p, e.Name)
			if info, err := c.fs.Lstat(np); err == nil {
				c.add(problem(CodeLostFoundStaleNote, np, "a move note whose entry is missing: an interrupted repair wrote it and did not move the file",
					"remove the note", &fix{kind: fixRemove, phase: phaseTemps, deps: []dep{{path: np, fp: info.Fingerprint()}}}))
			}
		case !isNote:
			c.rep.LostFound++
			if from := movedFrom(e.Name); from != "" {
				c.quarantined[from] = true
			}
		}
	}
}

// movedFrom returns the path that a lost+found entry was moved from, read from its
// name as move makes it ("<time>-<8 hex>-<path with / as _>"), or "" if the name is
// not of that shape. Record paths hold one slash and no other "_".
func movedFrom(entry string) string {
	parts := strings.SplitN(entry, "-", 3)
	if len(parts) != 3 || len(parts[0]) != len("20060102T150405Z") || len(parts[1]) != 8 {
		return ""
	}
	return strings.Replace(parts[2], "_", "/", 1)
}

// checkTemp checks a staged write's temp: its age decides.
func (c *checker) checkTemp(p string) {
	info, err := c.fs.Lstat(p)
	if err != nil {
		return
	}
	d := dep{path: p, fp: info.Fingerprint()}
	switch {
	case info.IsSymlink():
		c.add(problem(CodeSymlink, p, "a temp name that is a symbolic link (never followed)", actionMove, moveFix(phaseRecords, false, d)))
		return
	case !info.IsRegular():
		d.dir = info.IsDir()
		c.add(problem(CodeWrongType, p, "a temp name that is "+typeName(info.Mode), actionMove, moveFix(phaseRecords, false, d)))
		return
	}
	age := c.now.Sub(time.Unix(0, info.MtimeNs))
	var f Finding
	if age > store.TempMaxAge {
		f = problem(CodeTempLeftover, p, "a staged write older than "+humanAge(store.TempMaxAge)+", left by a crash or an abandoned transaction; never part of a record",
			"remove it", &fix{kind: fixRemove, phase: phaseTemps, deps: []dep{d}})
	} else {
		f = note(CodeTempRecent, p, "a staged write younger than "+humanAge(store.TempMaxAge)+" (perhaps in progress); maintenance removes it once older")
	}
	f.AgeSeconds = int64(age / time.Second)
	c.add(f)
}

// checkKind checks a kind directory and lists its names.
func (c *checker) checkKind(k record.Kind) error {
	p := string(k)
	info, err := c.fs.Lstat(p)
	if err != nil {
		return nil // gone since the listing
	}
	d := dep{path: p, fp: info.Fingerprint()}
	switch {
	case info.IsSymlink():
		c.add(problem(CodeSymlink, p, "the "+p+" directory is a symbolic link; the store never follows it, so it holds no records", actionMove+" (the link, not its target)", moveFix(phaseRoot, true, d)))
		return nil
	case !info.IsDir():
		c.add(problem(CodeWrongType, p, "the "+p+" directory is "+typeName(info.Mode), actionMove, moveFix(phaseRoot, true, d)))
		return nil
	}
	if err := fsx.CheckPrivateDir(p, info); err != nil {
		c.add(c.dirMetadata(p, "the "+p+" directory", info))
	}
	ents, err := c.fs.ReadDir(p)
	if err != nil {
		if fsx.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("fsck: listing %s: %w", path.Join(c.dir, p), err)
	}
	sortEntries(ents)
	for _, e := range ents {
		name := path.Join(p, e.Name)
		if fsx.IsTempName(e.Name) {
			c.checkTemp(name)
			continue
		}
		id, ok := strings.CutSuffix(e.Name, ".json")
		if !ok || !record.ValidID(k, id) {
			c.unknown(name, true)
			continue
		}
		c.rep.Records++
		if e.Type&fs.ModeSymlink != 0 {
			if info, err := c.fs.Lstat(name); err == nil {
				c.present[name] = info.Fingerprint()
				c.add(problem(CodeSymlink, name, "a record name that is a symbolic link; the store never follows it",
					actionMove+" (the link, not its target)", moveFix(recordPhase(k), true, dep{path: name, fp: info.Fingerprint()})))
			}
			continue
		}
		c.jobs = append(c.jobs, job{kind: k, id: id, path: name})
	}
	return nil
}

// recordPhase is the repair phase of a move of a record file of kind k: markers go
// before members.
func recordPhase(k record.Kind) int {
	if k == record.KindBatches {
		return phaseMarkers
	}
	return phaseRecords
}

// establishOwner decides whose signatures the records must carry. The directory is
// named like a store (checkLayout): its name is the SHA-256 of its owner's DID.
func (c *checker) establishOwner() error {
	base := filepath.Base(c.dir)
	namedFor := func(did identity.DID) bool { return filepath.Base(dataroot.StoreDir("", string(did))) == base }
	if c.opts.Owner != "" {
		key, err := identity.ParseDID(string(c.opts.Owner))
		if err != nil {
			return fmt.Errorf("%w: %v", ErrOwner, err)
		}
		if !namedFor(c.opts.Owner) {
			return fmt.Errorf("%w: %s is the store directory of another identity (its name is not the SHA-256 of %s)", ErrOwner, c.dir, c.opts.Owner)
		}
		c.setOwner(c.opts.Owner, key, OwnerGiven)
		return nil
	}
	if len(c.jobs) == 0 {
		return nil
	}
	seen := false
	for _, j := range c.jobs {
		did := c.peekSigner(j)
		seen = seen || did != ""
		if did == "" || !namedFor(did) {
			continue
		}
		if key, err := identity.ParseDID(string(did)); err == nil {
			c.setOwner(did, key, OwnerDirectoryName)
			return nil
		}
	}
	if !seen {
		return fmt.Errorf("%w: no record in %s can be read to learn its owner; give the owner with --identity", ErrOwner, c.dir)
	}
	return fmt.Errorf("%w: no record in %s is signed by the identity this directory is named for (a store copied under another identity's name?); give the owner with --identity", ErrOwner, c.dir)
}

func (c *checker) setOwner(did identity.DID, key identity.PublicKey, src OwnerSource) {
	c.owner, c.ownerKey = did, key
	c.rep.Owner, c.rep.OwnerSource = did, src
}

// peekSigner returns the signer a record file claims, or "". It only proposes a
// candidate owner; record.Parse decides every record's validity.
func (c *checker) peekSigner(j job) identity.DID {
	data, _, err := fsx.ReadFile(c.fs, j.path, c.opts.Limits.MaxBytes(j.kind))
	if err != nil {
		return ""
	}
	var h struct {
		Signer string `json:"signer"`
	}
	if json.Unmarshal(bytes.TrimSpace(data), &h) != nil {
		return ""
	}
	return identity.DID(h.Signer)
}

// verifyAll verifies every record on opts.Workers goroutines.
func (c *checker) verifyAll(ctx context.Context) ([]result, error) {
	results := make([]result, len(c.jobs))
	total := len(c.jobs)
	var next, done atomic.Int64
	var progMu sync.Mutex
	reported := -1
	report := func() {
		if c.opts.Progress == nil {
			return
		}
		progMu.Lock()
		defer progMu.Unlock()
		if n := int(done.Load()); n > reported {
			reported = n
			c.opts.Progress(Progress{Stage: StageVerify, Done: n, Total: total})
		}
	}
	step := int64(max(1, total/100))
	var wg sync.WaitGroup
	for w := 0; w < min(c.opts.Workers, max(total, 1)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(total) {
					return
				}
				results[i] = c.verify(c.jobs[i])
				if n := done.Add(1); n%step == 0 {
					report()
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	report()
	return results, nil
}

// verify reads one record file, bounded and without following links, and has the
// store judge it.
func (c *checker) verify(j job) result {
	data, info, err := fsx.ReadFile(c.fs, j.path, c.opts.Limits.MaxBytes(j.kind))
	phase := recordPhase(j.kind)
	if err != nil {
		fp := info.Fingerprint()
		switch {
		case fsx.IsNotExist(err):
			return result{vanished: true}
		case fsx.Errno(err) == syscall.ELOOP:
			if linfo, lerr := c.fs.Lstat(j.path); lerr == nil {
				fp = linfo.Fingerprint()
			}
			f := problem(CodeSymlink, j.path, "a record name that is a symbolic link; the store never follows it",
				actionMove+" (the link, not its target)", moveFix(phase, true, dep{path: j.path, fp: fp}))
			return result{fp: fp, finding: &f}
		case errors.Is(err, fsx.ErrNotRegular):
			f := problem(CodeWrongType, j.path, "a record name that is "+typeName(info.Mode)+", not a regular file",
				actionMove, moveFix(phase, true, dep{path: j.path, fp: fp, dir: info.IsDir()}))
			return result{fp: fp, finding: &f}
		case errors.Is(err, fsx.ErrTooLarge):
			f := problem(CodeOversize, j.path, fmt.Sprintf("%d bytes, over the %d-byte limit of %s records; the store refuses it unread",
				info.Size, c.opts.Limits.MaxBytes(j.kind), j.kind), actionMove, moveFix(phase, true, dep{path: j.path, fp: fp}))
			return result{fp: fp, finding: &f}
		}
		if linfo, lerr := c.fs.Lstat(j.path); lerr == nil {
			fp = linfo.Fingerprint()
		}
		f := problem(CodeRecordInvalid, j.path, "the record cannot be read: "+errnoText(err), actionMove,
			moveFix(phase, true, dep{path: j.path, fp: fp}))
		return result{fp: fp, finding: &f}
	}
	fp := info.Fingerprint()
	rec, perr := record.Parse(j.kind, j.id, data, c.owner, c.ownerKey)
	if perr != nil {
		f := problem(CodeRecordInvalid, j.path, "the store refuses this record: "+sanitize(perr.Error()), actionMove,
			moveFix(phase, true, dep{path: j.path, fp: fp}))
		return result{fp: fp, finding: &f}
	}
	refs, berr := blobRefsOf(j.path, rec) // before slim drops the envelope
	if berr != nil {
		f := problem(CodeRecordInvalid, j.path, "its envelope holds a blob body but does not parse: "+sanitize(berr.Error()), actionMove,
			moveFix(phase, true, dep{path: j.path, fp: fp}))
		return result{fp: fp, finding: &f}
	}
	r := result{rec: slim(rec), fp: fp, refs: refs}
	if err := fsx.CheckPrivateFile(j.path, info); err != nil {
		f := c.fileMetadata(j.path, "the record", info, j.kind)
		r.meta = &f
	}
	return r
}

// slim drops the bulky fields no cross-record check needs.
func slim(r record.Record) record.Record {
	switch v := r.(type) {
	case *record.Outbox:
		v.Envelope = nil
	case *record.Observation:
		v.Facts, v.Published = nil, nil
	case *record.Operation:
		v.Response = nil
	}
	return r
}

func retainUntil(r record.Record) int64 {
	switch v := r.(type) {
	case *record.Outbox:
		return v.RetainUntil
	case *record.Batch:
		return v.RetainUntil
	case *record.Message:
		return v.RetainUntil
	case *record.Receipt:
		return v.RetainUntil
	case *record.Observation:
		return v.RetainUntil
	case *record.Operation:
		return v.RetainUntil
	case *record.Binding:
		return v.RetainUntil
	case *record.Refusal:
		return v.RetainUntil
	}
	return 0
}

// uncommitted ends the explanation of an outbox record a send left uncommitted.
const uncommitted = "that send was never acknowledged and this envelope is never dispatched; store maintenance removes it"

// relate collects the verification results and checks what involves more than one
// record: batches, orphans, messages, receipts and observations, expiry.
func (c *checker) relate(results []result) {
	outbox := map[string]*record.Outbox{}
	markers := map[string]*record.Batch{}
	messages := map[string]*record.Message{}
	type receipt struct {
		path string
		r    *record.Receipt
	}
	var receipts []receipt
	observed := map[string]string{} // sender 0x00 digest → observation path
	expired := map[record.Kind]int{}
	nowMs := c.now.UnixMilli()
	fps := map[string]fsx.Fingerprint{}

	for i, res := range results {
		j := c.jobs[i]
		if res.vanished {
			continue
		}
		c.present[j.path] = res.fp
		fps[j.path] = res.fp
		if res.finding != nil {
			c.add(*res.finding)
			continue
		}
		c.rep.Valid++
		if res.meta != nil {
			c.add(*res.meta)
		}
		if retainUntil(res.rec) <= nowMs {
			expired[j.kind]++
		}
		switch r := res.rec.(type) {
		case *record.Outbox:
			outbox[j.id] = r
		case *record.Batch:
			markers[j.id] = r
		case *record.Message:
			messages[j.id] = r
		case *record.Receipt:
			receipts = append(receipts, receipt{j.path, r})
		case *record.Observation:
			observed[r.SenderDID+"\x00"+r.EnvelopeDigest] = j.path
		}
	}

	// Batches: every member present, valid and consistent (record.CheckBatch).
	broken := map[string]bool{}
	committed := map[string]bool{} // message ids with an intact batch
	type intactBatch struct {
		ref     stateRef
		members []*record.Outbox
	}
	var intact []intactBatch // the committed batches and singles, for the state rules
	for _, id := range sortedKeys(markers) {
		b := markers[id]
		p := record.Path(record.KindBatches, id)
		members := make([]*record.Outbox, len(b.EnvelopeIDs))
		var missing []string
		for i, eid := range b.EnvelopeIDs {
			members[i] = outbox[eid]
			if members[i] != nil {
				continue
			}
			mp := record.Path(record.KindOutbox, eid)
			state := "missing"
			if _, ok := c.present[mp]; ok {
				state = "invalid"
			}
			missing = append(missing, fmt.Sprintf("member %d (%s) is %s", i, mp, state))
		}
		action := "unwind the batch: move the marker to lost+found, then its present members"
		fx := moveFix(phaseMarkers, true, dep{path: p, fp: fps[p]})
		switch {
		case len(missing) > 0:
			why := fmt.Sprintf("the marker lists %d members and %s", len(b.EnvelopeIDs), missing[0])
			if len(missing) > 1 {
				why += fmt.Sprintf(" (and %d more)", len(missing)-1)
			}
			c.add(problem(CodeBatchMissingMember, p, why+"; the batch can never be delivered whole", action, fx))
			broken[id] = true
		default:
			if err := record.CheckBatch(b, members); err != nil {
				c.add(problem(CodeBatchInconsistent, p, "the store refuses this batch: "+sanitize(err.Error()), action, fx))
				broken[id] = true
				continue
			}
			committed[b.MessageID] = true
			intact = append(intact, intactBatch{stateRef{b.MessageID, id}, members})
			mp := record.Path(record.KindMessages, b.MessageID)
			if _, ok := c.present[mp]; !ok {
				c.add(note(CodeMessageMissing, p, "its message record "+mp+" is absent: delivery goes on, but the message's status cannot be reported"))
			}
		}
	}

	// Orphans: outbox records that no intact marker lists, or singles (DESIGN §7)
	// that no message record commits (the store's rule for dispatchable members;
	// maintenance removes such records). What an interrupted send leaves — members
	// without their marker, a single without its message record, members a marker
	// written by a later send of the message does not list — is normal: never
	// acknowledged, never dispatched, removed by maintenance (a note). An orphan made
	// by damage — a member of a broken batch, one whose marker or message record is
	// unusable, or one whose marker or message record an earlier (interrupted) repair
	// already moved to lost+found — is a problem, moved with the batch it belonged to.
	for _, id := range sortedKeys(outbox) {
		o := outbox[id]
		mp := record.Path(record.KindBatches, o.BatchID)
		b := markers[o.BatchID]
		mfp, mpresent := c.present[mp]
		p := record.Path(record.KindOutbox, id)
		if b == nil && record.IsSingle(o.BatchID, o.EnvelopeID, o.Ordinal) {
			msgPath := record.Path(record.KindMessages, o.MessageID)
			m := messages[o.MessageID]
			if record.CommitsSingle(m, o) {
				committed[o.MessageID] = true
				intact = append(intact, intactBatch{stateRef{o.MessageID, o.BatchID}, []*record.Outbox{o}})
				continue
			}
			gfp, gpresent := c.present[msgPath]
			switch {
			case !gpresent && c.quarantined[msgPath]:
				c.add(problem(CodeOrphanOutbox, p, "a one-envelope member whose message record "+msgPath+" an earlier repair moved to lost+found; it can never be dispatched", actionMove,
					moveFix(phaseRecords, true, dep{path: p, fp: fps[p]}, dep{path: mp, fp: mfp, absent: !mpresent, orAbsent: true},
						dep{path: msgPath, fp: gfp, absent: true, orAbsent: true})))
			case m != nil:
				c.add(note(CodeOutboxUncommitted, p, "a one-envelope member that its message record "+msgPath+" does not commit (an earlier send of the message, with another envelope, was interrupted): "+uncommitted))
			case !gpresent:
				c.add(note(CodeOutboxUncommitted, p, "a one-envelope member whose message record "+msgPath+" is absent (a send interrupted before it committed): "+uncommitted))
			default:
				c.add(problem(CodeOrphanOutbox, p, "a one-envelope member whose message record "+msgPath+" is unusable and is moved away; it can never be dispatched", actionMove,
					moveFix(phaseRecords, true, dep{path: p, fp: fps[p]}, dep{path: mp, fp: mfp, absent: !mpresent, orAbsent: true},
						dep{path: msgPath, fp: gfp, absent: !gpresent, orAbsent: true})))
			}
			continue
		}
		var why string
		switch {
		case b == nil && !mpresent && c.quarantined[mp]:
			why = "its batch marker " + mp + " was moved to lost+found by an earlier repair (its batch is being unwound)"
		case b == nil && !mpresent:
			c.add(note(CodeOutboxUncommitted, p, "no batch marker lists it (a send interrupted before it committed): "+uncommitted))
			continue
		case b == nil:
			why = "its batch marker " + mp + " is unusable and is moved away"
		case !slices.Contains(b.EnvelopeIDs, id):
			c.add(note(CodeOutboxUncommitted, p, "its batch marker "+mp+" does not list it (an earlier send of the message, with other envelopes, was interrupted): "+uncommitted))
			continue
		case broken[o.BatchID]:
			why = "its batch " + mp + " is broken and is unwound"
		default:
			continue
		}
		c.add(problem(CodeOrphanOutbox, p, why, actionMove+" (after its marker)",
			moveFix(phaseRecords, true, dep{path: p, fp: fps[p]}, dep{path: mp, fp: mfp, absent: !mpresent, orAbsent: true})))
	}

	// Messages: a queued message is accepted only once an intact marker (or its
	// single) commits it.
	for _, id := range sortedKeys(messages) {
		if messages[id].Status == record.StatusQueued && !committed[id] {
			c.add(note(CodeMessageUnaccepted, record.Path(record.KindMessages, id),
				"a queued message that no intact batch commits: the store reports it as absent, and sending it again finishes it"))
		}
	}

	// State rules: each committed message against its members (state.go); and a
	// relayed message that nothing commits any more (maintenance removed its settled
	// envelopes) against none, for a hold it must not keep.
	for _, b := range intact {
		c.addStateFindings(b.ref, messages[b.ref.messageID], b.members)
	}
	for _, id := range sortedKeys(messages) {
		if m := messages[id]; !committed[id] && m.Status == record.StatusRelayed && m.Held != nil {
			c.addStateFindings(stateRef{messageID: id}, m, nil)
		}
	}

	// Receipts: the inbox follower writes a "persisted" receipt and the observation
	// together, and raises the receipt once the relay has the acknowledgement. A
	// persisted receipt beside its observation is that in-between state, not damage:
	// moving the receipt away would lose the delivery confirmation the follower still
	// owes the sender.
	for _, r := range receipts {
		op, ok := observed[r.r.SenderDID+"\x00"+r.r.EnvelopeDigest]
		if !ok || r.r.State != record.ReceiptPersisted {
			continue
		}
		c.add(note(CodeReceiptUnacknowledged, r.path,
			"the receipt says persisted and the observation "+op+" of the same envelope exists: the envelope is stored but not yet acknowledged at the relay; the daemon acknowledges it, raises the receipt and confirms delivery at its next start"))
	}

	for _, k := range record.Kinds {
		if n := expired[k]; n > 0 {
			c.add(note(CodeRecordExpired, string(k), fmt.Sprintf("%d valid %s past their retainUntil; store maintenance removes them", n, plural(n, "record", "records"))))
		}
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
