package tmpdeps

import (
	_ "github.com/aws/aws-lambda-go/lambda"
	_ "github.com/aws/aws-lambda-go/events"
	_ "github.com/aws/aws-sdk-go-v2/config"
	_ "github.com/aws/aws-sdk-go-v2/feature/rds/auth"
	_ "github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	_ "github.com/aws/aws-sdk-go-v2/service/ssm"
	_ "github.com/golang-jwt/jwt/v5"
	_ "github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/pressly/goose/v3"
	_ "github.com/upstash/qstash-go"
	_ "gopkg.in/yaml.v3"
)
