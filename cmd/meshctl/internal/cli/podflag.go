package cli

import (
	"fmt"
	"strings"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/events"
)

// parsePod reads a -pod value or a pod argument: "<namespace>/<name>", or a bare name
// meaning the default namespace (as kubectl without -n).
func parsePod(s string) (events.PodRef, error) {
	p, err := events.ParsePodRef(s)
	if err != nil {
		return events.PodRef{}, fmt.Errorf("want <namespace>/<name> or a name in namespace %s: %w", events.DefaultNamespace, err)
	}
	return p, nil
}

// mintPod reads the -pod of a token minted for namespace ns: a bare name (a pod of
// ns), or "<ns>/<name>". A pod is in its token's namespace, so another namespace
// is an error, never a quiet default.
func mintPod(ns, s string) (events.PodRef, error) {
	if !strings.Contains(s, "/") {
		s = ns + "/" + s
	}
	p, err := events.ParsePodRef(s)
	if err != nil {
		return events.PodRef{}, err
	}
	if p.Namespace != ns {
		return events.PodRef{}, fmt.Errorf("pod %s is not in namespace %q (-ns): a token binds a pod of its own namespace", p, ns)
	}
	return p, nil
}

// stackPod reads the local stack in dir and returns its first pod that match
// accepts, nil when none does.
func stackPod(dir string, match func(stackfile.Pod) bool) (*stackfile.Pod, error) {
	st, err := stackfile.Read(dir)
	if err != nil {
		return nil, err
	}
	for i := range st.Pods {
		if match(st.Pods[i]) {
			return &st.Pods[i], nil
		}
	}
	return nil, nil
}
