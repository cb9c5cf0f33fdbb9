package configcheck_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/internal/configcheck/configchecktest"
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
