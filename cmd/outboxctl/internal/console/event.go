package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// eventRow is one outbox row as the event page shows it.
type eventRow struct {
	ID             int64
	Topic          string
	PartitionKey   string
	Payload        string
	Headers        map[string]string
	CreatedAt      time.Time
	AvailableAt    time.Time
	DispatchedAt   *time.Time
	DeadLetteredAt *time.Time
	Attempts       int
	LockedUntil    *time.Time
	LeaseToken     string
	LastError      string
	Generation     int
}

// State names the row's lifecycle state.
func (e eventRow) State(now time.Time) string {
	switch {
	case e.DispatchedAt != nil:
		return "dispatched"
	case e.DeadLetteredAt != nil:
		return "dead-lettered"
	case e.LeaseToken != "" && e.LockedUntil != nil && e.LockedUntil.After(now):
		return "leased (being published)"
	case e.LeaseToken != "":
		return "pending (lease expired)"
	case e.AvailableAt.After(now):
		return "pending (backing off or delayed)"
	default:
		return "pending"
	}
}

// dedupeRecord is one processed_messages row of the event.
type dedupeRecord struct {
	Consumer    string
	PayloadHash string
	ProcessedAt time.Time
}

type eventData struct {
	Query      string
	ID         int64
	Found      bool
	Row        eventRow
	State      string
	HeaderKeys []string
	DedupID    string
	TraceID    string
	Dedupe     []dedupeRecord
	Letters    []deadletter.Letter
	Problem    string
}

// event looks up one outbox id: the row, its dedupe records and its dead letters. The
// records and letters are shown even when retention has deleted the row.
func (s *Server) event(w http.ResponseWriter, r *http.Request) {
	raw := strings.TrimSpace(r.URL.Query().Get("id"))
	d := eventData{Query: raw}
	if raw == "" {
		s.render(w, r, http.StatusOK, "event", "Event", d)
		return
	}
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 {
		d.Problem = fmt.Sprintf("%q is not an outbox id (a positive number).", raw)
		s.render(w, r, http.StatusBadRequest, "event", "Event", d)
		return
	}
	d.ID = id
	ctx, cancel := s.queryContext(r)
	defer cancel()

	var headers string
	e := &d.Row
	err = s.cfg.DB.QueryRow(ctx, qEvent, pgx.QueryExecModeExec, id).Scan(&e.ID, &e.Topic, &e.PartitionKey, &e.Payload, &headers,
		&e.CreatedAt, &e.AvailableAt, &e.DispatchedAt, &e.DeadLetteredAt, &e.Attempts, &e.LockedUntil, &e.LeaseToken, &e.LastError, &e.Generation)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		s.fail(w, r, fmt.Errorf("read outbox row %d: %w", id, err))
		return
	default:
		d.Found = true
		_ = json.Unmarshal([]byte(headers), &e.Headers) // written by Enqueue as an object of strings
		e.Payload = prettyJSON([]byte(e.Payload))
		d.State = e.State(s.cfg.Now())
		d.HeaderKeys = sortedKeys(e.Headers)
		d.TraceID = traceID(e.Headers)
		d.DedupID = outbox.Message{ID: outbox.ID(id), Generation: e.Generation}.DeduplicationID()
	}

	rows, err := s.cfg.DB.Query(ctx, qDedupe, pgx.QueryExecModeExec, strconv.FormatInt(id, 10))
	if err != nil {
		s.fail(w, r, fmt.Errorf("read dedupe records of %d: %w", id, err))
		return
	}
	d.Dedupe, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (dedupeRecord, error) {
		var rec dedupeRecord
		return rec, row.Scan(&rec.Consumer, &rec.PayloadHash, &rec.ProcessedAt)
	})
	if err != nil {
		s.fail(w, r, fmt.Errorf("read dedupe records of %d: %w", id, err))
		return
	}

	ids, err := s.letterIDs(ctx, qEventLetterIDs, []any{id})
	if err != nil {
		s.fail(w, r, fmt.Errorf("read dead letters of %d: %w", id, err))
		return
	}
	if len(ids) > 0 {
		if d.Letters, err = deadletter.List(ctx, s.cfg.DB, deadletter.Filter{IDs: ids, IncludeResolved: true, Limit: len(ids)}); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	status := http.StatusOK
	if !d.Found && len(d.Dedupe) == 0 && len(d.Letters) == 0 {
		status = http.StatusNotFound
	}
	s.render(w, r, status, "event", fmt.Sprintf("Event %d", id), d)
}

// traceparentRE is a W3C traceparent: version-traceid-parentid-flags, lowercase hex.
var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$`)

// traceID returns the trace id of a traceparent header (any case of the name), or "".
// An all-zero trace id is invalid by the spec and ignored.
func traceID(h map[string]string) string {
	for k, v := range h {
		if !strings.EqualFold(k, "traceparent") {
			continue
		}
		m := traceparentRE.FindStringSubmatch(strings.TrimSpace(v))
		if m == nil || m[1] == strings.Repeat("0", 32) {
			return ""
		}
		return m[1]
	}
	return ""
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// prettyJSON indents JSON for reading (numbers and key order kept as stored); anything
// else is returned as is.
func prettyJSON(b []byte) string {
	var buf bytes.Buffer
	if json.Indent(&buf, b, "", "  ") != nil {
		return string(b)
	}
	return buf.String()
}
