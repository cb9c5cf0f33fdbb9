// Command outboxctl operates an outbox-relay deployment: migrations, health, dead letters,
// a long-running relay, the local stack, the local QStash server, benchmarks and chaos runs.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// env is what every command may read: flags come from args, configuration from getenv.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// stdin is what `outboxctl enqueue` reads; nil reads nothing.
	stdin io.Reader
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
		{"enqueue", "commit events read as JSON lines from stdin, kicking the relay Lambda", runEnqueue},
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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, stdin: os.Stdin}, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, e env, args []string) int {
	if len(args) == 0 {
		usage(e.stderr)
		return exitUsage
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		usage(e.stdout)
		return exitOK
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, e, args[1:])
		if code := exitCode(err); code != exitOK {
			if msg := err.Error(); msg != "" { // "" when already printed (a flag error)
				fmt.Fprintf(e.stderr, "outboxctl %s: %s%s\n", c.name, msg, hint(err))
			}
			return code
		}
		return exitOK
	}
	fmt.Fprintf(e.stderr, "outboxctl: unknown command %q\n\n", args[0])
	usage(e.stderr)
	return exitUsage
}

// sqlUndefinedTable is Postgres's SQLSTATE for a table that does not exist.
const sqlUndefinedTable = "42P01"

// hint is what to do about err when one step fixes it, on a line of its own; "" otherwise.
func hint(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == sqlUndefinedTable {
		return "\nhint: the database DATABASE_URL names has no " + strconv.Quote(tableOf(pe)) +
			" table in its search_path: run `outboxctl migrate up` on it first (or fix DATABASE_URL's database or search_path)"
	}
	return ""
}

// tableOf is the table a 42P01 error names ("relation \"outbox\" does not exist").
func tableOf(pe *pgconn.PgError) string {
	if _, rest, ok := strings.Cut(pe.Message, `"`); ok {
		if name, _, ok := strings.Cut(rest, `"`); ok {
			return name
		}
	}
	return "outbox"
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: outboxctl <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun outboxctl <command> -h for the command's flags.")
	fmt.Fprintln(w, "\n"+exitCodesHelp)
}
