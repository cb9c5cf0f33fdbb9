package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
)

// defaultGroupLetters is how many letters dlq show --group lists by default.
const defaultGroupLetters = 20

// listGroups prints the failure groups of the letters matching f.
func listGroups(ctx context.Context, e env, db deadletter.Querier, f deadletter.Filter, asJSON bool) error {
	groups, err := deadletter.Groups(ctx, db, f)
	if err != nil {
		return err
	}
	err = printList(e, groups, asJSON, f.Limit, "largest %d groups",
		"GROUP\tCOUNT\tFIRST SEEN\tLAST SEEN\tSOURCE\tTOPIC\tSTATUS\tSAMPLE ERROR", func(g deadletter.Group) string {
			count := fmt.Sprint(g.Count)
			if g.Open != g.Count {
				count = fmt.Sprintf("%d (%d open)", g.Count, g.Open)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", g.Fingerprint, count, g.FirstSeen.UTC().Format(time.RFC3339),
				g.LastSeen.UTC().Format(time.RFC3339), g.Source, dash(g.Topic), orDash(int64(g.StatusCode)), clip(g.SampleError, 60))
		})
	if err != nil || asJSON || len(groups) == 0 {
		return err
	}
	fmt.Fprintln(e.stdout, "next: outboxctl dlq show --group GROUP, then dlq redrive --group GROUP --dry-run")
	return nil
}

// groupView is dlq show --group --json.
type groupView struct {
	Group   deadletter.Group    `json:"group"`
	Letters []deadletter.Letter `json:"letters"`
}

// showGroup prints group fp (over open letters, or all with f.IncludeResolved) and its
// newest f.Limit letters.
func showGroup(ctx context.Context, e env, fp string, f deadletter.Filter, asJSON bool) error {
	pool, err := openPool(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	g, err := deadletter.GetGroup(ctx, pool, fp, f)
	if errors.Is(err, deadletter.ErrNotFound) {
		hint := ""
		if !f.IncludeResolved {
			hint = " (add --include-resolved to include resolved letters)"
		}
		return negativeErr(fmt.Errorf("no dead letter in group %s%s", fp, hint))
	}
	if err != nil {
		return err
	}
	f.Fingerprint = fp
	letters, err := deadletter.List(ctx, pool, f)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, groupView{Group: g, Letters: nonNil(letters)})
	}
	printGroup(e.stdout, g, letters)
	return nil
}

func printGroup(w io.Writer, g deadletter.Group, letters []deadletter.Letter) {
	fmt.Fprintf(w, "group:           %s\n", g.Fingerprint)
	fmt.Fprintf(w, "letters:         %d (%d open)\n", g.Count, g.Open)
	fmt.Fprintf(w, "first seen:      %s\n", g.FirstSeen.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "last seen:       %s\n", g.LastSeen.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "source:          %s\n", g.Source)
	fmt.Fprintf(w, "topic:           %s\n", dash(g.Topic))
	fmt.Fprintf(w, "status code:     %s\n", orDash(int64(g.StatusCode)))
	fmt.Fprintf(w, "error pattern:   %s\n", g.ErrorPattern)
	fmt.Fprintf(w, "sample error:    %s (letter %d)\n", g.SampleError, g.SampleID)
	fmt.Fprintf(w, "\nnewest %d letter(s):\n", len(letters))
	_ = printTable(w, "ID\tOUTBOX\tKEY\tATTEMPTS\tCREATED\tRESOLVED\tERROR", letters, func(l deadletter.Letter) string {
		return fmt.Sprintf("%d\t%s\t%s\t%d\t%s\t%s\t%s", l.ID, orDash(int64(l.OutboxID)), dash(l.PartitionKey), l.Attempts,
			l.CreatedAt.UTC().Format(time.RFC3339), resolvedText(l), clip(l.Error, 60))
	})
	fmt.Fprintf(w, "\nredrive them: outboxctl dlq redrive --group %s --dry-run, then without --dry-run\n", g.Fingerprint)
}
