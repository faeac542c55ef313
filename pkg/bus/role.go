package bus

import (
	"os"

	"github.com/meshagent/meshagent/pkg/bus/policy"
)

// AsService makes c connect as role r (a role that holds an nkey): its inbox prefix.
// Its credential comes from -nats-nkey.
func (c *Config) AsService(r policy.Role) {
	c.InboxPrefix = policy.Inbox(r, "")
}

// AsPod makes c connect as pod: the pod's inbox prefix, the pod as its claim (the
// connect user name) and, when no credential is configured, the pod's
// service-account token (tokenFile, when it exists) as the connect token, which the
// signer's auth callout checks. Without a token, a client certificate
// (TLSConfig.ClientCert) is what the callout checks.
func (c *Config) AsPod(pod, tokenFile string) {
	c.InboxPrefix = policy.Inbox(policy.Pod, pod)
	c.Pod = pod
	if c.CredsFile != "" || c.NKeyFile != "" || c.TokenFile != "" || tokenFile == "" {
		return
	}
	if _, err := os.Stat(tokenFile); err == nil {
		c.TokenFile = tokenFile
	}
}
