package samtemplate_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/outbox-relay/outbox-relay/v3/internal/prereq"
	"github.com/outbox-relay/outbox-relay/v3/internal/samtemplate"
)

// translateScript runs AWS's SAM translator (aws-sam-translator, which cfn-lint brings) over
// the template as `sam deploy` has CloudFormation do it, with CodeUri already uploaded.
const translateScript = `
import json, sys
from samtranslator.translator.translator import Translator
from samtranslator.parser import parser
from samtranslator.yaml_helper import yaml_parse
t = yaml_parse(open(sys.argv[1]).read())
t["Globals"]["Function"]["CodeUri"] = "s3://bucket/key"
out = Translator(managed_policy_map={}, sam_parser=parser.Parser()).translate(sam_template=t, parameter_values={})
json.dump(out, sys.stdout)
`

// errNoTranslator: python3 or aws-sam-translator is missing (a prerequisite, not a failure).
var errNoTranslator = errors.New("the SAM translator test needs python3 with aws-sam-translator (pip install 'cfn-lint==1.51.*')")

// translation runs the translator once for every test that reads its output.
var translation = sync.OnceValues(func() (map[string]any, error) {
	py, err := exec.LookPath("python3")
	if err != nil {
		return nil, errNoTranslator
	}
	if exec.Command(py, "-c", "import samtranslator").Run() != nil {
		return nil, errNoTranslator
	}
	dir, err := rootOnce()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(py, "-c", translateScript, filepath.Join(dir, "template.yaml"))
	cmd.Env = append(os.Environ(), "AWS_DEFAULT_REGION=eu-west-1") // pseudo parameters need a region
	out, err := cmd.Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return nil, fmt.Errorf("SAM translator: %w\n%s", err, ee.Stderr)
	} else if err != nil {
		return nil, fmt.Errorf("SAM translator: %w", err)
	}
	var cfn map[string]any
	return cfn, json.Unmarshal(out, &cfn)
})

// translated returns the CloudFormation template the SAM translator makes of template.yaml.
func translated(t *testing.T) map[string]any {
	t.Helper()
	cfn, err := translation()
	if errors.Is(err, errNoTranslator) {
		prereq.Missing(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return cfn
}

// TestTranslatedTemplateDeploysTwiceAndTakesQStash checks what only the translation shows:
// no schedule carries a fixed name (SAM names one after its logical id unless OmitName is
// set, and names are unique per account and region, so a second stack, staging beside prod,
// would fail to create), and each Function URL lets anyone call it both ways AWS requires
// (lambda:InvokeFunctionUrl with auth type NONE, and since October 2025 lambda:InvokeFunction
// via the URL): QStash carries no AWS credentials.
func TestTranslatedTemplateDeploysTwiceAndTakesQStash(t *testing.T) {
	t.Parallel()
	resources := samtemplate.Map(translated(t)["Resources"])
	schedules := 0
	urlPerms := map[string]map[string]bool{}
	for id, r := range resources {
		res := samtemplate.Map(r)
		props := samtemplate.Map(res["Properties"])
		switch res["Type"] {
		case "AWS::Scheduler::Schedule":
			schedules++
			if name, ok := props["Name"]; ok {
				t.Errorf("schedule %s has the fixed name %v: a second stack in the account fails to create (OmitName: true)", id, name)
			}
		case "AWS::Lambda::Permission":
			fn, _ := samtemplate.Map(props["FunctionName"])["Ref"].(string)
			if props["Principal"] != "*" || fn == "" {
				continue
			}
			if urlPerms[fn] == nil {
				urlPerms[fn] = map[string]bool{}
			}
			switch {
			case props["Action"] == "lambda:InvokeFunctionUrl" && props["FunctionUrlAuthType"] == "NONE":
				urlPerms[fn]["url"] = true
			case props["Action"] == "lambda:InvokeFunction" && props["InvokedViaFunctionUrl"] == true:
				urlPerms[fn]["invoke"] = true
			}
		}
	}
	if schedules != 3 {
		t.Errorf("%d schedules, want the drain, retention and dlq-sync", schedules)
	}
	for _, fn := range []string{"WebhookFunction", "FailureFunction"} {
		if !urlPerms[fn]["url"] || !urlPerms[fn]["invoke"] {
			t.Errorf("%s: public Function URL permissions %v, want both InvokeFunctionUrl (NONE) and InvokeFunction via the URL", fn, urlPerms[fn])
		}
	}
}

// TestTranslatedTemplateGuardsIamAuthAndLogLevels: a stack whose IAM auth could not connect
// is refused at deploy (the rds-db:connect grant names DbUser and DbResourceId, so both must
// be set), and Lambda's JSON log filter lets DEBUG lines through when LogLevel is debug but
// never filters above INFO, where the EMF metric lines, which carry no level, would be
// dropped and every alarm on them go blind.
func TestTranslatedTemplateGuardsIamAuthAndLogLevels(t *testing.T) {
	t.Parallel()
	cfn := translated(t)
	rule := samtemplate.Map(samtemplate.Map(cfn["Rules"])["IamAuthNamesItsUser"])
	asserted := fmt.Sprint(rule["Assertions"])
	if fmt.Sprint(rule["RuleCondition"]) != "map[Fn::Equals:[map[Ref:DbIamAuth] true]]" ||
		!strings.Contains(asserted, "map[Ref:DbUser]") || !strings.Contains(asserted, "map[Ref:DbResourceId]") {
		t.Errorf("rule IamAuthNamesItsUser = %v, want DbUser and DbResourceId asserted when DbIamAuth is true", rule)
	}
	if c := fmt.Sprint(samtemplate.Map(cfn["Conditions"])["IsDebug"]); c != "map[Fn::Equals:[map[Ref:LogLevel] debug]]" {
		t.Errorf("condition IsDebug = %s", c)
	}
	for id, r := range samtemplate.Map(cfn["Resources"]) {
		res := samtemplate.Map(r)
		if res["Type"] != "AWS::Lambda::Function" {
			continue
		}
		lc := samtemplate.Map(samtemplate.Map(res["Properties"])["LoggingConfig"])
		if got := fmt.Sprint(lc["ApplicationLogLevel"]); lc["LogFormat"] != "JSON" || got != "map[Fn::If:[IsDebug DEBUG INFO]]" {
			t.Errorf("%s: LoggingConfig %v, want JSON with ApplicationLogLevel DEBUG if IsDebug, else INFO", id, lc)
		}
	}
}

// TestTranslatedTemplateRefusesAStackWithoutAPassword: without IAM auth the database
// password comes only from DbSecretArn, so a stack with neither is refused at deploy
// instead of failing every cold start.
func TestTranslatedTemplateRefusesAStackWithoutAPassword(t *testing.T) {
	t.Parallel()
	rule := samtemplate.Map(samtemplate.Map(translated(t)["Rules"])["PasswordNeedsASecret"])
	if fmt.Sprint(rule["RuleCondition"]) != "map[Fn::Equals:[map[Ref:DbIamAuth] false]]" ||
		fmt.Sprint(rule["Assertions"]) != "[map[Assert:map[Fn::Not:[map[Fn::Equals:[map[Ref:DbSecretArn] ]]]] AssertDescription:DbSecretArn is empty and DbIamAuth is false; set the database secret's ARN, or DbIamAuth=true (with DbUser and DbResourceId).]]" {
		t.Errorf("rule PasswordNeedsASecret = %v, want DbSecretArn asserted non-empty when DbIamAuth is false", rule)
	}
}
