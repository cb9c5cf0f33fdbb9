package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres"
)

// letterFilter is the dead-letter filter of the list pages and of a redrive by filter.
type letterFilter struct {
	Topic  string
	Key    string
	Source string
	// Group is a failure group's fingerprint (deadletter.ValidFingerprint), "" for any.
	Group string
	// Since (inclusive) and Until (exclusive) bound created_at; zero is unbounded.
	Since, Until time.Time
	// SinceText and UntilText are the values as typed, to refill the form.
	SinceText, UntilText string
	// IncludeResolved lists resolved letters too (a redrive only ever takes open ones).
	IncludeResolved bool
}

// parseFilter reads a filter from query or form values; problems name each bad field.
func parseFilter(v url.Values, now time.Time) (letterFilter, []string) {
	f := letterFilter{
		Topic:           strings.TrimSpace(v.Get("topic")),
		Key:             strings.TrimSpace(v.Get("key")),
		Source:          strings.TrimSpace(v.Get("source")),
		Group:           strings.TrimSpace(v.Get("group")),
		SinceText:       strings.TrimSpace(v.Get("since")),
		UntilText:       strings.TrimSpace(v.Get("until")),
		IncludeResolved: v.Get("resolved") == "1",
	}
	var problems []string
	var err error
	if f.Group != "" {
		if err := deadletter.ValidFingerprint(f.Group); err != nil {
			problems = append(problems, "group: "+err.Error()+" (a fingerprint from the groups list)")
		}
	}
	if f.Since, err = parseWhen(f.SinceText, now); err != nil {
		problems = append(problems, "since: "+err.Error())
	}
	if f.Until, err = parseWhen(f.UntilText, now); err != nil {
		problems = append(problems, "until: "+err.Error())
	}
	return f, problems
}

// parseWhen accepts RFC 3339, the browser's datetime-local value (read as UTC), a date, or
// a duration before now (90m, 24h); "" is the zero time.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", time.DateOnly} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is not a time (2024-05-01T12:00:00Z, 2024-05-01) or a duration ago (90m, 24h)", s)
}

// empty reports whether no criterion is set.
func (f letterFilter) empty() bool {
	return f.Topic == "" && f.Key == "" && f.Source == "" && f.Group == "" && f.Since.IsZero() && f.Until.IsZero()
}

// values renders the filter as query values, for links and hidden form fields.
func (f letterFilter) values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("topic", f.Topic)
	set("key", f.Key)
	set("source", f.Source)
	set("group", f.Group)
	set("since", f.SinceText)
	set("until", f.UntilText)
	if f.IncludeResolved {
		v.Set("resolved", "1")
	}
	return v
}

// args are letterWhere's parameters $1..$8 for the cursor c.
func (f letterFilter) args(c cursor) []any {
	var at *time.Time
	var id *int64
	if !c.At.IsZero() {
		at, id = &c.At, &c.ID
	}
	null := postgres.NullIfZero[string]
	return []any{null(f.Topic), null(f.Key), null(f.Source), postgres.NullIfZero(f.Since), postgres.NullIfZero(f.Until),
		null(f.Group), at, id}
}

// deadletterFilter maps f to deadletter.Filter for Plan and Redrive, the code outboxctl
// dlq redrive runs. It returns false when f selects by something deadletter.Filter cannot
// express (the source): such a filter is expanded to letter ids first.
func (f letterFilter) deadletterFilter() (deadletter.Filter, bool) {
	df := deadletter.Filter{Topic: f.Topic, PartitionKey: f.Key, Fingerprint: f.Group, Since: f.Since, Until: f.Until}
	df.All = f.empty()
	return df, f.Source == ""
}

// cursor is a keyset position: the (created_at, id) of the last letter shown.
type cursor struct {
	At time.Time
	ID int64
}

func (c cursor) String() string {
	if c.At.IsZero() {
		return ""
	}
	return strconv.FormatInt(c.At.UnixMicro(), 10) + "." + strconv.FormatInt(c.ID, 10)
}

func parseCursor(s string) (cursor, error) {
	if s == "" {
		return cursor{}, nil
	}
	us, id, ok := strings.Cut(s, ".")
	micros, err1 := strconv.ParseInt(us, 10, 64)
	n, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil || n <= 0 {
		return cursor{}, fmt.Errorf("after=%q is not a page cursor", s)
	}
	return cursor{At: time.UnixMicro(micros), ID: n}, nil
}

type lettersData struct {
	Filter letterFilter
	Bar    filterBar
	// Group is the filter's failure group (nil without one, or when no letter matches).
	Group    *groupRow
	Letters  []deadletter.Letter
	Problems []string
	// Next and First link the next (older) page and the first page; "" when there is
	// none. template.URL: the query is already encoded (url.Values.Encode).
	Next  template.URL
	First template.URL
	Limit int
}

// letters lists dead letters, newest first, a keyset page at a time.
func (s *Server) letters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f, problems := parseFilter(q, s.cfg.Now())
	cur, err := parseCursor(q.Get("after"))
	if err != nil {
		problems = append(problems, err.Error())
	}
	limit := s.cfg.PageSize
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > MaxPageSize {
			problems = append(problems, fmt.Sprintf("limit must be a number in 1..%d", MaxPageSize))
		} else {
			limit = n
		}
	}
	data := lettersData{Filter: f, Bar: newFilterBar(f, "letters"), Problems: problems, Limit: limit}
	if len(problems) > 0 {
		s.render(w, r, http.StatusBadRequest, "letters", "Dead letters", data)
		return
	}
	ctx, cancel := s.queryContext(r)
	defer cancel()
	letters, more, err := s.letterPage(ctx, f, cur, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data.Letters = letters
	if f.Group != "" {
		if data.Group, err = s.groupOf(ctx, f, f.Group); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	if more {
		v := f.values()
		last := letters[len(letters)-1]
		v.Set("after", cursor{At: last.CreatedAt, ID: last.ID}.String())
		if limit != s.cfg.PageSize {
			v.Set("limit", strconv.Itoa(limit))
		}
		data.Next = template.URL("/dead-letters?" + v.Encode()) //nolint:gosec // encoded by url.Values
	}
	if !cur.At.IsZero() {
		data.First = template.URL("/dead-letters?" + f.values().Encode()) //nolint:gosec // encoded by url.Values
	}
	s.render(w, r, http.StatusOK, "letters", "Dead letters", data)
}

// letterPage returns up to limit letters after cur, and whether more follow. The keyset
// query picks the ids on the indexes; deadletter.List reads the rows (the code behind
// outboxctl dlq list), in the same order.
func (s *Server) letterPage(ctx context.Context, f letterFilter, cur cursor, limit int) ([]deadletter.Letter, bool, error) {
	q := qOpenLetterIDs
	if f.IncludeResolved {
		q = qAllLetterIDs
	}
	ids, err := s.letterIDs(ctx, q, append(f.args(cur), limit+1))
	if err != nil {
		return nil, false, fmt.Errorf("list dead letters: %w", err)
	}
	more := len(ids) > limit
	if more {
		ids = ids[:limit]
	}
	if len(ids) == 0 {
		return nil, false, nil
	}
	letters, err := deadletter.List(ctx, s.cfg.DB, deadletter.Filter{IDs: ids, IncludeResolved: true, Limit: len(ids)})
	if err != nil {
		return nil, false, err
	}
	return letters, more, nil
}

func (s *Server) letterIDs(ctx context.Context, q string, args []any) ([]int64, error) {
	rows, err := s.cfg.DB.Query(ctx, q, append([]any{pgx.QueryExecModeExec}, args...)...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

type letterData struct {
	Letter       deadletter.Letter
	PayloadText  string
	HeaderKeys   []string
	DedupID      string
	TraceID      string
	AllowRedrive bool
	// Group is the letter's failure group over the open letters; nil when none is open.
	Group *groupRow
}

// letter shows one dead letter with everything dlq show prints.
func (s *Server) letter(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		s.problem(w, r, http.StatusBadRequest, "A dead letter id is a positive number.")
		return
	}
	ctx, cancel := s.queryContext(r)
	defer cancel()
	l, err := deadletter.Get(ctx, s.cfg.DB, id)
	if errors.Is(err, deadletter.ErrNotFound) {
		s.problem(w, r, http.StatusNotFound, fmt.Sprintf("Dead letter %d does not exist.", id))
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	g, err := s.groupOf(ctx, letterFilter{}, l.Fingerprint)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "letter", fmt.Sprintf("Dead letter %d", id), letterData{
		Letter: l, PayloadText: prettyJSON(l.Payload), HeaderKeys: sortedKeys(l.Headers),
		TraceID: traceID(l.Headers), AllowRedrive: s.cfg.AllowRedrive, Group: g,
	})
}

type redriveData struct {
	Scope   string     // "ids" or "filter"
	Hidden  url.Values // the request's selection, for the confirm form
	Result  deadletter.RedriveResult
	DryRun  bool
	Matched int  // letters the selection matched (open or not)
	Empty   bool // nothing matched at all
	// Group is the failure group a filter names, as it stands before a redrive.
	Group *groupRow
}

// redrive previews (dry run, the default) or performs a redrive of letters named by id or
// of a whole filter, through deadletter.Plan and deadletter.Redrive: the same transaction
// and generation bump as outboxctl dlq redrive.
func (s *Server) redrive(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		s.problem(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	form := r.PostForm
	d := redriveData{Scope: form.Get("scope"), DryRun: form.Get("confirm") != "1", Hidden: url.Values{}}
	ctx, cancel := s.queryContext(r)
	defer cancel()

	var df deadletter.Filter
	switch d.Scope {
	case "ids":
		var ids []int64
		for _, v := range form["id"] {
			id, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || id <= 0 {
				s.problem(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not a dead letter id.", v))
				return
			}
			ids = append(ids, id)
			d.Hidden.Add("id", strconv.FormatInt(id, 10))
		}
		if len(ids) == 0 {
			s.problem(w, r, http.StatusBadRequest, "Select at least one dead letter to redrive.")
			return
		}
		df = deadletter.Filter{IDs: ids}
	case "filter":
		f, problems := parseFilter(form, s.cfg.Now())
		if len(problems) > 0 {
			s.problem(w, r, http.StatusBadRequest, strings.Join(problems, "; "))
			return
		}
		f.IncludeResolved = false
		d.Hidden = f.values()
		if f.Group != "" && d.DryRun {
			var err error
			if d.Group, err = s.groupOf(ctx, f, f.Group); err != nil {
				s.fail(w, r, err)
				return
			}
		}
		var direct bool
		if df, direct = f.deadletterFilter(); !direct {
			ids, err := s.letterIDs(ctx, qOpenLetterIDsAll, append(f.args(cursor{}), s.cfg.RedriveCap+1))
			if err != nil {
				s.fail(w, r, fmt.Errorf("select dead letters to redrive: %w", err))
				return
			}
			if len(ids) > s.cfg.RedriveCap {
				s.problem(w, r, http.StatusBadRequest, fmt.Sprintf(
					"More than %d open letters match; narrow the filter (topic, key, time) or use outboxctl dlq redrive.", s.cfg.RedriveCap))
				return
			}
			if len(ids) == 0 {
				d.Empty = true
				s.render(w, r, http.StatusOK, "redrive", "Redrive", d)
				return
			}
			df = deadletter.Filter{IDs: ids}
		}
	default:
		s.problem(w, r, http.StatusBadRequest, "scope must be ids or filter.")
		return
	}
	d.Hidden.Set("scope", d.Scope)

	var err error
	if d.DryRun {
		d.Result, err = deadletter.Plan(ctx, s.cfg.DB, df)
	} else {
		d.Result, err = deadletter.Redrive(ctx, s.cfg.DB, df, s.cfg.Tracer)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res := d.Result
	d.Matched = len(res.Redriven) + len(res.AlreadyPending) + len(res.AlreadyResolved) + len(res.Superseded) + len(res.OutboxMissing)
	d.Empty = d.Matched == 0 && len(res.NotFound) == 0
	if !d.DryRun {
		s.charts.reset() // redriven events count as pending since their creation
		s.cfg.Logger.Info("console redrive", "scope", d.Scope, "group", form.Get("group"), "redriven", len(res.Redriven),
			"already_pending", len(res.AlreadyPending), "already_resolved", len(res.AlreadyResolved),
			"superseded", len(res.Superseded), "outbox_missing", len(res.OutboxMissing), "not_found", len(res.NotFound), "remote_addr", r.RemoteAddr)
	}
	s.render(w, r, http.StatusOK, "redrive", "Redrive", d)
}
