package samtemplate_test

import (
	"os/exec"
	"strings"
	"testing"
)

// libraryInternals are the internal packages a library package under pkg/ may link: code
// the library runs but a user never calls (the relay's SQL, the receive step of both QStash
// receivers, the trusted origin, W3C trace context, the configurations' field checks). No
// pkg/ API names their types.
var libraryInternals = map[string]bool{
	modulePath + "/internal/configcheck": true,
	modulePath + "/internal/outboxstore": true,
	modulePath + "/internal/receive":     true,
	modulePath + "/internal/origin":      true,
	modulePath + "/internal/tracing":     true,
}

// TestLayering holds the import graph to the layout: the receiver functions do not link
// the relay engine (or retention), and no library package under pkg/ links a tool, an
// internal package (but libraryInternals), an example or a command.
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
			if strings.HasPrefix(p, modulePath) && strings.Contains(strings.TrimPrefix(p, modulePath), banned) && !libraryInternals[p] {
				t.Errorf("a library package links %s", p)
			}
		}
	}
}
