package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// flagSet is a command's (or subcommand's) flags and usage text. Every command parses
// through it, so -h, a bad flag and a stray argument behave the same everywhere: -h prints
// the usage and the flags on stdout (exit 0); a bad flag or argument prints the error and
// the usage on stderr (exit 2).
type flagSet struct {
	*flag.FlagSet
	e    env
	name string // "dlq list"
	text string // the usage text; "" prints "usage: outboxctl <name> [flags]"
	// deprecated maps an old flag name to the name that replaced it.
	deprecated map[string]string
	// env maps an environment variable to the value of the flag overriding it (envVar).
	env map[string]*string
}

// newFlagSet returns the flag set of the command name ("status", "dlq list").
func newFlagSet(e env, name string) *flagSet {
	fs := flag.NewFlagSet("outboxctl "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return &flagSet{FlagSet: fs, e: e, name: name}
}

// withUsage sets the usage text printed above the flags.
func (f *flagSet) withUsage(text string) *flagSet {
	f.text = text
	return f
}

// alias registers old as a deprecated spelling of the flag now, already registered: it
// sets the same value, is listed as deprecated, and warns on stderr when used.
func (f *flagSet) alias(old, now string) {
	fl := f.Lookup(now)
	if fl == nil {
		panic("outboxctl: alias of unregistered flag --" + now)
	}
	f.Var(fl.Value, old, "deprecated spelling of --"+now+", removed in the next release")
	if f.deprecated == nil {
		f.deprecated = map[string]string{}
	}
	f.deprecated[old] = now
}

// printUsage writes the usage text and the flags to w.
func (f *flagSet) printUsage(w io.Writer) {
	text := f.text
	if text == "" {
		text = "usage: outboxctl " + f.name + " [flags]"
	}
	fmt.Fprintln(w, strings.TrimRight(text, "\n"))
	fmt.Fprintln(w, "\nFlags:")
	saved := f.Output()
	f.SetOutput(w)
	f.PrintDefaults()
	f.SetOutput(saved)
	fmt.Fprintln(w, "  -h, --help\n    \tprint this help")
}

// fail prints the usage on stderr and returns err as a usage error (exit 2).
func (f *flagSet) fail(err error) error {
	f.printUsage(f.e.stderr)
	return usageErr(err)
}

// parse parses args, flags and positional arguments in any order (dlq redrive 4 5
// --dry-run; "--" ends the flags), and returns the positional arguments.
func (f *flagSet) parse(args []string) ([]string, error) {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		// A flag that takes a value takes the next argument, even one starting with "-"
		// (--max-xmin-age -1).
		if fl := f.Lookup(name); fl != nil && !isBoolFlag(fl) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	// The flag package prints a parse error itself; the usage goes after it, and -h's on
	// stdout, where a reader asked for it.
	f.Usage = func() {}
	err := f.Parse(flags)
	switch {
	case errors.Is(err, flag.ErrHelp):
		f.printUsage(f.e.stdout)
		return nil, err
	case err != nil:
		f.printUsage(f.e.stderr)
		return nil, usageErr(errors.New("")) // already said, naming the flag
	}
	f.Visit(func(fl *flag.Flag) {
		if now, ok := f.deprecated[fl.Name]; ok {
			fmt.Fprintf(f.e.stderr, "outboxctl %s: --%s is deprecated and goes in the next release; use --%s\n", f.name, fl.Name, now)
		}
	})
	return pos, nil
}

func isBoolFlag(fl *flag.Flag) bool {
	b, ok := fl.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// parseFlags parses args into fs and refuses positional arguments.
func parseFlags(fs *flagSet, args []string) error {
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fs.fail(fmt.Errorf("unexpected arguments %q", pos))
	}
	return nil
}

// subcommand is one verb of a command with verbs (dlq list, retention run).
type subcommand struct {
	name string
	run  func(ctx context.Context, e env, args []string) error
}

// dispatch runs the subcommand args[0] names. No subcommand, or an unknown one, prints the
// usage on stderr (exit 2); -h, --help or help prints it on stdout (exit 0).
func dispatch(ctx context.Context, e env, name, usage string, subs []subcommand, args []string) error {
	names := make([]string, len(subs))
	for i, s := range subs {
		if len(args) > 0 && args[0] == s.name {
			return s.run(ctx, e, args[1:])
		}
		names[i] = s.name
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help") {
		fmt.Fprintln(e.stdout, usage)
		return nil
	}
	fmt.Fprintln(e.stderr, usage)
	if len(args) == 0 {
		return usageErr(fmt.Errorf("expected %s", strings.Join(names, ", ")))
	}
	return usageErr(fmt.Errorf("unknown %s command %q (expected %s)", name, args[0], strings.Join(names, ", ")))
}
