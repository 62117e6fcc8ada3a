package record

import (
	"fmt"

	"github.com/sealbridge/sealbridge/pkg/errcode"
)

func where(r Record) string { return fmt.Sprintf("%s/%s", r.Kind(), r.RecordID()) }

func conflict(r Record, format string, args ...any) error {
	return errcode.New(errcode.DeliveryRecordConflict, where(r), fmt.Errorf(format, args...))
}

func statusErr(r Record, format string, args ...any) error {
	return errcode.New(errcode.InvalidDeliveryStatus, where(r), fmt.Errorf(format, args...))
}

func statusConflict(r Record, format string, args ...any) error {
	return errcode.New(errcode.DeliveryStatusConflict, where(r), fmt.Errorf(format, args...))
}
