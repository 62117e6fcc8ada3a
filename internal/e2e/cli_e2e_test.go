package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sealbridge/sealbridge/pkg/client"
)

// The four binaries and the section of their man pages.
var binaries = []struct{ name, section string }{
	{"sealbridge", "1"}, {"sealbridged", "8"}, {"sealbridge-fsck", "8"}, {"sealbridge-relay", "8"},
}

// cliRun is one run of a built binary.
type cliRun struct {
	code           int
	stdout, stderr string
}

// runCLI runs the binary name of dir with args, stdin as its standard input, in a
// fresh data root (SEALBRIDGE_HOME) unless env gives one.
func runCLI(t *testing.T, dir, stdin string, env []string, name string, args ...string) cliRun {
	t.Helper()
	cmd := exec.Command(filepath.Join(dir, name), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := cliRun{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s %q: %v", name, args, err)
	}
	return r
}

// helpSection returns the lines of the help's section that starts with a line
// beginning with title, up to the next blank line.
func helpSection(help, title string) []string {
	var lines []string
	in := false
	for l := range strings.SplitSeq(help, "\n") {
		switch {
		case !in && strings.HasPrefix(l, title):
			in = true
		case in && strings.TrimSpace(l) == "":
			return lines
		case in:
			lines = append(lines, l)
		}
	}
	return lines
}

// helpCommands are the commands a help's "Commands:" section lists.
func helpCommands(help string) []string {
	var names []string
	for _, l := range helpSection(help, "Commands:") {
		names = append(names, strings.Fields(l)[0])
	}
	return names
}

var helpFlagLine = regexp.MustCompile(`^\s+(?:-[a-z], )?--([a-z0-9][a-z0-9-]*)`)

// helpFlags are the flags a help's "Flags" section describes.
func helpFlags(help string) []string {
	var names []string
	for _, l := range helpSection(help, "Flags") {
		if m := helpFlagLine.FindStringSubmatch(l); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

// bashComplete completes words (the last one being completed) with the bash
// completion script of bin, as bash would on TAB; bash-completion's word splitter
// is replaced by its minimal equivalent.
func bashComplete(t *testing.T, dir, bin, script string, words ...string) []string {
	t.Helper()
	prog := `_get_comp_words_by_ref() { cur=${COMP_WORDS[COMP_CWORD]}; prev=${COMP_WORDS[COMP_CWORD-1]}; words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; }
compopt() { :; }
source "$1"; shift
COMP_WORDS=("$@"); COMP_CWORD=$(($#-1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
__start_` + bin + `
printf '%s\n' "${COMPREPLY[@]}"`
	cmd := exec.Command("bash", append([]string{"-c", prog, "bash", script}, words...)...)
	cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash completion of %s %q: %v", bin, words, err)
	}
	var got []string
	for l := range strings.SplitSeq(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			got = append(got, f[0])
		}
	}
	return got
}

// Every command and every flag the help of each of the four binaries describes is
// in its shell completions (bash, zsh and fish are scripts around `PROG
// __complete`, which each answers; bash's is run as bash runs it on TAB) and in its
// man pages, all made from the one definition of the command line.
func TestCompletionsAndManPagesCoverEveryCommandAndFlag(t *testing.T) {
	dir := buildCommands(t)
	_, bashErr := exec.LookPath("bash")
	home := t.TempDir()
	env := []string{"SEALBRIDGE_HOME=" + home}
	for _, b := range binaries {
		t.Run(b.name, func(t *testing.T) {
			man := t.TempDir()
			if r := runCLI(t, dir, "", env, b.name, "__man", man); r.code != 0 {
				t.Fatalf("__man: exit %d %s", r.code, r.stderr)
			}
			scripts := map[string]string{}
			for _, shell := range []string{"bash", "zsh", "fish"} {
				r := runCLI(t, dir, "", env, b.name, "completion", shell)
				if r.code != 0 || !strings.Contains(r.stdout, b.name) || !strings.Contains(r.stdout, "__complete") {
					t.Fatalf("completion %s: exit %d, %.200q %s", shell, r.code, r.stdout, r.stderr)
				}
				scripts[shell] = filepath.Join(t.TempDir(), shell)
				if err := os.WriteFile(scripts[shell], []byte(r.stdout), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			root := runCLI(t, dir, "", env, b.name, "--help")
			paths := [][]string{nil}
			cmds := helpCommands(root.stdout)
			for _, c := range cmds {
				paths = append(paths, []string{c})
			}
			if b.name == "sealbridge" && len(cmds) < 15 {
				t.Fatalf("sealbridge --help lists %d commands: %q", len(cmds), cmds)
			}
			complete := func(words ...string) []string {
				r := runCLI(t, dir, "", env, b.name, append([]string{"__complete"}, words...)...)
				var got []string
				for l := range strings.SplitSeq(r.stdout, "\n") {
					if f := strings.Fields(l); len(f) > 0 && !strings.HasPrefix(l, ":") {
						got = append(got, f[0])
					}
				}
				return got
			}
			if len(cmds) > 0 {
				got := complete("")
				var gotBash []string
				if bashErr == nil {
					gotBash = bashComplete(t, dir, b.name, scripts["bash"], b.name, "")
				}
				rootPage, err := os.ReadFile(filepath.Join(man, b.name+"."+b.section))
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range cmds {
					if !slices.Contains(got, c) {
						t.Errorf("%s __complete '' does not offer %s: %q", b.name, c, got)
					}
					if bashErr == nil && !slices.Contains(gotBash, c) {
						t.Errorf("bash does not complete %s %s: %q", b.name, c, gotBash)
					}
					if !strings.Contains(string(rootPage), `\fB`+b.name+"-"+c+"("+b.section+`)\fP`) {
						t.Errorf("%s.%s does not name %s-%s", b.name, b.section, b.name, c)
					}
				}
			}
			for _, p := range paths {
				help := runCLI(t, dir, "", env, b.name, append(p, "--help")...)
				flags := helpFlags(help.stdout)
				if help.code != 0 || len(flags) == 0 {
					t.Fatalf("%s %q --help: exit %d, flags %q\n%s", b.name, p, help.code, flags, help.stdout)
				}
				page := strings.Join(append([]string{b.name}, p...), "-") + "." + b.section
				text, err := os.ReadFile(filepath.Join(man, page))
				if err != nil {
					t.Fatalf("no man page %s: %v", page, err)
				}
				if !strings.Contains(string(text), ".SH EXIT STATUS") {
					t.Errorf("%s has no EXIT STATUS", page)
				}
				got := complete(append(p, "--")...)
				var gotBash []string
				if bashErr == nil {
					gotBash = bashComplete(t, dir, b.name, scripts["bash"], append(append([]string{b.name}, p...), "--")...)
				}
				for _, f := range flags {
					if !slices.Contains(got, "--"+f) {
						t.Errorf("%s %q: __complete does not offer --%s: %q", b.name, p, f, got)
					}
					if bashErr == nil && !slices.Contains(gotBash, "--"+f) {
						t.Errorf("%s %q: bash does not complete --%s: %q", b.name, p, f, gotBash)
					}
					if !strings.Contains(string(text), `\fB--`+f+`\fP`) {
						t.Errorf("%s does not describe --%s", page, f)
					}
				}
			}
		})
	}
}

// Each command's help is its own: its synopsis names its flags, its text says what
// it does, its exit statuses are those it can give; and the main help names every
// command that needs the daemon (each exits 3 when none runs).
func TestHelpOfEachCommand(t *testing.T) {
	dir := buildCommands(t)
	home := t.TempDir()
	env := []string{"SEALBRIDGE_HOME=" + home, "SEALBRIDGE_IDENTITY=alice"}
	help := func(args ...string) string {
		t.Helper()
		r := runCLI(t, dir, "", env, "sealbridge", args...)
		if r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, "usage: sealbridge") {
			t.Fatalf("sealbridge %q: exit %d\n%s\n%s", args, r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	if h := help("whoami", "--help"); !strings.Contains(h, "--socket") {
		t.Errorf("whoami --help does not describe --socket:\n%s", h)
	}
	if synopsis, _, _ := strings.Cut(help("inbox", "--help"), "\n\n"); !strings.Contains(synopsis, "--refused") {
		t.Errorf("inbox's synopsis lacks --refused: %q", synopsis)
	}
	for l := range strings.Lines(help("--help")) {
		if strings.HasPrefix(l, "  inbox ") && !strings.Contains(l, "--refused") {
			t.Errorf("the main help's line of inbox lacks --refused: %q", l)
		}
	}
	if h := help("help", "--help"); !strings.HasPrefix(h, "usage: sealbridge help ") {
		t.Errorf("help --help:\n%s", h)
	}
	if h := help("demo", "--help"); !strings.Contains(h, "three stores") || strings.Contains(h, "both stores") {
		t.Errorf("demo --help does not say it checks the three stores:\n%s", h)
	}
	// Each command's own exit statuses, not the main table.
	exits := func(cmd string) []string {
		var codes []string
		for _, l := range helpSection(help(cmd, "--help"), "Exit status:") {
			if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(l, "  ") && !strings.HasPrefix(l, "   ") {
				codes = append(codes, f[0])
			}
		}
		return codes
	}
	for cmd, want := range map[string][]string{
		"init": {"0", "1", "2"}, "whoami": {"0", "1", "2"}, "send": {"0", "1", "2", "3", "4"},
		"status": {"0", "1", "2", "3"}, "retry": {"0", "1", "2", "3"}, "relay": {"0", "1", "2"}, "demo": {"0", "1", "2"},
	} {
		if got := exits(cmd); !slices.Equal(got, want) {
			t.Errorf("%s --help: exit statuses %q, want %q", cmd, got, want)
		}
	}

	// The main help's paragraph on the daemon names every command that needs it.
	if r := runCLI(t, dir, "", env, "sealbridge", "init"); r.code != 0 {
		t.Fatalf("init: %d %s", r.code, r.stderr)
	}
	did := strings.TrimSpace(runCLI(t, dir, "", env, "sealbridge", "whoami").stdout)
	id := "0190b6a4-0000-7000-8000-000000000000"
	var paragraph string
	for p := range strings.SplitSeq(help("--help"), "\n\n") {
		if strings.Contains(p, "daemon") && strings.Contains(p, "sealbridged --home") {
			paragraph = p
		}
	}
	named := map[string]bool{}
	for _, w := range regexp.MustCompile(`[a-z]+`).FindAllString(paragraph, -1) {
		named[w] = true
	}
	for _, args := range [][]string{
		{"send", "--to", did, "--relay", "http://127.0.0.1:1"}, {"status", id}, {"ls"}, {"queue"}, {"inbox"}, {"watch"},
		{"hold", id}, {"release", id}, {"cancel", id}, {"retry", id}, {"whoami"}, {"init", "--identity", "bob"},
	} {
		r := runCLI(t, dir, "hello", env, "sealbridge", args...)
		if (r.code == 3) != named[args[0]] {
			t.Errorf("%s exits %d without a daemon (%s), but the main help's paragraph on the daemon names it: %v\n%s",
				args[0], r.code, strings.TrimSpace(r.stderr), named[args[0]], paragraph)
		}
	}
}

// cliHome is a fresh data root for the CLI tests, removed at the end, and the
// environment that makes it and identity "default" the binaries' defaults. It is
// made under the temp dir with a short name: the daemon's socket lives under it.
func cliHome(t *testing.T) (string, []string) {
	t.Helper()
	home, err := os.MkdirTemp("", "sbc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	return home, []string{"SEALBRIDGE_HOME=" + home, "SEALBRIDGE_IDENTITY=default", "XDG_RUNTIME_DIR="}
}

// A command-line mistake is a usage error (exit 2) that lists what is valid; the
// errors a user can fix carry a hint; an attempt's error says each thing once.
func TestCLIErrorsSayWhatIsValidAndHowToFix(t *testing.T) {
	dir := buildCommands(t)
	home, env := cliHome(t)
	sb := func(stdin string, args ...string) cliRun { return runCLI(t, dir, stdin, env, "sealbridge", args...) }
	if r := sb("", "init"); r.code != 0 {
		t.Fatalf("init: %d %s", r.code, r.stderr)
	}
	did := strings.TrimSpace(sb("", "whoami").stdout)
	for _, c := range []struct {
		args   []string
		code   int
		stderr []string
	}{
		{[]string{"ls", "--status", "bogus"}, 2, []string{`--status "bogus"`, "queued, relayed, delivered, closed"}},
		{[]string{"status", "not-a-uuid"}, 2, []string{`"not-a-uuid" is not a message id`}},
		{[]string{"ls"}, 3, []string{"sealbridge: error: no daemon is running for " + did + "\n",
			"sealbridge: hint: start one with: sealbridged --home " + home + " --identity default\n"}},
		{[]string{"send", "--to", did, "--relay", "http://127.0.0.1:1", "--file", filepath.Join(home, "nope.txt")}, 1,
			[]string{"nope.txt", "sealbridge: hint: give an existing file with --file"}},
		{[]string{"send", "--to", did, "--relay", "http://127.0.0.1:1", "extra"}, 2,
			[]string{"sealbridge: error: send: unexpected argument \"extra\""}},
	} {
		r := sb("", c.args...)
		if r.code != c.code {
			t.Errorf("%q: exit %d, want %d\n%s", c.args, r.code, c.code, r.stderr)
		}
		for _, want := range c.stderr {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("%q: stderr does not say %q:\n%s", c.args, want, r.stderr)
			}
		}
	}

	c := client.ForIdentity(home, did)
	startDaemonProcess(t, filepath.Join(dir, "sealbridged"), home, c)
	second := runCLI(t, dir, "", env, "sealbridged", "--home", home)
	if second.code != 1 || !strings.Contains(second.stderr, "already running (pid ") || !strings.Contains(second.stderr, "\nsealbridged: hint: ") {
		t.Errorf("a second daemon: exit %d\n%s", second.code, second.stderr)
	}

	// A relay that refuses connections and one that answers 503: each last error
	// says "unreachable" or "HTTP 503" once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"code":"RELAY_BUSY","message":"busy"}}`)
	}))
	t.Cleanup(busy.Close)
	for url, word := range map[string]string{dead: "unreachable", busy.URL: "HTTP 503"} {
		r := sb("hello", "send", "--to", did, "--relay", url)
		if r.code != 0 {
			t.Fatalf("send to %s: %d %s", url, r.code, r.stderr)
		}
		id := strings.TrimSpace(r.stdout)
		var last string
		poll(t, "a failed attempt to "+url, func() (bool, string) {
			m, err := c.Message(context.Background(), id)
			if err != nil {
				return false, err.Error()
			}
			last = m.LastError
			return m.Attempts > 0 && last != "", fmt.Sprintf("%d attempts, %q", m.Attempts, last)
		})
		if strings.Count(last, word) != 1 {
			t.Errorf("last error of a send to %s says %q %d times: %q", url, word, strings.Count(last, word), last)
		}
		if word == "unreachable" {
			if r := sb("", "cancel", id); r.code != 0 {
				t.Fatalf("cancel: %d %s", r.code, r.stderr)
			}
			r := sb("", "hold", id)
			if r.code != 1 || !strings.Contains(r.stderr, "hold: 1 of 1 message refused") {
				t.Errorf("hold of a cancelled message: exit %d\n%s", r.code, r.stderr)
			}
		}
	}
}

// jsonLinesOf decodes output that must be JSON lines: one object per line.
func jsonLinesOf(t *testing.T, what, out string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	for line := range strings.Lines(out) {
		var o map[string]any
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatalf("%s: line %q is not a JSON object: %v\n%s", what, line, err, out)
		}
		objs = append(objs, o)
	}
	return objs
}

// The operator's view: queue rows with relative times and a short reason (--wide:
// everything) and a hint to retry a waiting target; ls rows with a short did:key;
// --json as JSON lines for a list and one object for one item; the bulk actions
// read ids (or relay URLs) from standard input given "-".
func TestCLIOutputForOperators(t *testing.T) {
	dir := buildCommands(t)
	home, env := cliHome(t)
	sb := func(stdin string, args ...string) cliRun {
		t.Helper()
		r := runCLI(t, dir, stdin, env, "sealbridge", args...)
		if r.code != 0 {
			t.Fatalf("sealbridge %q: exit %d\n%s\n%s", args, r.code, r.stdout, r.stderr)
		}
		return r
	}
	sb("", "init")
	did := strings.TrimSpace(sb("", "whoami").stdout)
	c := client.ForIdentity(home, did)
	startDaemonProcess(t, filepath.Join(dir, "sealbridged"), home, c)
	var dead []string
	var lns []net.Listener
	for range 2 { // both open at once: two distinct ports, then closed
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		dead = append(dead, "http://"+ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	var ids []string
	for _, u := range []string{dead[0], dead[0], dead[1]} {
		ids = append(ids, strings.TrimSpace(sb("hello", "send", "--to", did, "--relay", u).stdout))
	}
	poll(t, "both targets unreachable", func() (bool, string) {
		l, err := c.Targets(context.Background())
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, tg := range l.Targets {
			if tg.State == "unreachable" {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%+v", l.Targets)
	})

	wide := sb("", "queue", "--wide")
	q := sb("", "queue")
	row := func(out, url string) string {
		for l := range strings.Lines(out) {
			if strings.HasPrefix(l, url+" ") && strings.Contains(l, "unreachable") {
				return strings.TrimRight(l, "\n")
			}
		}
		t.Fatalf("no row of %s in:\n%s", url, out)
		return ""
	}
	short, long := row(q.stdout, dead[0]), row(wide.stdout, dead[0])
	if !regexp.MustCompile(`unreachable for \d+[smh0-9]*, probe in \d`).MatchString(short) || strings.Contains(short, "Post ") ||
		!strings.HasSuffix(short, "relay unreachable: connection refused") || len(short) >= len(long) ||
		!strings.Contains(long, "Post ") || !strings.Contains(long, "next probe at ") {
		t.Errorf("queue row %q (--wide: %q)", short, long)
	}
	if !strings.Contains(q.stderr, "sealbridge: hint: ") || !strings.Contains(q.stderr, "sealbridge retry --target "+dead[0]) {
		t.Errorf("queue gives no hint to retry the waiting target:\n%s", q.stderr)
	}
	ls := sb("", "ls").stdout
	shortDID := "did:key:" + strings.TrimPrefix(did, "did:key:")[:4] + "…" + did[len(did)-4:]
	if strings.Contains(ls, did) || strings.Count(ls, shortDID) != 3 {
		t.Errorf("ls shows the whole did:key or not %s:\n%s", shortDID, ls)
	}
	if !strings.Contains(ls, "relay unreachable: connection refused\n") || strings.Contains(ls, "Post ") {
		t.Errorf("ls shows the whole error chain, not its gist:\n%s", ls)
	}

	// --json: JSON lines for lists, one object for one item.
	if n := len(jsonLinesOf(t, "ls --json", sb("", "ls", "--json").stdout)); n != 3 {
		t.Errorf("ls --json: %d objects", n)
	}
	if n := len(jsonLinesOf(t, "queue --json", sb("", "queue", "--json").stdout)); n != 2 {
		t.Errorf("queue --json: %d objects", n)
	}
	jsonLinesOf(t, "inbox --json", sb("", "inbox", "--json").stdout)
	var one map[string]any
	if out := sb("", "status", "--json", ids[0]).stdout; json.Unmarshal([]byte(out), &one) != nil || one["messageId"] != ids[0] {
		t.Errorf("status --json is not one object:\n%s", out)
	}
	if h := sb("", "--help").stdout; !strings.Contains(h, "JSON lines") {
		t.Errorf("the main help does not state the --json convention")
	}

	// Bulk actions read ids, or relay URLs, from standard input given "-".
	held := jsonLinesOf(t, "hold - --json", sb(ids[0]+"\n"+ids[2]+"\n", "hold", "-", "--json").stdout)
	if len(held) != 2 || held[0]["messageId"] != ids[0] || held[1]["messageId"] != ids[2] {
		t.Errorf("hold - --json: %v", held)
	}
	rel := sb(dead[0]+"\n"+dead[1]+"\n", "release", "--target", "-")
	if !strings.Contains(rel.stdout, ids[0]+"  released") || !strings.Contains(rel.stdout, ids[2]+"  released") {
		t.Errorf("release --target -:\n%s\n%s", rel.stdout, rel.stderr)
	}
	var queued []string
	for _, m := range jsonLinesOf(t, "ls --json", sb("", "ls", "--json", "--status", "queued").stdout) {
		queued = append(queued, m["messageId"].(string))
	}
	retry := sb(strings.Join(queued, "\n"), "retry", "-")
	if got := strings.Count(retry.stdout, "\n"); got != 3 {
		t.Errorf("retry - of 3 messages printed %d lines:\n%s", got, retry.stdout)
	}
	if r := sb("", "retry", "-"); r.stdout != "" || !strings.Contains(r.stderr, "nothing on standard input") {
		t.Errorf("retry - of nothing: %q %q", r.stdout, r.stderr)
	}
}

// sealbridge send with --to repeated sends one message to each recipient in one
// request and prints one line per recipient (id, status, recipient); the messages
// are listed one per recipient; a recipient named twice is a usage error (exit 2)
// with nothing sent; a relay URL with a trailing slash is kept in its canonical
// form, so `hold --target` with either spelling finds the messages.
func TestSendToSeveralRecipientsFromTheCLI(t *testing.T) {
	dir := buildCommands(t)
	home, env := cliHome(t)
	sb := func(stdin string, args ...string) cliRun {
		t.Helper()
		return runCLI(t, dir, stdin, env, "sealbridge", args...)
	}
	var dids []string
	for _, name := range []string{"default", "bob", "carol"} {
		if r := sb("", "init", "--identity", name); r.code != 0 {
			t.Fatalf("init %s: exit %d %s", name, r.code, r.stderr)
		}
		dids = append(dids, strings.TrimSpace(sb("", "whoami", "--identity", name).stdout))
	}
	c := client.ForIdentity(home, dids[0])
	startDaemonProcess(t, filepath.Join(dir, "sealbridged"), home, c)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	relayURL := "http://" + ln.Addr().String()
	ln.Close()

	if r := sb("hi", "send", "--to", dids[1], "--to", dids[1], "--relay", relayURL); r.code != 2 || !strings.Contains(r.stderr, "given twice") {
		t.Fatalf("a recipient twice: exit %d %q; want 2 saying it is given twice", r.code, r.stderr)
	}
	r := sb("hi", "send", "--to", dids[1], "--to", dids[2], "--relay", relayURL+"/")
	if r.code != 0 {
		t.Fatalf("send to two: exit %d %s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("send to two printed %q; want one line per recipient", r.stdout)
	}
	var ids []string
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) != 3 || f[1] != "queued" || f[2] != dids[i+1] {
			t.Fatalf("line %d %q; want ID queued %s", i, l, dids[i+1])
		}
		ids = append(ids, f[0])
	}
	if ids[0] == ids[1] {
		t.Fatalf("both recipients got message %s", ids[0])
	}
	l, err := c.Messages(context.Background(), "", 0, "")
	if err != nil || len(l.Messages) != 2 {
		t.Fatalf("listing: %+v %v; want the two messages", l, err)
	}
	for _, m := range l.Messages {
		if m.RelayURL != relayURL {
			t.Fatalf("message %s kept relay %q; want the canonical %q", m.MessageID, m.RelayURL, relayURL)
		}
	}
	for _, target := range []string{relayURL + "/", relayURL} {
		h := sb("", "hold", "--json", "--target", target)
		if h.code != 0 || !strings.Contains(h.stdout, ids[0]) || !strings.Contains(h.stdout, ids[1]) {
			t.Fatalf("hold --target %s: exit %d %s %s; want both messages", target, h.code, h.stdout, h.stderr)
		}
	}
}
