package wasm

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/xdswire"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The rewrite on the wire. A config is first decoded whole with the schema
// (schema.go), so that it is rejected exactly when Envoy's types reject it; then
// only the path to the module is taken apart: TypedExtensionConfig.typed_config
// → Wasm.config → PluginConfig.vm_config → VmConfig.code and
// .environment_variables. Everything else is kept as the bytes it came as, so
// unknown and newer fields pass through. A message field that occurs more than
// once is merged, as protobuf merges it (xdswire.Split).

// tecName is TypedExtensionConfig's full name, which its Any's type URL ends with.
const tecName = "envoy.config.core.v3.TypedExtensionConfig"

// extensionConfig is a TypedExtensionConfig: its name, typed_config (nil when
// absent), and its other fields as they came.
type extensionConfig struct {
	name  string
	typed *xdswire.Any
	rest  []byte
}

// decodeExtensionConfig decodes res as anypb's UnmarshalTo does: the type URL
// must name a TypedExtensionConfig (any prefix before the last '/').
func decodeExtensionConfig(res *anypb.Any) (*extensionConfig, error) {
	if res == nil {
		return nil, errors.New("no resource")
	}
	if u := res.GetTypeUrl(); !strings.HasSuffix(u, tecName) || (len(u) > len(tecName) && u[len(u)-len(tecName)-1] != '/') {
		return nil, fmt.Errorf("mismatched message type: got %q, want %q", u, tecName)
	}
	if err := check(res.GetValue(), "TypedExtensionConfig"); err != nil {
		return nil, err
	}
	rest, tc, present, err := xdswire.Split(res.GetValue(), 2)
	if err != nil {
		return nil, err
	}
	ec := &extensionConfig{rest: rest, name: lastString(rest, 1)}
	if present {
		a, err := xdswire.DecodeAny(tc)
		if err != nil {
			return nil, err
		}
		ec.typed = &a
	}
	return ec, nil
}

// encode is the config with typed_config tc.
func (ec *extensionConfig) encode(tc xdswire.Any) []byte {
	return xdswire.AppendAny(append([]byte(nil), ec.rest...), 2, tc)
}

// wasmConfig is a Wasm filter taken apart down to its VM.
type wasmConfig struct {
	network bool
	rest    []byte // the filter's fields but config
	pcRest  []byte // the PluginConfig's fields but vm_config
	name    string // the PluginConfig's name
	vm      vmConfig
}

// vmConfig is a VmConfig: its code, environment variables, and other fields.
type vmConfig struct {
	rest      []byte
	code      codeSource
	env       *envVars // nil: none
	localFile string   // set: code becomes local{filename: localFile}
}

// codeSource is the AsyncDataSource of the module: which of local and remote is
// set and, for remote, what the fetch needs.
type codeSource struct {
	local, remote bool
	hasURI        bool
	uri, sha256   string
	timeout       *time.Duration
}

// wasmFilter decodes ec's Wasm filter, given directly or in a udpa TypedStruct;
// nil when ec is not a Wasm filter.
func wasmFilter(ec *extensionConfig) (*wasmConfig, error) {
	tc := ec.typed
	if tc == nil {
		return nil, fmt.Errorf("typed extension config %s does not contain any typed config", ec.name)
	}
	var b []byte
	var network bool
	switch tc.TypeURL {
	case httpWasmType:
		b = tc.Value
	case networkWasmType:
		b, network = tc.Value, true
	case typedStructType:
		var wasm bool
		var err error
		if b, wasm, network, err = fromTypedStruct(ec.name, tc.Value); !wasm || err != nil {
			return nil, err
		}
	default:
		return nil, nil
	}
	if err := check(b, "Wasm"); err != nil {
		return nil, fmt.Errorf("failed to unmarshal extension config resource into Wasm filter: %w", err)
	}
	return decodeWasm(b, network)
}

// decodeWasm takes the checked Wasm filter b apart.
func decodeWasm(b []byte, network bool) (*wasmConfig, error) {
	rest, pc, _, err := xdswire.Split(b, 1)
	var pcRest, vm, vmRest, code, env []byte
	var hasEnv bool
	if err == nil {
		pcRest, vm, _, err = xdswire.Split(pc, 3)
	}
	if err == nil {
		vmRest, code, _, err = xdswire.Split(vm, 3)
	}
	if err == nil {
		vmRest, env, hasEnv, err = xdswire.Split(vmRest, 7)
	}
	w := &wasmConfig{network: network, rest: rest, pcRest: pcRest, name: lastString(pcRest, 1), vm: vmConfig{rest: vmRest}}
	if err == nil {
		w.vm.code, err = decodeCode(code)
	}
	if err == nil && hasEnv {
		w.vm.env, err = decodeEnv(env)
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read Wasm filter: %w", err)
	}
	return w, nil
}

// decodeCode reads the AsyncDataSource b: of its oneof, the member set last
// wins, and occurrences of the same member merge.
func decodeCode(b []byte) (codeSource, error) {
	var c codeSource
	var remote, uri, timeout []byte
	var hasTimeout bool
	err := xdswire.Fields(b, func(f xdswire.Field) error {
		switch {
		case f.Is(1, protowire.BytesType):
			c.local, c.remote, remote = true, false, nil
		case f.Is(2, protowire.BytesType):
			if !c.remote {
				remote = nil
			}
			c.local, c.remote, remote = false, true, append(remote, f.Bytes...)
		}
		return nil
	})
	if err == nil && c.remote {
		err = xdswire.Fields(remote, func(f xdswire.Field) error {
			switch {
			case f.Is(1, protowire.BytesType):
				c.hasURI, uri = true, append(uri, f.Bytes...)
			case f.Is(2, protowire.BytesType):
				c.sha256 = string(f.Bytes)
			}
			return nil
		})
	}
	if err == nil && c.hasURI {
		err = xdswire.Fields(uri, func(f xdswire.Field) error {
			switch {
			case f.Is(1, protowire.BytesType):
				c.uri = string(f.Bytes)
			case f.Is(3, protowire.BytesType):
				hasTimeout, timeout = true, append(timeout, f.Bytes...)
			}
			return nil
		})
	}
	if err == nil && hasTimeout {
		d := &durationpb.Duration{}
		if err = proto.Unmarshal(timeout, d); err == nil {
			t := d.AsDuration()
			c.timeout = &t
		}
	}
	return c, err
}

// failOpen is the plugin's failure policy, or its deprecated fail_open when unset.
func (w *wasmConfig) failOpen() bool {
	var policy int32
	var open bool
	_ = xdswire.Fields(w.pcRest, func(f xdswire.Field) error {
		switch {
		case f.Is(7, protowire.VarintType): // failure_policy
			policy = int32(f.Uint)
		case f.Is(5, protowire.VarintType): // fail_open, deprecated, and still read by Istio's agent
			open = f.Uint != 0
		}
		return nil
	})
	if policy != 0 { // FailurePolicy UNSPECIFIED
		return policy == 3 // FAIL_OPEN
	}
	return open
}

// encode is the filter, as the typed_config of its extension config.
func (w *wasmConfig) encode() xdswire.Any {
	vm := w.vm
	vmb := append([]byte(nil), vm.rest...)
	if vm.env != nil {
		vmb = xdswire.AppendMessage(vmb, 7, vm.env.encode)
	}
	vmb = xdswire.AppendMessage(vmb, 3, func(b []byte) []byte { // code: local{filename}
		return xdswire.AppendMessage(b, 1, func(b []byte) []byte { return xdswire.AppendBytes(b, 1, []byte(vm.localFile)) })
	})
	pc := xdswire.AppendBytes(append([]byte(nil), w.pcRest...), 3, vmb)
	out := xdswire.Any{TypeURL: httpWasmType, Value: xdswire.AppendBytes(append([]byte(nil), w.rest...), 1, pc)}
	if w.network {
		out.TypeURL = networkWasmType
	}
	return out
}

// envVars is an EnvironmentVariables: whether it has host_env_keys, its
// key_values as a map and as the entries that came, and its other fields.
type envVars struct {
	hostEnvKeys bool
	keyValues   map[string]string
	entries     []envEntry
	rest        []byte
}

// envEntry is one key_values entry as it came, and its key.
type envEntry struct {
	key string
	raw []byte
}

func decodeEnv(b []byte) (*envVars, error) {
	e := &envVars{keyValues: map[string]string{}}
	err := xdswire.Fields(b, func(f xdswire.Field) error {
		switch {
		case f.Is(1, protowire.BytesType):
			e.hostEnvKeys = true
		case f.Is(2, protowire.BytesType):
			var k, v string
			_ = xdswire.Fields(f.Bytes, func(f xdswire.Field) error {
				switch {
				case f.Is(1, protowire.BytesType):
					k = string(f.Bytes)
				case f.Is(2, protowire.BytesType):
					v = string(f.Bytes)
				}
				return nil
			})
			e.keyValues[k] = v // a later entry for a key wins
			e.entries = append(e.entries, envEntry{key: k, raw: f.Raw})
			return nil
		}
		e.rest = append(e.rest, f.Raw...)
		return nil
	})
	return e, err
}

// dropPrefix removes the variables whose names start with prefix.
func (e *envVars) dropPrefix(prefix string) {
	kept := e.entries[:0]
	for _, en := range e.entries {
		if strings.HasPrefix(en.key, prefix) {
			delete(e.keyValues, en.key)
			continue
		}
		kept = append(kept, en)
	}
	e.entries = kept
}

func (e *envVars) encode(b []byte) []byte {
	b = append(b, e.rest...)
	for _, en := range e.entries {
		b = append(b, en.raw...)
	}
	return b
}

// lastString is the last occurrence of the string field num of the checked
// message b ("" when none): the one protobuf keeps.
func lastString(b []byte, num protowire.Number) string {
	var s string
	_ = xdswire.Fields(b, func(f xdswire.Field) error {
		if f.Is(num, protowire.BytesType) {
			s = string(f.Bytes)
		}
		return nil
	})
	return s
}
