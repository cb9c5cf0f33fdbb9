package console

import (
	"context"
	"errors"
	"html/template"
	"net/http"

	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
)

// Groups shown at most: on the groups page, and on the overview.
const (
	groupPageLimit     = 100
	overviewGroupLimit = 10
)

// groupRow is one failure group with the links the pages show for it.
type groupRow struct {
	deadletter.Group
	// Letters lists the group's letters under the current filter.
	Letters template.URL
}

// filterBar is what the shared filter form and the Letters/Groups tabs render.
type filterBar struct {
	Filter  letterFilter
	Page    string // "letters" or "groups"
	Letters template.URL
	Groups  template.URL
}

func newFilterBar(f letterFilter, page string) filterBar {
	q := f.values().Encode()
	return filterBar{Filter: f, Page: page,
		Letters: template.URL("/dead-letters?" + q),        //nolint:gosec // encoded by url.Values
		Groups:  template.URL("/dead-letters/groups?" + q), //nolint:gosec // encoded by url.Values
	}
}

// lettersLink is the letter list of f narrowed to group fp.
func lettersLink(f letterFilter, fp string) template.URL {
	f.Group = fp
	return template.URL("/dead-letters?" + f.values().Encode()) //nolint:gosec // encoded by url.Values
}

type groupsData struct {
	Bar      filterBar
	Groups   []groupRow
	Problems []string
	// Truncated: more groups match than are shown (the largest are).
	Truncated bool
	Limit     int
}

// groupsPage lists the failure groups of the letters matching the filter, largest first,
// each linking to its letters and, with redrive allowed, to a dry run of its redrive.
func (s *Server) groupsPage(w http.ResponseWriter, r *http.Request) {
	f, problems := parseFilter(r.URL.Query(), s.cfg.Now())
	data := groupsData{Bar: newFilterBar(f, "groups"), Problems: problems, Limit: groupPageLimit}
	if len(problems) > 0 {
		s.render(w, r, http.StatusBadRequest, "groups", "Failure groups", data)
		return
	}
	ctx, cancel := s.queryContext(r)
	defer cancel()
	groups, truncated, err := s.groupsOf(ctx, f, groupPageLimit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	data.Groups, data.Truncated = groups, truncated
	s.render(w, r, http.StatusOK, "groups", "Failure groups", data)
}

// groupsOf returns up to limit failure groups of the letters matching f, largest first,
// through deadletter.Groups (the code behind outboxctl dlq list --groups), and whether more
// matched. deadletter.Filter has no source, but a group has exactly one, so a filter on
// source is applied to the groups: over the largest MaxPageSize of them.
func (s *Server) groupsOf(ctx context.Context, f letterFilter, limit int) ([]groupRow, bool, error) {
	df, _ := f.deadletterFilter()
	df.IncludeResolved = f.IncludeResolved
	df.Limit = limit + 1
	if f.Source != "" {
		df.Limit = MaxPageSize
	}
	groups, err := deadletter.Groups(ctx, s.cfg.DB, df)
	if err != nil {
		return nil, false, err
	}
	// With a source, groups beyond the largest MaxPageSize were not read.
	truncated := f.Source != "" && len(groups) == df.Limit
	out := make([]groupRow, 0, min(len(groups), limit))
	for _, g := range groups {
		if f.Source != "" && g.Source != f.Source {
			continue
		}
		if len(out) == limit {
			truncated = true
			break
		}
		out = append(out, groupRow{Group: g, Letters: lettersLink(f, g.Fingerprint)})
	}
	return out, truncated, nil
}

// groupOf returns group fp over the letters matching f (open ones unless f includes
// resolved), or nil when none matches.
func (s *Server) groupOf(ctx context.Context, f letterFilter, fp string) (*groupRow, error) {
	df, _ := f.deadletterFilter()
	df.IncludeResolved = f.IncludeResolved
	g, err := deadletter.GetGroup(ctx, s.cfg.DB, fp, df)
	if errors.Is(err, deadletter.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if f.Source != "" && g.Source != f.Source {
		return nil, nil
	}
	return &groupRow{Group: g, Letters: lettersLink(f, fp)}, nil
}
