// Package testwait waits in tests for asynchronous work by polling a condition against a
// deadline, so no test sleeps a fixed time and hopes. Tests only.
package testwait

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// maxInterval bounds the pause between polls: the first poll is immediate, then the pause
// doubles from a millisecond, so a condition that holds soon is seen soon and one that
// queries Postgres is not asked hundreds of times a second.
const maxInterval = 20 * time.Millisecond

// Eventually polls cond until it returns true. If timeout passes first it fails t with
// "timed out after <timeout> waiting for <format, args>". cond runs on the caller's
// goroutine, so it may call t.Fatal to stop at once on an outcome that cannot change.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if poll(timeout, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}) != nil {
		t.Fatalf("timed out after %v waiting for %s", timeout, fmt.Sprintf(format, args...))
	}
}

// EventuallyNil polls check until it returns nil. If timeout passes first it fails t with
// "timed out after <timeout>: " and check's last error, which can describe the state it
// saw. check runs on the caller's goroutine, as cond does for Eventually.
func EventuallyNil(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	if err := poll(timeout, check); err != nil {
		t.Fatalf("timed out after %v: %v", timeout, err)
	}
}

var errNotYet = errors.New("condition not met")

// poll calls check until it returns nil (poll returns nil) or timeout has passed (poll
// returns check's last error).
func poll(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(pause)
		pause = min(2*pause, maxInterval)
	}
}
