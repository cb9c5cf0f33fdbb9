// Package testwait waits in tests for asynchronous work by polling a condition against a
// deadline, so no test sleeps a fixed time and hopes. Tests only.
package testwait

import (
	"fmt"
	"testing"
	"time"
)

// maxInterval bounds the pause between polls: the first poll is immediate, then the pause
// doubles from a millisecond, so a condition that holds soon is seen soon and one that
// queries Postgres is not asked hundreds of times a second.
const maxInterval = 20 * time.Millisecond

// Eventually polls cond until it returns true. If timeout passes first it fails t with
// "timed out after <timeout>: <format, args>". cond runs on the caller's
// goroutine, so it may call t.Fatal to stop at once on an outcome that cannot change.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	EventuallyNil(t, timeout, func() error {
		if cond() {
			return nil
		}
		return fmt.Errorf(format, args...)
	})
}

// EventuallyNil polls check until it returns nil. If timeout passes first it fails t with
// "timed out after <timeout>: " and check's last error, which can describe the state it
// saw. check runs on the caller's goroutine, as cond does for Eventually.
func EventuallyNil(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %v", timeout, err)
			return
		}
		time.Sleep(pause)
		pause = min(2*pause, maxInterval)
	}
}
