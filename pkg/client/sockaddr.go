package client

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// maxSunPath is the usable length of a unix socket address on Linux (108 bytes
// including the terminating NUL).
const maxSunPath = 107

// ShortSocketAddr calls fn with an address for socket path that fits a sockaddr_un:
// path itself when short enough, otherwise /proc/self/fd/N/<base> through a
// descriptor of its directory (SocketPath's hashed run directories under a deep
// data root are longer than 107 bytes). The descriptor lives only during fn.
func ShortSocketAddr(path string, fn func(addr string) error) error {
	if len(path) <= maxSunPath {
		return fn(path)
	}
	fd, err := syscall.Open(filepath.Dir(path), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: filepath.Dir(path), Err: err}
	}
	defer syscall.Close(fd)
	return fn("/proc/self/fd/" + strconv.Itoa(fd) + "/" + filepath.Base(path))
}

func dialSocket(ctx context.Context, path string) (net.Conn, error) {
	var c net.Conn
	err := ShortSocketAddr(path, func(addr string) error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "unix", addr)
		return err
	})
	return c, err
}
