package awsenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
)

// DefaultTimeout bounds all of Resolve's AWS calls. Lambda caps an on-demand init phase at
// about 10 s; the SDK's three attempts with backoff fit well inside this.
const DefaultTimeout = 5 * time.Second

// Reference variables Resolve reads.
const (
	VarDBSecretARN  = "DB_SECRET_ARN"
	VarDBHost       = "DB_HOST"
	VarDBPort       = "DB_PORT"
	VarDBName       = "DB_NAME"
	VarDBUser       = "DB_USER"
	VarDBSSLMode    = "DB_SSLMODE"
	VarDBIAMAuth    = "DB_IAM_AUTH"
	VarDBProxy      = "DB_PROXY"
	paramSuffix     = "_PARAM"
	varDatabaseURL  = "DATABASE_URL"
	defaultSSLMode  = "require"
	defaultPort     = "5432"
	defaultDatabase = "postgres"
)

// ssmBacked lists the variables that may come from an SSM SecureString parameter named by
// <variable>_PARAM.
var ssmBacked = []string{"QSTASH_TOKEN", "QSTASH_CURRENT_SIGNING_KEY", "QSTASH_NEXT_SIGNING_KEY"}

// References maps each variable Resolve can produce to the variables that produce it. A
// deployment that sets none of a variable's references must set the variable itself.
var References = func() map[string][]string {
	m := map[string][]string{
		varDatabaseURL: {VarDBSecretARN, VarDBHost, VarDBPort, VarDBName, VarDBUser, VarDBSSLMode, VarDBIAMAuth, VarDBProxy},
	}
	for _, v := range ssmBacked {
		m[v] = []string{v + paramSuffix}
	}
	return m
}()

// SecretsManagerAPI is the part of the Secrets Manager client Resolve uses.
type SecretsManagerAPI interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// SSMAPI is the part of the SSM client Resolve uses.
type SSMAPI interface {
	GetParameters(ctx context.Context, in *ssm.GetParametersInput, optFns ...func(*ssm.Options)) (*ssm.GetParametersOutput, error)
}

// Resolver resolves secrets. The zero value is ready to use and builds its clients from
// config.LoadDefaultConfig (region and credentials from the Lambda environment), only when
// a reference variable is set.
type Resolver struct {
	// AWSConfig replaces config.LoadDefaultConfig (tests point BaseEndpoint at moto_server).
	AWSConfig *aws.Config
	// SecretsManager and SSM replace the clients built from the AWS config.
	SecretsManager SecretsManagerAPI
	SSM            SSMAPI
	// Timeout bounds all AWS calls together. Default DefaultTimeout.
	Timeout time.Duration
}

// Resolve is Resolver{}.Resolve.
func Resolve(ctx context.Context, getenv func(string) string) (func(string) string, error) {
	return Resolver{}.Resolve(ctx, getenv)
}

// Resolve fetches every secret the reference variables name, once, and returns a getenv
// that answers the resolved variables (DATABASE_URL, QSTASH_TOKEN, ...) from them and
// everything else from getenv. It reports every problem at once; errors name the variable
// and the secret or parameter, never a secret's value.
func (r Resolver) Resolve(ctx context.Context, getenv func(string) string) (func(string) string, error) {
	needDB := getenv(VarDBSecretARN) != "" || getenv(VarDBHost) != ""
	var params []string // SSM names, in ssmBacked order
	var paramVars []string
	var errs []error
	for _, v := range ssmBacked {
		name := getenv(v + paramSuffix)
		if name == "" {
			continue
		}
		if getenv(v) != "" {
			errs = append(errs, fmt.Errorf("%s and %s are both set: set one", v, v+paramSuffix))
			continue
		}
		params = append(params, name)
		paramVars = append(paramVars, v)
	}
	if needDB && getenv(varDatabaseURL) != "" {
		errs = append(errs, fmt.Errorf("DATABASE_URL and %s are both set: set one", dbSource(getenv)))
		needDB = false
	}
	if !needDB && len(params) == 0 {
		if err := errors.Join(errs...); err != nil {
			return nil, fmt.Errorf("resolve secrets: %w", err)
		}
		return getenv, nil
	}

	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.clients(ctx, needDB && getenv(VarDBSecretARN) != "", len(params) > 0); err != nil {
		return nil, fmt.Errorf("resolve secrets: %w", err)
	}

	resolved := map[string]string{}
	if needDB {
		dsn, err := r.databaseURL(ctx, getenv)
		if err != nil {
			errs = append(errs, err)
		} else {
			resolved[varDatabaseURL] = dsn
		}
	}
	if len(params) > 0 {
		values, err := r.parameters(ctx, params, paramVars)
		if err != nil {
			errs = append(errs, err)
		}
		for i, name := range params {
			if v, ok := values[name]; ok {
				resolved[paramVars[i]] = v
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("resolve secrets: %w", err)
	}
	return func(k string) string {
		if v, ok := resolved[k]; ok {
			return v
		}
		return getenv(k)
	}, nil
}

// DatabaseURLReader returns a function that reads DATABASE_URL again from the secret it
// was resolved from (DB_SECRET_ARN, or DB_HOST with DB_* settings), for NewCredentials; nil
// when there is nothing to re-read (a plain DATABASE_URL, or RDS IAM tokens, which are
// fresh per connection anyway).
func (r Resolver) DatabaseURLReader(getenv func(string) string) func(ctx context.Context) (string, error) {
	if getenv(VarDBSecretARN) == "" || getenv(varDatabaseURL) != "" {
		return nil
	}
	if iam, _ := parseBool(VarDBIAMAuth, getenv(VarDBIAMAuth)); iam {
		return nil
	}
	return func(ctx context.Context) (string, error) {
		timeout := r.Timeout
		if timeout <= 0 {
			timeout = DefaultTimeout
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := r.clients(ctx, true, false); err != nil {
			return "", fmt.Errorf("re-read database secret: %w", err)
		}
		dsn, err := r.databaseURL(ctx, getenv)
		if err != nil {
			return "", fmt.Errorf("re-read database secret: %w", err)
		}
		return dsn, nil
	}
}

// ParameterReader returns a function that reads variable again from the SSM parameter
// <variable>_PARAM names (QSTASH_TOKEN from QSTASH_TOKEN_PARAM, after a rotation), for a
// client that re-reads its credential when it is refused; nil when <variable>_PARAM is not
// set (the value is fixed: nothing to re-read). Errors name the parameter, never its value.
func (r Resolver) ParameterReader(getenv func(string) string, variable string) func(ctx context.Context) (string, error) {
	read := r.ParametersReader(getenv, variable)
	if read == nil {
		return nil
	}
	return func(ctx context.Context) (string, error) {
		get, err := read(ctx)
		if err != nil {
			return "", err
		}
		return get(variable), nil
	}
}

// ParametersReader is ParameterReader for several variables read together, in one
// GetParameters request (both signing keys, so a re-read sees one moment of SSM); nil
// unless every variable's _PARAM is set.
func (r Resolver) ParametersReader(getenv func(string) string, variables ...string) func(ctx context.Context) (func(string) string, error) {
	names := make(map[string]string, len(variables))
	params := make([]string, len(variables))
	for i, v := range variables {
		params[i] = v + paramSuffix
		if names[params[i]] = getenv(params[i]); names[params[i]] == "" {
			return nil
		}
	}
	// Resolve as at a cold start, with only these parameters set: same timeout, same errors.
	only := func(k string) string { return names[k] }
	return func(ctx context.Context) (func(string) string, error) {
		get, err := r.Resolve(ctx, only)
		if err != nil {
			return nil, fmt.Errorf("re-read %s: %w", strings.Join(params, ", "), err)
		}
		return get, nil
	}
}

func dbSource(getenv func(string) string) string {
	if getenv(VarDBSecretARN) != "" {
		return VarDBSecretARN
	}
	return VarDBHost
}

// clients builds the missing clients from the AWS configuration.
func (r *Resolver) clients(ctx context.Context, needSM, needSSM bool) error {
	if (!needSM || r.SecretsManager != nil) && (!needSSM || r.SSM != nil) {
		return nil
	}
	cfg, err := r.awsConfig(ctx)
	if err != nil {
		return err
	}
	if needSM && r.SecretsManager == nil {
		r.SecretsManager = secretsmanager.NewFromConfig(cfg)
	}
	if needSSM && r.SSM == nil {
		r.SSM = ssm.NewFromConfig(cfg)
	}
	return nil
}

func (r *Resolver) awsConfig(ctx context.Context) (aws.Config, error) {
	if r.AWSConfig != nil {
		return *r.AWSConfig, nil
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return aws.Config{}, fmt.Errorf("load AWS config: %w", err)
	}
	r.AWSConfig = &cfg
	return cfg, nil
}

// dbSecret is the RDS credentials secret. Port is a number in the RDS rotation shape but a
// string in hand-made secrets; both are accepted.
type dbSecret struct {
	Username string          `json:"username"`
	Password string          `json:"password"`
	Host     string          `json:"host"`
	Port     json.RawMessage `json:"port"`
	DBName   string          `json:"dbname"`
}

// databaseURL builds DATABASE_URL from the DB_* variables and, if DB_SECRET_ARN is set, the
// secret they name.
func (r Resolver) databaseURL(ctx context.Context, getenv func(string) string) (string, error) {
	var errs []error
	p := dsnParts{
		host:    getenv(VarDBHost),
		port:    getenv(VarDBPort),
		dbname:  getenv(VarDBName),
		user:    getenv(VarDBUser),
		sslmode: getenv(VarDBSSLMode),
	}
	var err error
	if p.iamAuth, err = parseBool(VarDBIAMAuth, getenv(VarDBIAMAuth)); err != nil {
		errs = append(errs, err)
	}
	if p.proxy, err = parseBool(VarDBProxy, getenv(VarDBProxy)); err != nil {
		errs = append(errs, err)
	}
	if arn := getenv(VarDBSecretARN); arn != "" {
		s, err := r.dbSecret(ctx, arn)
		if err != nil {
			return "", err
		}
		p.fromSecret(s, arn, &errs)
	} else if !p.iamAuth {
		errs = append(errs, fmt.Errorf("DB_HOST is set without DB_SECRET_ARN: set DB_SECRET_ARN for a password, or DB_IAM_AUTH=true"))
	}
	if p.host == "" {
		errs = append(errs, fmt.Errorf("database host unknown: the secret has no \"host\" and DB_HOST is not set"))
	}
	if p.user == "" {
		errs = append(errs, fmt.Errorf("database user unknown: set DB_USER or a secret with \"username\""))
	}
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	dsn, err := p.url()
	if err != nil {
		return "", err
	}
	return dsn, nil
}

func (r Resolver) dbSecret(ctx context.Context, arn string) (dbSecret, error) {
	out, err := r.SecretsManager.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(arn)})
	if err != nil {
		return dbSecret{}, fmt.Errorf("get secret %s (DB_SECRET_ARN): %w", arn, err)
	}
	if out.SecretString == nil {
		return dbSecret{}, fmt.Errorf("secret %s (DB_SECRET_ARN) has no SecretString: store the credentials as JSON text", arn)
	}
	var s dbSecret
	if err := json.Unmarshal([]byte(*out.SecretString), &s); err != nil {
		// json's errors quote types and offsets, never the input.
		return dbSecret{}, fmt.Errorf(`secret %s (DB_SECRET_ARN) is not RDS credentials JSON {"username","password","host","port","dbname"}: %w`, arn, err)
	}
	return s, nil
}

// fromSecret fills the parts the DB_* variables left empty. DB_HOST, DB_PORT and DB_NAME win
// over the secret (an RDS Proxy endpoint in front of the instance the secret names).
func (p *dsnParts) fromSecret(s dbSecret, arn string, errs *[]error) {
	missing := func(field string) {
		*errs = append(*errs, fmt.Errorf("secret %s (DB_SECRET_ARN) has no %q field", arn, field))
	}
	if s.Username == "" {
		if p.user == "" {
			missing("username")
		}
	} else if p.user == "" {
		p.user = s.Username
	}
	if !p.iamAuth {
		if s.Password == "" {
			missing("password")
		}
		p.password = s.Password
	}
	if p.host == "" {
		if s.Host == "" {
			*errs = append(*errs, fmt.Errorf("secret %s (DB_SECRET_ARN) has no \"host\" field and DB_HOST is not set (an RDS-managed secret holds only username and password)", arn))
		}
		p.host = s.Host
	}
	if p.port == "" && len(s.Port) > 0 && string(s.Port) != "null" {
		var n json.Number
		var str string
		switch {
		case json.Unmarshal(s.Port, &n) == nil:
			p.port = n.String()
		case json.Unmarshal(s.Port, &str) == nil:
			p.port = str
		default:
			*errs = append(*errs, fmt.Errorf("secret %s (DB_SECRET_ARN) field \"port\" must be a number", arn))
		}
	}
	if p.dbname == "" {
		p.dbname = s.DBName
	}
}

func (r Resolver) parameters(ctx context.Context, names, vars []string) (map[string]string, error) {
	out, err := r.SSM.GetParameters(ctx, &ssm.GetParametersInput{Names: names, WithDecryption: aws.Bool(true)})
	if err != nil {
		return nil, fmt.Errorf("get SSM parameters %s: %w", strings.Join(names, ", "), err)
	}
	values := make(map[string]string, len(out.Parameters))
	for _, p := range out.Parameters {
		if p.Name != nil && p.Value != nil {
			values[*p.Name] = *p.Value
		}
	}
	var errs []error
	for i, name := range names {
		switch v, ok := values[name]; {
		case slices.Contains(out.InvalidParameters, name) || !ok:
			errs = append(errs, fmt.Errorf("SSM parameter %s (%s) does not exist or is not readable", name, vars[i]+paramSuffix))
		case strings.TrimSpace(v) == "":
			errs = append(errs, fmt.Errorf("SSM parameter %s (%s) is empty", name, vars[i]+paramSuffix))
		default:
			values[name] = strings.TrimSpace(v)
		}
	}
	return values, errors.Join(errs...)
}

func parseBool(name, v string) (bool, error) {
	switch strings.ToLower(v) {
	case "", "false", "0", "no":
		return false, nil
	case "true", "1", "yes":
		return true, nil
	}
	return false, fmt.Errorf("%s %q must be true or false", name, v)
}
