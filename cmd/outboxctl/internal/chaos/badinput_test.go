package chaos_test

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/chaos"
)

// The hostile-input tests of the webhook and the failure callback live with them (pkg/webhook
// hostile_test.go, pkg/deadletter hostile_test.go); this file checks the chaos command's flags.

// TestChaosFlags: bad flags for outboxctl chaos are refused with the field named.
func TestChaosFlags(t *testing.T) {
	t.Parallel()
	cases := map[string][]string{
		"relays 0":           {"--relays", "0"},
		"rate above 1":       {"--publish-500", "1.5"},
		"rates over 1":       {"--publish-500", "0.6", "--publish-429", "0.6"},
		"unknown ordering":   {"--ordering", "lifo"},
		"negative kills":     {"--db-kills-per-second", "-1"},
		"kill rate above 1":  {"--kill-in-flight", "2"},
		"rate not a number":  {"--consumer-ack-lost", "often"},
		"seed not a number":  {"--seed", "abc"},
		"no delivery delay?": {"--max-delivery-delay", "0"},
		// Long-lived relays are not kicked: a kick fault without the deployed shape would
		// test nothing.
		"kick fault, no lambda": {"--kick-lost", "0.2"},
		"kick rates over 1":     {"--lambda", "--kick-lost", "0.6", "--kick-refused", "0.6"},
		"backstop too short":    {"--lambda", "--backstop", "1ms"},
		"negative idle gap":     {"--lambda", "--idle-gap", "-1s"},
	}
	for name, args := range cases {
		fs := flagSet()
		o := chaos.Options{DatabaseURL: "postgres://x", Faults: chaos.DefaultFaults()}.WithDefaults()
		fl := chaos.BindFlags(fs, &o)
		err := fs.Parse(args)
		if err == nil {
			fl.Apply()
			err = o.Validate()
		}
		if err == nil {
			t.Errorf("%s: %v accepted", name, args)
		}
	}
}

// TestChaosLambdaFlags: --lambda alone is a valid run: the deployed shape with its kick
// faults on at their default rates.
func TestChaosLambdaFlags(t *testing.T) {
	t.Parallel()
	fs := flagSet()
	o := chaos.Options{DatabaseURL: "postgres://x", Faults: chaos.DefaultFaults()}.WithDefaults()
	fl := chaos.BindFlags(fs, &o)
	if err := fs.Parse([]string{"--lambda", "--kick-refused", "0.3", "--pause", "-1"}); err != nil {
		t.Fatal(err)
	}
	fl.Apply()
	if err := o.Validate(); err != nil {
		t.Fatalf("--lambda refused: %v", err)
	}
	// Run applies the defaults again: "never pause" must survive them.
	if o = o.WithDefaults(); o.Lambda.PauseRate >= 0 {
		t.Fatalf("--pause -1 became %v after the defaults, want negative (never)", o.Lambda.PauseRate)
	}
	want := chaos.DefaultFaults().WithKickFaults()
	want.KickRefused = 0.3
	if o.Lambda == nil || o.Lambda.Backstop != chaos.DefaultBackstop || o.Faults != want {
		t.Fatalf("lambda %+v, faults %+v: want the default shape and kick faults, --kick-refused applied after them", o.Lambda, o.Faults)
	}
}
