package bus

import (
	"os"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	"github.com/meshagent/meshagent/pkg/events"
)

// AsService makes c connect as role r (a role that holds an nkey): its inbox prefix.
// Its credential comes from -nats-nkey.
func (c *Config) AsService(r policy.Role) {
	c.InboxPrefix = policy.Inbox(r, events.PodRef{})
}

// AsPod makes c connect as pod (namespace and name): the pod's inbox prefix, the pod
// as its claim (the connect user name, "<namespace>/<name>") and, when no credential is configured, the pod's
// service-account token (tokenFile, when it exists) as the connect token, which the
// signer's auth callout checks. Without a token, a client certificate
// (TLSConfig.ClientCert) is what the callout checks.
func (c *Config) AsPod(pod events.PodRef, tokenFile string) {
	c.InboxPrefix = policy.Inbox(policy.Pod, pod)
	c.Pod = pod.String()
	if c.CredsFile != "" || c.NKeyFile != "" || c.TokenFile != "" || tokenFile == "" {
		return
	}
	if _, err := os.Stat(tokenFile); err == nil {
		c.TokenFile = tokenFile
	}
}
