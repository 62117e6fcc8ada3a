// Command sealbridge-fsck checks a sealbridge store offline and, with --repair,
// repairs it. See newRoot (its help) and docs/FSCK.md.
package main

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/buildinfo"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/sealbridge/sealbridge/internal/cli"
	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/fsck"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/reconcile"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// usageText is the description of the command line, in its help and man page.
const usageText = `Checks a sealbridge store directory offline: every record against the store's
validity rules (signatures verified on every core), batches, orphans, messages,
receipts, leftover temps, the lock, modes, owners, symbolic links and unknown
files. Read-only unless --repair or --reconcile is given. Checking never needs the
private key; repairing a message's state (a message behind its envelopes, a hold
left on a closed record or made on one side only) signs the corrected record with
the key of --identity NAME.

--reconcile brings a store restored from a copy forward to what its relays know
(docs/FSCK.md "Reconcile"): it asks every relay the outbox names, and each
--relay URL, for the head it witnessed and for what it holds of the pending
envelopes, settles those a relay holds as relayed, writes a head above every
relay's (which ends STORE_ROLLED_BACK), then checks the store as without it. It
never sends an envelope, needs the key of --identity NAME, and is refused while
the store's daemon runs. A relay that cannot be asked fails it with nothing
written.

STORE-DIR is the store directory, <data root>/delivery/<hex sha256(DID)>; never a
data root, an empty path or any other directory. Without it, --home and
--identity name the store. (A STORE-DIR named "completion" is given as
./completion.)`

// exitText is the exit statuses, in the help and the man page.
const exitText = `  0   no problems found (with --reconcile: reconciled, and no problems found)
  1   problems were found and all were repaired
  4   problems are left (found by a check, or not repairable)
  8   operational error: the store cannot be checked (missing, not a directory,
      another user's, not laid out like a store, a data root, owner unknown) or
      the store is in use (its lock or its daemon is live) during --repair or
      --reconcile, or --reconcile could not ask a relay; nothing is changed
  16  usage error (an empty STORE-DIR, --home or --identity is one)
  32  cancelled (Ctrl-C); the store is left intact
`

// Exit codes, fsck(8)'s convention.
const (
	exitClean       = 0
	exitRepaired    = 1
	exitProblems    = 4
	exitOperational = 8
	exitUsage       = 16
	exitCancelled   = 32
)

// largeStore is the number of records from which a progress bar is shown on a
// terminal.
const largeStore = 10_000

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program: parse args, check or repair, print, and return the exit
// code. SIGINT and SIGTERM cancel it (exit 32).
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runContext(ctx, args, stdout, stderr)
}

// Test seams.
var (
	isTerminal = func(w io.Writer) bool {
		f, ok := w.(*os.File)
		if !ok {
			return false
		}
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		return err == nil
	}
	// testOnlyProgress, if set, is called with every progress report.
	testOnlyProgress func(fsck.Progress)
	// testOnlyRepair, if set, is called after every repair.
	testOnlyRepair func(fsck.ActionResult)
)

// prog is this binary's conventions (internal/cli): usage errors exit 16.
var prog = cli.Program{Name: "sealbridge-fsck", UsageExit: exitUsage, ManSection: "8", Version: version()}

// errUsage marks a usage error (as does a *cli.UsageError).
var errUsage = errors.New("usage error")

type config struct {
	json, repair, progress, version bool
	reconcile                       bool     // --reconcile
	relays                          []string // --relay URL, repeated
	home                            string
	identityArg                     string       // --identity as given (a name or a DID), or its default
	identityGiven                   bool         // --identity was given
	identity                        identity.DID // the owner, once known
	root                            string       // the data root, when known
	dir                             string
	viaHome                         bool               // the store was named by --home/--identity
	signer                          crypto.Signer      // the key of --identity NAME, for the state repairs
	owner                           *identity.Identity // the key of --identity NAME, for --reconcile
	reconciled                      *reconcile.Report  // what --reconcile did, once it did
}

// identityEnv names the identity when --identity is not given (as in sealbridge and
// sealbridged); then dataroot.DefaultIdentity.
const identityEnv = "SEALBRIDGE_IDENTITY"

// newRoot is the command line: its flags, help and exit statuses, from which the
// help, the completions and the man page are made. Its run parses into *c.
func newRoot(c *config) *cobra.Command {
	root := &cobra.Command{
		Use:   "sealbridge-fsck [--json] [--repair | --reconcile [--relay URL]...] [--progress] [--identity NAME|DID] STORE-DIR",
		Short: "check (and repair) a sealbridge store offline",
		Long:  usageText,
		Example: `  sealbridge-fsck
  sealbridge-fsck --home ~/.local/state/sealbridge --identity alice
  sealbridge-fsck ~/.local/state/sealbridge/delivery/256caa67…
  sealbridge-fsck --repair --json STORE-DIR
  sealbridge-fsck --reconcile --identity alice`,
		Args: cobra.ArbitraryArgs,
	}
	cli.Annotate(root, cli.AnnotSynopsis, "[--json] [--repair] [--progress] [--home DIR] [--identity NAME|DID]\n[--json] --reconcile [--relay URL]... [--home DIR] [--identity NAME]\n--version\ncompletion bash|zsh|fish")
	cli.Annotate(root, cli.AnnotExit, exitText)
	fs := root.Flags()
	fs.BoolVar(&c.json, "json", false, "print one JSON document (schema in docs/FSCK.md)")
	fs.BoolVar(&c.repair, "repair", false, "repair what can be repaired: files it does not keep are moved (never deleted) into lost+found/ with a note; stale temps are removed and a stale lock is marked free. Refused while the store's lock or its daemon (the flock of its pid file) is live")
	fs.BoolVar(&c.reconcile, "reconcile", false, "bring a store restored from a copy forward to what its relays hold, write a head above every relay's (ending STORE_ROLLED_BACK), then check it; never sends an envelope. Needs the key of --identity NAME; refused while the store's daemon runs; a relay that cannot be asked fails it with nothing written")
	fs.StringArrayVar(&c.relays, "relay", nil, "with --reconcile: also ask the relay at `URL` (repeatable), besides every relay the outbox names")
	fs.BoolVar(&c.progress, "progress", false, "report progress on stderr even when it is not a terminal (by default a bar is shown only on a terminal, for large stores)")
	fs.StringVar(&c.home, "home", "", cli.HomeUsage)
	fs.StringVar(&c.identityArg, "identity", "", "the owner: an identity `NAME|DID` (its key file <data root>/identities/NAME.key is read for its DID) or its did:key. Without STORE-DIR it names the store (default: $SEALBRIDGE_IDENTITY, else \"default\"); with STORE-DIR the directory's name must be the SHA-256 of its DID")
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	_ = root.MarkFlagDirname("home")
	return root
}

// errHelpShown: parseArgs printed the help; there is nothing to check.
var errHelpShown = errors.New("help shown")

// parseArgs parses the command line into a config; a help request prints the
// help on stdout and returns errHelpShown.
func parseArgs(args []string, stdout, stderr io.Writer) (config, error) {
	var c config
	ran := false
	root := newRoot(&c)
	root.RunE = func(cmd *cobra.Command, positional []string) error {
		ran = true
		return c.parse(cmd, positional)
	}
	err := prog.Execute(context.Background(), root, args, stdout, stderr)
	if err == nil && !ran {
		err = errHelpShown
	}
	return c, err
}

// parse checks the flags and arguments and completes c from them.
func (c *config) parse(cmd *cobra.Command, positional []string) error {
	if c.version {
		return nil
	}
	homeGiven := cmd.Flags().Changed("home")
	c.identityGiven = cmd.Flags().Changed("identity")
	// An empty value never means "the current directory" or "the default": it is
	// what a script passes for an unset variable.
	switch {
	case homeGiven && c.home == "":
		return fmt.Errorf("%w: --home is empty (an unset variable?); give the data root", errUsage)
	case c.identityGiven && c.identityArg == "":
		return fmt.Errorf("%w: --identity is empty (an unset variable?); give an identity name or a did:key", errUsage)
	case slices.Contains(positional, ""):
		return fmt.Errorf("%w: STORE-DIR is empty (an unset variable?); give the store directory, never an empty path", errUsage)
	case len(positional) > 1:
		return fmt.Errorf("%w: one STORE-DIR only (got %d)", errUsage, len(positional))
	case len(positional) == 1 && homeGiven:
		return fmt.Errorf("%w: give STORE-DIR or --home DIR [--identity NAME|DID], not both", errUsage)
	case c.reconcile && c.repair:
		return fmt.Errorf("%w: give --reconcile or --repair, not both (run --reconcile first; it checks the store after)", errUsage)
	case len(c.relays) > 0 && !c.reconcile:
		return fmt.Errorf("%w: --relay is for --reconcile", errUsage)
	case c.reconcile && isDID(c.identityArg):
		return fmt.Errorf("%w: --reconcile signs with the owner's key: give --identity NAME (its key file in the data root), not a did:key", errUsage)
	case c.reconcile && len(positional) == 1 && !c.identityGiven:
		return fmt.Errorf("%w: --reconcile signs with the owner's key: give --identity NAME with STORE-DIR", errUsage)
	case slices.Contains(c.relays, ""):
		return fmt.Errorf("%w: --relay is empty (an unset variable?); give a relay URL", errUsage)
	}
	if !c.identityGiven && len(positional) == 0 {
		c.identityArg = os.Getenv(identityEnv)
		if c.identityArg == "" {
			c.identityArg = dataroot.DefaultIdentity
		}
	}
	if c.identityArg != "" {
		if isDID(c.identityArg) {
			if _, err := identity.ParseDID(c.identityArg); err != nil {
				return fmt.Errorf("%w: --identity %q is not a valid did:key", errUsage, c.identityArg)
			}
			c.identity = identity.DID(c.identityArg)
		} else if err := dataroot.CheckIdentityName(c.identityArg); err != nil {
			return fmt.Errorf("%w: --identity: %v, or give a did:key", errUsage, err)
		}
	}
	if len(positional) == 1 {
		dir, err := filepath.Abs(positional[0])
		if err != nil {
			return fmt.Errorf("%w: STORE-DIR %q: %v", errUsage, positional[0], err)
		}
		c.dir = dir
		// <data root>/delivery/<64 hex>: the data root holds the identities and the
		// daemon's pid file. Elsewhere the layout check refuses the directory.
		if filepath.Base(filepath.Dir(dir)) == dataroot.DeliveryDir {
			c.root = filepath.Dir(filepath.Dir(dir))
		}
		return nil
	}
	root, err := dataroot.Resolve(c.home)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	c.root, c.viaHome = root, true
	return nil
}

// isDID reports whether an --identity value is meant as a DID rather than a name.
func isDID(s string) bool { return strings.HasPrefix(s, "did:") }

// identityError: a named identity's key file could not be read to learn its DID
// (err, whose hint, a key-file rule's fix, is kept).
type identityError struct {
	msg string
	err error
}

func (e *identityError) Error() string { return e.msg }
func (e *identityError) Unwrap() error { return e.err }

// resolveOwner learns the DID of an identity given by name (from its key file under
// the data root; fsck needs only the public half) and names the store directory
// when it was given by --home/--identity.
func resolveOwner(cfg *config) error {
	if cfg.identity == "" && cfg.identityArg != "" && cfg.root != "" {
		p := dataroot.KeyFile(cfg.root, cfg.identityArg)
		id, err := identity.LoadKeyFile(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return &identityError{fmt.Sprintf("no identity %s at %s", cfg.identityArg, p), nil}
		case err != nil:
			return &identityError{fmt.Sprintf("identity %s: %s", cfg.identityArg, strings.TrimPrefix(err.Error(), "identity: ")), err}
		}
		cfg.identity = id.DID()
		if cfg.repair {
			cfg.signer = id.Signer()
		}
		if cfg.reconcile {
			cfg.owner = id
		}
	}
	if cfg.viaHome {
		cfg.dir = dataroot.StoreDir(cfg.root, string(cfg.identity))
	}
	return nil
}

// daemonLive reports whether a daemon serves the store directory dir, by trying (and
// at once releasing) the flock of its pid file, which a running daemon holds. dir is
// <data root>/delivery/<hex sha256(DID)> (fsck checks the layout before asking), so
// the pid file is dataroot.PIDFile(<data root>, DID): its short id is the first 16
// hex digits of the directory's name. The pid file of earlier daemons,
// <data root>/run/<hex sha256(DID)>/sealbridged.pid, is tried too.
func daemonLive(dir string) (bool, string, error) {
	name := filepath.Base(dir)
	if len(name) != 64 {
		return false, "", fmt.Errorf("%s is not named like a store directory", dir)
	}
	root := filepath.Dir(filepath.Dir(dir))
	for _, p := range []string{
		filepath.Join(root, dataroot.RunDir, name[:16]+".pid"),
		filepath.Join(root, dataroot.RunDir, name, "sealbridged.pid"),
	} {
		live, who, err := pidFileLocked(p)
		if err != nil || live {
			return live, who, err
		}
	}
	return false, "", nil
}

// pidFileLocked reports whether the pid file p is flocked by another process. It
// never creates p, never follows a link at p, and never blocks.
func pidFileLocked(p string) (bool, string, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case err == unix.ENOENT || err == unix.ENOTDIR:
		return false, "", nil
	case err == unix.ELOOP:
		return false, "", fmt.Errorf("the daemon's pid file %s is a symbolic link", p)
	case err != nil:
		return false, "", fmt.Errorf("opening the daemon's pid file %s: %w", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, "", fmt.Errorf("the daemon's pid file %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, "", fmt.Errorf("the daemon's pid file %s is not a regular file", p)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	switch {
	case err == nil:
		return false, "", nil // closing the descriptor releases it
	case err != unix.EWOULDBLOCK:
		return false, "", fmt.Errorf("trying the lock of the daemon's pid file %s: %w", p, err)
	}
	buf := make([]byte, 32)
	n, _ := unix.Pread(fd, buf, 0)
	who := "pid file " + p
	if pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:max(n, 0)]))); err == nil {
		who = fmt.Sprintf("pid %d, pid file %s", pid, p)
	}
	return true, who, nil
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseArgs(args, stdout, stderr)
	switch {
	case errors.Is(err, errHelpShown):
		return exitClean
	case err != nil:
		prog.Report(stderr, usageOf(err))
		return exitCode(err, nil, nil)
	case cfg.version:
		fmt.Fprintf(stdout, "sealbridge-fsck %s\n", version())
		return exitClean
	}
	if err := resolveOwner(&cfg); err != nil {
		if cfg.json {
			writeJSON(stdout, cfg, nil, nil, nil, err, exitOperational)
		}
		writeError(stderr, cfg, err, nil, exitOperational)
		return exitOperational
	}

	if cfg.reconcile {
		rep, err := runReconcile(ctx, cfg)
		if err != nil {
			code := exitCode(err, nil, nil)
			if cfg.json {
				writeJSON(stdout, cfg, nil, nil, nil, err, code)
			}
			writeError(stderr, cfg, err, nil, code)
			return code
		}
		cfg.reconciled = &rep
		if !cfg.json {
			writeReconcile(stdout, rep)
		}
	}

	bar := &progressBar{w: stderr, tty: isTerminal(stderr), force: cfg.progress, now: time.Now}
	opts := fsck.Options{Owner: cfg.identity, Signer: cfg.signer, Tool: "sealbridge-fsck " + version(), Progress: func(p fsck.Progress) {
		bar.update(p)
		if testOnlyProgress != nil {
			testOnlyProgress(p)
		}
	}, OnRepair: func(a fsck.ActionResult) {
		if testOnlyRepair != nil {
			testOnlyRepair(a)
		}
	}, DaemonLive: daemonLive,
		// A store named by an identity whose key file was read, and not there yet:
		// nothing stored (exit 0, said so), not a missing directory.
		MayBeAbsent: cfg.viaHome && !isDID(cfg.identityArg)}
	var before, after *fsck.Report
	var repairs []fsck.ActionResult
	if cfg.repair {
		var rr *fsck.RepairReport
		rr, err = fsck.Repair(ctx, cfg.dir, opts)
		if rr != nil {
			before, after, repairs = rr.Before, rr.After, rr.Actions
		}
	} else {
		before, err = fsck.Check(ctx, cfg.dir, opts)
	}
	bar.finish()
	code := exitCode(err, before, after)
	if cfg.json {
		writeJSON(stdout, cfg, before, after, repairs, err, code)
	} else if err == nil {
		writeHuman(stdout, cfg, before, after, repairs)
	}
	if err != nil {
		writeError(stderr, cfg, err, repairs, code)
	}
	return code
}

// runReconcile is --reconcile (pkg/reconcile): on the store of --identity NAME,
// opened with the owner's key through its data root (so its local witness is
// read and written), unless its daemon runs (fsck.ErrLive: like --repair). It
// writes nothing when it fails.
func runReconcile(ctx context.Context, cfg config) (reconcile.Report, error) {
	var none reconcile.Report
	if cfg.owner == nil || cfg.root == "" {
		return none, errcode.WithHint(fmt.Errorf("--reconcile needs the owner's key, and %s is not in a data root", cfg.dir),
			"give the store as <data root>/delivery/<64 hex digits> with --identity NAME, or as --home DIR --identity NAME")
	}
	if want := dataroot.StoreDir(cfg.root, string(cfg.identity)); want != cfg.dir {
		return none, errcode.WithHint(fmt.Errorf("%s is not the store of identity %s (%s is)", cfg.dir, cfg.identityArg, want),
			"nothing was changed; give the identity that owns the store")
	}
	switch fi, err := os.Lstat(cfg.dir); {
	case errors.Is(err, os.ErrNotExist):
		return none, errcode.WithHint(fmt.Errorf("identity %s has no store at %s", cfg.identityArg, cfg.dir),
			"nothing to reconcile: a store is made by its first message")
	case err != nil:
		return none, err
	case !fi.IsDir():
		return none, fmt.Errorf("%w: %s is not a directory (symbolic links are not followed)", fsck.ErrNotStore, cfg.dir)
	}
	live, who, err := daemonLive(cfg.dir)
	if err != nil {
		return none, err
	}
	if live {
		return none, fmt.Errorf("%w: its daemon is running (%s)", fsck.ErrLive, who)
	}
	s, err := store.Open(cfg.owner.Signer(), store.Options{Home: cfg.root})
	if err != nil {
		return none, err
	}
	return reconcile.Run(ctx, s, cfg.owner, reconcile.Options{Relays: cfg.relays})
}

// writeReconcile prints what --reconcile did, before the check's lines.
func writeReconcile(w io.Writer, rep reconcile.Report) {
	if rep.RolledBack != "" {
		fmt.Fprintf(w, "sealbridge-fsck: reconcile: the store was rolled back: %s\n", rep.RolledBack)
	}
	for _, r := range rep.Relays {
		seen := "no head witnessed"
		if r.WitnessedSeq > 0 {
			seen = fmt.Sprintf("witnessed head seq %d", r.WitnessedSeq)
		}
		fmt.Fprintf(w, "sealbridge-fsck: reconcile: relay %s: %s; %d pending %s asked about: %d brought forward (relayed), %d left pending\n",
			r.URL, seen, r.Asked, plural(r.Asked, "envelope", "envelopes"), r.BroughtForward, r.LeftPending)
	}
	fmt.Fprintf(w, "sealbridge-fsck: reconcile: wrote head seq %d; %d %s brought forward, %d left pending (the daemon sends them)\n",
		rep.HeadSeq, rep.BroughtForward, plural(rep.BroughtForward, "envelope", "envelopes"), rep.LeftPending)
}

// exitCode is the one place that maps an outcome to an exit code.
func exitCode(err error, before, after *fsck.Report) int {
	switch {
	case errors.Is(err, errUsage), cli.IsUsage(err):
		return exitUsage
	case errors.Is(err, context.Canceled):
		return exitCancelled
	case err != nil:
		return exitOperational
	case before.Problems() == 0:
		return exitClean
	case after != nil && after.Problems() == 0:
		return exitRepaired
	default:
		return exitProblems
	}
}

func writeError(w io.Writer, cfg config, err error, repairs []fsck.ActionResult, code int) {
	done := 0
	for _, a := range repairs {
		if a.Result == fsck.ResultDone {
			done++
		}
	}
	switch code {
	case exitCancelled:
		fmt.Fprintf(w, "sealbridge-fsck: cancelled; the store is intact (%d %s made)\n", done, plural(done, "change", "changes"))
		return
	}
	prog.Report(w, err)
	repair := ""
	if cfg.repair {
		repair = " --repair"
	}
	switch {
	case errors.Is(err, fsck.ErrLive) && cfg.reconcile:
		fmt.Fprintf(w, "sealbridge-fsck: hint: nothing was changed; stop the daemon, then run sealbridge-fsck --reconcile again\n")
	case errors.Is(err, fsck.ErrLive):
		fmt.Fprintf(w, "sealbridge-fsck: hint: nothing was changed%s; check without --repair to see the findings\n", changedNote(done))
	case errors.Is(err, fsck.ErrOwner):
		fmt.Fprintf(w, "sealbridge-fsck: hint: give the owner: sealbridge-fsck%s --identity NAME|DID %s\n", repair, shellQuote(cfg.dir))
	case errors.Is(err, fsck.ErrDataRoot):
		fmt.Fprintf(w, "sealbridge-fsck: hint: nothing was changed%s; to check a store of this data root: sealbridge-fsck%s --home %s --identity NAME|DID\n",
			changedNote(done), repair, shellQuote(cfg.dir))
	case errors.Is(err, fsck.ErrNotStoreLayout), errors.Is(err, fsck.ErrNotStore):
		fmt.Fprintf(w, "sealbridge-fsck: hint: nothing was changed%s; STORE-DIR is <data root>/delivery/<64 hex digits>, or name the store: sealbridge-fsck%s --home DIR --identity NAME|DID\n",
			changedNote(done), repair)
	case errors.As(err, new(*identityError)) && errcode.HintOf(err) == "":
		fmt.Fprintf(w, "sealbridge-fsck: hint: give the owner's did:key with --identity, or create the identity with: sealbridge init --home %s --identity %s\n",
			shellQuote(cfg.root), shellQuote(cfg.identityArg))
	}
}

// usageOf is a parse error as a *cli.UsageError, without the "usage error: " that
// errUsage puts before a message (the error line says what it is); a hint is kept.
func usageOf(err error) error {
	if msg, ok := strings.CutPrefix(err.Error(), errUsage.Error()+": "); ok {
		err = errcode.WithHint(errors.New(msg), errcode.HintOf(err))
	}
	return cli.AsUsage(err)
}

func changedNote(done int) string {
	if done == 0 {
		return ""
	}
	return fmt.Sprintf(" after %d %s", done, plural(done, "change", "changes"))
}

// repairCommand is the exact command that repairs what a check found.
func repairCommand(cfg config) string { return fsckCommand(cfg, "--repair") }

// reconcileCommand is the command that reconciles this store (--reconcile needs
// an identity's name, never a did:key).
func reconcileCommand(cfg config) string {
	if isDID(cfg.identityArg) || !cfg.viaHome && !cfg.identityGiven {
		return fsckCommand(config{dir: cfg.dir, identityGiven: true, identityArg: "NAME"}, "--reconcile")
	}
	return fsckCommand(cfg, "--reconcile")
}

// fsckCommand is sealbridge-fsck with flag on the store cfg names, as it was named.
func fsckCommand(cfg config, flag string) string {
	cmd := "sealbridge-fsck " + flag
	if cfg.viaHome {
		if cfg.home != "" {
			cmd += " --home " + shellQuote(cfg.home)
		}
		return cmd + " --identity " + shellQuote(cfg.identityArg)
	}
	if cfg.identityGiven {
		cmd += " --identity " + shellQuote(cfg.identityArg)
	}
	return cmd + " " + shellQuote(cfg.dir)
}

// shellQuote quotes s for a POSIX shell if it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./+:@=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// version is the module version and VCS revision of this binary.
func version() string { return buildinfo.Version() }

// document is the --json output (docs/FSCK.md).
type document struct {
	Schema        string               `json:"schema"`
	Tool          string               `json:"tool"`
	Store         string               `json:"store"`
	Mode          string               `json:"mode"`
	Reconcile     *reconcile.Report    `json:"reconcile,omitempty"`
	Owner         string               `json:"owner,omitempty"`
	OwnerSource   string               `json:"ownerSource,omitempty"`
	Lock          string               `json:"lock,omitempty"`
	Summary       *summary             `json:"summary,omitempty"`
	Findings      []fsck.Finding       `json:"findings"`
	Repairs       *[]fsck.ActionResult `json:"repairs,omitempty"`
	Remaining     *[]fsck.Finding      `json:"remaining,omitempty"`
	RepairCommand string               `json:"repairCommand,omitempty"`
	ExitCode      int                  `json:"exitCode"`
	Error         string               `json:"error,omitempty"`
}

type summary struct {
	Records    int   `json:"records"`
	Valid      int   `json:"valid"`
	Problems   int   `json:"problems"`
	Repairable int   `json:"repairable"`
	Notes      int   `json:"notes"`
	LostFound  int   `json:"lostFound"`
	DurationMs int64 `json:"durationMs"`
	Repaired   *int  `json:"repaired,omitempty"`
	Left       *int  `json:"left,omitempty"`
}

const schema = "sealbridge-fsck/v1"

func writeJSON(w io.Writer, cfg config, before, after *fsck.Report, repairs []fsck.ActionResult, err error, code int) {
	doc := document{Schema: schema, Tool: "sealbridge-fsck " + version(), Store: cfg.dir, Mode: "check",
		Findings: []fsck.Finding{}, ExitCode: code}
	if cfg.repair {
		doc.Mode = "repair"
	}
	if cfg.reconcile {
		doc.Mode, doc.Reconcile = "reconcile", cfg.reconciled
	}
	if err != nil {
		doc.Error = err.Error()
	}
	if before != nil {
		doc.Owner, doc.OwnerSource, doc.Lock = string(before.Owner), string(before.OwnerSource), before.Lock
		doc.Findings = before.Findings
		doc.Summary = &summary{Records: before.Records, Valid: before.Valid, Problems: before.Problems(),
			Repairable: before.Repairable(), Notes: before.Notes(), LostFound: before.LostFound,
			DurationMs: before.Duration.Milliseconds()}
	}
	if cfg.repair {
		rs := repairs
		if rs == nil {
			rs = []fsck.ActionResult{}
		}
		doc.Repairs = &rs
		if after != nil {
			rem := after.Findings
			doc.Remaining = &rem
			repaired, left := countDone(repairs), after.Problems()
			doc.Summary.Repaired, doc.Summary.Left = &repaired, &left
		}
	}
	if code == exitProblems {
		doc.RepairCommand = repairCommand(cfg)
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	_ = enc.Encode(doc)
}

func countDone(rs []fsck.ActionResult) int {
	n := 0
	for _, a := range rs {
		if a.Result == fsck.ResultDone {
			n++
		}
	}
	return n
}

func writeHuman(w io.Writer, cfg config, before, after *fsck.Report, repairs []fsck.ActionResult) {
	final := before
	if after != nil {
		final = after
	}
	fmt.Fprintf(w, "sealbridge-fsck: %s: %d %s checked, %d %s (%d repairable), %d %s, in %s\n",
		cfg.dir, before.Records, plural(before.Records, "record", "records"), before.Problems(),
		plural(before.Problems(), "problem", "problems"), before.Repairable(), before.Notes(),
		plural(before.Notes(), "note", "notes"), before.Duration.Round(time.Millisecond))
	if cfg.repair {
		for _, a := range repairs {
			word := map[string]string{fsck.ResultDone: "repaired", fsck.ResultSkipped: "skipped ", fsck.ResultFailed: "FAILED  "}[a.Result]
			fmt.Fprintf(w, "%s  %-21s %s: %s\n", word, a.Code, a.Path, a.Detail)
		}
		if after != nil && len(repairs) > 0 {
			fmt.Fprintf(w, "after repair: %d %s left, %d %s; lost+found holds %d %s\n", after.Problems(),
				plural(after.Problems(), "problem", "problems"), after.Notes(), plural(after.Notes(), "note", "notes"),
				after.LostFound, plural(after.LostFound, "entry", "entries"))
		}
		for _, f := range final.Findings {
			writeFinding(w, f)
		}
	} else {
		for _, f := range before.Findings {
			writeFinding(w, f)
		}
	}
	left := final.Problems()
	if left == 0 {
		return
	}
	// A store behind its witness is reconciled, not repaired: --repair never
	// touches it (and refuses to write while it is rolled back).
	if slices.ContainsFunc(final.Findings, func(f fsck.Finding) bool { return f.Code == fsck.CodeStoreRolledBack }) {
		fmt.Fprintf(w, "the store is behind a head it wrote (restored from an older copy?): bring it forward first: %s\n",
			reconcileCommand(cfg))
		if left--; left == 0 {
			return
		}
	}
	repairable := final.Repairable()
	switch {
	case repairable > 0:
		fmt.Fprintf(w, "%d %s left; to repair %s: %s\n", left, plural(left, "problem", "problems"),
			plural(repairable, "it", "them"), repairCommand(cfg))
		if repairable < left {
			fmt.Fprintf(w, "%d %s cannot be repaired by sealbridge-fsck: see its action above\n", left-repairable, plural(left-repairable, "problem", "problems"))
		}
	default:
		fmt.Fprintf(w, "%d %s left that sealbridge-fsck cannot repair: see the actions above, then run: %s\n",
			left, plural(left, "problem", "problems"), repairCommand(cfg))
	}
}

func writeFinding(w io.Writer, f fsck.Finding) {
	line := fmt.Sprintf("%-7s  %-21s %s: %s", f.Severity, f.Code, f.Path, f.Explanation)
	if f.Holder != nil {
		line += fmt.Sprintf(" (pid %d on host %q since %s)", f.Holder.Pid, f.Holder.Host, f.Holder.Time.Format(time.RFC3339))
	}
	if f.Severity == fsck.Problem {
		line += " [" + repairWord(f) + "]"
	}
	fmt.Fprintln(w, line)
}

func repairWord(f fsck.Finding) string {
	if f.Repairable {
		return "repair: " + f.Action
	}
	return "not repairable: " + strings.TrimPrefix(f.Action, "none: ")
}

// progressBar draws progress on stderr: a bar redrawn in place on a terminal for a
// large store, or, when forced (--progress) on a non-terminal, a line every 10%.
type progressBar struct {
	w           io.Writer
	tty, force  bool
	now         func() time.Time
	stage       string
	large       bool // the store is large: a bar on a terminal, for every stage
	last        time.Time
	lastTenth   int
	drawn, done bool
}

func (b *progressBar) update(p fsck.Progress) {
	if p.Stage != b.stage {
		b.finish()
		*b = progressBar{w: b.w, tty: b.tty, force: b.force, now: b.now, stage: p.Stage, large: b.large}
	}
	if p.Stage == fsck.StageVerify && p.Total >= largeStore {
		b.large = true
	}
	if p.Total == 0 || b.done {
		return
	}
	verb, noun := "checking", "records"
	if p.Stage == fsck.StageRepair {
		verb, noun = "repairing", "problems"
	}
	switch {
	case b.tty && (b.force || b.large):
		if now := b.now(); p.Done < p.Total && now.Sub(b.last) < 100*time.Millisecond {
			return
		} else {
			b.last = now
		}
		const width = 30
		fill := width * p.Done / p.Total
		fmt.Fprintf(b.w, "\r\033[K%s [%s%s] %3d%% %d/%d %s", verb, strings.Repeat("#", fill),
			strings.Repeat(".", width-fill), 100*p.Done/p.Total, p.Done, p.Total, noun)
		b.drawn = true
	case b.force:
		if tenth := 10 * p.Done / p.Total; tenth > b.lastTenth || p.Done == p.Total {
			b.lastTenth = tenth
			past := map[string]string{"checking": "checked", "repairing": "repaired"}[verb]
			fmt.Fprintf(b.w, "sealbridge-fsck: %s %d/%d %s\n", past, p.Done, p.Total, noun)
		}
	}
	if p.Done == p.Total {
		b.finish()
	}
}

// finish ends a bar drawn in place, so what follows starts on a clean line.
func (b *progressBar) finish() {
	if b.drawn && !b.done {
		fmt.Fprint(b.w, "\r\033[K")
	}
	b.done = b.done || b.drawn
}
