package bustest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Secured is an embedded server with the real role table of pkg/bus/policy and a
// fresh credential set.
type Secured struct {
	Server *server.Server
	Creds  *policy.Credentials
}

// SecureServer starts an embedded server secured with the real permissions and a
// credential set generated in a temp dir. No callout runs: pods are refused until a
// test serves one (ServeCallout, or the signer's own).
func SecureServer(t testing.TB) *Secured {
	t.Helper()
	creds, err := policy.LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: t.TempDir(), Auth: &creds.Keys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &Secured{Server: s, Creds: creds}
}

// RoleOptions are the connect options of a role that holds an nkey: its key and its
// inbox prefix.
func (s *Secured) RoleOptions(t testing.TB, r policy.Role) []nats.Option {
	t.Helper()
	kp, err := policy.ReadSeed(s.Creds.SeedFile(r), nkeys.PrefixByteUser)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return []nats.Option{nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(policy.Inbox(r, "")), nats.Name(string(r))}
}

// Conn connects as role r and closes the connection when the test ends. Permission
// violations reported by the server are collected in errs when it is not nil.
func (s *Secured) Conn(t testing.TB, r policy.Role, errs *Errors) *nats.Conn {
	t.Helper()
	return connect(t, s.Server.ClientURL(), errs, s.RoleOptions(t, r)...)
}

// PodConn connects as pod with token (what the callout checks) and pod's inbox.
func (s *Secured) PodConn(t testing.TB, pod, token string, errs *Errors) (*nats.Conn, error) {
	t.Helper()
	nc, err := nats.Connect(s.Server.ClientURL(), nats.Token(token), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, pod)),
		nats.Name("pod/"+pod), nats.ErrorHandler(errs.handler()))
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

func connect(t testing.TB, url string, errs *Errors, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, append(opts, nats.ErrorHandler(errs.handler()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Admit decides a connect token for ServeCallout: the pod it admits and until when.
type Admit func(token string) (pod string, expires time.Time, err error)

// PodTokens admits a token "pod:<id>" as that pod for an hour: a stand-in for the
// signer's service-account check, for tests of the permissions alone.
func PodTokens(token string) (string, time.Time, error) {
	pod, ok := strings.CutPrefix(token, "pod:")
	if !ok {
		return "", time.Time{}, errors.New("not a test pod token")
	}
	return pod, time.Now().Add(time.Hour), nil
}

// ServeCallout answers the server's auth callout with admit, connected as the
// callout role, until the test ends.
func (s *Secured) ServeCallout(t testing.TB, admit Admit) {
	t.Helper()
	issuer, err := policy.ReadSeed(s.Creds.IssuerFile(), nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	nc := s.Conn(t, policy.Callout, nil)
	_, err = nc.Subscribe(policy.AuthCalloutSubject, func(m *nats.Msg) {
		req, err := policy.DecodeAuthRequest(m.Data)
		if err != nil {
			t.Errorf("callout: %v", err)
			return
		}
		var resp []byte
		pod, exp, err := admit(req.ConnectOptions.Token)
		if err == nil {
			resp, err = policy.AdmitPod(issuer, req, pod, exp)
		}
		if err != nil {
			resp, err = policy.Refuse(issuer, req, err.Error())
		}
		if err != nil {
			t.Errorf("callout: %v", err)
			return
		}
		_ = m.Respond(resp)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}
