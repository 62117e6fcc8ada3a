package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/sealbridge/sealbridge/internal/lockfile"
	"github.com/sealbridge/sealbridge/pkg/errcode"
	"github.com/sealbridge/sealbridge/pkg/record"
)

func where(r record.Record) string { return fmt.Sprintf("%s/%s", r.Kind(), r.RecordID()) }

func conflict(r record.Record, format string, args ...any) error {
	return errcode.New(errcode.DeliveryRecordConflict, where(r), fmt.Errorf(format, args...))
}

func invalidAt(path string, cause error) error {
	return errcode.New(errcode.OutboxStoreInvalid, path, cause)
}

func unwritable(path string, cause error) error {
	return errcode.New(errcode.OutboxStoreUnwritable, path, cause)
}

// lockError maps a lockfile error to its code.
func lockError(root string, err error) error {
	switch {
	case errors.Is(err, lockfile.ErrBusy), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// Held for the lock's bound, or the caller's context ended while it waited.
		return errcode.New(errcode.OutboxStoreBusy, root, err)
	case errors.Is(err, lockfile.ErrInvalid):
		return errcode.New(errcode.OutboxStoreInvalid, root+"/.lock", err)
	default:
		return errcode.Ensure(err, errcode.OutboxStoreUnwritable, root)
	}
}
