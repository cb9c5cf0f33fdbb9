package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime/debug"
)

// buildVersion is what the binary knows about its own build, from the information the Go
// toolchain embeds (runtime/debug.ReadBuildInfo; `go version -m` shows the same).
type buildVersion struct {
	// Version is the module version: vX.Y.Z from `go install ...@vX.Y.Z`, a pseudo-version
	// for a build in a git checkout, or "(devel)" when the toolchain knew neither.
	Version string `json:"version"`
	// Revision is the commit built (vcs.revision), empty when the build carries no VCS
	// stamp (-buildvcs=false, `go run`, a source tree without .git).
	Revision string `json:"revision,omitempty"`
	// Time is the commit's time (vcs.time, RFC 3339), not the time of the build.
	Time string `json:"time,omitempty"`
	// Modified reports that the work tree had uncommitted changes (vcs.modified).
	Modified bool `json:"modified"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go_version"`
}

// versionFrom reads bi; ok is false when the binary carries no build information.
func versionFrom(bi *debug.BuildInfo, ok bool) buildVersion {
	if !ok || bi == nil {
		return buildVersion{Version: "unknown"}
	}
	v := buildVersion{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (v buildVersion) write(w io.Writer) {
	fmt.Fprintf(w, "outboxctl %s\n", v.Version)
	rev := v.Revision
	switch {
	case rev == "":
		rev = "unknown (built without VCS information)"
	case v.Modified:
		rev += " (modified)"
	}
	fmt.Fprintf(w, "  revision     %s\n", rev)
	if v.Time != "" {
		fmt.Fprintf(w, "  commit time  %s\n", v.Time)
	}
	fmt.Fprintf(w, "  go           %s\n", v.GoVersion)
}

// runVersion prints the build's version, commit and toolchain; --json as one object.
func runVersion(_ context.Context, e env, args []string) error {
	fs := newFlagSet(e, "version")
	asJSON := fs.Bool("json", false, "print one JSON object: version, revision, time, modified, go_version")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	v := versionFrom(debug.ReadBuildInfo())
	if *asJSON {
		if err := json.NewEncoder(e.stdout).Encode(v); err != nil {
			return fmt.Errorf("write version: %w", err)
		}
		return nil
	}
	v.write(e.stdout)
	return nil
}
