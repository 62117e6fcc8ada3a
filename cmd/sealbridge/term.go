package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// isTerminal reports whether v is an *os.File open on a terminal.
func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progress shows how far a count has come: a redrawn bar on a terminal, a
// line per tenth otherwise.
type progress struct {
	w         io.Writer
	tty       bool
	label     string
	total     int
	start     time.Time
	shown     int // the count last drawn
	lastTenth int
	lastDraw  time.Time
}

func newProgress(w io.Writer, label string, total int) *progress {
	return &progress{w: w, tty: isTerminal(w), label: label, total: total, start: time.Now(), shown: -1}
}

// update shows done (0..total).
func (p *progress) update(done int) {
	if done == p.shown {
		return
	}
	now := time.Now()
	if p.tty {
		if done != p.total && now.Sub(p.lastDraw) < 50*time.Millisecond {
			return
		}
		const width = 30
		fill := width * done / max(p.total, 1)
		fmt.Fprintf(p.w, "\r%-8s [%s%s] %*d/%d  %s", p.label, strings.Repeat("#", fill),
			strings.Repeat(".", width-fill), len(fmt.Sprint(p.total)), done, p.total, round(now.Sub(p.start)))
	} else {
		tenth := 10 * done / max(p.total, 1)
		if tenth == p.lastTenth && done != p.total {
			return
		}
		p.lastTenth = tenth
		fmt.Fprintf(p.w, "%s: %d/%d (%s)\n", p.label, done, p.total, round(now.Sub(p.start)))
	}
	p.shown, p.lastDraw = done, now
}

// finish ends the bar's line on a terminal.
func (p *progress) finish() {
	if p.tty && p.shown >= 0 {
		fmt.Fprintln(p.w)
	}
}

// round shortens a duration for display.
func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	default:
		return d.Round(time.Millisecond)
	}
}
