package chaos

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash/qstashtest"
)

// Day-two event kinds, as reported in Report.Faults (each injected once when configured).
const (
	// FaultMigration: the pending migrations are applied while producers and relays run.
	FaultMigration = "migration_under_load"
	// FaultPasswordRotation: the database password changes while sessions opened with the
	// old one stay open (what RDS rotation does); the secret is updated with it.
	FaultPasswordRotation = "password_rotated_sessions_open"
	// FaultQStashOutage: the QStash API fails every request (503, then connection resets)
	// for DayTwo.Outage, longer than the relays' retry budget would last if a failed call
	// spent attempts.
	FaultQStashOutage = "qstash_outage"
)

// DayTwo are the events of a deployment's ordinary life, each injected once while the
// faults are on: a migration at a fifth of the events settled, the password rotation at a
// third, the outage from two fifths. The checker's invariants must hold through all of
// them, with no healthy event dead-lettered.
type DayTwo struct {
	// Migrate applies the pending migrations (the run starts on a schema some versions
	// behind). Nil: no migration.
	Migrate func(ctx context.Context) error
	// RotatePassword changes the database password and the secret ReadDatabaseURL returns,
	// leaving open sessions alone. Nil: no rotation.
	RotatePassword func(ctx context.Context) error
	// ReadDatabaseURL is the secret: every pool of the run re-reads its credentials here
	// when the server refuses the password (awsenv.Credentials), as the functions do.
	// Required with RotatePassword.
	ReadDatabaseURL func(ctx context.Context) (string, error)
	// Outage is how long the QStash API fails. Zero: no outage.
	Outage time.Duration
}

func (d DayTwo) validate() []error {
	var errs []error
	if d.RotatePassword != nil && d.ReadDatabaseURL == nil {
		errs = append(errs, fmt.Errorf("chaos options DayTwo.ReadDatabaseURL: required with RotatePassword"))
	}
	if d.Outage < 0 {
		errs = append(errs, fmt.Errorf("chaos options DayTwo.Outage: %v is negative", d.Outage))
	}
	return errs
}

// dayTwo injects the DayTwo events as the run's settled share crosses their points.
type dayTwo struct {
	h       *harness
	started [3]bool
	running atomic.Int32
	wg      sync.WaitGroup
	mu      sync.Mutex
	errs    []error
}

// step is called with the settled share on every progress poll while the faults are on.
func (d *dayTwo) step(ctx context.Context, share float64) {
	o := d.h.opts.DayTwo
	steps := []struct {
		at  float64
		on  bool
		run func(context.Context) error
	}{
		{0.2, o.Migrate != nil, d.migrate},
		{1.0 / 3, o.RotatePassword != nil, d.rotate},
		{0.4, o.Outage > 0, d.outage},
	}
	for i, s := range steps {
		if !s.on || d.started[i] || share < s.at {
			continue
		}
		d.started[i] = true
		d.running.Add(1)
		d.wg.Go(func() {
			defer d.running.Add(-1)
			if err := s.run(ctx); err != nil {
				d.mu.Lock()
				d.errs = append(d.errs, err)
				d.mu.Unlock()
			}
		})
	}
}

// busy reports an event still in progress: the faults stay on until it ends.
func (d *dayTwo) busy() bool { return d.running.Load() > 0 }

// kinds are the Report.Faults kinds of the configured events.
func (o DayTwo) kinds() []string {
	var k []string
	if o.Migrate != nil {
		k = append(k, FaultMigration)
	}
	if o.RotatePassword != nil {
		k = append(k, FaultPasswordRotation)
	}
	if o.Outage > 0 {
		k = append(k, FaultQStashOutage)
	}
	return k
}

// wait returns once every started event has ended, with their errors.
func (d *dayTwo) wait() []error {
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.errs
}

func (d *dayTwo) migrate(ctx context.Context) error {
	d.h.in.add(FaultMigration, 1)
	if err := d.h.opts.DayTwo.Migrate(ctx); err != nil {
		return fmt.Errorf("day two: migrate under load: %w", err)
	}
	return nil
}

func (d *dayTwo) rotate(ctx context.Context) error {
	d.h.in.add(FaultPasswordRotation, 1)
	if err := d.h.opts.DayTwo.RotatePassword(ctx); err != nil {
		return fmt.Errorf("day two: rotate the database password: %w", err)
	}
	return nil
}

// outage fails the QStash API for DayTwo.Outage: its first half answers 503, its second
// half resets connections. The server's other faults stay as they were.
func (d *dayTwo) outage(ctx context.Context) error {
	d.h.in.add(FaultQStashOutage, 1)
	half := d.h.opts.DayTwo.Outage / 2
	for _, mode := range []qstashtest.Outage{qstashtest.Outage503, qstashtest.OutageReset} {
		f := d.h.qs.Faults()
		f.Outage = mode
		d.h.qs.SetFaults(f)
		select {
		case <-time.After(half):
		case <-ctx.Done():
		}
	}
	f := d.h.qs.Faults()
	f.Outage = qstashtest.OutageNone
	d.h.qs.SetFaults(f)
	return nil
}

// credentialedPool opens a pool through awsenv.NewPool with the run's secret reader, as
// the functions open theirs, so a rotated password is re-read on the first refusal.
func (h *harness) credentialedPool(ctx context.Context, role string, maxConns int32) (*pgxpool.Pool, error) {
	u, err := url.Parse(h.opts.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse chaos database url: %w", err)
	}
	q := u.Query()
	q.Set("application_name", h.appName(role))
	u.RawQuery = q.Encode()
	p, err := awsenv.NewPool(ctx, u.String(), awsenv.PoolConfig{MaxConns: maxConns,
		Credentials: awsenv.NewCredentials(h.opts.DayTwo.ReadDatabaseURL)})
	if err != nil {
		return nil, fmt.Errorf("open chaos %s pool: %w", role, err)
	}
	return p, nil
}
