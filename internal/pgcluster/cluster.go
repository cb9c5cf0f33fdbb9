// Package pgcluster starts throwaway PostgreSQL servers (initdb and pg_ctl from the server
// binaries) for the local stack, the benchmarks and the tests that need a server of their
// own.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrNoPostgres means neither DATABASE_URL nor PostgreSQL server binaries are available.
var ErrNoPostgres = errors.New("no PostgreSQL: set DATABASE_URL to a server (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable) " +
	"or install the server binaries (Debian: apt-get install postgresql) so a throwaway cluster can be started")

// Cluster is a throwaway PostgreSQL server in its own directory, on a free loopback port,
// with trust authentication. Stop removes nothing but stops the server; the directory is
// the caller's to delete.
type Cluster struct {
	// URL connects as the postgres superuser to database postgres.
	URL  string
	Dir  string
	Port int
	bin  string
	user string
}

// FindPostgresBin returns the directory holding initdb and pg_ctl: PATH first, then the
// newest /usr/lib/postgresql/*/bin (Debian keeps them off PATH).
func FindPostgresBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode()&0o111 != 0
}

// StartCluster initialises and starts a cluster under dir (created if needed). PostgreSQL
// refuses to run as root, so as root the server runs as the "postgres" system user.
func StartCluster(ctx context.Context, dir string) (*Cluster, error) {
	return startCluster(ctx, dir, "--auth=trust")
}

// StartPasswordCluster is StartCluster with password authentication (scram-sha-256) over
// TCP, as RDS has, and trust on its Unix socket, where AdminURL connects: tests rotate
// passwords with it and see the refusals a deployment sees.
func StartPasswordCluster(ctx context.Context, dir string) (*Cluster, error) {
	return startCluster(ctx, dir, "--auth-local=trust", "--auth-host=scram-sha-256")
}

// AdminURL connects as the postgres superuser over the cluster's Unix socket (trusted by
// both kinds of cluster).
func (c *Cluster) AdminURL() string {
	return fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", c.Dir, c.Port)
}

func startCluster(ctx context.Context, dir string, auth ...string) (*Cluster, error) {
	bin, err := FindPostgresBin()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("start throwaway postgres: %w", err)
	}
	c := &Cluster{Dir: dir, Port: port, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("start throwaway postgres: running as root needs a postgres system user: %w", err)
		}
		c.user = "postgres"
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("start throwaway postgres: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, fmt.Errorf("start throwaway postgres: %w", err)
		}
	}
	data := filepath.Join(dir, "data")
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		if out, err := c.run(ctx, "initdb", append([]string{"-D", data, "-U", "postgres", "-E", "UTF8", "--no-sync"}, auth...)...); err != nil {
			return nil, fmt.Errorf("initdb: %w: %s", err, out)
		}
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=on", port, dir)
	if out, err := c.run(ctx, "pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		return nil, fmt.Errorf("pg_ctl start: %w: %s %s", err, out, lastLines(string(log), 5))
	}
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return c, nil
}

// Stop shuts the server down (fast mode: open connections are terminated).
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.Dir, "data"), "-m", "fast", "-w", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop: %w: %s", err, out)
	}
	return nil
}

// Restart stops and starts the server on the same port (fault-injection tests).
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.Stop(); err != nil {
		return err
	}
	return c.Start(ctx)
}

// Start starts a stopped server again on the same port.
func (c *Cluster) Start(ctx context.Context) error {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", c.Port, c.Dir)
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.Dir, "data"), "-o", opts, "-l", filepath.Join(c.Dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("pg_ctl start: %w: %s", err, out)
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, tool string, args ...string) ([]byte, error) {
	path := filepath.Join(c.bin, tool)
	var cmd *exec.Cmd
	if c.user != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.user, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = c.Dir
	return cmd.CombinedOutput()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
