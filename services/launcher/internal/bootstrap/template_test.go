package bootstrap

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"text/template"
)

// goTemplate renders text as the launcher rendered it with text/template.
func goTemplate(text string, p Params) (string, error) {
	t, err := template.New("t").Funcs(template.FuncMap{
		"host": func(a string) string { h, _, _ := net.SplitHostPort(a); return h },
		"port": func(a string) string { _, port, _ := net.SplitHostPort(a); return port },
	}).Parse(text)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	err = t.Execute(&b, p)
	return b.String(), err
}

// templateParams are the values the template tests render with.
func templateParams() Params {
	n := Node{Type: "sidecar", IPs: []string{"10.0.0.7"}, Pod: "web-0", Namespace: "shop", DNSDomain: "shop.svc.cluster.local",
		ServiceAccount: "web", ClusterID: "Kubernetes", Labels: map[string]string{"app": "web", "version": "v1"}}
	md := n.Metadata()
	md["PORTS"] = []any{8080, 9090}
	md["WEIGHT"] = 2.5
	md["ON"] = true
	md["NONE"] = nil
	return Params{NodeID: n.ID(), Cluster: n.ServiceCluster(), Metadata: md, SDSSocket: "/p/sds", XDSSocket: "/p/XDS",
		AdminAddr: "127.0.0.1:15000", StatsAddr: "0.0.0.0:15090"}
}

// templateCorpus exercises every kind of node and function, and failures.
var templateCorpus = []string{
	``, `plain text`, `{{.NodeID}} {{.Cluster}} {{.SDSSocket}} {{.XDSSocket}} {{.CredentialSocket}}`,
	`{{host .AdminAddr}}:{{port .AdminAddr}} {{.StatsAddr | port}} {{port .CredentialSocket}}`,
	`{{.Metadata.NAME}} {{.Metadata.LABELS.app}} {{.Metadata.MISSING}} {{.Metadata.NONE}} {{.Metadata.LABELS}}`,
	`{{.Metadata.PORTS}} {{.Metadata.WEIGHT}} {{.Metadata.ON}} {{.Metadata}}`,
	`{{- /* a comment */ -}} {{ .NodeID -}}   x  {{- .Cluster }}`,
	`{{if .StatsAddr}}stats{{else}}none{{end}} {{if .CredentialSocket}}cred{{else if .XDSSocket}}xds{{end}}`,
	`{{with .Metadata.LABELS}}{{.app}}{{else}}no labels{{end}} {{with .Metadata.MISSING}}x{{else}}missing{{end}}`,
	`{{range $k, $v := .Metadata.LABELS}}{{$k}}={{$v}};{{end}}`,
	`{{range .Metadata.PORTS}}[{{.}}]{{else}}empty{{end}} {{range $i, $e := .Metadata.PORTS}}{{$i}}:{{$e}} {{end}}`,
	`{{range .Metadata.MISSING}}x{{else}}nothing{{end}} {{range 3}}{{.}}{{end}} {{range $i := 0}}x{{else}}zero{{end}}`,
	`{{range .Metadata.PORTS}}{{if eq . 9090}}{{break}}{{end}}{{.}}{{end}} {{range .Metadata.PORTS}}{{if eq . 8080}}{{continue}}{{end}}{{.}}{{end}}`,
	`{{$x := .NodeID}}{{$x}} {{$x = "changed"}}{{$x}} {{$}}`,
	`{{$n := len .Metadata.LABELS}}{{$n}} {{len .NodeID}} {{len .Metadata.PORTS}}`,
	`{{index .Metadata "NAME"}} {{index .Metadata.PORTS 1}} {{index .Metadata.LABELS "nope"}} {{index .NodeID 0}}`,
	`{{slice .NodeID 0 7}} {{slice .NodeID 8}} {{slice .Metadata.PORTS 1}}`,
	`{{print .NodeID 1 2 "a" "b"}} {{println "x" 3}} {{printf "%s-%d-%v-%q" .Cluster 7 .Metadata.ON .SDSSocket}}`,
	`{{eq .Cluster "web.shop"}} {{eq .Cluster "a" "web.shop"}} {{ne 1 2}} {{lt 1 2}} {{le 2 2}} {{gt "b" "a"}} {{ge 1.5 2.5}}`,
	`{{eq 1 1.0}}`, `{{lt true false}}`, `{{eq .Metadata.NONE nil}}`,
	`{{and .NodeID .Cluster}} {{and "" .Cluster}} {{or "" .Cluster}} {{or "" 0}} {{not .NodeID}} {{not ""}}`,
	`{{and .Metadata.MISSING.x 1}}`, `{{or 1 .Metadata.MISSING.x}}`,
	`{{js "a'b\"c\\d<e>f&g=h\x01\u2028é\xff"}} {{js 1 "x"}} {{html 1 2}}`,
	`{{html "<a href='x'>&</a>\x00"}} {{urlquery "a b&c=d"}} {{.NodeID | printf "%s!"}} {{"x" | printf "%s%s" "y"}}`,
	`{{define "sock"}}{{.}}!{{end}}{{template "sock" .SDSSocket}} {{block "b" .Cluster}}[{{.}}]{{end}}`,
	`{{(printf "%s" .NodeID)}} {{(.Metadata.LABELS).app}} {{1}} {{1.5}} {{0x10}} {{'a'}} {{1e3}} {{"s"}} {{true}}`,
	// Failures.
	`{{.Nope}}`, `{{.NodeID.Sub}}`, `{{.Metadata.PORTS.x}}`, `{{nope}}`, `{{.NodeID 1}}`, `{{nil}}`, `{{template "x"}}`,
	`{{index .Metadata.PORTS 5}}`, `{{index .NodeID "a"}}`, `{{slice .NodeID 3 1}}`, `{{len 3}}`, `{{host 3}}`,
	`{{eq .NodeID 1}}`, `{{lt .Metadata .Metadata}}`, `{{range .NodeID}}x{{end}}`, `{{$y}}`, `{{if}}x{{end}}`, `{{end}}`,
	`{{define "r"}}{{template "r"}}{{end}}{{template "r"}}`, `{{printf 3}}`, `{{eq}}`, `{{ne 1}}`, `{{call .NodeID}}`,
}

// Every template renders as text/template renders it, and fails where it fails.
func TestTemplatesRenderAsTextTemplate(t *testing.T) {
	p := templateParams()
	for _, text := range templateCorpus {
		sameAsTextTemplate(t, text, p)
	}
}

// FuzzTemplateAsTextTemplate renders fuzzed templates both ways.
func FuzzTemplateAsTextTemplate(f *testing.F) {
	for _, text := range templateCorpus {
		f.Add(text)
	}
	p := templateParams()
	f.Fuzz(func(t *testing.T, text string) { sameAsTextTemplate(t, text, p) })
}

func sameAsTextTemplate(t *testing.T, text string, p Params) {
	t.Helper()
	want, wantErr := goTemplate(text, p)
	got, err := renderTemplate("t", text, p)
	if (err != nil) != (wantErr != nil) {
		t.Errorf("%s: error %v, text/template's %v", text, err, wantErr)
		return
	}
	if err == nil && string(got) != want {
		t.Errorf("%s:\n got %q\nwant %q", text, got, want)
	}
	if err != nil && !strings.HasPrefix(err.Error(), "template: t:") {
		t.Errorf("%s: error %q does not name the template", text, err)
	}
}
