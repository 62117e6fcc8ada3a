package fsx

import (
	"encoding/binary"
	"io/fs"

	"golang.org/x/sys/unix"
)

// InoLister is implemented by file systems that can list a directory with each
// entry's inode number (d_ino) as the directory reports it, without a stat per entry.
type InoLister interface {
	ReadDirInos(name string) ([]DirInode, error)
}

// DirInode is one name in a directory listing with its inode number.
type DirInode struct {
	Name string
	Ino  uint64
}

// ReadDirInos lists the names in directory name (without "." and "..", unsorted) with
// each entry's inode number as the directory reports it (getdents64): one syscall per
// buffer of entries, no stat per entry.
func (o *OS) ReadDirInos(name string) ([]DirInode, error) {
	fd, err := o.open("readdir", name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 64<<10)
	var out []DirInode
	for {
		var n int
		err := retryEINTR(func() (err error) {
			n, err = unix.Getdents(fd, buf)
			return err
		})
		if err != nil {
			return nil, &fs.PathError{Op: "readdir", Path: name, Err: err}
		}
		if n <= 0 {
			return out, nil
		}
		// struct linux_dirent64: d_ino u64, d_off s64, d_reclen u16, d_type u8, d_name.
		for off := 0; off+19 <= n; {
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			if reclen < 19 || off+reclen > n {
				return nil, &fs.PathError{Op: "readdir", Path: name, Err: unix.EIO}
			}
			ino := binary.NativeEndian.Uint64(buf[off:])
			raw := buf[off+19 : off+reclen]
			for i, c := range raw {
				if c == 0 {
					raw = raw[:i]
					break
				}
			}
			off += reclen
			if nm := string(raw); nm != "." && nm != ".." {
				out = append(out, DirInode{Name: nm, Ino: ino})
			}
		}
	}
}
