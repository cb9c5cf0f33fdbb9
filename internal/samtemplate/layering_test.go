package samtemplate_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLayering holds the import graph to the layout: the receiver functions do not link
// the relay engine (or retention), and no library package under pkg/ links a tool, an
// internal package (but the relay's own SQL, internal/outboxstore), an example or a command.
func TestLayering(t *testing.T) {
	t.Parallel()
	deps := func(pkgs ...string) []string {
		t.Helper()
		cmd := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...)
		cmd.Dir = root(t)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %v: %v", pkgs, err)
		}
		return strings.Fields(string(out))
	}
	for _, p := range deps("./functions/webhook", "./functions/failure") {
		if p == modulePath+"/pkg/relay" || p == modulePath+"/pkg/retention" {
			t.Errorf("a receiver function links %s", p)
		}
	}
	for _, p := range deps("./pkg/...") {
		for _, banned := range []string{"/cmd/", "/internal/", "/examples/", "/functions/"} {
			if strings.HasPrefix(p, modulePath) && strings.Contains(strings.TrimPrefix(p, modulePath), banned) && p != modulePath+"/internal/outboxstore" {
				t.Errorf("a library package links %s", p)
			}
		}
	}
}
