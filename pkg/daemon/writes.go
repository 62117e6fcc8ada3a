package daemon

// Failed store writes — a full disk, a used-up quota, a read-only or failing file
// system — are one health problem, "store writes", whoever met them: a request, the
// carrier, the inbox follower, maintenance, startup. So /readyz reports it in plain
// words while writes fail, the log says it as one condition (when it appears, at most
// once a minute per errno while it persists, once when it clears), and the API's
// answers say it with a hint. The write prober clears it: while the problem holds it
// probes the store (store.ProbeWrite) every writeProbeEvery, and the first probe that
// succeeds with no write failing meanwhile ends it.

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/sealbridge/sealbridge/internal/dataroot"
	"github.com/sealbridge/sealbridge/pkg/errcode"
)

// writeSource is the health problem's source and the condition's key.
const writeSource = "store writes"

// writeProbeEvery is the period of the write prober's probes while writes fail.
const writeProbeEvery = 2 * time.Second

// writeFailure reports whether err is a failed store write (OutboxStoreUnwritable).
func writeFailure(err error) bool { return errors.Is(err, errcode.OutboxStoreUnwritable) }

// errnoNames are the errnos a failed write is described by.
var errnoNames = map[syscall.Errno]string{
	syscall.ENOSPC: "ENOSPC", syscall.EDQUOT: "EDQUOT", syscall.EROFS: "EROFS", syscall.EIO: "EIO",
	syscall.EACCES: "EACCES", syscall.EPERM: "EPERM", syscall.EFBIG: "EFBIG", syscall.ENOMEM: "ENOMEM",
}

// errnoOf is err's errno and its name ("" and 0 if it carries none).
func errnoOf(err error) (syscall.Errno, string) {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return 0, ""
	}
	if name, ok := errnoNames[errno]; ok {
		return errno, name
	}
	return errno, fmt.Sprintf("errno %d", int(errno))
}

// describeWriteFailure says in plain words why the store at dir cannot be written
// (err, a failed write), and what to do.
func describeWriteFailure(dir string, err error) (msg, hint string) {
	q := dataroot.ShellQuote(dir)
	errno, name := errnoOf(err)
	then := "; sends are refused and deliveries wait meanwhile, and /readyz is ready again once a write succeeds"
	switch errno {
	case syscall.ENOSPC:
		return fmt.Sprintf("the disk holding %s is full (ENOSPC: no space left on device)", dir),
			"free space on the file system holding it (df -h " + q + ")" + then
	case syscall.EDQUOT:
		return fmt.Sprintf("this user's disk quota on the file system holding %s is used up (EDQUOT)", dir),
			"free space in this user's files on that file system, or raise the quota (quota -s)" + then
	case syscall.EROFS:
		return fmt.Sprintf("the file system holding %s is read-only (EROFS)", dir),
			"remount it read-write (a file system is remounted read-only after an error: check dmesg), then check the store with sealbridge-fsck" + then
	case syscall.EIO:
		return fmt.Sprintf("the disk holding %s fails (EIO: input/output error)", dir),
			"check the disk (dmesg), then the store with sealbridge-fsck" + then
	case syscall.EACCES, syscall.EPERM:
		return fmt.Sprintf("this user may not write the store %s (%s)", dir, name),
			"check the owner and mode of the store's directories with sealbridge-fsck" + then
	case 0:
		return fmt.Sprintf("the store %s cannot be written: %v", dir, err), "check the file system holding it" + then
	}
	return fmt.Sprintf("the store %s cannot be written (%s: %v)", dir, name, errno), "check the file system holding it" + then
}

// writeFailed records that a store write failed (err, a writeFailure): the health
// problem, in plain words, and its condition, logged at most once a minute per errno.
// It wakes the write prober and returns the words and the hint.
func (d *Daemon) writeFailed(err error) (msg, hint string) {
	msg, hint = describeWriteFailure(d.st.Dir(), err)
	d.writeFails.Add(1)
	d.health.setProblem(readyProblem{Source: writeSource, Code: errcode.Of(err), Error: msg, Hint: hint}, d.now())
	_, class := errnoOf(err)
	if class == "" {
		class = errClass(err)
	}
	d.cond.warn(writeSource, class, "store: writes fail", "reason", msg, "hint", hint, "err", err)
	select {
	case d.writeKick <- struct{}{}:
	default:
	}
	return msg, hint
}

// probeWrites is the write prober: see the top of this file.
func (d *Daemon) probeWrites(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.writeKick:
		}
		for d.health.has(writeSource) {
			if !d.sleep(ctx, writeProbeEvery, nil) {
				return
			}
			fails := d.writeFails.Load()
			err := d.st.ProbeWrite()
			switch {
			case err == nil && d.writeFails.Load() == fails:
				d.health.clear(writeSource)
				d.cond.clear(writeSource, "store: writes work again", "store", d.st.Dir())
			case err != nil && writeFailure(err):
				d.writeFailed(err)
			case err != nil:
				d.log.Warn("store: probing writes", "err", err)
			}
		}
	}
}

// storeWarn logs a store failure met beside a request's answer: a failed write as
// the one "store writes" condition (writeFailed), anything else as a warning.
func (d *Daemon) storeWarn(msg string, err error, attrs ...any) {
	if writeFailure(err) {
		d.writeFailed(err)
		return
	}
	d.log.Warn(msg, append(attrs, "err", err)...)
}
