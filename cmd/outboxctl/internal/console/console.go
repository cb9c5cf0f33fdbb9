package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/v3/internal/health"
)

// Defaults of Config.
const (
	// DefaultListen is loopback only: the console shows payloads and can redrive.
	DefaultListen = "127.0.0.1:8089"
	// DefaultPageSize is the number of dead letters on one list page.
	DefaultPageSize = 50
	// MaxPageSize caps the page size a request may ask for.
	MaxPageSize = 500
	// DefaultRedriveCap bounds a redrive by filter that has to be expanded to letter ids
	// (a filter on source, which deadletter.Filter lacks).
	DefaultRedriveCap = 10_000
	// DefaultQueryTimeout bounds the database work of one request.
	DefaultQueryTimeout = 10 * time.Second
)

// TokenEnv is the environment variable outboxctl ui reads the token from.
const TokenEnv = "OUTBOX_UI_TOKEN"

// ErrTokenRequired is returned by CheckListen and New for a non-loopback address without a token.
var ErrTokenRequired = errors.New("a non-loopback --listen address needs a bearer token: pass --token or set " + TokenEnv)

// DB is what the console reads and redrives through: *pgxpool.Pool satisfies it.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config configures New. Zero values take the defaults noted.
type Config struct {
	// DB is the deployment's database (search_path selects the schema). Required.
	DB DB
	// Listen is the address the console is served on; it only decides whether Token is
	// required (CheckListen). Default DefaultListen.
	Listen string
	// AllowRedrive enables the redrive actions; without it the console is read-only and
	// every action answers 403.
	AllowRedrive bool
	// Token, when set, must accompany every request (Authorization: Bearer, or the login
	// cookie). Required when Listen is not a loopback address.
	Token string
	// Thresholds turn the status figures into the verdict shown, as outboxctl status does
	// with its flags. Zero means the status defaults.
	Thresholds health.Thresholds
	// PageSize is the default number of letters per list page. Default DefaultPageSize.
	PageSize int
	// RedriveCap bounds a redrive by filter expanded to ids. Default DefaultRedriveCap.
	RedriveCap int
	// QueryTimeout bounds one request's database work. Default DefaultQueryTimeout.
	QueryTimeout time.Duration
	// Logger records actions (redrives, logins). Default: discard.
	Logger *slog.Logger
	// Tracer, when set, records each redrive in a span linked to the redriven events'
	// producer spans (deadletter.Traced). Nil: tracing off.
	Tracer trace.Tracer
	// Now is the clock (tests). Default time.Now.
	Now func() time.Time
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Listen = cmp.Or(c.Listen, DefaultListen)
	c.PageSize = cmp.Or(c.PageSize, DefaultPageSize)
	c.RedriveCap = cmp.Or(c.RedriveCap, DefaultRedriveCap)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, DefaultQueryTimeout)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.DB == nil {
		return errors.New("console config: DB is required")
	}
	if c.PageSize < 1 || c.PageSize > MaxPageSize {
		return fmt.Errorf("console config: PageSize must be in 1..%d, got %d", MaxPageSize, c.PageSize)
	}
	if c.RedriveCap < 1 {
		return fmt.Errorf("console config: RedriveCap must be positive, got %d", c.RedriveCap)
	}
	if c.QueryTimeout < 0 {
		return fmt.Errorf("console config: QueryTimeout must not be negative, got %s", c.QueryTimeout)
	}
	return CheckListen(c.Listen, c.Token)
}

// CheckListen returns ErrTokenRequired when addr (host:port) is not loopback and token is
// empty. A host name other than localhost counts as non-loopback: it may resolve anywhere.
func CheckListen(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("console config: Listen %q is not host:port: %w", addr, err)
	}
	if token == "" && !IsLoopback(host) {
		return ErrTokenRequired
	}
	return nil
}

// IsLoopback reports whether host (without port) is a loopback address or localhost. The
// empty host (":8089") listens on every interface, so it is not loopback.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Server is the console's http.Handler.
type Server struct {
	cfg      Config
	key      []byte // per-process secret: CSRF and session MACs
	loopback bool   // Listen is loopback: Host headers must be loopback too
	mux      *http.ServeMux
	pages    *pages
	charts   *chartCache
}

// New returns the console for cfg.
func New(cfg Config) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("create console secret: %w", err)
	}
	host, _, _ := net.SplitHostPort(cfg.Listen)
	pg, err := loadPages()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, key: key, loopback: IsLoopback(host), pages: pg, charts: &chartCache{}}
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	m := http.NewServeMux()
	m.Handle("GET /static/", http.StripPrefix("/static/", staticHandler()))
	m.HandleFunc("GET /login", s.loginPage)
	m.HandleFunc("POST /login", s.login)
	m.HandleFunc("POST /logout", s.authed(s.logout))
	m.HandleFunc("GET /{$}", s.authed(s.overview))
	m.HandleFunc("GET /dead-letters", s.authed(s.letters))
	m.HandleFunc("GET /dead-letters/groups", s.authed(s.groupsPage))
	m.HandleFunc("GET /dead-letters/{id}", s.authed(s.letter))
	m.HandleFunc("POST /dead-letters/redrive", s.authed(s.action(s.redrive)))
	m.HandleFunc("GET /events", s.authed(s.event))
	s.mux = m
}

// ServeHTTP applies the security headers and the Host check to every request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer browsers send "Origin: null" on form
	// posts, which sameOrigin must refuse.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if s.loopback && !s.loopbackHost(r.Host) {
		// DNS rebinding: a page on another site whose name now resolves to 127.0.0.1
		// would otherwise read this console as its own origin.
		http.Error(w, "this console answers on a loopback address only (Host must be localhost or a loopback IP)", http.StatusMisdirectedRequest)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) loopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	return IsLoopback(host)
}

// Serve serves the console on ln until ctx ends, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down console: %w", err)
	}
	return nil
}

// Banner writes what outboxctl ui prints at startup: the URL and the safety mode.
func (s *Server) Banner(w io.Writer, url string) {
	fmt.Fprintf(w, "outbox console on %s\n", url)
	if s.cfg.AllowRedrive {
		fmt.Fprintln(w, "  redrive: ENABLED (--allow-redrive); every action is a POST with a CSRF token")
	} else {
		fmt.Fprintln(w, "  read-only: start with --allow-redrive to redrive dead letters")
	}
	switch {
	case s.cfg.Token != "" && !s.loopback:
		fmt.Fprintln(w, "  listening beyond loopback: every request needs the bearer token (Authorization: Bearer, or log in at /login);")
		fmt.Fprintln(w, "  the console speaks plain HTTP, so put TLS in front of it or reach it through an SSH tunnel")
	case s.cfg.Token != "":
		fmt.Fprintln(w, "  every request needs the bearer token (Authorization: Bearer, or log in at /login)")
	default:
		fmt.Fprintln(w, "  loopback only, no token: anyone with a shell on this machine can use it")
	}
}
