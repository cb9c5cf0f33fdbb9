// Command outboxctl operates an outbox-relay deployment: migrations, health, dead letters,
// a long-running relay, the local stack, the local QStash server, benchmarks and chaos runs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// env is what every command may read: flags come from args, configuration from getenv.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e env, args []string) error
}

func commands() []command {
	return []command{
		{"migrate", "apply (up) or list (status) schema migrations on DATABASE_URL", runMigrate},
		{"status", "is it healthy? backlog, oldest age, leases, dead letters, xmin horizon", runStatus},
		{"dlq", "dead letters: list, show, redrive", runDLQ},
		{"ui", "operator console in the browser: overview, dead letters, event lookup", runUI},
		{"relay", "drain continuously as a long-lived process (outside Lambda)", runRelay},
		{"retention", "delete old dispatched rows and expired dedupe records", runRetention},
		{"dev", "run the local stack and a demo producer end to end", runDev},
		{"qstash-dev", "run the local QStash-compatible server", runQStashDev},
		{"sign-event", "re-sign a sample Function URL event with the local keys", runSignEvent},
		{"bench", "benchmark the relay and consumers against the database's limits", runBench},
		{"chaos", "fault-injection run with an invariant checker", runChaos},
		{"env", "every environment variable: default, readers, meaning (docs/configuration.md)", runEnv},
		{"version", "the build's version, commit and Go toolchain (--json)", runVersion},
	}
}

// exitError carries a specific exit status (status: 1 degraded, 2 unhealthy).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, e env, args []string) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(e.stdout)
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, e, args[1:])
		if err == nil {
			return 0
		}
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.err != nil && ee.err.Error() != "" {
				fmt.Fprintf(e.stderr, "outboxctl %s: %v\n", c.name, ee.err)
			}
			return ee.code
		}
		fmt.Fprintf(e.stderr, "outboxctl %s: %v\n", c.name, err)
		return 1
	}
	fmt.Fprintf(e.stderr, "outboxctl: unknown command %q\n\n", args[0])
	usage(e.stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: outboxctl <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun outboxctl <command> -h for the command's flags.")
}

// parseFlags parses args into fs and refuses positional arguments: exit 2 with the usage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return &exitError{code: 2, err: fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	return nil
}

// newFlagSet returns a flag set that writes its usage to e.stderr and returns errors.
func newFlagSet(e env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("outboxctl "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs
}
