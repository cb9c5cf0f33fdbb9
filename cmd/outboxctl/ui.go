package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/outbox-relay/outbox-relay/v3/cmd/outboxctl/internal/console"
)

const uiUsage = `usage: outboxctl ui [--listen 127.0.0.1:8089] [--allow-redrive] [--token T] [-v]

The operator console: overview, dead letters (filter, inspect, redrive) and event lookup,
in a browser, on DATABASE_URL. Read-only unless --allow-redrive. A --listen address that
is not loopback needs a token (--token, or better OUTBOX_UI_TOKEN, which stays out of the
process list); requests then carry it as "Authorization: Bearer T" or log in at /login.`

func runUI(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "ui").withUsage(uiUsage)
	listen := fs.String("listen", console.DefaultListen, "address to serve the console on (host:port)")
	allow := fs.Bool("allow-redrive", false, "enable redrive (otherwise the console is read-only)")
	token := fs.String("token", "", "bearer token every request must carry (default $"+console.TokenEnv+"); required off loopback")
	verbose := fs.Bool("v", false, "log every action as JSON to stderr (redrives and logins are always logged)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	tok := *token
	if tok == "" {
		tok = e.getenv(console.TokenEnv)
	}
	// Refuse before touching the database: an exposed console without a token is never
	// what was meant.
	if err := console.CheckListen(*listen, tok); err != nil {
		return usageErr(err)
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewJSONHandler(e.stderr, &slog.HandlerOptions{Level: level}))
	pool, err := openPool(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	tr, stop, err := startTracing(ctx, e.getenv, tracingServiceName)
	if err != nil {
		return err
	}
	defer stop()
	return serveConsole(ctx, e, console.Config{DB: pool, Listen: *listen, AllowRedrive: *allow, Token: tok, Logger: logger, Tracer: tr})
}

// serveConsole listens on cfg.Listen, prints the console's URL and serves until ctx ends.
func serveConsole(ctx context.Context, e env, cfg console.Config) error {
	srv, ln, err := listenConsole(e.stdout, cfg)
	if err != nil {
		return err
	}
	return srv.Serve(ctx, ln)
}

// listenConsole builds the console, opens its listener and prints its URL and mode to w.
func listenConsole(w io.Writer, cfg console.Config) (*console.Server, net.Listener, error) {
	srv, err := console.New(cfg)
	if err != nil {
		return nil, nil, usageErr(err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("listen for the console: %w", err)
	}
	srv.Banner(w, "http://"+ln.Addr().String()+"/")
	return srv, ln, nil
}
