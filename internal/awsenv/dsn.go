package awsenv

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
)

// dsnParts are the pieces of DATABASE_URL.
type dsnParts struct {
	host, port, dbname, user, password, sslmode string
	iamAuth, proxy                              bool
}

// DefaultConnectTimeout is the connect_timeout (seconds) of a built DATABASE_URL: pgconn has
// no default, and a dial to an unreachable VPC address would otherwise wait for the
// invocation's deadline.
const DefaultConnectTimeout = 5

// url renders the parts as a postgres:// URL. Every component is escaped, so passwords with
// '@', ':', '/', '?', '#' or '%' survive.
func (p dsnParts) url() (string, error) {
	port := p.port
	if port == "" {
		port = defaultPort
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("database port %q must be a number between 1 and 65535 (DB_PORT or the secret's \"port\")", port)
	}
	dbname := p.dbname
	if dbname == "" {
		dbname = defaultDatabase
	}
	sslmode := p.sslmode
	if sslmode == "" {
		sslmode = defaultSSLMode
	}
	switch sslmode {
	case "disable", "allow", "prefer", "require", "verify-ca", "verify-full":
	default:
		return "", fmt.Errorf("DB_SSLMODE %q must be disable, allow, prefer, require, verify-ca or verify-full", sslmode)
	}
	q := url.Values{}
	q.Set("sslmode", sslmode)
	q.Set("connect_timeout", strconv.Itoa(DefaultConnectTimeout))
	if p.proxy {
		// RDS Proxy and PgBouncer (transaction mode) move a session between backends and pin
		// it on named prepared statements: use unnamed statements, one round trip each.
		q.Set("default_query_exec_mode", "exec")
	}
	if p.iamAuth {
		q.Set(dsnKeyIAMAuth, "true")
	}
	u := url.URL{
		Scheme:   "postgres",
		Host:     net.JoinHostPort(p.host, port),
		Path:     "/" + dbname,
		RawQuery: q.Encode(),
	}
	if p.password != "" {
		u.User = url.UserPassword(p.user, p.password)
	} else {
		u.User = url.User(p.user)
	}
	return u.String(), nil
}
