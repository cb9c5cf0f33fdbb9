package qstashtest

import "testing"

// TestLogsKeepTheirNewerHalf: the request and attempt logs stop growing at maxLog entries
// and keep the newest ones in order, so a server that runs for hours (qstash-dev, the
// two-hour pinned benchmark) holds a bounded history.
func TestLogsKeepTheirNewerHalf(t *testing.T) {
	t.Parallel()
	var log []int
	for i := range 3*maxLog + 7 {
		log = appendBounded(log, i)
		if len(log) > maxLog {
			t.Fatalf("after %d appends the log holds %d entries, more than %d", i+1, len(log), maxLog)
		}
	}
	last := 3*maxLog + 6
	if len(log) < maxLog/2 || log[len(log)-1] != last {
		t.Fatalf("log holds %d entries ending at %d, want at least %d ending at %d", len(log), log[len(log)-1], maxLog/2, last)
	}
	for i := 1; i < len(log); i++ {
		if log[i] != log[i-1]+1 {
			t.Fatalf("entries %d and %d are %d and %d: not the newest in order", i-1, i, log[i-1], log[i])
		}
	}
}
