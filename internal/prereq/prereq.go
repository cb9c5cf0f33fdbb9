// Package prereq decides what a test does when something it needs from the machine is
// missing (a Postgres server or its binaries, aws-lambda-rie, moto_server, Chromium, TLS).
package prereq

import (
	"fmt"
	"os"
	"testing"
)

// Missing ends a test that cannot run without a missing prerequisite: under CI (CI set to
// anything) it fails, because .ci/run installs or starts every prerequisite and a skip
// there would hide a broken setup as a pass; elsewhere it skips with the reason, which
// says how to get what is missing.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}
