package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
)

const dlqUsage = `usage:
  outboxctl dlq list [--groups] [--topic T] [--key K] [--since TIME] [--until TIME] [--include-resolved] [--limit N] [--json]
  outboxctl dlq show [--json] (ID | --group FP [--include-resolved] [--limit N])
  outboxctl dlq redrive (ID... | --group FP | --topic T | --key K | --since TIME | --until TIME | --all) [--dry-run] [--json]
  outboxctl dlq sync [--delete-synced] [--json]

TIME is RFC 3339 (2024-05-01T12:00:00Z), a date (2024-05-01), or a duration ago (90m, 24h).
list shows open letters; --include-resolved adds resolved ones. redrive --all redrives every
open letter. list --groups shows failure groups: letters with the same topic, source, status
code and error (ids, numbers and times aside). FP is a group's fingerprint; work through them with
  dlq list --groups  ->  dlq show --group FP  ->  dlq redrive --group FP --dry-run  ->  dlq redrive --group FP
sync records the QStash DLQ entries of this outbox that dead_letters lacks (see dlq sync -h).
Deprecated, removed in the next release: list --group (now --groups), list and show --all
(now --include-resolved). Run outboxctl dlq <command> -h for its flags.`

func runDLQ(ctx context.Context, e env, args []string) error {
	return dispatch(ctx, e, "dlq", dlqUsage, []subcommand{
		{"list", dlqList}, {"show", dlqShow}, {"redrive", dlqRedrive}, {"sync", dlqSync},
	}, args)
}

// filterFlags registers the selection flags shared by list and redrive.
type filterFlags struct {
	topic, key, since, until string
	asJSON                   bool
}

func (f *filterFlags) register(fs *flagSet) {
	fs.StringVar(&f.topic, "topic", "", "only letters of this topic")
	fs.StringVar(&f.key, "key", "", "only letters of this partition key")
	fs.StringVar(&f.since, "since", "", "only letters created at or after TIME")
	fs.StringVar(&f.until, "until", "", "only letters created before TIME")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
}

// includeResolved registers --include-resolved and its deprecated spelling --all.
func includeResolved(fs *flagSet, help string) *bool {
	v := fs.Bool("include-resolved", false, help)
	fs.alias("all", "include-resolved")
	return v
}

func (f *filterFlags) filter(now time.Time) (deadletter.Filter, error) {
	out := deadletter.Filter{Topic: f.topic, PartitionKey: f.key}
	var err error
	if out.Since, err = parseTime(f.since, now); err != nil {
		return out, fmt.Errorf("--since: %w", err)
	}
	if out.Until, err = parseTime(f.until, now); err != nil {
		return out, fmt.Errorf("--until: %w", err)
	}
	return out, nil
}

// parseTime accepts RFC 3339, a date, or a duration before now; "" is the zero time.
func parseTime(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is not RFC 3339 (2024-05-01T12:00:00Z), a date (2024-05-01) or a duration (24h)", s)
}

// groupFlag reads --group FP: "" when unset, else a valid fingerprint or an exit-2 error.
func groupFlag(fp string) (string, error) {
	if fp == "" {
		return "", nil
	}
	if err := deadletter.ValidFingerprint(fp); err != nil {
		return "", usageErr(fmt.Errorf("--group: %w (see outboxctl dlq list --groups)", err))
	}
	return fp, nil
}

func parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return nil, fmt.Errorf("%q is not a dead letter id (a positive number; see outboxctl dlq list)", a)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

const (
	dlqListUsage = `usage: outboxctl dlq list [--groups] [--topic T] [--key K] [--since TIME] [--until TIME] [--include-resolved] [--limit N] [--json]

Lists open dead letters, newest first; with --groups, their failure groups, largest first.
TIME is RFC 3339 (2024-05-01T12:00:00Z), a date (2024-05-01), or a duration ago (90m, 24h).`
	dlqShowUsage = `usage: outboxctl dlq show [--json] ID
       outboxctl dlq show [--json] --group FP [--include-resolved] [--limit N]

Shows one dead letter (headers, payload, its group), or one failure group and its newest letters.
Exit status 1 when the letter or group does not exist.`
	dlqRedriveUsage = `usage: outboxctl dlq redrive (ID... | --group FP | --topic T | --key K | --since TIME | --until TIME | --all) [--dry-run] [--json]

Resets the outbox rows of the selected open letters to pending, so the relay sends them again.
Exit status 1 when a letter could not be redriven (not found, or its outbox row is gone).`
)

func dlqList(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "dlq list").withUsage(dlqListUsage)
	var ff filterFlags
	ff.register(fs)
	resolved := includeResolved(fs, "include resolved letters")
	limit := fs.Int("limit", deadletter.DefaultListLimit, "at most this many letters (groups with --groups), newest (largest) first")
	groups := fs.Bool("groups", false, "list failure groups (fingerprint, count, first and last seen) instead of letters")
	fs.alias("group", "groups")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fs.fail(fmt.Errorf("unexpected arguments %q; use outboxctl dlq show ID for one letter, dlq show --group FP for one group", pos))
	}
	f, err := ff.filter(time.Now())
	if err != nil {
		return usageErr(err)
	}
	f.IncludeResolved, f.Limit = *resolved, *limit
	pool, err := openPool(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *groups {
		return listGroups(ctx, e, pool, f, ff.asJSON)
	}
	letters, err := deadletter.List(ctx, pool, f)
	if err != nil {
		return err
	}
	return printList(e, letters, ff.asJSON, f.Limit, "newest %d",
		"ID\tSOURCE\tOUTBOX\tTOPIC\tKEY\tSTATUS\tATTEMPTS\tCREATED\tRESOLVED\tERROR", func(l deadletter.Letter) string {
			return fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s", l.ID, l.Source, orDash(int64(l.OutboxID)), dash(l.Topic),
				dash(l.PartitionKey), orDash(int64(l.StatusCode)), l.Attempts, l.CreatedAt.UTC().Format(time.RFC3339),
				resolvedText(l), clip(l.Error, 60))
		})
}

// printList prints what a dlq list found: as JSON (none as []), as "no dead letters", or
// as a table under header, one line a row, with a note when --limit cut the list (shown
// says which rows it kept, e.g. "newest %d").
func printList[T any](e env, rows []T, asJSON bool, limit int, shown, header string, line func(T) string) error {
	if asJSON {
		return writeJSON(e.stdout, nonNil(rows))
	}
	if len(rows) == 0 {
		fmt.Fprintln(e.stdout, "no dead letters")
		return nil
	}
	if err := printTable(e.stdout, header, rows, line); err != nil {
		return err
	}
	if len(rows) == limit {
		fmt.Fprintf(e.stdout, "(showing the "+shown+"; use --limit or narrow the filter)\n", limit)
	}
	return nil
}

// printTable writes header and a line a row in aligned columns (line separates them with
// tabs).
func printTable[T any](w io.Writer, header string, rows []T, line func(T) string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, line(r))
	}
	return tw.Flush()
}

func dlqShow(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "dlq show").withUsage(dlqShowUsage)
	asJSON := fs.Bool("json", false, "print JSON")
	group := fs.String("group", "", "show failure group FP (a fingerprint from dlq list --groups) and its newest letters")
	limit := fs.Int("limit", defaultGroupLetters, "with --group: at most this many letters, newest first")
	resolved := includeResolved(fs, "with --group: include resolved letters")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	fp, err := groupFlag(*group)
	if err != nil {
		return err
	}
	switch {
	case fp != "" && len(pos) > 0:
		return usageErr(fmt.Errorf("--group: give a letter id or --group FP, not both (got %q)", pos))
	case fp != "":
		return showGroup(ctx, e, fp, deadletter.Filter{IncludeResolved: *resolved, Limit: *limit}, *asJSON)
	case len(pos) != 1:
		return fs.fail(errors.New("expected one dead letter id, or --group FP"))
	}
	ids, err := parseIDs(pos)
	if err != nil {
		return usageErr(err)
	}
	pool, err := openPool(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	l, err := deadletter.Get(ctx, pool, ids[0])
	if errors.Is(err, deadletter.ErrNotFound) {
		return negativeErr(fmt.Errorf("dead letter %d does not exist", ids[0]))
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, l)
	}
	w := e.stdout
	fmt.Fprintf(w, "id:              %d\n", l.ID)
	fmt.Fprintf(w, "source:          %s\n", l.Source)
	fmt.Fprintf(w, "outbox id:       %s\n", orDash(int64(l.OutboxID)))
	fmt.Fprintf(w, "topic:           %s\n", dash(l.Topic))
	fmt.Fprintf(w, "partition key:   %s\n", dash(l.PartitionKey))
	fmt.Fprintf(w, "created:         %s\n", l.CreatedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "resolved:        %s\n", resolvedText(l))
	fmt.Fprintf(w, "error:           %s\n", l.Error)
	fmt.Fprintf(w, "attempts:        %d\n", l.Attempts)
	fmt.Fprintf(w, "status code:     %s\n", orDash(int64(l.StatusCode)))
	fmt.Fprintf(w, "qstash message:  %s\n", dash(l.QStashMessageID))
	fmt.Fprintf(w, "qstash dlq id:   %s\n", dash(l.QStashDLQID))
	fmt.Fprintf(w, "group:           %s (outboxctl dlq show --group %s)\n", l.Fingerprint, l.Fingerprint)
	if len(l.Headers) > 0 {
		fmt.Fprintln(w, "headers:")
		for k, v := range l.Headers {
			fmt.Fprintf(w, "  %s: %s\n", k, v)
		}
	}
	if l.ResponseBody != "" {
		fmt.Fprintf(w, "response body:   %s\n", l.ResponseBody)
	}
	fmt.Fprintln(w, "payload:")
	if l.Payload == nil {
		fmt.Fprintln(w, "  (none)")
		return nil
	}
	var v any
	if json.Unmarshal(l.Payload, &v) == nil {
		b, _ := json.MarshalIndent(v, "  ", "  ")
		fmt.Fprintf(w, "  %s\n", b)
	} else {
		fmt.Fprintf(w, "  %s\n", l.Payload)
	}
	return nil
}

func dlqRedrive(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "dlq redrive").withUsage(dlqRedriveUsage)
	var ff filterFlags
	ff.register(fs)
	all := fs.Bool("all", false, "redrive every open letter (required when no id or filter is given)")
	dryRun := fs.Bool("dry-run", false, "print what would be redriven, change nothing")
	group := fs.String("group", "", "only letters of failure group FP (a fingerprint from dlq list --groups)")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	f, err := ff.filter(time.Now())
	if err != nil {
		return usageErr(err)
	}
	if f.Fingerprint, err = groupFlag(*group); err != nil {
		return err
	}
	if f.IDs, err = parseIDs(pos); err != nil {
		return usageErr(err)
	}
	f.All = *all
	if len(f.IDs) == 0 && f.Fingerprint == "" && f.Topic == "" && f.PartitionKey == "" && f.Since.IsZero() && f.Until.IsZero() && !f.All {
		return fs.fail(errors.New("name letter ids, --group FP or a filter, or pass --all to redrive every open letter"))
	}
	pool, err := openPool(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	var res deadletter.RedriveResult
	if *dryRun {
		res, err = deadletter.Plan(ctx, pool, f)
	} else {
		tr, stop, terr := startTracing(ctx, e.getenv, tracingServiceName)
		if terr != nil {
			return terr
		}
		res, err = deadletter.Redrive(ctx, pool, f, tr)
		stop()
	}
	if err != nil {
		return err
	}
	if ff.asJSON {
		if err := writeJSON(e.stdout, res); err != nil {
			return err
		}
	} else {
		printRedrive(e.stdout, res)
	}
	if n := len(res.OutboxMissing) + len(res.NotFound); n > 0 {
		return negativeErr(fmt.Errorf("%d letter(s) could not be redriven", n))
	}
	// As dlq show --group answers for the same group: a group with no open letter is a "no".
	if f.Fingerprint != "" && len(res.Redriven)+len(res.AlreadyPending)+len(res.AlreadyResolved)+len(res.Superseded) == 0 {
		return negativeErr(fmt.Errorf("no open dead letter in group %s (dlq list --groups lists them)", f.Fingerprint))
	}
	return nil
}

func printRedrive(w io.Writer, res deadletter.RedriveResult) {
	verb, pending := "redrove", "resolved; its outbox row %d is already pending, left as is"
	if res.DryRun {
		verb, pending = "would redrive", "would be resolved; its outbox row %d is already pending"
	}
	for _, r := range res.Redriven {
		if res.DryRun {
			fmt.Fprintf(w, "letter %d: would reset outbox row %d to pending\n", r.LetterID, r.OutboxID)
		} else {
			fmt.Fprintf(w, "letter %d: outbox row %d reset to pending (generation %d)\n", r.LetterID, r.OutboxID, r.Generation)
		}
	}
	for _, r := range res.AlreadyPending {
		fmt.Fprintf(w, "letter %d: "+pending+"\n", r.LetterID, r.OutboxID)
	}
	for _, id := range res.AlreadyResolved {
		fmt.Fprintf(w, "letter %d: already resolved, nothing to do\n", id)
	}
	for _, r := range res.Superseded {
		fmt.Fprintf(w, "letter %d: about a generation its outbox row %d has left behind (now generation %d); resolved as superseded, row left as is\n",
			r.LetterID, r.OutboxID, r.Generation)
	}
	for _, id := range res.OutboxMissing {
		fmt.Fprintf(w, "letter %d: its outbox row no longer exists (deleted by retention?); left open, redeliver its payload by hand (outboxctl dlq show %d)\n", id, id)
	}
	for _, id := range res.NotFound {
		fmt.Fprintf(w, "letter %d: not found\n", id)
	}
	fmt.Fprintf(w, "%s %d letter(s); %d already resolved, %d already pending, %d superseded, %d without outbox row, %d not found\n",
		verb, len(res.Redriven), len(res.AlreadyResolved), len(res.AlreadyPending), len(res.Superseded), len(res.OutboxMissing), len(res.NotFound))
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// nonNil makes a list that found nothing print as [] rather than null.
func nonNil[T any](ls []T) []T {
	if ls == nil {
		return []T{}
	}
	return ls
}

func resolvedText(l deadletter.Letter) string {
	if l.ResolvedAt == nil {
		return "-"
	}
	return l.ResolvedAt.UTC().Format(time.RFC3339) + " (" + l.Resolution + ")"
}

func orDash(n int64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
