package samtemplate_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestTemplateServerlessRepoMetadata: what `sam publish` sends meets the Serverless
// Application Repository's constraints (AWS SAM developer guide, "Metadata section
// properties"), names files that exist, and carries CHANGELOG.md's newest release, so a
// release cannot bump one and forget the other.
func TestTemplateServerlessRepoMetadata(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root(t), "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tpl struct {
		Metadata map[string]map[string]any `yaml:"Metadata"`
	}
	if err := yaml.Unmarshal(b, &tpl); err != nil {
		t.Fatal(err)
	}
	app := tpl.Metadata["AWS::ServerlessRepo::Application"]
	if app == nil {
		t.Fatal("template has no Metadata: AWS::ServerlessRepo::Application")
	}
	str := func(key string) string {
		t.Helper()
		s, ok := app[key].(string)
		if !ok || s == "" {
			// The repository resolves no intrinsic functions: every value is literal.
			t.Errorf("%s = %#v, want a non-empty literal string", key, app[key])
		}
		return s
	}
	check := func(key, value string, max int, re *regexp.Regexp) {
		t.Helper()
		if len(value) > max || (re != nil && !re.MatchString(value)) {
			t.Errorf("%s %q: want at most %d characters matching %v", key, value, max, re)
		}
	}
	check("Name", str("Name"), 140, regexp.MustCompile(`^[a-zA-Z0-9-]+$`))
	check("Description", str("Description"), 256, nil)
	// The documented pattern is ^[a-z0-9](([a-z0-9]|-(?!-))*[a-z0-9])?$: no double hyphen.
	author := str("Author")
	check("Author", author, 127, regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`))
	if strings.Contains(author, "--") {
		t.Errorf("Author %q has a double hyphen", author)
	}
	labels, _ := app["Labels"].([]any)
	if len(labels) == 0 || len(labels) > 10 {
		t.Errorf("Labels %v: want 1 to 10", app["Labels"])
	}
	for _, l := range labels {
		s, _ := l.(string)
		check("Label", s, 127, regexp.MustCompile(`^[a-zA-Z0-9+\-_:/@]+$`))
	}
	for _, key := range []string{"HomePageUrl", "SourceCodeUrl"} {
		if u := str(key); !strings.HasPrefix(u, "https://") {
			t.Errorf("%s %q is not an https URL", key, u)
		}
	}

	if id := str("SpdxLicenseId"); id != "Apache-2.0" {
		t.Errorf("SpdxLicenseId %q, want Apache-2.0 (LICENSE)", id)
	}
	license, err := os.ReadFile(filepath.Join(root(t), str("LicenseUrl")))
	if err != nil || !strings.Contains(string(license), "Apache License\n                           Version 2.0") {
		t.Errorf("LicenseUrl %q is not the Apache-2.0 text: %v", app["LicenseUrl"], err)
	}
	if _, err := os.Stat(filepath.Join(root(t), str("ReadmeUrl"))); err != nil {
		t.Errorf("ReadmeUrl: %v", err)
	}

	changelog, err := os.ReadFile(filepath.Join(root(t), "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	newest := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`).FindSubmatch(changelog)
	if newest == nil {
		t.Fatal("CHANGELOG.md names no release (## [x.y.z] - yyyy-mm-dd)")
	}
	if v := str("SemanticVersion"); v != string(newest[1]) {
		t.Errorf("SemanticVersion %q, CHANGELOG.md's newest release %s", v, newest[1])
	}
}
