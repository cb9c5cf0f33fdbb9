package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/logtest"
)

// TestQStashDevRefusesBadOptions: a plan, batch-error shape or negative latency it does not
// know is refused before anything listens, saying which option is wrong.
func TestQStashDevRefusesBadOptions(t *testing.T) {
	t.Parallel()
	for flag, args := range map[string][]string{
		"--plan":         {"--plan", "gold"},
		"--batch-errors": {"--batch-errors", "sometimes"},
		"--latency":      {"--latency", "-5ms"},
	} {
		stderr := &logtest.Buffer{}
		e := env{stdout: io.Discard, stderr: stderr, getenv: func(string) string { return "" }}
		code := run(context.Background(), e, append([]string{"qstash-dev", "--port", "1"}, args...))
		if code == 0 || !strings.Contains(stderr.String(), flag) {
			t.Errorf("%v: exit %d, stderr %q, want an error naming %s", args, code, stderr.String(), flag)
		}
	}
}
