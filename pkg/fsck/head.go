package fsck

import (
	"fmt"
	"path/filepath"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/envelope"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/identity"
	"github.com/sealbridge/sealbridge/pkg/store"
)

// The head checks (DESIGN §5, "The head"; docs/FSCK.md). fsck reads .head and the
// local witness and never writes either: a head is only written by the store
// (WriteHead, Reconcile), so no repair rewrites, moves or removes it.

// headRead is what reading one head file found: the head, or why it is unusable
// (a finding's explanation), or neither (absent).
type headRead struct {
	head *envelope.StoreHead
	why  string
}

// readHeadFile reads the head file name of fsys by the store's rules: a private
// regular file with one link, read without following a link, at most
// envelope.MaxHeadSize bytes, a head that verifies, signed by the identity the
// store directory is named for.
func (c *checker) readHeadFile(fsys fsx.FS, name, what string) headRead {
	info, err := fsys.Lstat(name)
	if fsx.IsNotExist(err) {
		return headRead{}
	}
	if err != nil {
		return headRead{why: what + " cannot be examined: " + errnoText(err)}
	}
	if info.IsSymlink() || !info.IsRegular() {
		return headRead{why: what + " is " + typeName(info.Mode) + ", not a regular file"}
	}
	if err := fsx.CheckPrivateFile(name, info); err != nil {
		switch code, why := metadataProblem(info, 0o600); code {
		case CodeBadOwner:
			return headRead{why: what + " is " + why}
		case CodeHardLink:
			return headRead{why: fmt.Sprintf("%s has %d links; a head must have exactly one", what, info.Nlink)}
		default:
			return headRead{why: what + " has " + why}
		}
	}
	data, _, err := fsx.ReadFile(fsys, name, envelope.MaxHeadSize)
	if err != nil {
		if info.Size > envelope.MaxHeadSize {
			return headRead{why: fmt.Sprintf("%s is %d bytes, larger than a head can be (%d)", what, info.Size, envelope.MaxHeadSize)}
		}
		return headRead{why: what + " cannot be read: " + errnoText(err)}
	}
	h, err := envelope.ParseStoreHead(data)
	if err != nil {
		return headRead{why: what + " is not a valid signed head (" + err.Error() + ")"}
	}
	if !c.namedFor(h.Owner) {
		return headRead{why: what + " is signed by " + string(h.Owner) + ", not by the identity the store directory is named for"}
	}
	if c.opts.Owner != "" && h.Owner != c.opts.Owner {
		return headRead{why: what + " is signed by " + string(h.Owner) + ", not by the owner given"}
	}
	return headRead{head: h}
}

// namedFor reports whether the store directory is named for did.
func (c *checker) namedFor(did identity.DID) bool {
	return filepath.Base(dataroot.StoreDir("", string(did))) == filepath.Base(c.dir)
}

// checkHeadFormat reads .head before anything else is read: a head of the owner
// naming a newer format than this binary reads refuses the whole run
// (STORE_FORMAT_NEWER), with nothing read further and nothing changed.
func (c *checker) checkHeadFormat() error {
	c.head = c.readHeadFile(c.fs, store.HeadFile, ".head")
	if h := c.head.head; h != nil && h.Format > store.FormatVersion {
		err := errcode.New(errcode.StoreFormatNewer, filepath.Join(c.dir, store.HeadFile),
			fmt.Errorf("store format %d, this sealbridge-fsck reads format %d", h.Format, store.FormatVersion))
		return errcode.WithHint(err, fmt.Sprintf("this sealbridge reads format %d; the store at %s was written by format %d: use a newer sealbridge", store.FormatVersion, c.dir, h.Format))
	}
	return nil
}

// witnessPath is the local witness of the store's head: Options.WitnessFile, or
// <data root>/witness/<store directory name>.head (dataroot.WitnessFile: the store
// directory is <data root>/delivery/<hex sha256(owner)>, checkLayout).
func (c *checker) witnessPath() string {
	if c.opts.WitnessFile != "" {
		return c.opts.WitnessFile
	}
	root := filepath.Dir(filepath.Dir(c.dir))
	return filepath.Join(root, dataroot.WitnessDir, filepath.Base(c.dir)+".head")
}

// checkHead reports the head's findings: head-absent (a note, for a store with
// records and no head), head-invalid, the witness unusable (witness-invalid) or
// ahead of the head (store-rolled-back).
func (c *checker) checkHead() {
	const fixHead = "none: fsck never rewrites the head; move it out of the store directory by hand, then run sealbridge-fsck --reconcile"
	switch {
	case c.head.why != "":
		c.add(problem(CodeHeadInvalid, store.HeadFile, c.head.why+"; the store refuses to open", fixHead, nil))
	case c.head.head == nil && len(c.jobs) > 0:
		c.add(note(CodeHeadAbsent, store.HeadFile, "the store has no head: it is from before heads (format 1) or has not written one yet; the store writes one after its next commit"))
	}
	wp := c.witnessPath()
	dir := filepath.Dir(wp)
	w := c.readHeadFile(fsx.NewOS(dir), filepath.Base(wp), "the local witness")
	if w.why != "" {
		c.add(problem(CodeWitnessInvalid, wp, w.why+"; the store refuses to open",
			"none: move it out of "+dir+" by hand, then run sealbridge-fsck --reconcile", nil))
		return
	}
	if w.head == nil || c.head.why != "" {
		return
	}
	headSeq := int64(0)
	if c.head.head != nil {
		headSeq = c.head.head.Seq
	}
	if w.head.Seq > headSeq {
		c.add(problem(CodeStoreRolledBack, store.HeadFile,
			fmt.Sprintf("the store's head is seq %d but its owner signed seq %d (the local witness in the data root's %s/): the store was restored from an older copy, and refuses every write until it is reconciled",
				headSeq, w.head.Seq, dataroot.WitnessDir),
			"run sealbridge-fsck --reconcile", nil))
	}
}
