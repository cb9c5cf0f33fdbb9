package main

import (
	"errors"
	"flag"
)

// The exit codes of every outboxctl command: what a script may branch on. A command picks
// one by returning nil (0), a usageErr (2), a negativeErr (1), or any other error (3).
const (
	exitOK = 0
	// exitNegative is the command's own "no": it ran and the answer is bad (status not
	// healthy, a dead letter that does not exist, a redrive that left letters open, a
	// chaos invariant broken, a dev run that lost events).
	exitNegative = 1
	// exitUsage means nothing was done: a bad or missing flag, argument or command, or an
	// environment variable that is missing or invalid. Fix the invocation and rerun.
	exitUsage = 2
	// exitRuntime means the command could not do its job: the database is unreachable, a
	// query or QStash request failed, the relay stopped past its grace period.
	exitRuntime = 3
)

// exitCodesHelp is the contract as outboxctl help prints it (docs/operations.md says the same).
const exitCodesHelp = `Exit codes (every command):
  0  ok (status: healthy)
  1  the command's negative answer: status degraded or unhealthy (--json "status" says which),
     dlq show of a letter that does not exist, dlq redrive that left letters open, chaos
     invariants broken, dev events lost
  2  usage: bad flag, missing or extra argument, unknown command, missing or invalid
     environment; nothing was done
  3  runtime failure: database unreachable, a query or QStash request failed, relay stopped
     past its grace period
-h or --help on any command prints its usage and flags and exits 0.`

// exitError carries the exit code of err; the others map to exitRuntime (exitCode).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErr marks err as a usage error: exit 2, nothing done.
func usageErr(err error) error { return &exitError{code: exitUsage, err: err} }

// negativeErr marks err as the command's negative answer: exit 1.
func negativeErr(err error) error { return &exitError{code: exitNegative, err: err} }

// exitCode is the exit code for a command's error.
func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	default:
		return exitRuntime
	}
}
