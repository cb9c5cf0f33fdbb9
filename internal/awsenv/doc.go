// Package awsenv prepares a Lambda function's environment at cold start: it resolves the
// secrets the function's configuration names (an RDS credentials secret in Secrets Manager,
// QStash credentials in SSM SecureString parameters) into the plain variables the code reads,
// and opens a pgx pool sized for Lambda, optionally behind RDS Proxy or PgBouncer and
// optionally authenticating with RDS IAM tokens.
//
// Resolve runs once, before the function's loadConfig, and returns a getenv that overlays
// the resolved values on the process environment:
//
//	DB_SECRET_ARN    Secrets Manager secret holding the database credentials as JSON:
//	                 {"username","password","host","port","dbname"} (the RDS rotation
//	                 shape). An RDS-managed master secret holds only username and password;
//	                 DB_HOST, DB_PORT and DB_NAME supply the rest.
//	DB_HOST          database or RDS Proxy endpoint; overrides the secret's host
//	DB_PORT          default 5432; overrides the secret's port
//	DB_NAME          overrides the secret's dbname (default: the secret's, else postgres)
//	DB_USER          with DB_IAM_AUTH and no secret: the database user
//	DB_SSLMODE       default require
//	DB_IAM_AUTH      true: authenticate with RDS IAM tokens instead of a password
//	DB_PROXY         true: the endpoint is RDS Proxy or PgBouncer (no server-side
//	                 prepared statements: default_query_exec_mode=exec)
//	  -> DATABASE_URL
//
//	QSTASH_TOKEN_PARAM                 SSM SecureString name -> QSTASH_TOKEN
//	QSTASH_CURRENT_SIGNING_KEY_PARAM   SSM SecureString name -> QSTASH_CURRENT_SIGNING_KEY
//	QSTASH_NEXT_SIGNING_KEY_PARAM      SSM SecureString name -> QSTASH_NEXT_SIGNING_KEY
//
// A variable and its reference must not both be set (DATABASE_URL and DB_SECRET_ARN, or
// QSTASH_TOKEN and QSTASH_TOKEN_PARAM): which one wins would be a guess. With no reference
// set Resolve makes no AWS call and loads no AWS configuration, so local runs need none.
package awsenv
