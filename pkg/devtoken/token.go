package devtoken

import (
	"cmp"
	"crypto"
	"fmt"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Token is a token's claims, each left out when zero, so that a test can mint a
// broken token (no expiry, no namespace, an empty pod) as easily as a good one.
type Token struct {
	Iss, Sub string
	Aud      []string
	IAT, NBF time.Time
	Exp      time.Time
	NS, SA   string // the kubernetes.io namespace and service account, when NS is set
	// Pod is kubernetes.io.pod.name when set (a pod-bound token); PodClaim forces a
	// pod object even when Pod is empty (a broken token).
	Pod      string
	PodClaim bool
	// PodUID is kubernetes.io.pod.uid when set; otherwise one derived from the
	// namespace and name. A pod recreated under its old name has a new UID: give
	// each instance its own to simulate restarts.
	PodUID string
	// Node is kubernetes.io.node.name when set: the node the pod is scheduled on,
	// as Kubernetes (1.32 on, ServiceAccountTokenPodNodeInfo) binds a pod's token.
	Node string
}

// ServiceAccount returns the claims of a token for ns/sa from issuer for audience
// (DefaultAudience when empty), valid for ttl from now and bound to no pod.
func ServiceAccount(issuer, audience, ns, sa string, now time.Time, ttl time.Duration) Token {
	if audience == "" {
		audience = DefaultAudience
	}
	return Token{Iss: issuer, Sub: "system:serviceaccount:" + ns + ":" + sa, Aud: []string{audience},
		IAT: now, NBF: now, Exp: now.Add(ttl), NS: ns, SA: sa}
}

// ForPod returns t bound to pod, as a pod's projected token is.
func (t Token) ForPod(pod string) Token {
	t.Pod = pod
	return t
}

// OnNode returns t bound to node, as a pod's projected token is.
func (t Token) OnNode(node string) Token {
	t.Node = node
	return t
}

// Sign signs t with key (ES256) under kid. It checks nothing: the caller decides
// whether the token is meant to be valid.
func Sign(key crypto.Signer, kid string, t Token) (string, error) {
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	m := map[string]any{}
	if t.Iss != "" {
		m["iss"] = t.Iss
	}
	if t.Sub != "" {
		m["sub"] = t.Sub
	}
	if len(t.Aud) > 0 {
		m["aud"] = t.Aud
	}
	for k, v := range map[string]time.Time{"iat": t.IAT, "nbf": t.NBF, "exp": t.Exp} {
		if !v.IsZero() {
			m[k] = v.Unix()
		}
	}
	k8s := map[string]any{}
	if t.NS != "" {
		k8s["namespace"] = t.NS
		k8s["serviceaccount"] = map[string]any{"name": t.SA, "uid": uid("serviceaccount", t.NS, t.SA)}
	}
	if t.Pod != "" || t.PodClaim {
		k8s["pod"] = map[string]any{"name": t.Pod, "uid": cmp.Or(t.PodUID, uid("pod", t.NS, t.Pod))}
	}
	if t.Node != "" {
		k8s["node"] = map[string]any{"name": t.Node, "uid": uid("node", "", t.Node)}
	}
	if len(k8s) > 0 {
		m["kubernetes.io"] = k8s
	}
	tok, err := jwt.Signed(sig).Claims(m).Serialize()
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return tok, nil
}
