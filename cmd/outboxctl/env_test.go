package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig/envdoc"
)

func TestEnvCommandPrintsTheReference(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCLIEnv(t, nil, "env")
	if code != 0 {
		t.Fatalf("outboxctl env: exit %d: %s", code, stderr)
	}
	var want bytes.Buffer
	if err := envdoc.Markdown(&want); err != nil {
		t.Fatal(err)
	}
	if out != want.String() {
		t.Fatal("outboxctl env does not print envdoc.Markdown")
	}

	code, out, stderr = runCLIEnv(t, nil, "env", "--names")
	if code != 0 {
		t.Fatalf("outboxctl env --names: exit %d: %s", code, stderr)
	}
	if names := strings.Fields(out); len(names) != len(envdoc.Vars) || names[0] != envdoc.Vars[0].Name {
		t.Fatalf("outboxctl env --names printed %d names starting %q, want %d", len(names), names[0], len(envdoc.Vars))
	}

	if code, out, _ := runCLIEnv(t, nil, "env", "-h"); code != 0 || !strings.Contains(out, "-names") {
		t.Fatalf("outboxctl env -h: exit %d, usage %q", code, out)
	}
	if code, _, _ := runCLIEnv(t, nil, "env", "extra"); code != 2 {
		t.Fatalf("outboxctl env extra: exit %d, want 2", code)
	}
}
