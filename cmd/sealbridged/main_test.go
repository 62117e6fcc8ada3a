package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestVersionAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "sealbridged ") {
		t.Fatalf("--version: %d %q", code, out.String())
	}
	if code := run(context.Background(), []string{"--log-format", "xml"}, &out, &errb); code != 2 {
		t.Fatalf("bad log format: %d", code)
	}
	errb.Reset()
	if code := run(context.Background(), []string{"--home", t.TempDir()}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "sealbridge init") {
		t.Fatalf("no identity: %d %q", code, errb.String())
	}
}
