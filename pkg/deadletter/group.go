package deadletter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Group is the dead letters of one failure cause: one topic, source and status code, and
// one error pattern (the error with ids, numbers, hex, UUIDs and timestamps replaced by
// placeholders). The database computes every letter's fingerprint (migration 0010), so
// letters from every writer, old ones included, are grouped alike.
type Group struct {
	// Fingerprint names the group: 16 lower-case hex digits. Filter.Fingerprint selects it.
	Fingerprint string `json:"fingerprint"`
	Topic       string `json:"topic,omitempty"`
	Source      string `json:"source"`
	// StatusCode is the letters' HTTP status, 0 when none.
	StatusCode int `json:"status_code,omitempty"`
	// ErrorPattern is what the letters' errors have in common, e.g.
	// "qstash delivery failed: HTTP <n> after <n> of <n> retries".
	ErrorPattern string `json:"error_pattern"`
	// Count is how many letters matched; Open how many of them are unresolved (equal to
	// Count unless the filter included resolved letters).
	Count int64 `json:"count"`
	Open  int64 `json:"open"`
	// FirstSeen and LastSeen are the oldest and newest matching letter's created_at.
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// SampleID and SampleError are the newest matching letter and its error as written.
	SampleID    int64  `json:"sample_id"`
	SampleError string `json:"sample_error"`
}

// fingerprintLen is the length of a fingerprint in hex digits.
const fingerprintLen = 16

// ErrBadFingerprint is wrapped by ValidFingerprint's error.
var ErrBadFingerprint = errors.New("not a dead letter fingerprint")

// ValidFingerprint returns nil for 16 lower-case hex digits (as Group.Fingerprint and
// Letter.Fingerprint show them), else an error wrapping ErrBadFingerprint.
func ValidFingerprint(fp string) error {
	if len(fp) != fingerprintLen {
		return fmt.Errorf("%w: %q is not %d hex digits", ErrBadFingerprint, fp, fingerprintLen)
	}
	for i := 0; i < len(fp); i++ {
		if c := fp[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("%w: %q has %q, want only 0-9 and a-f", ErrBadFingerprint, fp, c)
		}
	}
	return nil
}

// Groups returns the failure groups of the letters matching f, the largest first (then the
// most recently seen), at most f.Limit (default DefaultListLimit). Without IncludeResolved
// only open letters are grouped. One statement, however many letters match.
func Groups(ctx context.Context, db Querier, f Filter) ([]Group, error) {
	return listLimited(ctx, db, f, qGroups, "group dead letters", scanGroup)
}

// scanGroup reads one row of qGroups.
func scanGroup(row pgx.CollectableRow) (Group, error) {
	var g Group
	var status *int32
	err := row.Scan(&g.Fingerprint, &g.Topic, &g.Source, &status, &g.ErrorPattern, &g.Count, &g.Open,
		&g.FirstSeen, &g.LastSeen, &g.SampleID, &g.SampleError)
	if status != nil {
		g.StatusCode = int(*status)
	}
	return g, err
}

// GetGroup returns the group of fingerprint fp over the letters matching f (f.Fingerprint
// is set to fp), or an error wrapping ErrNotFound when no such letter matches.
func GetGroup(ctx context.Context, db Querier, fp string, f Filter) (Group, error) {
	if err := ValidFingerprint(fp); err != nil {
		return Group{}, fmt.Errorf("get dead letter group: %w", err)
	}
	f.Fingerprint, f.Limit = fp, 1
	groups, err := Groups(ctx, db, f)
	if err != nil {
		return Group{}, err
	}
	if len(groups) == 0 {
		return Group{}, fmt.Errorf("get dead letter group %s: %w", fp, ErrNotFound)
	}
	return groups[0], nil
}
