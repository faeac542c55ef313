package bustest

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/embedded"
	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/meshagent/meshagent/tests/testkit"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Secured is an embedded server with the real role table of pkg/bus/policy and a
// fresh credential set.
type Secured struct {
	Server *server.Server
	Creds  *policy.Credentials
	// CAFile is the bus CA (PEM) of a TLS server (SecureTLSServer), "" otherwise:
	// clients verify the server with it.
	CAFile string
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

// SecureTLSServer is SecureServer with TLS required on its client port. The server
// asks every client for a certificate and requires none (tls.RequestClientCert), as a
// bus that admits pods by their mesh certificate does: whatever a client presents
// goes to the auth callout, which verifies it. Its certificate is from a bus CA of
// its own (CAFile).
func SecureTLSServer(t testing.TB) *Secured {
	t.Helper()
	creds, err := policy.LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ca := testkit.NewCA(t, "bus CA", nil, time.Now(), 24*time.Hour)
	leaf := ca.Issue(t, testkit.Spec{Name: "nats", DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Minute), Life: 24 * time.Hour})
	caFile := filepath.Join(t.TempDir(), "bus-ca.pem")
	if err := os.WriteFile(caFile, []byte(ca.PEM()), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := embedded.Start(embedded.Config{Port: -1, StoreDir: t.TempDir(), Auth: &creds.Keys,
		TLS: &tls.Config{Certificates: []tls.Certificate{leaf.TLS()}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &Secured{Server: s, Creds: creds, CAFile: caFile}
}

// TLSOptions verify a TLS server with its bus CA; none for a plaintext server.
func (s *Secured) TLSOptions() []nats.Option {
	if s.CAFile == "" {
		return nil
	}
	return []nats.Option{nats.RootCAs(s.CAFile)}
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
	return append([]nats.Option{nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(policy.Inbox(r, events.PodRef{})), nats.Name(string(r))}, s.TLSOptions()...)
}

// Conn connects as role r and closes the connection when the test ends. Permission
// violations reported by the server are collected in errs when it is not nil.
func (s *Secured) Conn(t testing.TB, r policy.Role, errs *Errors) *nats.Conn {
	t.Helper()
	return connect(t, s.Server.ClientURL(), errs, s.RoleOptions(t, r)...)
}

// PodConn connects as pod with token (what the callout checks) and pod's inbox.
func (s *Secured) PodConn(t testing.TB, pod events.PodRef, token string, errs *Errors) (*nats.Conn, error) {
	t.Helper()
	nc, err := nats.Connect(s.Server.ClientURL(), append([]nats.Option{nats.Token(token), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, pod)),
		nats.Name("pod/" + pod.String()), nats.ErrorHandler(errs.handler())}, s.TLSOptions()...)...)
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
type Admit func(token string) (pod events.PodRef, expires time.Time, err error)

// PodTokens admits a token "pod:<namespace>/<name>" (a bare name: the default
// namespace) as that pod for an hour: a stand-in for the signer's service-account
// check, for tests of the permissions alone.
func PodTokens(token string) (events.PodRef, time.Time, error) {
	s, ok := strings.CutPrefix(token, "pod:")
	if !ok {
		return events.PodRef{}, time.Time{}, errors.New("not a test pod token")
	}
	pod, err := events.ParsePodRef(s)
	if err != nil {
		return events.PodRef{}, time.Time{}, err
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
