// Package configchecktest checks, for the tests of every configuration in pkg/, that a bad
// configuration is reported in the one shape configcheck gives: a *publish.ConfigError per
// bad field.
package configchecktest

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// RequireFields fails t unless err is made only of *publish.ConfigErrors of the
// configuration config, each with a reason, naming exactly the fields want (a field may be
// reported more than once). Wrapping and joining around them are looked through.
func RequireFields(t testing.TB, err error, config string, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want %s config errors for %v", config, want)
	}
	got := map[string]bool{}
	for _, leaf := range leaves(err) {
		var ce *publish.ConfigError
		if !errors.As(leaf, &ce) {
			t.Errorf("%q is not a *publish.ConfigError (in %v)", leaf, err)
			continue
		}
		if ce.Config != config || ce.Reason == "" {
			t.Errorf("%q: want Config %q and a reason", ce, config)
		}
		got[ce.Field] = true
	}
	wantSet := map[string]bool{}
	for _, f := range want {
		wantSet[f] = true
	}
	if !maps.Equal(got, wantSet) {
		t.Errorf("fields %v, want %v:\n%v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(wantSet)), err)
	}
}

// leaves are the errors err joins, through any wrapping.
func leaves(err error) []error {
	switch e := err.(type) {
	case *publish.ConfigError:
		return []error{e}
	case interface{ Unwrap() []error }:
		var out []error
		for _, c := range e.Unwrap() {
			out = append(out, leaves(c)...)
		}
		return out
	case interface{ Unwrap() error }:
		if u := e.Unwrap(); u != nil {
			return leaves(u)
		}
	}
	return []error{err}
}
