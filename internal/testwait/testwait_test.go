package testwait

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a testing.TB that records a failure instead of ending the test, as
// testing.T's Fatalf would.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = fmt.Sprintf(format, args...)
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	calls := 0
	start := time.Now()
	Eventually(r, 10*time.Second, func() bool { calls++; return calls == 3 }, "three calls")
	if r.failed != "" || calls != 3 {
		t.Fatalf("failed %q after %d calls", r.failed, calls)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("took %v for three polls", el)
	}
}

func TestEventuallyFailsWithTheMessage(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	start := time.Now()
	Eventually(r, 50*time.Millisecond, func() bool { return false }, "%d rows", 7)
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Fatalf("gave up after %v, before the timeout", el)
	}
	if want := "timed out after 50ms waiting for 7 rows"; r.failed != want {
		t.Fatalf("failure %q, want %q", r.failed, want)
	}
}

func TestEventuallyNilReportsTheLastError(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	n := 0
	EventuallyNil(r, 30*time.Millisecond, func() error { n++; return fmt.Errorf("seen %d", n) })
	if !strings.HasPrefix(r.failed, "timed out after 30ms: seen ") || r.failed != fmt.Sprintf("timed out after 30ms: seen %d", n) {
		t.Fatalf("failure %q after %d checks", r.failed, n)
	}
	r2 := &recorder{TB: t}
	EventuallyNil(r2, time.Second, func() error { return nil })
	if r2.failed != "" {
		t.Fatalf("a check that holds failed: %q", r2.failed)
	}
}
