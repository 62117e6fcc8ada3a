//go:build linux

package fsx

import (
	"errors"
	"io/fs"
	"time"

	"golang.org/x/sys/unix"
)

// probeTimeNs is the modification time ProbeGranularity sets: an odd second with a
// non-zero digit at every sub-second place, so each granularity keeps a different part
// of it (2 s also drops the odd second).
const probeTimeNs = 1_600_000_001_123_456_789

// granularities are the timestamp granularities ProbeGranularity tells apart, finest
// first: nanoseconds (ext4 with large inodes, XFS, Btrfs, tmpfs), microseconds (some
// network file systems), 1, 10 and 100 ms, 1 s (ext3, ext4 with 128-byte inodes, many
// NFS servers) and 2 s (FAT).
var granularities = []time.Duration{time.Nanosecond, time.Microsecond, time.Millisecond,
	10 * time.Millisecond, 100 * time.Millisecond, time.Second, 2 * time.Second}

// ErrGranularityUnknown is returned by ProbeGranularity when the time the file system
// kept is not the probe's time truncated to any granularity it knows.
var ErrGranularityUnknown = errors.New("fsx: the file system kept a modification time of no known granularity")

// ProbeGranularity measures the timestamp granularity of the file system that holds
// directory dir. It opens an unnamed file there (O_TMPFILE: no name ever appears, the
// directory does not change, and the file is gone when closed), sets its modification
// time to one with a non-zero digit at every sub-second place, and reads back what the
// file system kept. It fails where it cannot run: a file system without O_TMPFILE
// (FAT, NFS, older overlayfs), a read-only one, or a directory we may not write.
func ProbeGranularity(fsys FS, dir string) (time.Duration, error) {
	f, err := fsys.OpenFile(dir, unix.O_RDWR|unix.O_TMPFILE, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := f.SetTimes(probeTimeNs, probeTimeNs); err != nil {
		return 0, err
	}
	info, err := f.Stat()
	if err != nil {
		return 0, err
	}
	for _, g := range granularities {
		if info.MtimeNs == probeTimeNs-probeTimeNs%int64(g) {
			return g, nil
		}
	}
	return 0, &fs.PathError{Op: "probe granularity", Path: dir, Err: ErrGranularityUnknown}
}

// Coarse wraps an FS and reports every file time (Lstat and File.Stat) truncated to
// Granularity, as a file system with coarse timestamps would store it: 1 s for ext3,
// ext4 with 128-byte inodes and many NFS servers, 2 s for FAT. Tests use it to run
// code on such a file system; ProbeGranularity through it finds Granularity (or the
// inner file system's, if coarser). Everything else passes through.
type Coarse struct {
	FS
	Granularity time.Duration
}

var _ FS = (*Coarse)(nil)

// NewCoarse wraps inner with timestamps of granularity g.
func NewCoarse(inner FS, g time.Duration) *Coarse { return &Coarse{FS: inner, Granularity: g} }

func (c *Coarse) truncate(info Info) Info {
	if g := int64(c.Granularity); g > 1 {
		info.MtimeNs = floorTo(info.MtimeNs, g)
		info.CtimeNs = floorTo(info.CtimeNs, g)
	}
	return info
}

func floorTo(ns, g int64) int64 {
	r := ns % g
	if r < 0 {
		r += g
	}
	return ns - r
}

// Lstat implements FS.
func (c *Coarse) Lstat(name string) (Info, error) {
	info, err := c.FS.Lstat(name)
	if err != nil {
		return info, err
	}
	return c.truncate(info), nil
}

// OpenFile implements FS.
func (c *Coarse) OpenFile(name string, flag int, perm uint32) (File, error) {
	f, err := c.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return coarseFile{File: f, fs: c}, nil
}

type coarseFile struct {
	File
	fs *Coarse
}

func (f coarseFile) Stat() (Info, error) {
	info, err := f.File.Stat()
	if err != nil {
		return info, err
	}
	return f.fs.truncate(info), nil
}
