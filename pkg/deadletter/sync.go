package deadletter

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/v3/internal/configcheck"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
)

// Identity of an outbox message published before it moved into the destination URL
// (qstash.ParseIdentity): forwarded headers.
const (
	identityIDHeader     = "X-Outbox-Id"
	identityGenHeader    = "X-Outbox-Generation"
	upstashForwardPrefix = "Upstash-Forward-"
	nonRetryableHeader   = "Upstash-NonRetryable-Error"
)

// DLQ is QStash's dead-letter queue as Sync uses it. (*qstash.Publisher).DLQ returns one
// (*qstash.DLQ); a test may put its own in front.
type DLQ interface {
	// List returns one page of entries, oldest first, and the cursor of the next page
	// ("" after the last page).
	List(ctx context.Context, cursor string) (entries []qstash.DLQEntry, next string, err error)
	// Delete removes entries by DLQ id and returns how many existed.
	Delete(ctx context.Context, dlqIDs []string) (int, error)
}

var _ DLQ = (*qstash.DLQ)(nil)

// SyncConfig configures Sync. Zero fields take the defaults.
type SyncConfig struct {
	// DLQ is QStash's dead-letter queue ((*qstash.Publisher).DLQ). Required.
	DLQ DLQ
	// DestinationBaseURL is the webhook base the relay publishes to (PUBLIC_BASE_URL):
	// only entries whose URL is <DestinationBaseURL>/events/<topic> are this outbox's.
	// Required.
	DestinationBaseURL string
	// Name is the deployment name (OUTBOX_NAME). Default qstash.DefaultName. An entry
	// that shows a deduplication id other than <Name>-<id>[-r<generation>], or a queue
	// other than <QueuePrefix>-<n>, belongs to another deployment and is left alone.
	Name string
	// QueuePrefix names the deployment's FIFO queues. Default Name.
	QueuePrefix string
	// DeleteSynced deletes from QStash every entry of this outbox that dead_letters holds
	// once the whole DLQ has been read.
	DeleteSynced bool
	// Logger receives one line per sync. Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SyncConfig) WithDefaults() SyncConfig {
	c.Name = cmp.Or(c.Name, qstash.DefaultName)
	c.QueuePrefix = cmp.Or(c.QueuePrefix, c.Name)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Validate reports every invalid field, each a *publish.ConfigError.
func (c SyncConfig) Validate() error {
	bad := configcheck.For("dlq sync")
	if c.DLQ == nil {
		bad.Bad("DLQ", "is nil; it must be QStash's dead-letter queue ((*qstash.Publisher).DLQ)")
	}
	if configcheck.BaseURL(c.DestinationBaseURL) != nil {
		bad.Bad("DestinationBaseURL", "%q must be the webhook's absolute base URL, e.g. https://hooks.example.com", c.DestinationBaseURL)
	}
	return bad.Err()
}

// SyncResult counts what Sync did with the DLQ entries it read.
type SyncResult struct {
	// Scanned entries were read from QStash's DLQ, in Pages pages.
	Scanned int `json:"scanned"`
	Pages   int `json:"pages"`
	// Foreign entries are not this outbox's (another deployment, another sender): left alone.
	Foreign int `json:"foreign"`
	// Recorded entries became new open dead letters; Superseded ones new resolved letters
	// (their event was redriven since).
	Recorded   int `json:"recorded"`
	Superseded int `json:"superseded"`
	// Rescheduled entries failed for a transient reason (the consumer down, not the
	// event's fault): their outbox row went back to pending under a new generation, as the
	// failure callback does (Reopen), and the entry was then recorded resolved, superseded.
	// Counted in Superseded too.
	Rescheduled int `json:"rescheduled"`
	// AlreadyRecorded entries were in dead_letters before (the failure callback or an
	// earlier sync recorded them).
	AlreadyRecorded int `json:"already_recorded"`
	// Pending entries are being recorded by a concurrent writer: the next sync sees them.
	Pending int `json:"pending"`
	// Deleted entries were removed from QStash (DeleteSynced).
	Deleted int `json:"deleted"`
}

// Sync records every entry of QStash's DLQ that belongs to this outbox and is missing from
// dead_letters, as a delivery letter like the failure callback's (same error text, so both
// land in one group), and marks its outbox row dead-lettered when the entry is about the
// row's current generation. It is idempotent: an entry is recorded once per QStash message
// id however often, and however concurrently, Sync runs. With DeleteSynced it then deletes
// from QStash the entries dead_letters holds, and nothing else.
//
// An entry belongs to this outbox when its URL is <DestinationBaseURL>/events/<topic>, it
// names an outbox id (outbox_id and generation in the URL's query, or the older forwarded
// X-Outbox-Id header), and any deduplication id or queue it shows is this deployment's.
// Each page is recorded in one statement. Sync returns what it did so far with an error.
func Sync(ctx context.Context, db Querier, cfg SyncConfig) (SyncResult, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return SyncResult{}, err
	}
	var (
		res     SyncResult
		synced  []string // DLQ ids of entries dead_letters holds
		cursor  string
		started = time.Now()
	)
	m := matcher{base: strings.TrimRight(cfg.DestinationBaseURL, "/") + "/events/", name: cfg.Name, queuePrefix: cfg.QueuePrefix}
	for {
		entries, next, err := cfg.DLQ.List(ctx, cursor)
		if err != nil {
			return res, fmt.Errorf("sync qstash dlq: %w", err)
		}
		res.Pages++
		res.Scanned += len(entries)
		var page syncPage
		for _, e := range entries {
			id, ok := m.match(e)
			if !ok {
				res.Foreign++
				continue
			}
			if err := reopenTransient(ctx, db, e, id, &res); err != nil {
				return res, fmt.Errorf("sync qstash dlq: %w", err)
			}
			page.add(e, id)
		}
		if len(page.messageIDs) > 0 {
			ids, err := page.record(ctx, db, &res)
			if err != nil {
				return res, fmt.Errorf("sync qstash dlq: %w", err)
			}
			synced = append(synced, ids...)
		}
		if next == "" || len(entries) == 0 {
			break
		}
		if next == cursor {
			return res, fmt.Errorf("sync qstash dlq: the DLQ API returned cursor %q again; stopping rather than reading the same page forever", next)
		}
		cursor = next
	}
	// Deleting only after the last page: deleting while paging would shift a positional
	// cursor past entries not yet read.
	if cfg.DeleteSynced && len(synced) > 0 {
		slices.Sort(synced)
		n, err := cfg.DLQ.Delete(ctx, slices.Compact(synced))
		res.Deleted = n
		if err != nil {
			return res, fmt.Errorf("sync qstash dlq: %w", err)
		}
	}
	level := slog.LevelInfo
	if res.Recorded > 0 {
		// New dead letters are an operator's problem: warn, as the failure callback does.
		level = slog.LevelWarn
	}
	cfg.Logger.Log(ctx, level, "qstash dlq synced", slog.Int("scanned", res.Scanned), slog.Int("foreign", res.Foreign),
		slog.Int("recorded", res.Recorded), slog.Int("superseded", res.Superseded), slog.Int("already_recorded", res.AlreadyRecorded),
		slog.Int("pending", res.Pending), slog.Int("deleted", res.Deleted), slog.Int64("duration_ms", time.Since(started).Milliseconds()))
	return res, nil
}

// reopenTransient puts the outbox row of an entry that failed for a transient reason back
// to pending, as the failure callback does when its callback arrives (this entry's never
// did): a consumer outage dead-letters nothing, whichever path reports it. One statement
// per such entry; the page's record then finds the row at a newer generation and records
// the entry resolved, superseded.
func reopenTransient(ctx context.Context, db Querier, e qstash.DLQEntry, id entryIdentity, res *SyncResult) error {
	f := DeliveryFailure{QStashMessageID: e.MessageID, Status: e.ResponseStatus, ResponseHeader: e.ResponseHeader,
		Retried: e.MaxRetries, MaxRetries: e.MaxRetries, OutboxID: outbox.ID(id.outboxID), Generation: id.generation}
	if f.Permanent() || id.generation == nil || id.outboxID <= 0 {
		return nil
	}
	r, err := Reopen(ctx, db, f, ProbeSchedule{})
	if err != nil {
		return err
	}
	if r.State == ReopenDone {
		res.Rescheduled++
	}
	return nil
}

// entryIdentity is the outbox message a DLQ entry is about.
type entryIdentity struct {
	outboxID int64
	// generation is nil when the entry does not say (older messages).
	generation *int
	topic      string
}

// matcher decides which entries are this outbox's.
type matcher struct {
	base, name, queuePrefix string
}

func (m matcher) match(e qstash.DLQEntry) (entryIdentity, bool) {
	if e.MessageID == "" || e.DLQID == "" {
		return entryIdentity{}, false
	}
	dest, _, _ := strings.Cut(e.URL, "?")
	topic, ok := strings.CutPrefix(dest, m.base)
	if !ok || topic == "" || strings.Contains(topic, "/") {
		return entryIdentity{}, false
	}
	if t, err := url.PathUnescape(topic); err == nil {
		topic = t
	}
	id, ok := identity(e)
	if !ok {
		return entryIdentity{}, false
	}
	id.topic = topic
	if e.DeduplicationID != "" {
		want := m.name + "-" + strconv.FormatInt(id.outboxID, 10)
		rest, ok := strings.CutPrefix(e.DeduplicationID, want)
		if !ok || (rest != "" && !validRedriveSuffix(rest, id.generation)) {
			return entryIdentity{}, false
		}
	}
	if e.QueueName != "" {
		n, ok := strings.CutPrefix(e.QueueName, m.queuePrefix+"-")
		if _, err := strconv.ParseUint(n, 10, 32); !ok || err != nil {
			return entryIdentity{}, false
		}
	}
	return id, true
}

// validRedriveSuffix reports whether s is "-r<generation>" (matching gen when known).
func validRedriveSuffix(s string, gen *int) bool {
	n, ok := strings.CutPrefix(s, "-r")
	g, err := strconv.Atoi(n)
	return ok && err == nil && g > 0 && (gen == nil || *gen == g)
}

// identity reads the outbox identity from the URL (qstash.ParseIdentity), else, for a URL
// without one, from the forwarded headers. A malformed identity is no identity.
func identity(e qstash.DLQEntry) (entryIdentity, bool) {
	id, err := qstash.ParseIdentity(e.URL)
	if err == nil {
		return entryIdentity{outboxID: int64(id.OutboxID), generation: &id.Generation}, true
	}
	if !errors.Is(err, qstash.ErrNoIdentity) {
		return entryIdentity{}, false
	}
	header := func(name string) string {
		if v := e.Header.Get(name); v != "" {
			return strings.TrimSpace(v)
		}
		return strings.TrimSpace(e.Header.Get(upstashForwardPrefix + name))
	}
	outboxID, err := strconv.ParseInt(header(identityIDHeader), 10, 64)
	if err != nil || outboxID <= 0 {
		return entryIdentity{}, false
	}
	out := entryIdentity{outboxID: outboxID}
	if g, err := strconv.Atoi(header(identityGenHeader)); err == nil && g >= 0 {
		out.generation = &g
	}
	return out, true
}

// syncPage holds one page's entries of this outbox as the columns of qRecordSynced.
type syncPage struct {
	messageIDs, dlqIDs []string
	outboxIDs          []int64
	generations        []*int32
	topics             []string
	payloads           []*string
	errorTexts         []string
	attempts, statuses []*int32
	responseBodies     []string
	failedAt           []*time.Time
	dlqIDByMessage     map[string]string
	seen               map[string]bool
}

func (p *syncPage) add(e qstash.DLQEntry, id entryIdentity) {
	msgID := textColumn([]byte(e.MessageID), maxIDBytes)
	if p.seen[msgID] {
		return // a page repeating an entry records it once
	}
	if p.seen == nil {
		p.seen, p.dlqIDByMessage = map[string]bool{}, map[string]string{}
	}
	p.seen[msgID] = true
	dlqID := textColumn([]byte(e.DLQID), maxIDBytes)
	p.dlqIDByMessage[msgID] = e.DLQID

	// QStash's DLQ API does not report the retries made. A retryable failure reached the
	// DLQ by exhausting them all; a non-retryable answer (489) stopped early, after an
	// unknown number, recorded as NULL attempts.
	f := DeliveryFailure{Status: e.ResponseStatus, ResponseBody: e.ResponseBody, Retried: e.MaxRetries, MaxRetries: e.MaxRetries}
	attempts := int32ptr(e.MaxRetries)
	if e.ResponseStatus == 489 && strings.EqualFold(e.ResponseHeader.Get(nonRetryableHeader), "true") {
		f.Retried, attempts = 0, nil
	}
	var payload *string
	// jsonb rejects \u0000 that encoding/json accepts; such a body falls back to the row's.
	if len(e.Body) > 0 && json.Valid(e.Body) && !bytes.Contains(e.Body, []byte(`\u0000`)) {
		s := string(e.Body)
		payload = &s
	}
	var gen *int32
	if id.generation != nil {
		gen = int32ptr(*id.generation)
	}
	p.messageIDs = append(p.messageIDs, msgID)
	p.dlqIDs = append(p.dlqIDs, dlqID)
	p.outboxIDs = append(p.outboxIDs, id.outboxID)
	p.generations = append(p.generations, gen)
	p.topics = append(p.topics, textColumn([]byte(id.topic), maxIDBytes))
	p.payloads = append(p.payloads, payload)
	p.errorTexts = append(p.errorTexts, f.errorText())
	p.attempts = append(p.attempts, attempts)
	p.statuses = append(p.statuses, nonZero32(e.ResponseStatus))
	p.responseBodies = append(p.responseBodies, textColumn(e.ResponseBody, maxResponseBodyBytes))
	p.failedAt = append(p.failedAt, dlqTime(e.DLQID))
}

// record writes the page in one statement and returns the DLQ ids of its entries that
// dead_letters now holds. A deadlock with a concurrent writer of the same letters (the
// failure callback locks in another order) is retried.
func (p *syncPage) record(ctx context.Context, db Querier, res *SyncResult) ([]string, error) {
	for try := 1; ; try++ {
		rows, err := db.Query(ctx, qRecordSynced, p.messageIDs, p.dlqIDs, p.outboxIDs, p.generations, p.topics,
			p.payloads, p.errorTexts, p.attempts, p.statuses, p.responseBodies, p.failedAt)
		if err != nil {
			return nil, fmt.Errorf("record dlq entries: %w", err)
		}
		var (
			msgID                         string
			created, superseded, recorded bool
			synced                        []string
			counts                        SyncResult
		)
		for rows.Next() {
			if err := rows.Scan(&msgID, &created, &superseded, &recorded); err != nil {
				rows.Close()
				return nil, fmt.Errorf("record dlq entries: %w", err)
			}
			switch {
			case created && superseded:
				counts.Superseded++
			case created:
				counts.Recorded++
			case recorded:
				counts.AlreadyRecorded++
			default:
				counts.Pending++
			}
			if created || recorded {
				synced = append(synced, p.dlqIDByMessage[msgID])
			}
		}
		err = rows.Err()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001") && try < 3 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("record dlq entries: %w", err)
		}
		res.Recorded += counts.Recorded
		res.Superseded += counts.Superseded
		res.AlreadyRecorded += counts.AlreadyRecorded
		res.Pending += counts.Pending
		return synced, nil
	}
}

// dlqTime reads the failure time from a DLQ id (<unix ms>-<seq>, e.g. 1725323658779-0);
// nil (meaning now) when the id has another form.
func dlqTime(dlqID string) *time.Time {
	ms, _, ok := strings.Cut(dlqID, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	// Plausible unix milliseconds: 2020 to 2100.
	if !ok || err != nil || n < 1_577_836_800_000 || n > 4_102_444_800_000 {
		return nil
	}
	t := time.UnixMilli(n)
	return &t
}

func int32ptr(n int) *int32 {
	v := int32(n)
	return &v
}

func nonZero32(n int) *int32 {
	if n == 0 {
		return nil
	}
	return int32ptr(n)
}
