package fsck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/pkg/record"
)

// maxExplanation bounds the length of an explanation taken from an error.
const maxExplanation = 200

// sanitize turns an error text into one explanation line that carries no payload
// contents: only the first line, every quoted value replaced by "…" unless it is a
// kind name, and bounded in length. The store's own error texts name fields, kinds and
// ids; values copied from a file (a status, a key name, a character) are dropped.
func sanitize(msg string) string {
	if i := strings.IndexAny(msg, "\r\n"); i >= 0 {
		msg = msg[:i]
	}
	var b strings.Builder
	for i := 0; i < len(msg); {
		c := msg[i]
		// A single quote opens a quoted value only after a space (encoding/json's
		// "invalid character 'x'"), not in a word like "store's".
		if c != '"' && (c != '\'' || (i > 0 && msg[i-1] != ' ')) {
			b.WriteByte(c)
			i++
			continue
		}
		end := closingQuote(msg, i)
		if end < 0 {
			b.WriteString(string(c) + "…" + string(c))
			break
		}
		inner := msg[i+1 : end]
		if c == '"' && record.Kind(inner).Valid() {
			b.WriteString(msg[i : end+1])
		} else {
			b.WriteString(string(c) + "…" + string(c))
		}
		i = end + 1
	}
	out := strings.TrimSpace(b.String())
	if len(out) > maxExplanation {
		out = strings.ToValidUTF8(out[:maxExplanation], "") + "…"
	}
	return out
}

// closingQuote returns the index of the quote closing the one at i, honouring
// backslash escapes, or -1.
func closingQuote(s string, i int) int {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case q:
			return j
		}
	}
	return -1
}

// errnoText describes a file-system error without its path.
func errnoText(err error) string {
	if e := fsx.Errno(err); e != 0 {
		return e.Error()
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return sanitize(pe.Err.Error())
	}
	return sanitize(err.Error())
}

// typeName names the file type of a mode.
func typeName(mode uint32) string {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		return "a regular file"
	case syscall.S_IFDIR:
		return "a directory"
	case syscall.S_IFLNK:
		return "a symbolic link"
	case syscall.S_IFIFO:
		return "a FIFO"
	case syscall.S_IFSOCK:
		return "a socket"
	case syscall.S_IFCHR:
		return "a character device"
	case syscall.S_IFBLK:
		return "a block device"
	}
	return "of an unknown type"
}

// metadataProblem classifies why fsx.CheckPrivateFile or CheckPrivateDir refused info
// (which they already did: this only picks the code and the words).
func metadataProblem(info fsx.Info, wantPerm uint32) (Code, string) {
	switch {
	case int(info.Uid) != os.Geteuid():
		return CodeBadOwner, fmt.Sprintf("owned by uid %d, not by the user running fsck (uid %d)", info.Uid, os.Geteuid())
	case !info.IsDir() && info.Nlink != 1:
		return CodeHardLink, fmt.Sprintf("has %d links; a record must have exactly one", info.Nlink)
	default:
		return CodeBadMode, fmt.Sprintf("mode %04o: group or others have access (want %04o)", info.Perm(), wantPerm)
	}
}

// humanAge formats an age coarsely (its largest unit), for explanations that must
// not change from one second to the next.
func humanAge(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%d days", int(d/(24*time.Hour)))
	case d >= time.Hour:
		return fmt.Sprintf("%d h", int(d/time.Hour))
	case d >= time.Minute:
		return fmt.Sprintf("%d min", int(d/time.Minute))
	}
	return "less than a minute"
}
