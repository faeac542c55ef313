// Package kubeobj is the Kubernetes API objects meshagent reads and serves, in the
// API server's JSON and as much of each as it uses: the signer's node authorizer
// reads pods, and meshctl up's stand-in for the API server serves them.
package kubeobj

// Pod is the API server's JSON for a pod: its name, where it runs, as whom, and
// its phase.
type Pod struct {
	Kind     string     `json:"kind,omitempty"`
	Metadata ObjectMeta `json:"metadata"`
	Spec     PodSpec    `json:"spec"`
	Status   PodStatus  `json:"status"`
}

// ObjectMeta is an object's name and namespace.
type ObjectMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

// PodSpec is where a pod runs and as which service account.
type PodSpec struct {
	NodeName           string `json:"nodeName"`
	ServiceAccountName string `json:"serviceAccountName"`
}

// PodStatus is a pod's phase (Pending, Running, Succeeded, Failed, Unknown).
type PodStatus struct {
	Phase string `json:"phase"`
}

// PodList is the answer to a list of pods.
type PodList struct {
	Kind       string `json:"kind,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
	Items      []Pod  `json:"items"`
}
