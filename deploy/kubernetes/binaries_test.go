package kubernetes_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// binary is what one meshagent binary reads: its flags and their env vars, as its
// config package binds them with pkg/flagenv (fs.String(&v, "flag", "ENV", def, usage)).
type binary struct {
	flags map[string]bool
	envs  map[string]string // env -> flag
}

// services are the binaries the manifests run, by directory under services/.
var services = []string{"signer", "rotator", "operator", "sds-edge", "xds-relay", "launcher", "node-agent"}

var (
	bindingsOnce sync.Once
	bindingsVal  map[string]*binary
	bindingsErr  error
)

// bindings derives every binary's flags and env vars from its source: `go list -deps`
// names the packages the binary links, and each flagenv binding in them is read from
// the syntax tree. Only packages a binary links count, so pkg/bus's NATS_* variables
// belong to the signer but not to the launcher.
func bindings(t *testing.T) map[string]*binary {
	t.Helper()
	bindingsOnce.Do(func() { bindingsVal, bindingsErr = loadBindings() })
	if bindingsErr != nil {
		t.Fatal(bindingsErr)
	}
	return bindingsVal
}

func loadBindings() (map[string]*binary, error) {
	root, err := filepath.Abs("../..")
	if err != nil {
		return nil, err
	}
	out := map[string]*binary{}
	for _, svc := range services {
		cmd := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{.Module.Path}}{{end}}|{{.Dir}}|{{join .GoFiles " "}}`, "./services/"+svc)
		cmd.Dir = root
		list, err := cmd.Output()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				return nil, &listError{svc, string(ee.Stderr)}
			}
			return nil, err
		}
		b := &binary{flags: map[string]bool{}, envs: map[string]string{}}
		for _, line := range strings.Split(strings.TrimSpace(string(list)), "\n") {
			parts := strings.SplitN(line, "|", 3)
			if len(parts) != 3 || !strings.HasPrefix(parts[0], "github.com/meshagent/meshagent/") {
				continue
			}
			for _, f := range strings.Fields(parts[2]) {
				if err := scanBindings(filepath.Join(parts[1], f), b); err != nil {
					return nil, err
				}
			}
		}
		out[svc] = b
	}
	return out, nil
}

type listError struct{ svc, stderr string }

func (e *listError) Error() string {
	return "go list ./services/" + e.svc + " (the test needs the repository's go.work): " + e.stderr
}

var bindMethods = map[string]bool{"String": true, "Bool": true, "Int": true, "Float64": true, "Duration": true, "List": true}

// scanBindings adds the flagenv bindings in one file: calls X.String/Bool/Int/List/
// Float64/Duration(ptr, "flag", "ENV", default, usage).
func scanBindings(path string, b *binary) error {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return err
	}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 5 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !bindMethods[sel.Sel.Name] {
			return true
		}
		name, ok1 := stringLit(call.Args[1])
		env, ok2 := stringLit(call.Args[2])
		if !ok1 || !ok2 || name == "" {
			return true
		}
		b.flags[name] = true
		if env != "" {
			b.envs[env] = name
		}
		return true
	})
	return nil
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// The derivation itself: it must find what each binary is known to read, and keep
// binaries apart.
func TestBindingsAreDerivedPerBinary(t *testing.T) {
	b := bindings(t)
	want := map[string][]string{
		"signer":    {"CA_KEK_FILE", "TOKEN_ISSUER_DISCOVERY", "BUS_CALLOUT_SEED", "NATS_URL", "NATS_NKEY", "NATS_TLS_CA", "HTTP_ADDR", "LOG_JSON"},
		"rotator":   {"ROTATOR_INSTANCE", "NATS_NKEY", "HTTP_ADDR"},
		"operator":  {"OPERATOR_INSTANCE", "INVENTORY_REPLICAS", "NATS_NKEY", "NATS_TLS_CA", "HTTP_ADDR", "LOG_JSON"},
		"sds-edge":  {"TRUST_ANCHORS_FILE", "TOKEN_FILE", "SDS_SOCKET", "NATS_TOKEN_FILE", "POD_NAME"},
		"xds-relay": {"XDS_TOKEN_FILE", "DISCOVERY_ADDRESS", "NATS_URL"},
		"launcher":  {"ENVOY_BINARY", "TERMINATION_DRAIN_DURATION", "SDS_SOCKET", "NATS_URL", "TOKEN_FILE", "ISTIO_KUBE_APP_PROBERS"},
	}
	for svc, envs := range want {
		for _, e := range envs {
			if b[svc].envs[e] == "" {
				t.Errorf("%s: %s not found among its bindings", svc, e)
			}
		}
	}
	for _, e := range []string{"CA_KEK_FILE", "SECRET_TTL", "DISCOVERY_ADDRESS"} {
		if b["launcher"].envs[e] != "" {
			t.Errorf("launcher credited with %s, which it does not link", e)
		}
	}
	if !b["signer"].flags["token-issuer-discovery"] || b["signer"].envs["CA_KEK_FILE"] != "ca-kek-file" {
		t.Errorf("signer flags: %v", b["signer"].envs)
	}
}
