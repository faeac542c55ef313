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
