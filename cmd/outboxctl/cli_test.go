package main

import (
	"context"
	"strings"
	"testing"
)

// helpCases are the commands and subcommands with one flag each that their -h must list;
// every command in commands() is checked whether listed here or not.
var helpCases = []struct {
	path []string
	flag string
}{
	{[]string{"migrate"}, "-lock-timeout"},
	{[]string{"status"}, "-max-oldest-age"},
	{[]string{"dlq", "list"}, "-include-resolved"},
	{[]string{"dlq", "show"}, "-group"},
	{[]string{"dlq", "redrive"}, "-dry-run"},
	{[]string{"dlq", "sync"}, "-delete-synced"},
	{[]string{"ui"}, "-allow-redrive"},
	{[]string{"relay"}, "-grace"},
	{[]string{"enqueue"}, "-json"},
	{[]string{"retention", "run"}, "-dedupe-ttl"},
	{[]string{"dev"}, "-events"},
	{[]string{"qstash-dev"}, "-time-scale"},
	{[]string{"sign-event"}, "-in"},
	{[]string{"bench"}, "-scenarios"},
	{[]string{"bench", "relay-drain"}, "-rtt"},
	{[]string{"chaos"}, "-no-faults"},
	{[]string{"env"}, "-names"},
	{[]string{"version"}, "-json"},
}

// TestEveryCommandHelpAndBadFlag: -h and --help print the usage and the flags on stdout and
// exit 0; an unknown flag exits 2 with the error and the usage on stderr. Neither reads the
// environment (it is empty here) or touches a database.
func TestEveryCommandHelpAndBadFlag(t *testing.T) {
	t.Parallel()
	cases := helpCases
	for _, c := range commands() {
		listed := false
		for _, h := range helpCases {
			listed = listed || h.path[0] == c.name
		}
		if !listed {
			cases = append(cases, struct {
				path []string
				flag string
			}{[]string{c.name}, ""})
		}
	}
	for _, c := range cases {
		name := strings.Join(c.path, " ")
		usageLine := "usage: outboxctl " + name
		for _, h := range []string{"-h", "--help"} {
			code, out, stderr := runCLIEnv(t, nil, append(c.path, h)...)
			if code != 0 || !strings.Contains(out, usageLine) || !strings.Contains(out, "Flags:") || !strings.Contains(out, "-h, --help") || stderr != "" {
				t.Errorf("%s %s: exit %d, want 0 and the usage and flags on stdout:\nstdout:\n%s\nstderr:\n%s", name, h, code, out, stderr)
			}
			if c.flag != "" && !strings.Contains(out, "  "+c.flag+" ") && !strings.Contains(out, "  "+c.flag+"\n") {
				t.Errorf("%s %s does not list %s:\n%s", name, h, c.flag, out)
			}
		}
		code, out, stderr := runCLIEnv(t, nil, append(c.path, "--no-such-flag")...)
		if code != exitUsage || out != "" || !strings.Contains(stderr, "flag provided but not defined: -no-such-flag") || !strings.Contains(stderr, usageLine) {
			t.Errorf("%s --no-such-flag: exit %d, want 2 and the usage on stderr:\nstdout:\n%s\nstderr:\n%s", name, code, out, stderr)
		}
	}
}

// TestCommandsWithVerbs: dlq and retention without a verb, or with an unknown one, exit 2
// with their usage on stderr; -h prints it on stdout.
func TestCommandsWithVerbs(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"dlq", "retention"} {
		for _, c := range []struct {
			args   []string
			code   int
			stdout bool
		}{{nil, exitUsage, false}, {[]string{"frob"}, exitUsage, false}, {[]string{"--bogus"}, exitUsage, false}, {[]string{"-h"}, exitOK, true}, {[]string{"help"}, exitOK, true}} {
			code, out, stderr := runCLIEnv(t, nil, append([]string{cmd}, c.args...)...)
			where := stderr
			if c.stdout {
				where = out
			}
			if code != c.code || !strings.Contains(where, "usage:") || !strings.Contains(where, "outboxctl "+cmd+" ") {
				t.Errorf("%s %v: exit %d, want %d with the usage on %s:\nstdout:\n%s\nstderr:\n%s", cmd, c.args, code, c.code, map[bool]string{true: "stdout", false: "stderr"}[c.stdout], out, stderr)
			}
		}
	}
}

// TestHelpDocumentsExitCodes: outboxctl help lists every exit code; no command, or an
// unknown one, is a usage error.
func TestHelpDocumentsExitCodes(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		code, out, _ := runCLIEnv(t, nil, args...)
		if code != 0 || !strings.Contains(out, "Exit codes") {
			t.Fatalf("%v: exit %d\n%s", args, code, out)
		}
		for _, line := range []string{"  0  ok", "  1  the command's negative answer", "  2  usage", "  3  runtime failure"} {
			if !strings.Contains(out, line) {
				t.Errorf("%v does not document %q:\n%s", args, line, out)
			}
		}
	}
	for _, args := range [][]string{nil, {"frob"}} {
		if code, _, stderr := runCLIEnv(t, nil, args...); code != exitUsage || !strings.Contains(stderr, "usage: outboxctl") {
			t.Errorf("%v: exit %d, want 2 with the usage on stderr: %q", args, code, stderr)
		}
	}
}

// TestExitCodes: the mapping from a command's error to the process's exit code.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, exitOK},
		{"usage", usageErr(context.Canceled), exitUsage},
		{"negative", negativeErr(context.Canceled), exitNegative},
		{"any other error", context.DeadlineExceeded, exitRuntime},
	} {
		if got := exitCode(c.err); got != c.want {
			t.Errorf("%s: exit %d, want %d", c.name, got, c.want)
		}
	}
}
