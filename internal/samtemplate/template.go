// Package samtemplate reads the SAM template as plain data, so tests can check it against the
// code: which variables each function reads, which secrets it is granted, which metrics
// its alarms watch. Typed CloudFormation models reject newer properties (LoggingConfig)
// and drop ScheduleV2 and !GetAtt; plain maps keep everything.
//
// The package's tests are the deployment checks: template_test.go (template vs code),
// build_test.go (make build-<LogicalId> yields static linux/arm64 bootstraps) and
// rie_test.go (each function, built, under aws-lambda-rie against real Postgres and the
// local QStash server).
package samtemplate

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// Template is a parsed CloudFormation/SAM template. Intrinsic functions appear in their
// long JSON form: {"Ref": "X"}, {"Fn::GetAtt": ["A", "B"]}, {"Fn::Sub": "..."}, ...
type Template struct {
	Transform  any
	Parameters map[string]map[string]any
	Conditions map[string]any
	Globals    map[string]any
	Resources  map[string]Resource
	Outputs    map[string]map[string]any
}

// Resource is one entry of Resources.
type Resource struct {
	Type       string
	Properties map[string]any
	Metadata   map[string]any
	Condition  string
}

// Load reads and parses the template at path.
func Load(path string) (*Template, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read template: %w", err)
	}
	return Parse(b)
}

// Parse parses a template, converting CloudFormation short-form tags (!Ref, !GetAtt,
// !Sub, !If, ...) to their long form.
func Parse(b []byte) (*Template, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse template: %w", err)
	}
	if len(doc.Content) != 1 {
		return nil, errors.New("parse template: empty document")
	}
	v, err := plain(doc.Content[0])
	if err != nil {
		return nil, fmt.Errorf("parse template: %w", err)
	}
	root, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("parse template: top level is not a mapping")
	}
	t := &Template{
		Transform:  root["Transform"],
		Conditions: Map(root["Conditions"]),
		Globals:    Map(root["Globals"]),
		Parameters: map[string]map[string]any{},
		Resources:  map[string]Resource{},
		Outputs:    map[string]map[string]any{},
	}
	for k, v := range Map(root["Parameters"]) {
		t.Parameters[k] = Map(v)
	}
	for k, v := range Map(root["Outputs"]) {
		t.Outputs[k] = Map(v)
	}
	for k, v := range Map(root["Resources"]) {
		m := Map(v)
		cond, _ := m["Condition"].(string)
		typ, _ := m["Type"].(string)
		t.Resources[k] = Resource{Type: typ, Properties: Map(m["Properties"]), Metadata: Map(m["Metadata"]), Condition: cond}
	}
	return t, nil
}

// plain converts a YAML node to maps, slices and scalars.
func plain(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.AliasNode:
		return plain(n.Alias)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			v, err := plain(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = v
		}
		return tagged(n, m)
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := plain(c)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
		}
		return tagged(n, s)
	case yaml.ScalarNode:
		if isShortTag(n.Tag) {
			return tagged(n, n.Value)
		}
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
		return v, nil
	}
	return nil, fmt.Errorf("line %d: unexpected YAML node kind %v", n.Line, n.Kind)
}

func isShortTag(tag string) bool { return strings.HasPrefix(tag, "!") && !strings.HasPrefix(tag, "!!") }

// tagged wraps v in the long form of n's short tag, if it has one.
func tagged(n *yaml.Node, v any) (any, error) {
	if !isShortTag(n.Tag) {
		return v, nil
	}
	name := n.Tag[1:]
	switch name {
	case "Ref", "Condition":
		return map[string]any{name: v}, nil
	case "GetAtt":
		// The short form is "Resource.Attribute"; the long form a two-element list.
		if s, ok := v.(string); ok {
			res, attr, found := strings.Cut(s, ".")
			if !found {
				return nil, fmt.Errorf("line %d: !GetAtt %q is not Resource.Attribute", n.Line, s)
			}
			v = []any{res, attr}
		}
		return map[string]any{"Fn::GetAtt": v}, nil
	case "Base64", "Cidr", "FindInMap", "GetAZs", "ImportValue", "Join", "Select", "Split", "Sub",
		"Transform", "And", "Equals", "If", "Not", "Or", "Length", "ToJsonString":
		return map[string]any{"Fn::" + name: v}, nil
	}
	return nil, fmt.Errorf("line %d: unknown CloudFormation tag !%s", n.Line, name)
}

// Map returns v as a map, or nil.
func Map(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// Functions returns every AWS::Serverless::Function with Globals.Function merged into its
// properties as SAM merges them: maps key by key, the function's value winning.
func (t *Template) Functions() map[string]Resource {
	globals := Map(Map(t.Globals)["Function"])
	out := map[string]Resource{}
	for id, r := range t.Resources {
		if r.Type != "AWS::Serverless::Function" {
			continue
		}
		r.Properties = merge(globals, r.Properties)
		out[id] = r
	}
	return out
}

func merge(base, over map[string]any) map[string]any {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]any{}
	}
	for k, v := range over {
		bm, okB := out[k].(map[string]any)
		om, okO := v.(map[string]any)
		if okB && okO && !isIntrinsic(bm) && !isIntrinsic(om) {
			out[k] = merge(bm, om)
			continue
		}
		out[k] = v
	}
	return out
}

func isIntrinsic(m map[string]any) bool {
	if len(m) != 1 {
		return false
	}
	for k := range m {
		return k == "Ref" || k == "Condition" || strings.HasPrefix(k, "Fn::")
	}
	return false
}

// Get walks a path of map keys.
func Get(v any, path ...string) any {
	for _, p := range path {
		v = Map(v)[p]
	}
	return v
}

// Walk calls f for every value in v, depth first.
func Walk(v any, f func(any)) {
	f(v)
	switch x := v.(type) {
	case map[string]any:
		for _, c := range x {
			Walk(c, f)
		}
	case []any:
		for _, c := range x {
			Walk(c, f)
		}
	}
}
