package configcheck_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck/configchecktest"
)

func TestProblems(t *testing.T) {
	t.Parallel()
	if err := configcheck.For("x").Err(); err != nil {
		t.Fatalf("no bad field: %v", err)
	}
	bad := configcheck.For("webhook")
	bad.Bad("Pool", "is nil")
	bad.Bad("MaxBodyBytes", "%d is negative", -1)
	err := bad.Err()
	if want := "webhook config Pool: is nil\nwebhook config MaxBodyBytes: -1 is negative"; err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}
	configchecktest.RequireFields(t, fmt.Errorf("new handler: %w", err), "webhook", "Pool", "MaxBodyBytes")
}

// failures records what RequireFields reports instead of failing the test.
type failures struct {
	testing.TB
	n int
}

func (f *failures) Errorf(string, ...any) { f.n++ }
func (f *failures) Fatalf(string, ...any) { f.n++ }

func TestRequireFieldsRefuses(t *testing.T) {
	t.Parallel()
	bad := configcheck.For("webhook")
	bad.Bad("Pool", "is nil")
	for name, c := range map[string]struct {
		err    error
		config string
		fields []string
	}{
		"no error":        {nil, "webhook", []string{"Pool"}},
		"another field":   {bad.Err(), "webhook", []string{"Verifier"}},
		"a missing field": {bad.Err(), "webhook", []string{"Pool", "Verifier"}},
		"another config":  {bad.Err(), "relay", []string{"Pool"}},
		"a plain error":   {errors.Join(bad.Err(), errors.New("Verifier is nil")), "webhook", []string{"Pool"}},
	} {
		f := &failures{TB: t}
		configchecktest.RequireFields(f, c.err, c.config, c.fields...)
		if f.n == 0 {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestURLs: the one check of the configurations' URLs. A base URL is one the code appends
// paths to, so a query or a fragment, even an empty one, is refused.
func TestURLs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url        string
		http, base bool
	}{
		{"https://hooks.example.com", true, true},
		{"http://127.0.0.1:8080/base/", true, true},
		{"https://hooks.example.com/?v=1", true, false},
		{"https://hooks.example.com/?", true, false},
		{"https://hooks.example.com/#top", true, false},
		{"https://hooks.example.com/#", true, false},
		{"ftp://hooks.example.com", false, false},
		{"hooks.example.com/path", false, false},
		{"https:///path", false, false},
		{"", false, false},
		{"https://bad host", false, false},
	} {
		if err := configcheck.HTTPURL(c.url); (err == nil) != c.http {
			t.Errorf("HTTPURL(%q) = %v, want ok %v", c.url, err, c.http)
		}
		err := configcheck.BaseURL(c.url)
		if (err == nil) != c.base {
			t.Errorf("BaseURL(%q) = %v, want ok %v", c.url, err, c.base)
		}
		if err != nil && c.url != "" && !strings.Contains(err.Error(), c.url) {
			t.Errorf("BaseURL(%q): %v does not quote the URL", c.url, err)
		}
	}
}
