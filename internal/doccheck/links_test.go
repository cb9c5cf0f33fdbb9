package doccheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository, from this package's directory.
var root = filepath.Join("..", "..")

var (
	fence    = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```[^\\n]*$")
	codeSpan = regexp.MustCompile("`[^`\\n]*`")
	link     = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	heading  = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
)

// TestDocLinksResolve checks every relative link of README.md and docs/*.md.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	checked := 0
	anchorsOf := map[string]map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, target := range links(string(src)) {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), filepath.FromSlash(path))
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %q: no such file", rel(f), target)
					continue
				}
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s: link %q: a fragment into a file that is not markdown", rel(f), target)
				continue
			}
			if anchorsOf[dest] == nil {
				b, err := os.ReadFile(dest)
				if err != nil {
					t.Fatal(err)
				}
				anchorsOf[dest] = anchors(string(b))
			}
			if !anchorsOf[dest][frag] {
				t.Errorf("%s: link %q: %s has no heading with that anchor", rel(f), target, rel(dest))
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d relative links: the scan is broken", checked)
	}
}

// links returns the targets of the markdown links and images outside code.
func links(md string) []string {
	md = fence.ReplaceAllString(md, "")
	md = codeSpan.ReplaceAllString(md, "")
	var out []string
	for _, m := range link.FindAllStringSubmatch(md, -1) {
		out = append(out, m[1])
	}
	return out
}

// anchors returns the anchors GitHub gives md's headings: lower case, every character but
// letters, digits, spaces, '-' and '_' dropped, spaces as '-', repeats numbered -1, -2, ...
func anchors(md string) map[string]bool {
	md = fence.ReplaceAllString(md, "")
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(md, -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

func rel(path string) string {
	r, err := filepath.Rel(root, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(r)
}

func TestDocAnchors(t *testing.T) {
	t.Parallel()
	got := anchors("# Ordering modes (`ORDERING`)\n## 1. Flow-control keys and labels: `^[A-Za-z0-9._-]+$`\n## Local invoke\n## Local invoke\n```\n# not a heading\n```\n")
	for _, want := range []string{"ordering-modes-ordering", "1-flow-control-keys-and-labels-a-za-z0-9_-", "local-invoke", "local-invoke-1"} {
		if !got[want] {
			t.Errorf("anchor %q missing from %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a line in a code block was taken for a heading")
	}
}
