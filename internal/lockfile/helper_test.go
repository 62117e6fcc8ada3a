package lockfile_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sealbridge/sealbridge/internal/fsx"
	"github.com/sealbridge/sealbridge/internal/lockfile"
)

// The helper process is this test binary re-executed with helperEnv set. It reports
// over stdout, one line per event, and is driven over stdin.
const (
	helperEnv  = "LOCKFILE_TEST_HELPER"
	helperDir  = "LOCKFILE_TEST_DIR"
	helperFile = "LOCKFILE_TEST_FILE"
	helperN    = "LOCKFILE_TEST_N"
)

// TestHelperProcess is not a test: it is the body of the child processes.
//
//	hold: acquire, print "locked", wait for stdin to close, unlock, print "unlocked".
//	loop: print "ready", wait for a line on stdin, then N times acquire, append "enter <pid>\n" and "exit <pid>\n" to FILE, unlock;
//	      print "done".
//	exit: exit at once (to obtain a dead pid).
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	fail := func(err error) {
		fmt.Printf("error %v\n", err)
		os.Exit(2)
	}
	fsys := fsx.NewOS(os.Getenv(helperDir))
	ctx := context.Background()
	switch mode {
	case "hold":
		l, err := lockfile.Acquire(ctx, fsys, lockfile.Options{Wait: 20 * time.Second})
		if err != nil {
			fail(err)
		}
		fmt.Println("locked")
		_, _ = io.Copy(io.Discard, os.Stdin)
		if err := l.Unlock(); err != nil {
			fail(err)
		}
		fmt.Println("unlocked")
	case "loop":
		n, err := strconv.Atoi(os.Getenv(helperN))
		if err != nil {
			fail(err)
		}
		f, err := os.OpenFile(os.Getenv(helperFile), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			fail(err)
		}
		enter := []byte(fmt.Sprintf("enter %d\n", os.Getpid()))
		exit := []byte(fmt.Sprintf("exit %d\n", os.Getpid()))
		// Start together with the other children: wait for a line on stdin.
		fmt.Println("ready")
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			fail(err)
		}
		for range n {
			l, err := lockfile.Acquire(ctx, fsys, lockfile.Options{Wait: 50 * time.Second})
			if err != nil {
				fail(err)
			}
			if _, err := f.Write(enter); err != nil {
				fail(err)
			}
			if _, err := f.Write(exit); err != nil {
				fail(err)
			}
			if err := l.Unlock(); err != nil {
				fail(err)
			}
		}
		fmt.Println("done")
	case "exit":
	default:
		fail(fmt.Errorf("unknown mode %q", mode))
	}
	os.Exit(0)
}

type child struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *syncBuffer
	waited bool
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startChild starts the helper in mode with extra environment.
func startChild(t *testing.T, mode, dir string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperDir+"="+dir)
	// A race-enabled binary sleeps 1 s at exit by default: not for our children.
	cmd.Env = append(cmd.Env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Env = append(cmd.Env, env...)
	c := &child{t: t, cmd: cmd, lines: make(chan string, 16), stderr: &syncBuffer{}}
	cmd.Stderr = c.stderr
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if !c.waited {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	return c
}

// expect waits (bounded) for the child's next stdout line and checks it.
func (c *child) expect(want string) {
	c.t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			c.t.Fatalf("child %d exited before %q; stderr:\n%s", c.cmd.Process.Pid, want, c.stderr.String())
		}
		if line != want {
			c.t.Fatalf("child %d said %q, want %q; stderr:\n%s", c.cmd.Process.Pid, line, want, c.stderr.String())
		}
	case <-time.After(60 * time.Second):
		c.t.Fatalf("child %d: no %q within 60s; stderr:\n%s", c.cmd.Process.Pid, want, c.stderr.String())
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// wait reaps the child and returns its wait error.
func (c *child) wait() error {
	c.waited = true
	return c.cmd.Wait()
}

// deadPid returns the pid of a child that has exited and been reaped.
func deadPid(t *testing.T, dir string) int {
	t.Helper()
	c := startChild(t, "exit", dir)
	if err := c.wait(); err != nil {
		t.Fatalf("exit helper: %v; stderr:\n%s", err, c.stderr.String())
	}
	pid := c.pid()
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Skipf("pid %d reused already (%v)", pid, err)
	}
	return pid
}

func hostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	if err != nil {
		t.Skipf("no hostname: %v", err)
	}
	return h
}

// lines of a file, without the trailing empty one.
func fileLines(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
