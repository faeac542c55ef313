package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestInjectsWorkloadsAndPassesOthersThrough(t *testing.T) {
	in := `apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ports: [{port: 80}]
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: shop}
spec:
  containers: [{name: web, image: example/web:1}]
`
	var out bytes.Buffer
	if err := run([]string{"-tag", "v9"}, strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "kind: Service") || strings.Count(s, "\n---\n") != 1 || !strings.Contains(s, "image: meshagent/sds-edge:v9") ||
		!strings.Contains(s, "image: meshagent/launcher-envoy:v9") {
		t.Fatalf("output:\n%s", s)
	}
	if err := run(nil, strings.NewReader("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containerz: []}\n"), &out); err == nil || !strings.Contains(err.Error(), "document 1") {
		t.Fatalf("misspelled pod: %v", err)
	}
}

// -bus node puts every pod of the file on the node tier; a bad value is refused.
func TestBusFlag(t *testing.T) {
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: web-0, namespace: shop}\nspec:\n  containers: [{name: web, image: example/web:1}]\n"
	var out bytes.Buffer
	if err := run([]string{"-bus", "node"}, strings.NewReader(pod), &out); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "BUS_VIA_NODE") || !strings.Contains(s, "nats://meshagent-node.meshagent-system.svc:4223") || strings.Contains(s, "NATS_TLS_CA") {
		t.Fatalf("output:\n%s", s)
	}
	out.Reset()
	if err := run(nil, strings.NewReader(pod), &out); err != nil || strings.Contains(out.String(), "BUS_VIA_NODE") {
		t.Fatalf("default: %v\n%s", err, out.String())
	}
	if err := run([]string{"-bus", "leaf"}, strings.NewReader(pod), &out); err == nil || !strings.Contains(err.Error(), "meshagent.io/bus") {
		t.Fatalf("-bus leaf: %v", err)
	}
}
