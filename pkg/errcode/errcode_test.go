package errcode_test

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// designCodes is the list of DESIGN §15, in its order.
var designCodes = []string{
	"OUTBOX_FULL", "OUTBOX_STORE_BUSY", "OUTBOX_STORE_INVALID", "OUTBOX_STORE_UNWRITABLE",
	"OUTBOX_DEADLINE_EXPIRED", "DELIVERY_RECORD_CONFLICT", "INVALID_DELIVERY_STATUS",
	"DELIVERY_STATUS_CONFLICT", "IDEMPOTENCY_STORE_FULL", "IDEMPOTENCY_STORE_BUSY",
	"IDEMPOTENCY_KEY_REUSED", "IDEMPOTENCY_IN_PROGRESS", "MESSAGE_NOT_FOUND", "MESSAGE_CLOSED",
	"BODY_TOO_LARGE", "BODY_MISSING", "BODY_SIZE_MISMATCH", "BODY_DIGEST_MISMATCH", "BODY_CHUNK_INVALID",
	"STORE_ROLLED_BACK", "STORE_FORMAT_NEWER",
}

func TestCatalogueMatchesDesign(t *testing.T) {
	if len(errcode.All) != len(designCodes) {
		t.Fatalf("All has %d codes, DESIGN §15 lists %d", len(errcode.All), len(designCodes))
	}
	for i, c := range errcode.All {
		if c.String() != designCodes[i] {
			t.Errorf("All[%d] = %s, want %s", i, c, designCodes[i])
		}
	}
}

func TestCodesDistinct(t *testing.T) {
	shape := regexp.MustCompile(`^[A-Z]+(_[A-Z]+)+$`)
	names := map[string]bool{}
	ptrs := map[*errcode.Code]bool{}
	for _, c := range errcode.All {
		if c == nil {
			t.Fatal("nil code in All")
		}
		if names[c.String()] {
			t.Errorf("duplicate code string %s", c)
		}
		if ptrs[c] {
			t.Errorf("duplicate code value %s", c)
		}
		names[c.String()], ptrs[c] = true, true
		if !shape.MatchString(c.String()) {
			t.Errorf("code %q is not UPPER_SNAKE", c)
		}
		if !strings.HasPrefix(c.Error(), c.String()+": ") || len(c.Error()) <= len(c.String())+2 {
			t.Errorf("Code.Error() = %q, want the code and a meaning", c.Error())
		}
		for _, d := range errcode.All {
			if c != d && errors.Is(c, d) {
				t.Errorf("errors.Is(%s, %s) = true", c, d)
			}
			if c != d && errors.Is(errcode.New(c, "x", nil), d) {
				t.Errorf("errors.Is(New(%s), %s) = true", c, d)
			}
		}
	}
}

func TestLookup(t *testing.T) {
	for _, c := range errcode.All {
		if got := errcode.Lookup(c.String()); got != c {
			t.Errorf("Lookup(%q) = %v", c, got)
		}
	}
	for _, name := range []string{"", "outbox_full", "OUTBOX_FULL ", "NOPE", "OUTBOX_FULL: outbox capacity limit reached"} {
		if got := errcode.Lookup(name); got != nil {
			t.Errorf("Lookup(%q) = %v, want nil", name, got)
		}
	}
}

func TestIsThroughWrapping(t *testing.T) {
	cause := &fs.PathError{Op: "write", Path: "outbox/x.json", Err: syscall.ENOSPC}
	base := errcode.New(errcode.OutboxStoreUnwritable, "outbox/x.json", cause)
	wrapped := fmt.Errorf("commit: %w", fmt.Errorf("txn 7: %w", base))
	for name, err := range map[string]error{"direct": base, "wrapped": wrapped, "joined": errors.Join(errors.New("other"), wrapped)} {
		if !errors.Is(err, errcode.OutboxStoreUnwritable) {
			t.Errorf("%s: errors.Is(err, OutboxStoreUnwritable) = false", name)
		}
		if errors.Is(err, errcode.OutboxStoreInvalid) {
			t.Errorf("%s: errors.Is(err, OutboxStoreInvalid) = true", name)
		}
		// The cause stays reachable for logs.
		if !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("%s: errno not reachable", name)
		}
		var pe *fs.PathError
		if !errors.As(err, &pe) || pe != cause {
			t.Errorf("%s: errors.As did not reach the *fs.PathError cause", name)
		}
		if got := errcode.Of(err); got != "OUTBOX_STORE_UNWRITABLE" {
			t.Errorf("%s: Of = %q", name, got)
		}
		if got := errcode.CodeOf(err); got != errcode.OutboxStoreUnwritable {
			t.Errorf("%s: CodeOf = %v", name, got)
		}
	}
	// A bare sentinel is itself an error carrying its code.
	bare := fmt.Errorf("decide: %w", errcode.IdempotencyKeyReused)
	if !errors.Is(bare, errcode.IdempotencyKeyReused) || errcode.CodeOf(bare) != errcode.IdempotencyKeyReused || errcode.Of(bare) != "IDEMPOTENCY_KEY_REUSED" {
		t.Errorf("bare sentinel through %%w: Is/CodeOf/Of disagree")
	}
}

func TestUnwrap(t *testing.T) {
	cause := errors.New("disk on fire")
	err := errcode.New(errcode.OutboxStoreInvalid, "messages/a.json", cause)
	if got := errors.Unwrap(err); got != cause {
		t.Fatalf("Unwrap = %v, want the cause", got)
	}
	if got := errors.Unwrap(errcode.New(errcode.OutboxFull, "x", nil)); got != nil {
		t.Fatalf("Unwrap without cause = %v, want nil", got)
	}
	if got := errors.Unwrap(errcode.Errorf(errcode.OutboxFull, "%d pending", 3)); got != nil {
		t.Fatalf("Unwrap of Errorf = %v, want nil", got)
	}
	var ce *errcode.Error
	if !errors.As(fmt.Errorf("w: %w", err), &ce) || ce.Code != errcode.OutboxStoreInvalid || ce.Context != "messages/a.json" || ce.Cause != cause {
		t.Fatalf("errors.As(*Error) = %+v", ce)
	}
}

func TestFirstCodeWins(t *testing.T) {
	inner := errcode.New(errcode.OutboxStoreInvalid, "outbox/a.json", nil)
	outer := errcode.New(errcode.OutboxStoreBusy, "plan", fmt.Errorf("retry: %w", inner))
	if errcode.CodeOf(outer) != errcode.OutboxStoreBusy || errcode.Of(outer) != "OUTBOX_STORE_BUSY" {
		t.Fatalf("CodeOf = %v, want the outermost code", errcode.CodeOf(outer))
	}
	// Both codes stay visible to errors.Is.
	if !errors.Is(outer, errcode.OutboxStoreBusy) || !errors.Is(outer, errcode.OutboxStoreInvalid) {
		t.Fatal("errors.Is does not see both codes of the chain")
	}
}

func TestOfAndCodeOfUncoded(t *testing.T) {
	for _, err := range []error{nil, errors.New("plain"), fmt.Errorf("w: %w", syscall.EIO)} {
		if got := errcode.Of(err); got != "" {
			t.Errorf("Of(%v) = %q, want empty", err, got)
		}
		if got := errcode.CodeOf(err); got != nil {
			t.Errorf("CodeOf(%v) = %v, want nil", err, got)
		}
	}
}

func TestEnsure(t *testing.T) {
	if got := errcode.Ensure(nil, errcode.OutboxStoreUnwritable, "x"); got != nil {
		t.Fatalf("Ensure(nil) = %v", got)
	}
	coded := fmt.Errorf("w: %w", errcode.New(errcode.OutboxFull, "pending", nil))
	if got := errcode.Ensure(coded, errcode.OutboxStoreUnwritable, "x"); got != coded {
		t.Fatalf("Ensure changed an already coded error: %v", got)
	}
	bare := fmt.Errorf("w: %w", errcode.OutboxStoreBusy)
	if got := errcode.Ensure(bare, errcode.OutboxStoreUnwritable, "x"); got != bare {
		t.Fatalf("Ensure changed an error carrying a bare code: %v", got)
	}
	plain := &fs.PathError{Op: "rename", Path: "outbox/.t.tmp", Err: syscall.EIO}
	got := errcode.Ensure(plain, errcode.OutboxStoreUnwritable, "outbox/a.json")
	if !errors.Is(got, errcode.OutboxStoreUnwritable) || errcode.CodeOf(got) != errcode.OutboxStoreUnwritable {
		t.Fatalf("Ensure(plain) = %v, want OUTBOX_STORE_UNWRITABLE", got)
	}
	if errors.Unwrap(got) != plain || !errors.Is(got, syscall.EIO) {
		t.Fatalf("Ensure(plain) lost the cause: %v", got)
	}
	if !strings.Contains(got.Error(), "outbox/a.json") {
		t.Fatalf("Ensure(plain).Error() = %q lacks the context", got.Error())
	}
}

func TestErrorText(t *testing.T) {
	cause := &fs.PathError{Op: "fsync", Path: "outbox", Err: syscall.EIO}
	tests := []struct {
		err  error
		want string
	}{
		{errcode.New(errcode.OutboxStoreInvalid, "outbox/1b4e.json", nil), "OUTBOX_STORE_INVALID: outbox/1b4e.json"},
		{errcode.New(errcode.OutboxStoreUnwritable, "outbox/1b4e.json", cause), "OUTBOX_STORE_UNWRITABLE: outbox/1b4e.json: fsync outbox: input/output error"},
		{errcode.New(errcode.OutboxFull, "", nil), "OUTBOX_FULL"},
		{errcode.New(errcode.OutboxFull, "", cause), "OUTBOX_FULL: fsync outbox: input/output error"},
		{errcode.Errorf(errcode.IdempotencyStoreFull, "%d of %d operations", 10000, 10000), "IDEMPOTENCY_STORE_FULL: 10000 of 10000 operations"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	// New adds nothing of its own beyond the code, the context and the cause: not the
	// code's description, not any other state.
	for _, c := range errcode.All {
		err := errcode.New(c, "ctx-123", nil)
		if got, want := err.Error(), c.String()+": ctx-123"; got != want {
			t.Errorf("New(%s).Error() = %q, want %q", c, got, want)
		}
	}
}

func TestErrorfDoesNotWrap(t *testing.T) {
	// Errorf formats context only: a %w verb does not make its argument a cause.
	inner := errors.New("inner")
	err := errcode.Errorf(errcode.OutboxFull, "%v", inner)
	if errors.Is(err, inner) {
		t.Fatal("Errorf context became a cause")
	}
	if !errors.Is(err, errcode.OutboxFull) {
		t.Fatal("Errorf lost its code")
	}
}
