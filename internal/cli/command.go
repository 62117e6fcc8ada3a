package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
)

// ManCommand is the hidden first argument that makes Execute write the program's
// man pages into the directory given as the second one, instead of running a
// command (`PROG __man DIR`, as cobra's own hidden `__complete`); `just man` runs it
// for the four binaries.
const ManCommand = "__man"

// Annotations a command may carry (cobra.Command.Annotations).
const (
	// AnnotExit is the command's own exit statuses, as its help and man page print
	// them ("  0   success\n  2   usage error\n"); without it, DefaultExit.
	AnnotExit = "cli.exit"
	// AnnotSynopsis is further synopsis lines (newline-separated, without the
	// command's path) printed under "usage:".
	AnnotSynopsis = "cli.synopsis"
)

// Commands are listed in the order of their definition, everywhere (help, man
// pages, completions).
func init() { cobra.EnableCommandSorting = false }

// helpWidth is the column at which flag descriptions are wrapped.
const helpWidth = 90

// DefaultExit is the exit statuses of a command that states none of its own.
func (p Program) DefaultExit() string {
	return fmt.Sprintf("  0   success\n  %-3d usage error\n", p.UsageExit)
}

// Annotate sets an annotation of c and returns c.
func Annotate(c *cobra.Command, key, value string) *cobra.Command {
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[key] = value
	return c
}

// NoArgs is a cobra.PositionalArgs that refuses positional arguments with a usage
// error naming the first one.
func NoArgs(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if c.HasParent() {
		return Usagef("%s: unexpected argument %q (%s takes no arguments)", c.Name(), args[0], c.Name())
	}
	return Usagef("unexpected argument %q: %s takes flags only", args[0], c.Name())
}

// prepare makes root and every command under it follow the conventions: errors are
// returned, not printed (Report prints them); a flag error or a refused argument is
// a *UsageError naming the command's --help; an empty positional argument is
// refused; flags keep the order of their definition; the help is HelpText.
func (p Program) prepare(root *cobra.Command, args []string) {
	root.SilenceErrors, root.SilenceUsage = true, true
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd(args...)
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Short = "print the shell completion script: bash, zsh, fish or powershell"
		}
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if c.HasParent() {
			err = fmt.Errorf("%s: %w", c.Name(), err)
		}
		return &UsageError{Err: err, Help: c.CommandPath() + " --help"}
	})
	root.SetHelpFunc(func(c *cobra.Command, _ []string) { fmt.Fprint(c.OutOrStdout(), p.HelpText(c)) })
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.DisableFlagsInUseLine = true
		c.Flags().SortFlags = false
		c.InitDefaultHelpFlag()
		if c.Annotations["cli.prepared"] == "" {
			Annotate(c, "cli.prepared", "1")
			orig := c.Args
			c.Args = func(c *cobra.Command, args []string) error {
				for _, a := range args {
					if a == "" {
						return Usagef("%san argument is empty (an unset shell variable?)", commandPrefix(c))
					}
				}
				if orig == nil {
					return nil
				}
				err := orig(c, args)
				if err != nil && !IsUsage(err) {
					err = Usagef("%s%v", commandPrefix(c), err)
				}
				return err
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// commandPrefix is "CMD: " for a subcommand, "" for the program itself (the
// error line already names it).
func commandPrefix(c *cobra.Command) string {
	if c.HasParent() {
		return c.Name() + ": "
	}
	return ""
}

// Execute runs the command line args on the tree root: a help request prints the
// help on stdout and returns nil; anything else returns the command's error, for
// the caller to Report and map to its exit status. A usage error that names no
// help is given the failing command's. `PROG __man DIR` writes the man pages
// (WriteMan) instead.
func (p Program) Execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) error {
	if args == nil {
		args = []string{}
	}
	if len(args) == 2 && args[0] == ManCommand {
		return p.WriteMan(root, args[1])
	}
	p.prepare(root, args)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	c, err := root.ExecuteContextC(ctx)
	var ue *UsageError
	if errors.As(err, &ue) && ue.Help == "" && c != nil && c.HasParent() {
		ue.Help = c.CommandPath() + " --help"
	}
	return err
}

// HelpText is c's help: its synopsis, description, subcommands, flags, examples
// and exit statuses, from the command's definition (the same that makes its
// completions and its man page).
func (p Program) HelpText(c *cobra.Command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s\n", c.UseLine())
	if more := c.Annotations[AnnotSynopsis]; more != "" {
		for l := range strings.SplitSeq(more, "\n") {
			fmt.Fprintf(&b, "       %s %s\n", c.CommandPath(), l)
		}
	}
	if d := strings.TrimSpace(c.Long); d != "" {
		fmt.Fprintf(&b, "\n%s\n", d)
	} else if c.Short != "" {
		fmt.Fprintf(&b, "\n%s.\n", strings.TrimSuffix(c.Short, "."))
	}
	if c.HasAvailableSubCommands() {
		b.WriteString("\nCommands:\n")
		width := 0
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() {
				width = max(width, len(s.Name()))
			}
		}
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() {
				fmt.Fprintf(&b, "  %-*s  %s\n", width, s.Name(), s.Short)
			}
		}
	}
	if fl := c.LocalFlags(); fl.HasAvailableFlags() {
		title := "Flags:"
		if c.HasAvailableSubCommands() {
			title = "Flags (of " + c.Name() + " itself):"
		}
		fmt.Fprintf(&b, "\n%s\n%s", title, fl.FlagUsagesWrapped(helpWidth))
	}
	if c.Example != "" {
		fmt.Fprintf(&b, "\nExamples:\n%s\n", strings.TrimRight(c.Example, "\n"))
	}
	fmt.Fprintf(&b, "\nExit status:\n%s", p.exitText(c))
	return b.String()
}

func (p Program) exitText(c *cobra.Command) string {
	if e := c.Annotations[AnnotExit]; e != "" {
		return strings.TrimRight(e, "\n") + "\n"
	}
	return p.DefaultExit()
}

// WriteMan writes a man page for root and for each available command under it
// into dir (created if absent, mode 0700), named PROG[-CMD…].SECTION
// (p.ManSection, default 1), from the same definitions as the help. It sets
// SOURCE_DATE_EPOCH's date when that is set (reproducible builds), else today's.
func (p Program) WriteMan(root *cobra.Command, dir string) error {
	p.prepare(root, nil)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	section := p.ManSection
	if section == "" {
		section = "1"
	}
	var walk func(c *cobra.Command) error
	walk = func(c *cobra.Command) error {
		if c.HasParent() && !c.IsAvailableCommand() {
			return nil
		}
		for _, s := range c.Commands() {
			if err := walk(s); err != nil {
				return err
			}
		}
		long := c.Long
		defer func() { c.Long = long }()
		c.Long = strings.TrimSpace(cmpOr(long, c.Short)) + "\n\n# EXIT STATUS\n" + indent(p.exitText(c), "    ")
		name := strings.ReplaceAll(c.CommandPath(), " ", "-") + "." + section
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		c.DisableAutoGenTag = true
		err = doc.GenMan(c, &doc.GenManHeader{Section: section, Source: p.Name + " " + p.Version, Manual: "sealbridge manual"}, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
	return walk(root)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func indent(s, by string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = by + strings.TrimPrefix(l, "  ")
	}
	return strings.Join(lines, "\n") + "\n"
}

// flagDocLine is one flag's first line in a usage text: "  --NAME [ARG]  what…".
var flagDocLine = regexp.MustCompile(`^  --([a-z0-9][a-z0-9-]*)(?: (\S+))?(?:\s{2,}(.*))?$`)

// parseFlagDoc reads a usage text made of "  --NAME [ARG]  description" entries,
// whose description may go on over further lines indented deeper, into each
// flag's value name and description, and the names in the order of the text.
func parseFlagDoc(text string) (map[string][2]string, []string) {
	docs := map[string][2]string{}
	var order []string
	cur := ""
	for l := range strings.SplitSeq(text, "\n") {
		if m := flagDocLine.FindStringSubmatch(l); m != nil {
			cur = m[1]
			docs[cur] = [2]string{m[2], strings.TrimSpace(m[3])}
			order = append(order, cur)
			continue
		}
		if cur != "" && strings.HasPrefix(l, "   ") && strings.TrimSpace(l) != "" {
			d := docs[cur]
			d[1] = strings.TrimSpace(d[1] + " " + strings.TrimSpace(l))
			docs[cur] = d
			continue
		}
		cur = ""
	}
	return docs, order
}

// namedValue gives a flag's value the name its description uses (ARG in
// "--NAME ARG"), which the help prints after the flag.
type namedValue struct {
	pflag.Value
	name string
}

func (v namedValue) Type() string { return v.name }

// Named gives flag name of fs the value name metavar that its help prints after it
// ("--deadline 24h|TIME"), for a description that does not name the value itself.
func Named(fs *pflag.FlagSet, name, metavar string) {
	f := fs.Lookup(name)
	f.Value = namedValue{f.Value, metavar}
}

// AddGoFlags adds to fs the flags a package defines on a standard-library flag set
// (gfs), parsed through the same values, and describes each from doc, that
// package's usage text for them ("  --NAME [ARG]  what…" entries), in that text's
// order. It returns what the help would get wrong — the flags doc does not
// describe (added last, described as undocumented) and the names doc describes
// that gfs does not define (ignored) — for a test to refuse; a binary still runs.
func AddGoFlags(fs *pflag.FlagSet, gfs *flag.FlagSet, doc string) (undescribed, unknown []string) {
	docs, order := parseFlagDoc(doc)
	gfs.VisitAll(func(gf *flag.Flag) {
		if docs[gf.Name][1] == "" {
			undescribed = append(undescribed, gf.Name)
			order = append(order, gf.Name)
			docs[gf.Name] = [2]string{"", "(undocumented)"}
		}
	})
	for _, name := range order {
		gf := gfs.Lookup(name)
		if gf == nil {
			unknown = append(unknown, name)
			continue
		}
		f := pflag.PFlagFromGoFlag(gf)
		d := docs[name]
		f.Usage = d[1]
		if d[0] != "" && f.NoOptDefVal == "" {
			f.Value = namedValue{f.Value, d[0]}
		}
		fs.AddFlag(f)
	}
	return undescribed, unknown
}

// Wrap fills text's words into lines of at most width columns.
func Wrap(text string, width int) string {
	var b strings.Builder
	n := 0
	for _, w := range strings.Fields(text) {
		switch {
		case n == 0:
		case n+1+len([]rune(w)) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len([]rune(w))
	}
	return b.String()
}
