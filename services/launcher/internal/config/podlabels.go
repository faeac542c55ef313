package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// PodLabelsFile is where Istio's injection template mounts the pod's labels
// (a downward-API volume; Istio's constants.PodInfoLabelsPath), under the pod root.
const PodLabelsFile = "etc/istio/pod/labels"

// maxLabelsFile bounds the labels file: Kubernetes caps a pod's labels well below it.
const maxLabelsFile = 1 << 20

// readPodLabels merges the downward-API labels file at path over labels (from
// ISTIO_METAJSON_LABELS), as pilot-agent builds node metadata LABELS: the file's
// labels win, pod-template-hash is left out. A missing file leaves labels as
// they are.
func readPodLabels(path string, labels map[string]string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return labels, nil
	}
	if err != nil {
		return labels, fmt.Errorf("-pod-labels-file: %w", err)
	}
	if len(b) > maxLabelsFile {
		return labels, fmt.Errorf("-pod-labels-file: %s: %d bytes, more than %d", path, len(b), maxLabelsFile)
	}
	fromFile, err := parseDownwardAPI(string(b))
	if err != nil {
		return labels, fmt.Errorf("-pod-labels-file: %s: %w", path, err)
	}
	merged := make(map[string]string, len(labels)+len(fromFile))
	for k, v := range labels {
		merged[k] = v
	}
	for k, v := range fromFile {
		if k == "pod-template-hash" { // the ReplicaSet's, not the workload's (as Istio)
			continue
		}
		merged[k] = v
	}
	return merged, nil
}

// parseDownwardAPI reads the kubelet's downward-API form, one key="quoted value"
// a line (Istio's bootstrap.ParseDownwardAPI): a line without = is skipped.
func parseDownwardAPI(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		k, q, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v, err := strconv.Unquote(q)
		if err != nil {
			return nil, fmt.Errorf("label %s: value %.40s is not quoted: %w", k, q, err)
		}
		out[k] = v
	}
	return out, nil
}
