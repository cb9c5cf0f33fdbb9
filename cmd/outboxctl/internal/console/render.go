package console

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/humanize"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pages holds one template set per page, each the layout plus the page's "content".
type pages struct {
	byName map[string]*template.Template
}

var funcs = template.FuncMap{
	"utc": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"utcp": func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"secs":  humanize.Seconds,
	"bytes": humanize.Bytes,
	"dash": func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	},
	"clip": func(s string, n int) string {
		s = strings.ReplaceAll(s, "\n", " ")
		if r := []rune(s); len(r) > n {
			return string(r[:n-1]) + "…"
		}
		return s
	},
	"ms":    func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) },
	"upper": strings.ToUpper,
	"sum": func(xs ...int) int {
		t := 0
		for _, x := range xs {
			t += x
		}
		return t
	},
}

func loadPages() (*pages, error) {
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("parse console layout: %w", err)
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("list console templates: %w", err)
	}
	p := &pages{byName: map[string]*template.Template{}}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return nil, fmt.Errorf("parse console template %s: %w", n, err)
		}
		p.byName[name] = t
	}
	return p, nil
}

// view is what every page template receives.
type view struct {
	Title        string
	Page         string
	CSRF         string
	AllowRedrive bool
	TokenAuth    bool
	Now          time.Time
	Data         any
}

// render executes page into a buffer first, so a template error becomes a 500 rather
// than half a page. Pages are never stored: they hold payloads.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, page, title string, data any) {
	t, ok := s.pages.byName[page]
	if !ok {
		http.Error(w, "unknown page", http.StatusInternalServerError)
		return
	}
	v := view{Title: title, Page: page, CSRF: s.csrf(w, r), AllowRedrive: s.cfg.AllowRedrive,
		TokenAuth: s.cfg.Token != "", Now: s.cfg.Now(), Data: data}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		s.cfg.Logger.Error("render console page", "page", page, "error", err.Error())
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) renderLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	next := "/"
	if r.Method == http.MethodGet && r.URL.Path != "/login" {
		next = r.URL.RequestURI()
	}
	if r.Method == http.MethodPost {
		next = localPath(r.PostFormValue("next"))
	}
	s.render(w, r, status, "login", "Log in", struct{ Next, Message string }{next, msg})
}

// problem renders a message page with status.
func (s *Server) problem(w http.ResponseWriter, r *http.Request, status int, msg string) {
	s.render(w, r, status, "problem", http.StatusText(status), msg)
}

// fail logs err and answers 500 (504 when the query ran out of time) without echoing
// internals: the error may quote data.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	s.cfg.Logger.Error("console request", "path", r.URL.Path, "error", err.Error())
	// pgconn does not always wrap the context's error; its text names it either way.
	timedOut := errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), context.DeadlineExceeded.Error())
	if r.Context().Err() == nil && timedOut {
		s.problem(w, r, http.StatusGatewayTimeout, "The database did not answer in time.")
		return
	}
	s.problem(w, r, http.StatusInternalServerError, "The database query failed; the console's log has the error.")
}

func (s *Server) queryContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
}

func staticHandler() http.Handler {
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		files.ServeHTTP(w, r)
	})
}
