package samtemplate_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/metrics"
	"github.com/outbox-relay/outbox-relay/v3/internal/samtemplate"
	"github.com/outbox-relay/outbox-relay/v3/pkg/deadletter"
	"github.com/outbox-relay/outbox-relay/v3/pkg/qstash"
	"github.com/outbox-relay/outbox-relay/v3/pkg/relay"
	"github.com/outbox-relay/outbox-relay/v3/pkg/webhook"
)

func TestParseShortTags(t *testing.T) {
	t.Parallel()
	tpl, err := samtemplate.Parse([]byte(`
Resources:
  R:
    Type: X
    Properties:
      A: !Ref P
      B: !GetAtt Fn.Url
      C: !Sub "${P}/x"
      D: !If [Cond, !Ref AWS::NoValue, [1, 2]]
      E: !Join ["", !Ref L]
      F: !GetAtt [Fn, Arn]
`))
	if err != nil {
		t.Fatal(err)
	}
	got := tpl.Resources["R"].Properties
	want := map[string]any{
		"A": map[string]any{"Ref": "P"},
		"B": map[string]any{"Fn::GetAtt": []any{"Fn", "Url"}},
		"C": map[string]any{"Fn::Sub": "${P}/x"},
		"D": map[string]any{"Fn::If": []any{"Cond", map[string]any{"Ref": "AWS::NoValue"}, []any{1, 2}}},
		"E": map[string]any{"Fn::Join": []any{"", map[string]any{"Ref": "L"}}},
		"F": map[string]any{"Fn::GetAtt": []any{"Fn", "Arn"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v\nwant %#v", got, want)
	}
	if _, err := samtemplate.Parse([]byte("A: !Bogus x\n")); err == nil {
		t.Error("unknown tag accepted")
	}
}

func TestTemplateFunctions(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	if tpl.Transform != "AWS::Serverless-2016-10-31" {
		t.Errorf("Transform = %v", tpl.Transform)
	}
	fns := tpl.Functions()
	if got := sortedKeys(fns); !slices.Equal(got, []string{"FailureFunction", "RelayFunction", "WebhookFunction"}) {
		t.Fatalf("functions %v", got)
	}
	for id, fn := range fns {
		p := fn.Properties
		if p["Runtime"] != "provided.al2023" || p["Handler"] != "bootstrap" || p["CodeUri"] != "." ||
			!reflect.DeepEqual(p["Architectures"], []any{"arm64"}) {
			t.Errorf("%s: Runtime %v Handler %v CodeUri %v Architectures %v", id, p["Runtime"], p["Handler"], p["CodeUri"], p["Architectures"])
		}
		if fn.Metadata["BuildMethod"] != "makefile" {
			t.Errorf("%s: BuildMethod %v, want makefile", id, fn.Metadata["BuildMethod"])
		}
		// sam build runs make build-<LogicalId>; each must build its own main.
		pkg := buildPackage(t, id)
		want := "./functions/" + strings.ToLower(strings.TrimSuffix(id, "Function"))
		if pkg != want {
			t.Errorf("make build-%s builds %s, want %s", id, pkg, want)
		}
		if samtemplate.Get(p, "LoggingConfig", "LogFormat") != "JSON" {
			t.Errorf("%s: LogFormat %v", id, samtemplate.Get(p, "LoggingConfig", "LogFormat"))
		}
		lg := refs(samtemplate.Get(p, "LoggingConfig", "LogGroup"))
		if len(lg) != 1 || tpl.Resources[lg[0]].Type != "AWS::Logs::LogGroup" || tpl.Resources[lg[0]].Properties["RetentionInDays"] == nil {
			t.Errorf("%s: LogGroup %v is not a log group of this stack with a retention", id, lg)
		}
		for _, k := range []string{"Timeout", "MemorySize"} {
			if r := refs(p[k]); len(r) != 1 || tpl.Parameters[r[0]] == nil {
				t.Errorf("%s: %s is not a parameter: %v", id, k, p[k])
			}
		}
	}

	relay := fns["RelayFunction"].Properties
	if r := refs(relay["ReservedConcurrentExecutions"]); len(r) != 1 || tpl.Parameters[r[0]] == nil {
		t.Errorf("relay ReservedConcurrentExecutions %v is not a parameter", relay["ReservedConcurrentExecutions"])
	}
	if timeout := toInt(defaultOf(t, tpl, relay["Timeout"])); timeout >= 60 {
		t.Errorf("relay Timeout default %v: must stay below the one-minute schedule", timeout)
	}
	eic := samtemplate.Map(relay["EventInvokeConfig"])
	if eic["MaximumRetryAttempts"] != 0 || toInt(eic["MaximumEventAgeInSeconds"]) < 60 || toInt(eic["MaximumEventAgeInSeconds"]) > 120 {
		t.Errorf("relay EventInvokeConfig %v: want no retries and a 60-120 s event age", eic)
	}
	// The three schedules deliver exactly the sample events' payloads.
	inputs := map[string]string{}
	for name, ev := range samtemplate.Map(relay["Events"]) {
		typ := samtemplate.Get(ev, "Type")
		if typ != "ScheduleV2" && typ != "Schedule" {
			t.Errorf("relay event %s is %v", name, typ)
			continue
		}
		in, _ := samtemplate.Get(ev, "Properties", "Input").(string)
		inputs[canonicalJSON(t, []byte(in))] = name
		if rp := samtemplate.Map(samtemplate.Get(ev, "Properties", "RetryPolicy")); rp["MaximumRetryAttempts"] != 0 {
			t.Errorf("relay event %s RetryPolicy %v: want no retries (the next tick replaces a missed one)", name, rp)
		}
		if r := refs(samtemplate.Get(ev, "Properties", "ScheduleExpression")); len(r) != 1 || tpl.Parameters[r[0]] == nil {
			t.Errorf("relay event %s schedule is not a parameter", name)
		}
	}
	for _, f := range []string{"events/schedule.json", "events/retention.json", "events/dlq-sync.json"} {
		if _, ok := inputs[canonicalJSON(t, readFile(t, f))]; !ok {
			t.Errorf("no relay schedule has Input %s (have %v)", f, inputs)
		}
	}
	if len(inputs) != 3 {
		t.Errorf("relay schedules %v, want drain, retention and dlq-sync", inputs)
	}
	if d := defaultOf(t, tpl, samtemplate.Get(relay, "Events", "Drain", "Properties", "ScheduleExpression")); d != "rate(1 minute)" {
		t.Errorf("drain schedule default %v", d)
	}

	for _, id := range []string{"WebhookFunction", "FailureFunction"} {
		u := samtemplate.Map(fns[id].Properties["FunctionUrlConfig"])
		if u["AuthType"] != "NONE" || u["InvokeMode"] != "BUFFERED" {
			t.Errorf("%s FunctionUrlConfig %v: want AuthType NONE, BUFFERED", id, u)
		}
		// A receiver referencing its own URL, or the relay, would be a dependency cycle.
		for _, r := range refs(fns[id].Properties) {
			if strings.HasPrefix(r, id+"Url") || strings.HasPrefix(r, "RelayFunction") {
				t.Errorf("%s refers to %s: cycle", id, r)
			}
		}
	}
	for v, url := range map[string]string{"PUBLIC_BASE_URL": "WebhookFunctionUrl.FunctionUrl", "FAILURE_CALLBACK_URL": "FailureFunctionUrl.FunctionUrl"} {
		if !slices.Contains(refs(samtemplate.Get(relay, "Environment", "Variables", v)), url) {
			t.Errorf("relay %s does not use !GetAtt %s", v, url)
		}
	}
}

// TestTemplateSetsEveryVariableTheCodeReads derives each function's variables from its
// main package (and envconfig / awsenv), so a variable added to the code without the
// template fails here; and the reverse, so a misspelt template variable fails too.
func TestTemplateSetsEveryVariableTheCodeReads(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	for id, fn := range tpl.Functions() {
		dir := strings.TrimPrefix(buildPackage(t, id), "./")
		read, imports := codeVariables(t, dir)
		if !imports[modulePath+"/internal/awsenv"] {
			t.Errorf("%s (%s) does not import internal/awsenv: its secrets would never be resolved", id, dir)
		}
		set := samtemplate.Map(samtemplate.Get(fn.Properties, "Environment", "Variables"))
		for _, v := range sortedKeys(read) {
			_, ok := set[v]
			switch {
			case localOnly[v] && ok:
				t.Errorf("%s: %s is local-only and must not be set in Lambda", id, v)
			case !localOnly[v] && !ok:
				t.Errorf("%s: %s reads %s, the template does not set it", id, dir, v)
			}
		}
		for _, v := range sortedKeys(set) {
			if !read[v] {
				t.Errorf("%s: the template sets %s, which %s never reads", id, v, dir)
			}
		}
	}
}

// TestTemplateGrantsExactlyTheSecretsTheCodeReads: the execution role may read exactly the
// secret and the parameters its variables name, and nothing with a wildcard.
func TestTemplateGrantsExactlyTheSecretsTheCodeReads(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	for id, fn := range tpl.Functions() {
		env := samtemplate.Map(samtemplate.Get(fn.Properties, "Environment", "Variables"))
		want := map[string]string{} // "action resource" -> condition ("" = always)
		for k, v := range env {
			r := refs(v)
			switch {
			case strings.HasSuffix(k, "_PARAM"):
				if len(r) != 1 || tpl.Parameters[r[0]] == nil {
					t.Fatalf("%s: %s is not a template parameter", id, k)
				}
				want["ssm:GetParameters arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter${"+r[0]+"}"] = ""
			case k == "DB_SECRET_ARN":
				want["secretsmanager:GetSecretValue {Ref:"+r[0]+"}"] = "HasDbSecret"
			}
		}
		want["kms:Decrypt {Ref:KmsKeyArn}"] = "HasKmsKey"
		want["rds-db:connect arn:${AWS::Partition}:rds-db:${AWS::Region}:${AWS::AccountId}:dbuser:${DbResourceId}/${DbUser}"] = "UseIamAuth"

		got := map[string]string{}
		policies, _ := fn.Properties["Policies"].([]any)
		if len(policies) == 0 {
			t.Errorf("%s: no Policies", id)
		}
		for _, pol := range policies {
			stmts, ok := samtemplate.Get(pol, "Statement").([]any)
			if !ok {
				t.Errorf("%s: policy %v is not an inline statement list (SAM policy templates and managed policies are broader)", id, pol)
				continue
			}
			for _, s := range stmts {
				cond := ""
				if ifs, ok := samtemplate.Map(s)["Fn::If"].([]any); ok && len(ifs) == 3 {
					cond, _ = ifs[0].(string)
					if !reflect.DeepEqual(ifs[2], map[string]any{"Ref": "AWS::NoValue"}) {
						t.Errorf("%s: conditional statement %v grants something when %s is false", id, s, cond)
					}
					if tpl.Conditions[cond] == nil {
						t.Errorf("%s: unknown condition %s", id, cond)
					}
					s = ifs[1]
				}
				st := samtemplate.Map(s)
				if st["Effect"] != "Allow" {
					t.Errorf("%s: statement %v", id, st)
				}
				action, ok := st["Action"].(string)
				if !ok || strings.Contains(action, "*") {
					t.Errorf("%s: Action %v must be one action, no wildcard", id, st["Action"])
				}
				res := st["Resource"]
				list, ok := res.([]any)
				if !ok {
					list = []any{res}
				}
				for _, r := range list {
					rs := resourceString(r)
					if strings.Contains(rs, "*") {
						t.Errorf("%s: %s on %s: wildcard resource", id, action, rs)
					}
					got[action+" "+rs] = cond
				}
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s grants\n  %v\nwant\n  %v", id, fmtGrants(got), fmtGrants(want))
		}
	}
}

func resourceString(r any) string {
	m := samtemplate.Map(r)
	if s, ok := m["Fn::Sub"].(string); ok {
		return s
	}
	if ref, ok := m["Ref"].(string); ok {
		return "{Ref:" + ref + "}"
	}
	return fmt.Sprint(r)
}

func fmtGrants(m map[string]string) string {
	var b strings.Builder
	for _, k := range sortedKeys(m) {
		fmt.Fprintf(&b, "\n  %s [%s]", k, m[k])
	}
	return b.String()
}

// TestTemplateAlarmsWatchEmittedMetrics holds every alarm and dashboard metric to
// internal/metrics' definitions: name, namespace and Function dimension.
func TestTemplateAlarmsWatchEmittedMetrics(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	if d := tpl.Parameters["MetricsNamespace"]["Default"]; d != metrics.DefaultNamespace {
		t.Errorf("MetricsNamespace default %v, want %s", d, metrics.DefaultNamespace)
	}
	fns := tpl.Functions()
	type alarm struct{ metric, function, stat string }
	var found []alarm
	lambdaErrors := map[string]bool{}
	url5xx := map[string]bool{}
	for id, r := range tpl.Resources {
		if r.Type != "AWS::CloudWatch::Alarm" {
			continue
		}
		p := r.Properties
		// A metric-math alarm (Metrics) watches each of its MetricStats: each is held to
		// the same rules as a single-metric alarm, with its Stat as the Statistic.
		watched := []map[string]any{p}
		if ms, ok := p["Metrics"].([]any); ok {
			watched = nil
			for _, m := range ms {
				stat := samtemplate.Map(samtemplate.Map(m)["MetricStat"])
				if stat == nil {
					continue
				}
				w := map[string]any{}
				for k, v := range p {
					w[k] = v
				}
				for k, v := range samtemplate.Map(stat["Metric"]) {
					w[k] = v
				}
				w["Statistic"] = stat["Stat"]
				watched = append(watched, w)
			}
		}
		for _, p := range watched {
			dims, _ := p["Dimensions"].([]any)
			if len(dims) != 1 {
				t.Errorf("%s: Dimensions %v: must be exactly one emitted dimension set", id, dims)
				continue
			}
			name, _ := samtemplate.Get(dims[0], "Name").(string)
			value := samtemplate.Get(dims[0], "Value")
			metric, _ := p["MetricName"].(string)
			if p["Namespace"] == "AWS/Lambda" {
				if (metric != "Errors" && metric != "Url5xxCount") || name != "FunctionName" {
					t.Errorf("%s: AWS/Lambda %s by %s", id, metric, name)
				}
				if r := refs(value); len(r) == 1 && fns[r[0]].Type != "" {
					if metric == "Errors" {
						lambdaErrors[r[0]] = true
					} else {
						url5xx[r[0]] = true
					}
				}
				if p["Statistic"] != "Sum" || toInt(p["Threshold"]) != 0 || p["ComparisonOperator"] != "GreaterThanThreshold" {
					t.Errorf("%s: want any %s > 0 (Sum)", id, metric)
				}
			} else {
				if r := refs(p["Namespace"]); len(r) != 1 || r[0] != "MetricsNamespace" {
					t.Errorf("%s: Namespace %v, want !Ref MetricsNamespace", id, p["Namespace"])
				}
				def, ok := metrics.Lookup(metric)
				if !ok {
					t.Errorf("%s: metric %q is not emitted by the code (internal/metrics)", id, metric)
				} else if name != metrics.DimFunction || value != def.Function {
					t.Errorf("%s: %s dimension %s=%v, the code emits Function=%s", id, metric, name, value, def.Function)
				}
				found = append(found, alarm{metric, fmt.Sprint(value), fmt.Sprint(p["Statistic"])})
				if metric == metrics.OldestPendingAgeSeconds {
					if p["Statistic"] != "Maximum" || toInt(p["DatapointsToAlarm"]) >= toInt(p["EvaluationPeriods"]) || p["TreatMissingData"] != "breaching" {
						t.Errorf("%s: want Maximum, M-of-N (M < N), missing data breaching: %v", id, p)
					}
				} else if toInt(p["Threshold"]) != 0 || p["ComparisonOperator"] != "GreaterThanThreshold" {
					t.Errorf("%s: want any %s > 0", id, metric)
				}
			}
		}
		for _, k := range []string{"AlarmActions", "OKActions"} {
			ifs, ok := samtemplate.Map(p[k])["Fn::If"].([]any)
			if !ok || ifs[0] != "HasAlarmTopic" || !reflect.DeepEqual(ifs[1], []any{map[string]any{"Ref": "AlarmTopicArn"}}) {
				t.Errorf("%s: %s %v, want !If [HasAlarmTopic, [!Ref AlarmTopicArn], NoValue]", id, k, p[k])
			}
		}
	}
	for _, want := range []alarm{
		{metrics.OldestPendingAgeSeconds, metrics.FunctionRelay, "Maximum"},
		{metrics.DeadLettered, metrics.FunctionRelay, "Sum"},
		{metrics.DeferredDeployment, metrics.FunctionRelay, "Sum"},
		{metrics.DeferredOutage, metrics.FunctionRelay, "Sum"},
		{metrics.DeliveryDeadLetters, metrics.FunctionFailure, "Sum"},
		{metrics.DeliveriesRescheduled, metrics.FunctionFailure, "Sum"},
		{metrics.OpenCircuits, metrics.FunctionRelay, "Maximum"},
		{metrics.DLQSyncRecorded, metrics.FunctionRelay, "Sum"},
		{metrics.RejectedDeliveries, metrics.FunctionWebhook, "Sum"},
		{metrics.RejectedCallbacks, metrics.FunctionFailure, "Sum"},
	} {
		if !slices.Contains(found, want) {
			t.Errorf("no alarm on %v", want)
		}
	}
	for _, id := range functionIDs {
		if !lambdaErrors[id] {
			t.Errorf("no AWS/Lambda Errors alarm for %s", id)
		}
	}
	// The receivers answer through Function URLs: their 5xx (a database or secret they
	// cannot reach) are HTTP statuses, not Lambda errors.
	for _, id := range []string{"WebhookFunction", "FailureFunction"} {
		if !url5xx[id] {
			t.Errorf("no AWS/Lambda Url5xxCount alarm for %s", id)
		}
	}
	// Every alarm has a runbook line in docs/deploy.md.
	runbook, err := os.ReadFile(filepath.Join(root(t), "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	for id, r := range tpl.Resources {
		if r.Type != "AWS::CloudWatch::Alarm" {
			continue
		}
		suffix, _ := samtemplate.Get(r.Properties, "AlarmName", "Fn::Sub").(string)
		suffix = strings.TrimPrefix(suffix, "${AWS::StackName}")
		if suffix == "" || !strings.Contains(string(runbook), "`<stack>"+suffix+"`") {
			t.Errorf("%s: alarm name ...%s has no runbook line in docs/deploy.md (name it as `<stack>%s`)", id, suffix, suffix)
		}
	}
	if c := tpl.Conditions["HasAlarmTopic"]; c == nil {
		t.Error("no HasAlarmTopic condition")
	}

	// Dashboard: the body is valid JSON once substituted, and every custom metric exists.
	var dash samtemplate.Resource
	for _, r := range tpl.Resources {
		if r.Type == "AWS::CloudWatch::Dashboard" {
			dash = r
		}
	}
	body, _ := samtemplate.Map(dash.Properties["DashboardBody"])["Fn::Sub"].(string)
	body = subVar.ReplaceAllStringFunc(body, func(s string) string {
		if s == "${OldestPendingAgeThreshold}" {
			return "300"
		}
		if s == "${MetricsNamespace}" {
			return metrics.DefaultNamespace
		}
		return "x"
	})
	var d struct {
		Widgets []struct {
			Properties struct {
				Metrics [][]any `json:"metrics"`
			} `json:"properties"`
		} `json:"widgets"`
	}
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("dashboard body is not JSON: %v", err)
	}
	shown := map[string]bool{}
	for _, w := range d.Widgets {
		for _, m := range w.Properties.Metrics {
			if len(m) < 4 || m[0] == "AWS/Lambda" {
				continue
			}
			name, _ := m[1].(string)
			def, ok := metrics.Lookup(name)
			if !ok || m[0] != metrics.DefaultNamespace || m[2] != metrics.DimFunction || m[3] != def.Function {
				t.Errorf("dashboard metric %v: not what the code emits", m)
			}
			shown[name] = true
		}
	}
	for _, m := range []string{metrics.BacklogPending, metrics.OldestPendingAgeSeconds, metrics.Dispatched, metrics.DeadLettered,
		metrics.DeliveryDeadLetters, metrics.DLQSyncRecorded, metrics.Processed, metrics.Duplicate, metrics.PermanentFailure, metrics.TransientFailure} {
		if !shown[m] {
			t.Errorf("dashboard does not show %s", m)
		}
	}
}

// TestTemplateReferencesResolve catches misspelt Ref, GetAtt and ${} targets and
// conditions, and checks the outputs.
func TestTemplateReferencesResolve(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	known := func(name string) bool {
		base, _, _ := strings.Cut(name, ".")
		if strings.HasPrefix(name, "AWS::") || tpl.Parameters[name] != nil {
			return true
		}
		if _, ok := tpl.Resources[base]; ok {
			return true
		}
		// SAM generates <Function>Url for FunctionUrlConfig.
		_, ok := tpl.Functions()[strings.TrimSuffix(base, "Url")]
		return ok && strings.HasSuffix(base, "Url")
	}
	all := []any{tpl.Globals, tpl.Conditions}
	for _, o := range tpl.Outputs {
		all = append(all, o)
	}
	for _, r := range tpl.Resources {
		all = append(all, r.Properties)
	}
	for _, name := range refs(all) {
		if !known(name) {
			t.Errorf("reference to unknown %q", name)
		}
	}
	samtemplate.Walk(all, func(x any) {
		if ifs, ok := samtemplate.Map(x)["Fn::If"].([]any); ok {
			if c, _ := ifs[0].(string); tpl.Conditions[c] == nil {
				t.Errorf("unknown condition %q", c)
			}
		}
	})
	for name, want := range map[string]string{"WebhookUrl": "WebhookFunctionUrl.FunctionUrl", "FailureCallbackUrl": "FailureFunctionUrl.FunctionUrl"} {
		if r := refs(tpl.Outputs[name]["Value"]); !slices.Contains(r, want) {
			t.Errorf("output %s = %v, want !GetAtt %s", name, tpl.Outputs[name]["Value"], want)
		}
	}
	if s, _ := samtemplate.Map(tpl.Outputs["DashboardUrl"]["Value"])["Fn::Sub"].(string); !strings.Contains(s, "#dashboards:name=${Dashboard}") {
		t.Errorf("DashboardUrl output %q", s)
	}
}

// TestEnvFileMatchesTemplate: sam local applies only variables the template declares, so
// a misspelt or undeclared key in the env file would silently do nothing.
func TestEnvFileMatchesTemplate(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	var env map[string]map[string]string
	if err := json.Unmarshal(readFile(t, "env.example.json"), &env); err != nil {
		t.Fatalf("env.example.json: %v", err)
	}
	fns := tpl.Functions()
	for block, vars := range env {
		for k, v := range vars {
			declared := 0
			for id, fn := range fns {
				if block != "Parameters" && block != id {
					continue
				}
				if _, ok := samtemplate.Map(samtemplate.Get(fn.Properties, "Environment", "Variables"))[k]; ok {
					declared++
				}
			}
			if declared == 0 {
				t.Errorf("env.example.json %s.%s is not declared by the template (block must be Parameters or a function id)", block, k)
			}
			switch k {
			case "QSTASH_CURRENT_SIGNING_KEY":
				if v != qstash.DevCurrentSigningKey {
					t.Errorf("%s.%s is not the dev key sign-event signs with", block, k)
				}
			case "QSTASH_NEXT_SIGNING_KEY":
				if v != qstash.DevNextSigningKey {
					t.Errorf("%s.%s is not the dev next key", block, k)
				}
			case "QSTASH_TOKEN":
				if v != qstash.DevToken {
					t.Errorf("%s.%s is not the local QStash token", block, k)
				}
			}
		}
	}
	cfg := string(readFile(t, "samconfig.toml"))
	for _, want := range []string{"version = 0.1", "[default.build.parameters]", "[default.deploy.parameters]", "resolve_s3 = true",
		`capabilities = "CAPABILITY_IAM"`, "confirm_changeset = true", "parameter_overrides", "[default.local_invoke.parameters]", `env_vars = "env.example.json"`} {
		if !strings.Contains(cfg, want) {
			t.Errorf("samconfig.toml lacks %q", want)
		}
	}
}

func defaultOf(t *testing.T, tpl *samtemplate.Template, v any) any {
	t.Helper()
	r := refs(v)
	if len(r) != 1 || tpl.Parameters[r[0]] == nil {
		t.Fatalf("%v is not a parameter reference", v)
	}
	return tpl.Parameters[r[0]]["Default"]
}

// TestTemplateRelayDefaultsAreTheLibrarys: the stack deploys the relay with the library's
// defaults, the setting the backlog benchmark measures as "the template's defaults".
func TestTemplateRelayDefaultsAreTheLibrarys(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	for name, want := range map[string]int{"BatchSize": relay.DefaultBatchSize, "PublishConcurrency": relay.DefaultPublishConcurrency} {
		if got := toInt(tpl.Parameters[name]["Default"]); got != want {
			t.Errorf("%s default %d, want the library's %d", name, got, want)
		}
	}
}

func toInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case float64:
		return int(n)
	}
	return -1
}

func canonicalJSON(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("invalid JSON %q: %v", b, err)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// TestTemplatePayloadLimitIsShared: one parameter bounds the payload for the relay and the
// webhook, so the relay never publishes what the webhook would refuse (it dead-letters it,
// saying why). Its default fits every plan and the webhook library's own limit; at its
// largest, the failure callback that carries the payload base64-encoded (plus at most
// 64 KiB of the callback's own fields) still fits the failure function's limit.
func TestTemplatePayloadLimitIsShared(t *testing.T) {
	t.Parallel()
	tpl := loadTemplate(t)
	fns := tpl.Functions()
	ref := map[string]any{"Ref": "MaxPayloadBytes"}
	for fn, v := range map[string]string{"RelayFunction": "QSTASH_MAX_MESSAGE_BYTES", "WebhookFunction": "MAX_BODY_BYTES"} {
		if got := samtemplate.Get(fns[fn].Properties, "Environment", "Variables", v); !reflect.DeepEqual(got, ref) {
			t.Errorf("%s %s = %v, want %v", fn, v, got, ref)
		}
	}
	free, err := qstash.PlanFree.Limits()
	if err != nil {
		t.Fatal(err)
	}
	def, most := int64(toInt(tpl.Parameters["MaxPayloadBytes"]["Default"])), int64(toInt(tpl.Parameters["MaxPayloadBytes"]["MaxValue"]))
	if def < 1 || def > free.MaxMessageBytes || def > webhook.DefaultMaxBodyBytes {
		t.Errorf("MaxPayloadBytes default %d: want at most the free plan's %d and the webhook's %d", def, free.MaxMessageBytes, webhook.DefaultMaxBodyBytes)
	}
	if callback := 4*((most+2)/3) + 64<<10; most < def || callback > deadletter.DefaultCallbackMaxBodyBytes {
		t.Errorf("MaxPayloadBytes MaxValue %d: its failure callback (%d bytes) must fit the failure function's %d", most, callback, deadletter.DefaultCallbackMaxBodyBytes)
	}
}
