package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/prereq"
)

func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	stamped := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v2.0.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "09b9554f0c1e"},
		{Key: "vcs.time", Value: "2026-12-03T08:05:35Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	for _, tt := range []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want buildVersion
		text []string
	}{
		{"stamped", stamped, true,
			buildVersion{Version: "v2.0.0", Revision: "09b9554f0c1e", Time: "2026-12-03T08:05:35Z", Modified: true, GoVersion: "go1.26.8"},
			[]string{"outboxctl v2.0.0\n", "revision     09b9554f0c1e (modified)\n", "commit time  2026-12-03T08:05:35Z\n", "go           go1.26.8\n"}},
		{"no vcs", &debug.BuildInfo{GoVersion: "go1.26.8"}, true,
			buildVersion{Version: "(devel)", GoVersion: "go1.26.8"},
			[]string{"outboxctl (devel)\n", "revision     unknown (built without VCS information)\n"}},
		{"no build info", nil, false, buildVersion{Version: "unknown"}, []string{"outboxctl unknown\n"}},
	} {
		got := versionFrom(tt.bi, tt.ok)
		if got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
		var b bytes.Buffer
		got.write(&b)
		for _, w := range tt.text {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: text %q lacks %q", tt.name, b.String(), w)
			}
		}
		if tt.name == "no vcs" && strings.Contains(b.String(), "commit time") {
			t.Errorf("%s: text %q shows a commit time it does not have", tt.name, b.String())
		}
	}
}

// TestVersionOfTheBuiltBinary builds outboxctl with VCS stamping and checks that version
// --json reports what the toolchain embedded (go version -m reads the same binary), that
// --version is the same command, and, where Go can stamp the checkout, that the revision
// is HEAD.
func TestVersionOfTheBuiltBinary(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds outboxctl")
	}
	// The machines' GOFLAGS may carry -buildvcs=false; the command line overrides it.
	bin := buildCLI(t, "-buildvcs=true")
	var got buildVersion
	out, err := exec.Command(bin, "version", "--json").Output()
	if err != nil {
		t.Fatalf("outboxctl version --json: %v", err)
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("version --json %q: %v", out, err)
	}
	if alias, err := exec.Command(bin, "--version", "--json").Output(); err != nil || !bytes.Equal(alias, out) {
		t.Errorf("--version --json = %q, %v; want %q", alias, err, out)
	}

	m, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	embedded := map[string]string{}
	for _, line := range strings.Split(string(m), "\n") {
		f := strings.Split(strings.TrimSpace(line), "\t")
		switch {
		case len(f) >= 3 && f[0] == "mod":
			embedded["version"] = f[2]
		case len(f) == 2 && f[0] == "build":
			k, v, _ := strings.Cut(f[1], "=")
			embedded[k] = v
		}
	}
	want := buildVersion{Version: embedded["version"], Revision: embedded["vcs.revision"], Time: embedded["vcs.time"],
		Modified: embedded["vcs.modified"] == "true", GoVersion: runtime.Version()}
	if got != want {
		t.Errorf("version --json = %+v, go version -m says %+v", got, want)
	}

	// Go stamps a checkout only where .git is a directory (not in a git worktree, whose
	// .git is a file); CI builds a clean clone.
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		prereq.Missing(t, "not in a git checkout (%v): the revision is not checked", err)
	}
	if fi, err := os.Stat(filepath.Join(strings.TrimSpace(string(root)), ".git")); err != nil || !fi.IsDir() {
		prereq.Missing(t, "a git worktree (%v): Go stamps VCS information only where .git is a directory, as in CI's clean clone, so the revision is not checked", err)
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != strings.TrimSpace(string(head)) {
		t.Errorf("revision %q, want HEAD %q", got.Revision, head)
	}
	if _, err := time.Parse(time.RFC3339, got.Time); err != nil {
		t.Errorf("commit time %q: %v", got.Time, err)
	}
}

func TestVersionRefusesArguments(t *testing.T) {
	t.Parallel()
	if code, _, stderr := runCLIEnv(t, nil, "version", "extra"); code != 2 {
		t.Fatalf("exit %d, want 2; stderr %q", code, stderr)
	}
}
