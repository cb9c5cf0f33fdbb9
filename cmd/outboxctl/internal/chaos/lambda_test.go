package chaos_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/chaos"
)

// TestChaosLambda runs the deployed shape with every fault on, the kick faults too: the
// relay function's handler in environments behind the local Lambda service, woken by the
// producers' kicks and a schedule. Nothing may be lost, applied twice or applied out of
// key order, whichever kicks were lost, refused or never sent.
func TestChaosLambda(t *testing.T) {
	t.Parallel()
	seed := chaosSeed(t)
	faults := chaos.DefaultFaults().WithKickFaults()
	// Relays that keep their promises leave few kicks to send (a few dozen a run): a
	// higher rate makes sure some are lost.
	faults.KickLost = 0.3
	rep := runChaos(t, chaos.Options{Events: chaosEvents(t, 2000), Seed: seed, Relays: 3,
		Faults: faults, Lambda: &chaos.Lambda{Backstop: time.Second}})
	l := rep.Lambda
	if l == nil {
		t.Fatal("the report has no lambda section")
	}
	for _, kind := range []string{chaos.FaultKickNotSent, chaos.FaultKickLost} {
		if rep.Faults[kind] == 0 {
			t.Errorf("fault %s was never injected (seed %d)", kind, seed)
		}
	}
	if rep.Faults[chaos.FaultKickRefused] == 0 {
		// TestChaosLambdaKicksFail refuses every kick.
		t.Logf("fault %s was never injected (seed %d)", chaos.FaultKickRefused, seed)
	}
	if l.KickInvocations == 0 || l.TickInvocations == 0 {
		t.Errorf("kick invocations %d, tick invocations %d: the run did not use both triggers", l.KickInvocations, l.TickInvocations)
	}
	if l.Kicks.Sent == 0 || l.Kicks.Skipped == 0 {
		t.Errorf("kicks %+v: none sent or none coalesced", l.Kicks)
	}
}

// TestChaosLambdaKicksFail: every kick invoke is lost (accepted, then never run) or
// refused (429/500, also after the SDK's retries) while the faults are on, and they stay
// on until every event settled, so only the schedule's ticks wake the relay: every event
// of a failed kick is delivered by the backstop, once.
func TestChaosLambdaKicksFail(t *testing.T) {
	t.Parallel()
	for name, faults := range map[string]chaos.Faults{"lost": {KickLost: 1}, "refused": {KickRefused: 1}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seed := chaosSeed(t)
			const backstop = 500 * time.Millisecond
			url := chaosDB(t)
			rep := runChaosOn(t, chaos.Options{DatabaseURL: url, Events: chaosEvents(t, 300), Seed: seed, Relays: 2, SettledShare: 1,
				Timeout: 3 * time.Minute, Faults: faults, Lambda: &chaos.Lambda{Backstop: backstop}})
			l := rep.Lambda
			// Delivered by the next tick, not eventually: the slowest event took about a
			// backstop period and an idle gap.
			db, err := pgxpool.New(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var p50, max float64
			if err := db.QueryRow(t.Context(), qLatency).Scan(&p50, &max); err != nil {
				t.Fatal(err)
			}
			t.Logf("commit -> applied p50 %.0f ms, max %.0f ms (backstop %v)", p50*1000, max*1000, backstop)
			// Loose enough for -race on a busy machine (a few seconds here), tight enough to
			// catch ticks that stop claiming.
			if max > 20 {
				t.Errorf("the slowest event took %.1f s with a %v backstop", max, backstop)
			}
			if l.KickInvocations != 0 {
				t.Errorf("%d kick invocations ran, with every kick %s", l.KickInvocations, name)
			}
			if l.TicksThatClaimed == 0 {
				t.Errorf("no scheduled tick claimed an event: who delivered them? %+v", l)
			}
			switch name {
			case "lost":
				// The kickers believe their kicks went out: the Invoke API said 202.
				if rep.Faults[chaos.FaultKickLost] == 0 || l.Kicks.Sent == 0 {
					t.Errorf("lost %d, kicks %+v: no kick was lost on purpose (seed %d)", rep.Faults[chaos.FaultKickLost], l.Kicks, seed)
				}
			case "refused":
				if rep.Faults[chaos.FaultKickRefused] == 0 || l.Kicks.Failed == 0 || l.Kicks.Sent != 0 {
					t.Errorf("refused %d, kicks %+v: want every kick failed (seed %d)", rep.Faults[chaos.FaultKickRefused], l.Kicks, seed)
				}
			}
		})
	}
}

// qLatency is the commit -> first application time of the run's events, p50 and max, in
// seconds (created_at is the transaction's start, a few milliseconds before its commit).
const qLatency = `
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s), max(s) FROM (
    SELECT extract(epoch FROM min(e.applied_at) - o.created_at)::float8 AS s
    FROM outbox o JOIN demo_effects e ON e.outbox_id = o.id GROUP BY o.id, o.created_at) x`
