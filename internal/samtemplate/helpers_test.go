package samtemplate_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/awsenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig"
	"github.com/outbox-relay/outbox-relay/v3/internal/envconfig/relayenv"
	"github.com/outbox-relay/outbox-relay/v3/internal/lambdatest"
	"github.com/outbox-relay/outbox-relay/v3/internal/samtemplate"
	"github.com/outbox-relay/outbox-relay/v3/internal/telemetry"
)

const modulePath = "github.com/outbox-relay/outbox-relay/v3"

// functionIDs are the template's functions, by logical id.
var functionIDs = []string{"RelayFunction", "WebhookFunction", "FailureFunction"}

// localOnly are variables a main reads that must not be set in Lambda: LISTEN_ADDR switches
// the receivers from Lambda to a plain HTTP server (local stack); AWS_LAMBDA_FUNCTION_TIMEOUT
// is set by the emulator and sam local, AWS_LAMBDA_FUNCTION_MEMORY_SIZE by Lambda itself
// (Lambda reserves AWS_LAMBDA_* names).
var localOnly = map[string]bool{"LISTEN_ADDR": true, "AWS_LAMBDA_FUNCTION_TIMEOUT": true, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": true}

var rootOnce = sync.OnceValues(lambdatest.ModuleRoot)

func root(t *testing.T) string {
	t.Helper()
	r, err := rootOnce()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func loadTemplate(t *testing.T) *samtemplate.Template {
	t.Helper()
	tpl, err := samtemplate.Load(filepath.Join(root(t), "template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

var pkgRe = regexp.MustCompile(`\./functions/[a-z0-9_]+`)

// buildPackage returns the package `make build-<id>` compiles, from make's dry run.
func buildPackage(t *testing.T, id string) string {
	t.Helper()
	cmd := exec.Command("make", "-n", "--no-print-directory", "build-"+id, "ARTIFACTS_DIR=/nonexistent")
	cmd.Dir = root(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build-%s: %v\n%s", id, err, out)
	}
	m := pkgRe.FindAllString(string(out), -1)
	if len(m) != 1 || !strings.Contains(string(out), "go build") {
		t.Fatalf("make build-%s does not go build exactly one ./functions/ package:\n%s", id, out)
	}
	return m[0]
}

// scanGo adds the imports and the getenv("X") literals of dir's non-test files.
func scanGo(t *testing.T, dir string, vars, imports map[string]bool) {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(root(t), dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s (%v)", dir, err)
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			imports[p] = true
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			var name string
			switch fn := call.Fun.(type) {
			case *ast.Ident:
				name = fn.Name
			case *ast.SelectorExpr:
				name = fn.Sel.Name
			}
			if name != "getenv" && name != "Getenv" {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				v, _ := strconv.Unquote(lit.Value)
				vars[v] = true
			}
			return true
		})
	}
}

// codeVariables returns the environment variables the main package in dir reads: every
// getenv("X") / os.Getenv("X") in its non-test files (and in internal/relayfunc's, which is
// the relay's cold start, when it imports it), what its envconfig reader reads
// (relayenv.Read for the relay, ReadWebhook, ReadFailure) if it imports envconfig, the
// OTEL_* variables the template passes (telemetry.Variables) if it imports telemetry, and,
// for variables awsenv can resolve, their references if it imports awsenv. imports
// reports which of those packages it uses.
func codeVariables(t *testing.T, dir string) (vars map[string]bool, imports map[string]bool) {
	t.Helper()
	vars, imports = map[string]bool{}, map[string]bool{}
	scanGo(t, dir, vars, imports)
	if imports[modulePath+"/internal/relayfunc"] {
		scanGo(t, "internal/relayfunc", vars, imports)
	}
	if imports[modulePath+"/internal/receiverfunc"] {
		// The receivers' shared cold start resolves secrets and sets up tracing for them.
		imports[modulePath+"/internal/awsenv"], imports[modulePath+"/internal/telemetry"] = true, true
	}
	if imports[modulePath+"/internal/envconfig"] || imports[modulePath+"/internal/envconfig/relayenv"] {
		record := func(k string) string { vars[k] = true; return "" }
		switch filepath.Base(dir) {
		case "relay":
			_, _ = relayenv.Read(record)
		case "webhook":
			_, _ = envconfig.ReadWebhook(1)(record)
		case "failure":
			_, _ = envconfig.ReadFailure(1)(record)
		default:
			t.Fatalf("%s imports envconfig but has no reader here", dir)
		}
	}
	if imports[modulePath+"/internal/telemetry"] {
		// telemetry.Setup and the OpenTelemetry SDK read these; the main never names them.
		for _, v := range telemetry.Variables {
			vars[v] = true
		}
	}
	if imports[modulePath+"/internal/awsenv"] {
		for v := range maps(vars) {
			for _, ref := range awsenv.References[v] {
				vars[ref] = true
			}
		}
	}
	return vars, imports
}

// maps returns a copy, so callers can add to the original while ranging.
func maps(m map[string]bool) map[string]bool {
	c := make(map[string]bool, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// refs returns the names an expression refers to: Ref targets, GetAtt resources and ${X}
// in Sub strings.
func refs(v any) []string {
	var out []string
	samtemplate.Walk(v, func(x any) {
		m := samtemplate.Map(x)
		if r, ok := m["Ref"].(string); ok {
			out = append(out, r)
		}
		if ga, ok := m["Fn::GetAtt"].([]any); ok && len(ga) == 2 {
			s, _ := ga[0].(string)
			a, _ := ga[1].(string)
			out = append(out, s+"."+a)
		}
		sub := m["Fn::Sub"]
		if l, ok := sub.([]any); ok && len(l) > 0 {
			sub = l[0]
		}
		if s, ok := sub.(string); ok {
			for _, mm := range subVar.FindAllStringSubmatch(s, -1) {
				out = append(out, mm[1])
			}
		}
	})
	return out
}

var subVar = regexp.MustCompile(`\$\{([A-Za-z0-9_:.]+)\}`)

func readFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
