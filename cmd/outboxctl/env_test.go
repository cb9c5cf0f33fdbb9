package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/envconfig/envdoc"
)

func TestEnvCommandPrintsTheReference(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	e := env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}
	if code := run(context.Background(), e, []string{"env"}); code != 0 {
		t.Fatalf("outboxctl env: exit %d: %s", code, errOut.String())
	}
	var want bytes.Buffer
	if err := envdoc.Markdown(&want); err != nil {
		t.Fatal(err)
	}
	if out.String() != want.String() {
		t.Fatal("outboxctl env does not print envdoc.Markdown")
	}

	out.Reset()
	if code := run(context.Background(), e, []string{"env", "--names"}); code != 0 {
		t.Fatalf("outboxctl env --names: exit %d: %s", code, errOut.String())
	}
	if names := strings.Fields(out.String()); len(names) != len(envdoc.Vars) || names[0] != envdoc.Vars[0].Name {
		t.Fatalf("outboxctl env --names printed %d names starting %q, want %d", len(names), names[0], len(envdoc.Vars))
	}

	out.Reset()
	if code := run(context.Background(), e, []string{"env", "-h"}); code != 0 || !strings.Contains(out.String(), "-names") {
		t.Fatalf("outboxctl env -h: exit %d, usage %q", code, out.String())
	}
	if code := run(context.Background(), e, []string{"env", "extra"}); code != 2 {
		t.Fatalf("outboxctl env extra: exit %d, want 2", code)
	}
}
