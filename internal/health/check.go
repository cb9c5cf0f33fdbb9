package health

import (
	"cmp"
	"fmt"
	"time"
)

// Status is the verdict of Check; its value is the exit code of outboxctl status.
type Status int

const (
	// Healthy: nothing needs attention.
	Healthy Status = 0
	// Degraded: something needs a look soon (a growing backlog, a new dead letter), but
	// events still flow.
	Degraded Status = 1
	// Unhealthy: events are not flowing or are being lost to dead letters; act now.
	Unhealthy Status = 2
)

// String returns the lower-case name outboxctl status prints ("healthy", "degraded",
// "unhealthy").
func (s Status) String() string {
	switch s {
	case Healthy:
		return "healthy"
	case Degraded:
		return "degraded"
	case Unhealthy:
		return "unhealthy"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// MarshalText renders the status as its name in JSON.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Defaults for Thresholds.
const (
	// DefaultMaxOldestPendingAge matches the template's alarm: five minutes is five missed
	// schedule ticks.
	DefaultMaxOldestPendingAge = 5 * time.Minute
	// DefaultMaxTransactionAge: no transaction in an outbox database should stay open for
	// minutes; the relay's own never span an HTTP call.
	DefaultMaxTransactionAge = 5 * time.Minute
	// DefaultMaxXminAge, in transaction ids: far below autovacuum_freeze_max_age (200M), so
	// a stuck slot or prepared transaction is seen long before wraparound protection.
	DefaultMaxXminAge = 10_000_000
)

// Thresholds tune Check. Durations: zero means the default, negative disables the check.
// Counts: the number tolerated (zero, the default, tolerates none); negative disables.
type Thresholds struct {
	// MaxOldestPendingAge: an older pending event makes the outbox unhealthy.
	MaxOldestPendingAge time.Duration
	// MaxDeadLetters: more unresolved dead letters make it degraded.
	MaxDeadLetters int64
	// MaxStuckLeases: more expired, unmarked leases make it degraded.
	MaxStuckLeases int64
	// MaxFlapping: more rows past FlappingAttempts make it degraded.
	MaxFlapping int64
	// MaxTransactionAge: an older open (or prepared) transaction makes it degraded.
	MaxTransactionAge time.Duration
	// MaxXminAge: an older xmin horizon, in transaction ids, makes it degraded.
	// Zero means DefaultMaxXminAge.
	MaxXminAge int64
}

// WithDefaults returns t with zero durations and MaxXminAge set to their defaults.
func (t Thresholds) WithDefaults() Thresholds {
	t.MaxOldestPendingAge = cmp.Or(t.MaxOldestPendingAge, DefaultMaxOldestPendingAge)
	t.MaxTransactionAge = cmp.Or(t.MaxTransactionAge, DefaultMaxTransactionAge)
	t.MaxXminAge = cmp.Or(t.MaxXminAge, DefaultMaxXminAge)
	return t
}

// Check returns the report's status and one reason per threshold crossed (empty when
// healthy). The status is the worst of the reasons.
func (r Report) Check(t Thresholds) (Status, []string) {
	t = t.WithDefaults()
	st := Healthy
	reasons := []string{}
	flag := func(s Status, format string, args ...any) {
		st = max(st, s)
		reasons = append(reasons, fmt.Sprintf(format, args...))
	}
	age := seconds(r.Queue.OldestPendingAgeSeconds)
	if t.MaxOldestPendingAge > 0 && age > t.MaxOldestPendingAge {
		flag(Unhealthy, "oldest pending event (id %d) is %s old, above %s: the relay is not keeping up or not running",
			r.Queue.OldestPendingID, age.Round(time.Second), t.MaxOldestPendingAge)
	}
	if t.MaxDeadLetters >= 0 && r.DeadLettersUnresolved > t.MaxDeadLetters {
		flag(Degraded, "%d unresolved dead letters (outboxctl dlq list)", r.DeadLettersUnresolved)
	}
	if t.MaxStuckLeases >= 0 && r.Queue.StuckLeases > t.MaxStuckLeases {
		flag(Degraded, "%d leases expired without a mark: a relay died mid-batch", r.Queue.StuckLeases)
	}
	if t.MaxFlapping >= 0 && r.Queue.Flapping > t.MaxFlapping {
		flag(Degraded, "%d pending events have failed more than %d times (max attempts %d)", r.Queue.Flapping, FlappingAttempts, r.Queue.MaxAttempts)
	}
	for _, c := range r.Circuits {
		// The relay rides it out: nothing is lost or dead-lettered, events wait in the
		// outbox. Degraded, not unhealthy: the oldest pending age says when it hurts.
		flag(Degraded, "the consumer of topic %s is down: circuit open for %s after %d failed deliveries (%d failed probes); "+
			"%d events held in the outbox, none dead-lettered; the relay probes it and resumes on the first delivery (docs/operations.md, consumer outage)",
			c.Topic, seconds(c.OpenForSeconds).Round(time.Second), c.Failures, c.ProbeFailures, r.HeldEvents)
	}
	h := r.Horizon
	if t.MaxTransactionAge > 0 {
		if a := seconds(h.OldestTransactionAgeSeconds); a > t.MaxTransactionAge {
			flag(Degraded, "a transaction has been open for %s (pid %d, %s, application %q), above %s: it holds back VACUUM",
				a.Round(time.Second), h.OldestTransactionPID, h.OldestTransactionState, h.OldestTransactionApp, t.MaxTransactionAge)
		}
		if a := seconds(h.OldestPreparedAgeSeconds); h.PreparedTransactions > 0 && a > t.MaxTransactionAge {
			flag(Degraded, "a prepared transaction has been pending for %s (pg_prepared_xacts), above %s", a.Round(time.Second), t.MaxTransactionAge)
		}
	}
	if t.MaxXminAge > 0 && h.XminHorizonAge > t.MaxXminAge {
		flag(Degraded, "the xmin horizon is %d transactions old (backend %d, replication slot %d, prepared %d), above %d",
			h.XminHorizonAge, h.BackendXminAge, h.SlotXminAge, h.PreparedXminAge, t.MaxXminAge)
	}
	return st, reasons
}
