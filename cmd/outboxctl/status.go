package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/humanize"

	"github.com/outbox-relay/outbox-relay/v3/internal/health"
)

const statusUsage = `usage: outboxctl status [--json] [--max-oldest-age 5m] [--max-dead-letters 0] [--max-stuck-leases 0]
                        [--max-flapping 0] [--max-transaction-age 5m] [--max-xmin-age 10000000]

Exit status: 0 healthy; 1 degraded or unhealthy (unhealthy: the oldest pending event is
older than --max-oldest-age; the output and --json "status" say which, and why); 3 the
report could not be read (the database unreachable). Counts are how many are tolerated; a
negative value or duration turns that check off.

It also reports the attempts QStash made (and bills) per delivered event over the last hour
and day, from each delivery's Upstash-Retried and the dead letters' retries (qstash_attempts
in --json; informational, no threshold).`

// statusOutput is the --json document: the verdict, its reasons, and the whole report.
type statusOutput struct {
	Status health.Status `json:"status"`
	// ExitCode is the process's: 0 healthy, 1 degraded or unhealthy.
	ExitCode int      `json:"exit_code"`
	Reasons  []string `json:"reasons"`
	health.Report
	// QStashAttempts is null when it could not be read (the report still is).
	QStashAttempts *health.AttemptsReport `json:"qstash_attempts"`
}

func runStatus(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "status").withUsage(statusUsage)
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	var th health.Thresholds
	fs.DurationVar(&th.MaxOldestPendingAge, "max-oldest-age", health.DefaultMaxOldestPendingAge, "unhealthy when the oldest pending event is older")
	fs.Int64Var(&th.MaxDeadLetters, "max-dead-letters", 0, "degraded above this many unresolved dead letters")
	fs.Int64Var(&th.MaxStuckLeases, "max-stuck-leases", 0, "degraded above this many expired, unmarked leases")
	fs.Int64Var(&th.MaxFlapping, "max-flapping", 0, fmt.Sprintf("degraded above this many pending events with more than %d attempts", health.FlappingAttempts))
	fs.DurationVar(&th.MaxTransactionAge, "max-transaction-age", health.DefaultMaxTransactionAge, "degraded when a transaction has been open longer")
	fs.Int64Var(&th.MaxXminAge, "max-xmin-age", health.DefaultMaxXminAge, "degraded when the xmin horizon is older, in transaction ids")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	pool, err := openPool(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	report, err := health.Collect(ctx, pool)
	if err != nil {
		return err
	}
	st, reasons := report.Check(th)
	code := exitOK
	if st != health.Healthy {
		code = exitNegative
	}
	// Attempts are informational: a failure to read them (a schema before migration 0011)
	// is shown, not allowed to hide the verdict.
	var attempts *health.AttemptsReport
	a, attErr := health.CollectAttempts(ctx, pool)
	if attErr == nil {
		attempts = &a
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		if err := enc.Encode(statusOutput{Status: st, ExitCode: code, Reasons: reasons, Report: report, QStashAttempts: attempts}); err != nil {
			return fmt.Errorf("write status: %w", err)
		}
	} else {
		printStatus(e.stdout, report, st)
		printAttempts(e.stdout, attempts, attErr)
		printReasons(e.stdout, reasons)
	}
	if st == health.Healthy {
		return nil
	}
	return negativeErr(errors.New(st.String() + ": " + strings.Join(reasons, "; ")))
}

func printStatus(w io.Writer, r health.Report, st health.Status) {
	q, h := r.Queue, r.Horizon
	fmt.Fprintf(w, "outbox is %s\n\n", strings.ToUpper(st.String()))
	fmt.Fprintf(w, "  pending         %d (ready %d, leased %d, stuck leases %d, flapping %d)\n",
		q.Pending, q.Ready, q.Leased, q.StuckLeases, q.Flapping)
	if q.Pending > 0 {
		fmt.Fprintf(w, "  oldest pending  %s (id %d)\n", humanize.Seconds(q.OldestPendingAgeSeconds), q.OldestPendingID)
	} else {
		fmt.Fprintf(w, "  oldest pending  -\n")
	}
	for _, c := range r.Circuits {
		probe := fmt.Sprintf("next probe in %s", humanize.Seconds(c.NextProbeInSeconds))
		if c.ProbeID != 0 {
			probe = fmt.Sprintf("probe %d in flight", c.ProbeID)
		}
		fmt.Fprintf(w, "  consumer down   %s: circuit open %s, %d failures, %d failed probes, %s; %d events held\n",
			c.Topic, humanize.Seconds(c.OpenForSeconds), c.Failures, c.ProbeFailures, probe, r.HeldEvents)
	}
	fmt.Fprintf(w, "  dispatched/min  %s  %d in the last hour, %d in the last minute\n",
		sparkline(r.DispatchedPerMinute), r.DispatchedLastHour, last(r.DispatchedPerMinute))
	if r.DeadLettersUnresolved == 0 {
		fmt.Fprintf(w, "  dead letters    none unresolved\n")
	} else {
		var parts []string
		for _, g := range r.DeadLetters {
			topic := g.Topic
			if topic == "" {
				topic = "(no topic)"
			}
			parts = append(parts, fmt.Sprintf("%s %s: %d", g.Source, topic, g.Count))
		}
		fmt.Fprintf(w, "  dead letters    %d unresolved (%s)\n", r.DeadLettersUnresolved, strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "  outbox table    %s (%s table + %s indexes), ~%d rows, %d dead tuples, last autovacuum %s\n",
		humanize.Bytes(r.Outbox.TotalBytes), humanize.Bytes(r.Outbox.TableBytes), humanize.Bytes(r.Outbox.IndexBytes),
		r.Outbox.RowsEstimate, r.Outbox.DeadTuples, when(r.Outbox.LastAutovacuum))
	fmt.Fprintf(w, "  processed msgs  ~%d rows (estimate), %s\n", r.ProcessedMessages.RowsEstimate, humanize.Bytes(r.ProcessedMessages.TotalBytes))
	if h.OpenTransactions > 0 {
		fmt.Fprintf(w, "  oldest xact     %s (pid %d, %s, application %q); %d open\n",
			humanize.Seconds(h.OldestTransactionAgeSeconds), h.OldestTransactionPID, h.OldestTransactionState, h.OldestTransactionApp, h.OpenTransactions)
	} else {
		fmt.Fprintf(w, "  oldest xact     none open\n")
	}
	fmt.Fprintf(w, "  xmin horizon    %d xids (backends %d, replication slots %d, prepared %d)\n",
		h.XminHorizonAge, h.BackendXminAge, h.SlotXminAge, h.PreparedXminAge)
}

func printReasons(w io.Writer, reasons []string) {
	if len(reasons) > 0 {
		fmt.Fprintln(w, "\nreasons:")
		for _, r := range reasons {
			fmt.Fprintf(w, "  - %s\n", r)
		}
	}
}

// printAttempts prints what QStash's delivery attempts cost over the last hour and day.
func printAttempts(w io.Writer, r *health.AttemptsReport, err error) {
	if r == nil {
		fmt.Fprintf(w, "\n  qstash attempts unavailable: %v\n", err)
		return
	}
	fmt.Fprintln(w, "\nqstash attempts (billed; from Upstash-Retried and the dead letters):")
	for _, p := range []struct {
		name string
		a    health.Attempts
	}{{"last hour", r.LastHour}, {"last day", r.LastDay}} {
		a := p.a
		per := "-"
		if a.Delivered > 0 {
			per = fmt.Sprintf("%.2f", a.PerDelivered)
		}
		fmt.Fprintf(w, "  %-9s  %s per delivered event: %d attempts, %d for %d delivered, %d for %d given up",
			p.name, per, a.Total, a.DeliveryAttempts, a.Delivered, a.DeadLetterAttempts, a.DeadLettered)
		if a.UnknownAttempts > 0 {
			fmt.Fprintf(w, " (%d delivered without a retry count, counted once)", a.UnknownAttempts)
		}
		fmt.Fprintln(w)
	}
}

// sparkline draws one character per minute, scaled to the busiest minute; '·' is a minute
// with no dispatch at all, so "idle" and "slow" look different.
func sparkline(counts []int64) string {
	const bars = "▁▂▃▄▅▆▇█"
	levels := []rune(bars)
	var peak int64
	for _, n := range counts {
		peak = max(peak, n)
	}
	var b strings.Builder
	for _, n := range counts {
		if n == 0 {
			b.WriteRune('·')
			continue
		}
		i := int((n*int64(len(levels)) - 1) / peak)
		b.WriteRune(levels[min(i, len(levels)-1)])
	}
	return b.String()
}

func last(xs []int64) int64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)-1]
}

func when(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}
