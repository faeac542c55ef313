package loadgen

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/devtoken"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
)

// benchTokens reads the tokens of cfg.TokensFile (cycled when it holds fewer than
// cfg.N), or mints N from the local stack's dev issuer, one service account each,
// as a fleet holds them; with the dev issuer also mint, the token of the i-th such
// service account.
func benchTokens(cfg SignConfig) ([]string, func(i int) (string, error), error) {
	if cfg.TokensFile != "" {
		toks, err := readTokens(cfg.TokensFile)
		return toks, nil, err
	}
	iss, err := devtoken.Load(filepath.Join(cfg.Dir, "issuer"))
	if err != nil {
		return nil, nil, fmt.Errorf("dev token issuer (or give -tokens): %w", err)
	}
	now := time.Now()
	mint := func(i int) (string, error) {
		return iss.Mint(cfg.Namespace, fmt.Sprintf("%s-%d", cfg.ServiceAccount, i), cfg.Stack.TokenIssuer.Audience, time.Hour, now)
	}
	toks := make([]string, cfg.N)
	for i := range toks {
		if toks[i], err = mint(i); err != nil {
			return nil, nil, err
		}
	}
	return toks, mint, nil
}

// readTokens reads a file of tokens, one a line (-tokens).
func readTokens(file string) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("-tokens: %w", err)
	}
	defer f.Close()
	var toks []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			toks = append(toks, t)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("-tokens: %w", err)
	}
	if len(toks) == 0 {
		return nil, fmt.Errorf("-tokens: %s holds no token", file)
	}
	return toks, nil
}

// podConns connects once per token as the pod it is bound to (the signer's auth
// callout admits it by the token) and returns each pod's sign subject: its pod
// subject (mode SubjectPod) or its identity subject (SubjectID). The claims are
// read, not verified: the callout and the signer verify them.
func podConns(url, tlsCA string, toks []string, mode string) ([]string, []*nats.Conn, error) {
	var subjects []string
	var conns []*nats.Conn
	for i, tok := range toks {
		sa, pod, err := tokenPod(tok)
		if err != nil {
			return nil, conns, fmt.Errorf("-tokens: token %d: %w", i+1, err)
		}
		subj, err := events.PodSignSubject(pod)
		if mode == SubjectID {
			subj, err = events.IdentitySignSubject(pod, sa)
		}
		if err != nil {
			return nil, conns, fmt.Errorf("-tokens: token %d: %w", i+1, err)
		}
		opts := []nats.Option{nats.Token(tok), nats.CustomInboxPrefix(policy.Inbox(policy.Pod, pod)), nats.Name("meshctl bench sign/pod/" + pod.String())}
		if tlsCA != "" {
			opts = append(opts, nats.RootCAs(tlsCA))
		}
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			return nil, conns, fmt.Errorf("connect as pod %s (admitted by the signer's auth callout): %w", pod, err)
		}
		conns = append(conns, nc)
		subjects = append(subjects, subj)
	}
	return subjects, conns, nil
}

// tokenPod reads the service account and pod (in the token's namespace) a
// Kubernetes token is bound to, without verifying it.
func tokenPod(tok string) (sa string, pod events.PodRef, err error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", pod, errors.New("not a JWT")
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", pod, fmt.Errorf("claims: %w", err)
	}
	var c struct {
		K8s struct {
			Namespace      string `json:"namespace"`
			ServiceAccount struct {
				Name string `json:"name"`
			} `json:"serviceaccount"`
			Pod struct {
				Name string `json:"name"`
			} `json:"pod"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return "", pod, fmt.Errorf("claims: %w", err)
	}
	if c.K8s.Pod.Name == "" {
		return "", pod, errors.New("not bound to a pod (no kubernetes.io.pod.name): -subject pod and id need pod-bound tokens")
	}
	return c.K8s.ServiceAccount.Name, events.PodRef{Namespace: c.K8s.Namespace, Name: c.K8s.Pod.Name}, nil
}
