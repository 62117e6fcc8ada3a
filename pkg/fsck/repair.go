package fsck

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/record"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// RepairReport is the result of Repair: the check before, what was done, and the
// check after.
type RepairReport struct {
	Before  *Report
	Actions []ActionResult
	// After is the check run once the repairs are done (Before when there was
	// nothing to repair; nil when Repair stopped early).
	After *Report
}

// ActionResult is what Repair did about one finding.
type ActionResult struct {
	Code   Code   `json:"code"`
	Path   string `json:"path"`
	Action string `json:"action"`
	// Result is "done", "skipped" (the store changed since the check: nothing was
	// done; run again) or "failed".
	Result string `json:"result"`
	// Detail says where a file was moved, or why the action was skipped or failed.
	Detail string `json:"detail,omitempty"`
}

// Action results.
const (
	ResultDone    = "done"
	ResultSkipped = "skipped"
	ResultFailed  = "failed"
)

// noteSuffix ends the name of the note written beside each file moved to lost+found.
const noteSuffix = ".fsck.json"

// MoveNote is the JSON note written beside everything Repair moves into lost+found,
// as "<moved name>.fsck.json".
type MoveNote struct {
	V int `json:"v"`
	// From is the original path, relative to the store directory.
	From string `json:"from"`
	// To is the new path, relative to the store directory.
	To      string    `json:"to"`
	MovedAt time.Time `json:"movedAt"`
	Code    Code      `json:"code"`
	Why     string    `json:"why"`
	Tool    string    `json:"tool"`
}

// Repair checks dir and repairs every repairable problem, then checks again.
//
// It refuses (ErrLive) while the store lock is live or held and not yet stale, or
// while opts.DaemonLive reports a daemon, and refuses a directory that is not a
// store (see Check). Before every change it confirms, by recheck, that the directory
// is still the one checked and no daemon serves it, else it stops with the error.
// It moves only what movable allows: names inside kind directories and the store's
// own top-level names. It never deletes anything but stale temps,
// a stale lock and orphan lock temps: every other file it does not keep is moved into
// lost+found/ (0700) with a MoveNote beside it, by rename followed by an fsync of
// both directories. Batches are unwound by the store's rule: a broken batch's marker
// is moved before its members. A record is kept byte for byte or moved, except for
// the state rules (state.go): with opts.Signer (the owner's key) their record is
// rewritten by a store transaction; without it they are left, not repairable.
//
// Each change is made under the store lock (lockfile.Acquire, one short hold per
// change) after confirming, by fingerprint, that what the check saw is still there;
// if not, that change is skipped and the next run sees the new state. Repair is
// idempotent: run again, it finds nothing to do. Cancelling ctx stops it between
// changes and returns ctx's error with the report so far; every change is atomic, so
// the store is intact.
func Repair(ctx context.Context, dir string, opts Options) (*RepairReport, error) {
	opts = opts.withDefaults()
	probe, err := newChecker(dir, opts)
	if err != nil {
		return nil, err
	}
	if err := probe.checkRoot(); err != nil {
		if probe.absentStore() {
			// Nothing stored yet (Options.MayBeAbsent): nothing to repair.
			before, err := Check(ctx, dir, opts)
			if err != nil {
				return nil, err
			}
			return &RepairReport{Before: before, After: before}, nil
		}
		return nil, err
	}
	if err := probe.checkLayout(); err != nil {
		return nil, err
	}
	if err := refuseLive(probe, opts); err != nil {
		return nil, err
	}
	before, err := Check(ctx, dir, opts)
	if err != nil {
		return nil, err
	}
	rep := &RepairReport{Before: before}
	plan := planOf(before)
	if len(plan) == 0 {
		rep.After = before
		return rep, nil
	}
	r := &repairer{fs: probe.fs, dir: probe.dir, root: before.root, opts: opts, moved: map[string]string{}, owner: before.Owner}
	if before.Owner != "" {
		if r.ownerKey, err = identity.ParseDID(string(before.Owner)); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrOwner, err)
		}
	}
	if opts.Signer != nil {
		pub, ok := opts.Signer.Public().(ed25519.PublicKey)
		if !ok || identity.FormatDID(pub) != before.Owner {
			return rep, fmt.Errorf("%w: the key given to sign repaired records is not the owner's (%s)", ErrOwner, before.Owner)
		}
	}
	for i, f := range plan {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		res, err := r.apply(ctx, f)
		rep.Actions = append(rep.Actions, res)
		if opts.OnRepair != nil {
			opts.OnRepair(res)
		}
		if opts.Progress != nil {
			opts.Progress(Progress{Stage: StageRepair, Done: i + 1, Total: len(plan)})
		}
		if err != nil {
			return rep, err
		}
	}
	after, err := Check(ctx, dir, opts)
	if err != nil {
		return rep, err
	}
	rep.After = after
	return rep, nil
}

// refuseLive returns ErrLive if a writer or a daemon uses the store.
func refuseLive(c *checker, opts Options) error {
	st, err := lockfile.Inspect(c.fs, opts.lockOptions())
	if err == nil && st.Present && !st.Stale {
		who := "a writer"
		if st.Holder != nil {
			who = fmt.Sprintf("pid %d on host %q", st.Holder.Pid, st.Holder.Host)
		}
		if st.Live {
			return fmt.Errorf("%w: the store lock is held by %s; stop it (or wait for it) and run the repair again", ErrLive, who)
		}
		return fmt.Errorf("%w: the store lock of %s is not stale yet (after %s); run the repair again then", ErrLive, who, opts.LockStale)
	}
	return daemonLive(opts, c.dir)
}

// daemonLive returns ErrLive if opts.DaemonLive reports a daemon serving dir.
func daemonLive(opts Options, dir string) error {
	if opts.DaemonLive == nil {
		return nil
	}
	live, who, err := opts.DaemonLive(dir)
	if err != nil {
		return fmt.Errorf("fsck: asking whether a daemon serves %s: %w", dir, err)
	}
	if live {
		return fmt.Errorf("%w: a daemon serves the store (%s); stop it and run the repair again", ErrLive, who)
	}
	return nil
}

// planOf returns the repairable findings in the order their fixes must run.
func planOf(r *Report) []Finding {
	var plan []Finding
	for _, f := range r.Findings {
		if f.Severity == Problem && f.fix != nil {
			plan = append(plan, f)
		}
	}
	sort.SliceStable(plan, func(i, j int) bool { return plan[i].fix.phase < plan[j].fix.phase })
	return plan
}

type repairer struct {
	fs       fsx.FS
	dir      string          // the absolute store directory
	root     fsx.Fingerprint // the store directory as the check saw it
	opts     Options
	owner    identity.DID
	ownerKey identity.PublicKey
	moved    map[string]string // original path → lost+found path
	st       *store.Store      // opened by the first state fix (Options.Signer)
}

var errChanged = errors.New("changed since the check")

// apply runs one fix.
func (r *repairer) apply(ctx context.Context, f Finding) (ActionResult, error) {
	fx := f.fix
	res := ActionResult{Code: f.Code, Path: f.Path, Action: f.Action}
	done := func(detail string) (ActionResult, error) {
		res.Result, res.Detail = ResultDone, detail
		return res, nil
	}
	failed := func(err error) (ActionResult, error) {
		res.Result, res.Detail = ResultFailed, sanitize(err.Error())
		return res, nil
	}
	if dest, ok := r.moved[f.Path]; ok {
		return done("already moved to " + dest)
	}
	switch {
	case fx.kind == fixBreakLock:
		// BreakStale locks the lock file itself while it decides and writes it free.
		if err := r.recheck(); err != nil {
			res.Result, res.Detail = ResultSkipped, sanitize(err.Error())
			return res, err
		}
		broke, err := lockfile.BreakStale(r.fs, r.opts.lockOptions())
		switch {
		case err != nil:
			return failed(err)
		case broke:
			return done("marked free")
		}
		if st, err := lockfile.Inspect(r.fs, r.opts.lockOptions()); err == nil && !st.Present {
			return done("already free")
		}
		res.Result, res.Detail = ResultSkipped, "the lock is no longer stale; run fsck again"
		return res, nil
	case fx.kind == fixState:
		// The store's own transaction takes the store lock and decides the rule again
		// on the records it reads.
		if err := r.recheck(); err != nil {
			res.Result, res.Detail = ResultSkipped, sanitize(err.Error())
			return res, err
		}
		switch err := r.repairState(ctx, f); {
		case errors.Is(err, errStateGone):
			res.Result, res.Detail = ResultSkipped, "the records no longer break this rule; run fsck again"
			return res, nil
		case err != nil && ctx.Err() != nil:
			res.Result, res.Detail = ResultSkipped, sanitize(err.Error())
			return res, ctx.Err()
		case err != nil:
			return failed(err)
		}
		return done("rewritten by a store transaction: " + f.Action)
	case fx.phase == phaseLockFile:
		// A planted .lock: not a lock by the protocol, and no lock can be taken while
		// it is there. Moved without the lock.
		return r.run(f, res)
	}
	// Confirmed before the lock is taken (taking it writes in the directory), and
	// again under it (run).
	if err := r.recheck(); err != nil {
		res.Result, res.Detail = ResultSkipped, sanitize(err.Error())
		return res, err
	}
	lock, err := lockfile.Acquire(ctx, r.fs, r.opts.lockOptions())
	if err != nil {
		res.Result, res.Detail = ResultSkipped, "the store lock could not be taken"
		switch {
		case ctx.Err() != nil:
			return res, ctx.Err()
		case errors.Is(err, lockfile.ErrBusy):
			return res, fmt.Errorf("%w: a writer took the store lock during the repair: %v", ErrLive, err)
		}
		return res, fmt.Errorf("fsck: taking the store lock: %w", err)
	}
	res, err = r.run(f, res)
	if uerr := lock.Unlock(); uerr != nil && err == nil {
		err = fmt.Errorf("fsck: releasing the store lock: %w", uerr)
	}
	return res, err
}

// run checks a fix's dependencies and makes the change (under the lock, except for
// the lock file itself).
func (r *repairer) run(f Finding, res ActionResult) (ActionResult, error) {
	fx := f.fix
	if err := r.recheck(); err != nil {
		res.Result, res.Detail = ResultSkipped, sanitize(err.Error())
		return res, err
	}
	if why := r.checkDeps(fx); why != "" {
		if (fx.kind == fixRemove || fx.kind == fixCleanLockTemps) && r.absent(f.Path) {
			res.Result, res.Detail = ResultDone, "already gone"
			return res, nil
		}
		res.Result, res.Detail = ResultSkipped, why+" since the check; run fsck again"
		return res, nil
	}
	var err error
	switch fx.kind {
	case fixMove:
		var dest string
		if dest, err = r.move(f); err == nil {
			res.Detail = "moved to " + dest
		}
	case fixRemove:
		if err = fsx.RemoveFile(r.fs, path.Dir(f.Path), path.Base(f.Path)); err == nil {
			res.Detail = "removed"
		}
	case fixChmod:
		if err = chmodBeneath(r.fs, f.Path, fx.dir, fx.perm, fx.deps[0].fp); err == nil {
			res.Detail = fmt.Sprintf("mode set to %04o", fx.perm)
		}
	case fixRewrite:
		if err = r.rewrite(f); err == nil {
			res.Detail = "rewritten as a private file with the same bytes"
		}
	case fixCopyBlob:
		if err = r.copyBlob(f); err == nil {
			res.Detail = "replaced by a private copy of the same bytes"
		}
	case fixCleanLockTemps:
		_, err = lockfile.CleanOrphans(r.fs, r.opts.lockOptions())
		switch {
		case err == nil && r.absent(f.Path):
			res.Detail = "removed"
		case err == nil:
			res.Result, res.Detail = ResultSkipped, "the lock temp is in use"
			return res, nil
		}
	default:
		err = fmt.Errorf("fsck: unknown fix %d", fx.kind)
	}
	if err != nil {
		res.Result = ResultFailed
		if errors.Is(err, errChanged) {
			res.Result = ResultSkipped
		}
		res.Detail = sanitize(err.Error())
		return res, nil
	}
	res.Result = ResultDone
	return res, nil
}

func (r *repairer) absent(p string) bool {
	_, err := r.fs.Lstat(p)
	return fsx.IsNotExist(err)
}

// checkDeps returns "" if every fact the fix relies on still holds, else why not.
func (r *repairer) checkDeps(fx *fix) string {
	for _, d := range fx.deps {
		info, err := r.fs.Lstat(d.path)
		switch {
		case fsx.IsNotExist(err):
			if !d.absent && !d.orAbsent {
				return d.path + " is gone"
			}
		case err != nil:
			return d.path + ": " + errnoText(err)
		case d.absent:
			return d.path + " appeared"
		case d.dir:
			if info.Dev != d.fp.Dev || info.Ino != d.fp.Ino || info.Uid != d.fp.Uid || info.Mode&syscall.S_IFMT != d.fp.Mode&syscall.S_IFMT {
				return d.path + " was replaced"
			}
		case info.Fingerprint() != d.fp:
			return d.path + " changed"
		}
	}
	return ""
}

// move renames f.Path into lost+found under a fresh name, makes the rename durable
// (fsync of lost+found, then of the source directory), grows the generation if the
// name was part of a kind's listing, and writes the note beside it.
func (r *repairer) move(f Finding) (string, error) {
	if !movable(f.Path) {
		return "", fmt.Errorf("fsck: %s is not a name of the store's layout and is never moved", f.Path)
	}
	if _, err := fsx.MkdirPrivate(r.fs, store.LostAndFound); err != nil {
		return "", err
	}
	now := r.opts.Now().UTC()
	flat := strings.ReplaceAll(f.Path, "/", "_")
	var dest string
	for {
		dest = path.Join(store.LostAndFound, fmt.Sprintf("%s-%s-%s", now.Format("20060102T150405Z"), randHex(4), flat))
		_, err := r.fs.Lstat(dest)
		if fsx.IsNotExist(err) {
			break
		}
		if err != nil {
			return "", err
		}
	}
	// The note first, durably: a crash after it and before the move leaves a note
	// without its entry (reported as lost-found-stale-note and removed by the next
	// repair, which moves the entry again); never a moved entry without its note.
	note, _ := json.Marshal(MoveNote{V: 1, From: f.Path, To: dest, MovedAt: now, Code: f.Code, Why: f.Explanation, Tool: r.opts.Tool})
	if err := fsx.WriteFile(r.fs, store.LostAndFound, path.Base(dest)+noteSuffix, append(note, '\n')); err != nil {
		return "", fmt.Errorf("writing the note of the move to %s: %w", dest, err)
	}
	if err := r.fs.Rename(f.Path, dest); err != nil {
		// Take the note back (best effort; a leftover is a stale note, removed later).
		_ = fsx.RemoveFile(r.fs, store.LostAndFound, path.Base(dest)+noteSuffix)
		return "", err
	}
	r.moved[f.Path] = dest
	if f.fix.bump {
		r.bumpGeneration()
	}
	if err := r.fs.SyncDir(store.LostAndFound); err != nil {
		return dest, err
	}
	if err := r.fs.SyncDir(path.Dir(f.Path)); err != nil {
		return dest, err
	}
	return dest, nil
}

// rewrite replaces a file we keep by a private copy of the same bytes (a new inode,
// mode 0600, owned by us, one link), after re-verifying a record.
func (r *repairer) rewrite(f Finding) error {
	fx := f.fix
	limit := int64(1 << 30) // the generation file: one byte per publication
	if fx.record != "" {
		limit = r.opts.Limits.MaxBytes(fx.record)
	}
	data, info, err := fsx.ReadFile(r.fs, f.Path, limit)
	if err != nil {
		return err
	}
	if info.Fingerprint() != fx.deps[0].fp {
		return errChanged
	}
	if fx.record != "" {
		id := strings.TrimSuffix(path.Base(f.Path), ".json")
		if _, err := record.Parse(fx.record, id, data, r.owner, r.ownerKey); err != nil {
			return fmt.Errorf("%w: the record is no longer valid", errChanged)
		}
	}
	if err := fsx.WriteFile(r.fs, path.Dir(f.Path), path.Base(f.Path), data); err != nil {
		return err
	}
	if fx.bump {
		r.bumpGeneration()
	}
	return nil
}

// bumpGeneration appends one "\n" to .generation, where the store appends a kind's
// mark at every publication (a byte that is not a kind mark means "every kind may
// have changed", docs/FORMAT.md §7), so that processes holding cached listings notice the change even within one
// timestamp tick. Best effort: a generation file that is not a private regular file
// is left alone (its own finding deals with it).
func (r *repairer) bumpGeneration() {
	f, err := r.fs.OpenFile(store.GenerationFile, syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CREAT|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil || fsx.CheckPrivateFile(store.GenerationFile, info) != nil {
		return
	}
	_, _ = f.Write([]byte{'\n'})
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
