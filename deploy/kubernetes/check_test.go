package kubernetes_test

import (
	"fmt"
	"net"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/meshagent/meshagent/pkg/bus/policy"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// imageBinary maps an image (without registry or tag) to the binary it runs.
var imageBinary = map[string]string{
	"meshagent/signer": "signer", "meshagent/rotator": "rotator", "meshagent/operator": "operator", "meshagent/sds-edge": "sds-edge",
	"meshagent/xds-relay": "xds-relay", "meshagent/launcher-envoy": "launcher", "meshagent/nats-server": "nats-server",
	"meshagent/node-agent": "node-agent",
}

// imageFiles are files an image brings along (deploy/kubernetes/images).
var imageFiles = map[string]map[string]bool{"meshagent/launcher-envoy": {"/usr/local/bin/envoy": true}}

// secretFiles are files the binaries refuse when group or others may read them
// (pkg/bus/policy.ReadSeed; the signer's ca.LoadKEK).
var secretFiles = map[string]bool{"NATS_NKEY": true, "BUS_CALLOUT_SEED": true, "BUS_CALLOUT_NKEY": true, "CA_KEK_FILE": true}

// busAuthFiles are the files `meshctl bus-auth -out DIR` writes: a seed per role in
// policy.Users, the callout issuer's seed and nats-auth.conf.
func busAuthFiles() map[string]bool {
	creds := &policy.Credentials{Dir: "/"}
	out := map[string]bool{"nats-auth.conf": true, filepath.Base(creds.IssuerFile()): true}
	for _, r := range policy.Users {
		out[filepath.Base(creds.SeedFile(r))] = true
	}
	return out
}

const saTokenDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// checker collects every mismatch between manifests and binaries.
type checker struct {
	bins     map[string]*binary
	inv      *inventory // for configMapKeyRef; nil: refs are not resolved (the sidecar lives in the workload's namespace)
	problems []string
}

func (c *checker) addf(format string, a ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, a...))
}

func (c *checker) workload(w *workload) {
	where := w.kind + "/" + w.name
	if c.inv != nil { // a fleet pod: all of it is ours
		c.restrictedPod(where, w.spec)
	}
	for _, ct := range w.spec.InitContainers {
		if ct.RestartPolicy == nil || *ct.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			continue // a plain init container of the workload: not ours
		}
		c.container(where, w, ct)
	}
	for _, ct := range w.spec.Containers {
		// In the fleet's manifests every container is ours; in a workload only the injected ones.
		if _, ours := imageBinary[imageName(ct.Image)]; ours || c.inv != nil {
			c.container(where, w, ct)
		}
	}
}

func imageName(image string) string {
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	parts := strings.Split(image, "/")
	if len(parts) > 2 {
		parts = parts[len(parts)-2:]
	}
	return strings.Join(parts, "/")
}

func (c *checker) container(where string, w *workload, ct corev1.Container) {
	where += "/" + ct.Name
	bin, ok := imageBinary[imageName(ct.Image)]
	if !ok {
		c.addf("%s: image %q runs no meshagent binary", where, ct.Image)
		return
	}
	c.restrictedContainer(where, w.spec, ct)
	b := c.bins[bin]
	env := map[string]string{}
	for _, e := range ct.Env {
		env[e.Name] = c.value(where, e)
		if b != nil && b.envs[e.Name] == "" {
			c.addf("%s: env %s: %s reads no such variable", where, e.Name, bin)
		}
	}
	for _, a := range ct.Args {
		if name, ok := strings.CutPrefix(a, "-"); ok && b != nil {
			name = strings.TrimPrefix(strings.SplitN(name, "=", 2)[0], "-")
			if !b.flags[name] {
				c.addf("%s: arg %s: %s has no such flag", where, a, bin)
			}
		}
	}
	ports := map[string]int32{}
	numbers := map[int32]bool{}
	for _, p := range ct.Ports {
		ports[p.Name] = p.ContainerPort
		numbers[p.ContainerPort] = true
	}
	for _, name := range []string{"HTTP_ADDR", "GRPC_ADDR"} {
		if v, ok := env[name]; ok {
			_, port, err := net.SplitHostPort(v)
			if err != nil || !numbers[atoi32(port)] {
				c.addf("%s: %s=%s: no containerPort for it", where, name, v)
			}
		}
	}
	if bin != "nats-server" {
		if _, ok := env["HTTP_ADDR"]; !ok {
			c.addf("%s: HTTP_ADDR unset: the default listens on loopback, where no probe reaches", where)
		}
		_, httpPort, _ := net.SplitHostPort(env["HTTP_ADDR"])
		for kind, p := range map[string]*corev1.Probe{"liveness": ct.LivenessProbe, "readiness": ct.ReadinessProbe, "startup": ct.StartupProbe} {
			if p == nil || p.HTTPGet == nil {
				c.addf("%s: no HTTP %s probe", where, kind)
				continue
			}
			if got := resolvePort(p.HTTPGet.Port, ports); got != atoi32(httpPort) {
				c.addf("%s: %s probe on port %v, but HTTP_ADDR listens on %s", where, kind, p.HTTPGet.Port.String(), httpPort)
			}
			if p.HTTPGet.Path != "/healthz" && p.HTTPGet.Path != "/readyz" {
				c.addf("%s: %s probe path %q is not /healthz or /readyz", where, kind, p.HTTPGet.Path)
			}
		}
	}
	if ct.Resources.Requests.Cpu().IsZero() || ct.Resources.Requests.Memory().IsZero() || ct.Resources.Limits.Memory().IsZero() {
		c.addf("%s: needs cpu and memory requests and a memory limit", where)
	}
	for name, v := range env {
		if !strings.HasPrefix(v, "/") || v == "/" || imageFiles[imageName(ct.Image)][v] {
			continue
		}
		c.path(where, w, ct, name, v)
	}
	for i, a := range ct.Args {
		if a == "-c" && i+1 < len(ct.Args) {
			c.path(where, w, ct, "-c", ct.Args[i+1])
		}
	}
}

func atoi32(s string) int32 {
	var n int32
	if _, err := fmt.Sscan(s, &n); err != nil {
		return -1
	}
	return n
}

func resolvePort(p intstr.IntOrString, named map[string]int32) int32 {
	if p.Type == intstr.String {
		if n, ok := named[p.StrVal]; ok {
			return n
		}
		return -1
	}
	return p.IntVal
}

func (c *checker) value(where string, e corev1.EnvVar) string {
	if e.ValueFrom == nil {
		return e.Value
	}
	if r := e.ValueFrom.ConfigMapKeyRef; r != nil && c.inv != nil {
		cm := c.inv.configMaps[r.Name]
		if cm == nil {
			c.addf("%s: env %s: ConfigMap %s is not in the manifests", where, e.Name, r.Name)
			return ""
		}
		v, ok := cm.Data[r.Key]
		if !ok {
			c.addf("%s: env %s: ConfigMap %s has no key %s", where, e.Name, r.Name, r.Key)
		}
		return v
	}
	if r := e.ValueFrom.SecretKeyRef; r != nil {
		c.addf("%s: env %s: a secret in an env var; the binaries read credentials from files", where, e.Name)
	}
	return ""
}

// path checks that file p (named by env var or flag name) is on a volume the
// container mounts, and is a file that volume holds.
func (c *checker) path(where string, w *workload, ct corev1.Container, name, p string) {
	p = path.Clean(p)
	var mount *corev1.VolumeMount
	for i, m := range ct.VolumeMounts {
		mp := path.Clean(m.MountPath)
		if p == mp || strings.HasPrefix(p, mp+"/") {
			if mount == nil || len(mp) > len(path.Clean(mount.MountPath)) {
				mount = &ct.VolumeMounts[i]
			}
		}
	}
	if mount == nil {
		if strings.HasPrefix(p, saTokenDir+"/") && (w.spec.AutomountServiceAccountToken == nil || *w.spec.AutomountServiceAccountToken) {
			return
		}
		c.addf("%s: %s=%s is on no volume the container mounts", where, name, p)
		return
	}
	var vol *corev1.Volume
	for i := range w.spec.Volumes {
		if w.spec.Volumes[i].Name == mount.Name {
			vol = &w.spec.Volumes[i]
		}
	}
	if vol == nil {
		c.addf("%s: mount %s names no volume of the pod", where, mount.Name)
		return
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(p, path.Clean(mount.MountPath)), "/")
	if mount.SubPath != "" {
		rel = mount.SubPath
	}
	var items []corev1.KeyToPath
	var mode *int32
	switch {
	case vol.Secret != nil:
		items, mode = vol.Secret.Items, vol.Secret.DefaultMode
		for _, it := range items {
			if strings.HasSuffix(it.Key, ".nk") && !busAuthFiles()[it.Key] {
				c.addf("%s: secret %s key %s is no file `meshctl bus-auth` writes", where, vol.Secret.SecretName, it.Key)
			}
		}
	case vol.ConfigMap != nil:
		items, mode = vol.ConfigMap.Items, vol.ConfigMap.DefaultMode
		if cm := c.inv; cm != nil && cm.configMaps[vol.ConfigMap.Name] != nil {
			for _, it := range items {
				if _, ok := cm.configMaps[vol.ConfigMap.Name].Data[it.Key]; !ok {
					c.addf("%s: ConfigMap %s has no key %s", where, vol.ConfigMap.Name, it.Key)
				}
			}
		}
	case vol.Projected != nil:
		mode = vol.Projected.DefaultMode
		for _, s := range vol.Projected.Sources {
			if s.ServiceAccountToken != nil {
				items = append(items, corev1.KeyToPath{Key: "token", Path: s.ServiceAccountToken.Path})
			}
		}
	case vol.EmptyDir != nil:
		return // created at run time by the binaries
	default:
		c.addf("%s: %s=%s is on volume %s of a kind the check does not know", where, name, p, vol.Name)
		return
	}
	found := false
	for _, it := range items {
		if it.Path == rel {
			found = true
			if it.Mode != nil {
				mode = it.Mode
			}
		}
	}
	if !found {
		c.addf("%s: %s=%s: volume %s holds no file %q (list it in items)", where, name, p, vol.Name, rel)
	}
	if secretFiles[name] {
		if vol.Secret == nil {
			c.addf("%s: %s=%s must come from a Secret", where, name, p)
		}
		c.secretReadable(where, w.spec, ct, name, p, mode)
	}
}

// secretReadable checks that the binary will read secret file p (policy.OpenSecret)
// as the kubelet writes it: owned by root; with an fsGroup, of that group with
// group read added, and the process has that group.
func (c *checker) secretReadable(where string, spec corev1.PodSpec, ct corev1.Container, name, p string, mode *int32) {
	eff := int32(0o644) // the kubelet's default mode
	if mode != nil {
		eff = *mode
	}
	var fsGroup *int64
	if spec.SecurityContext != nil {
		fsGroup = spec.SecurityContext.FSGroup
	}
	if fsGroup != nil {
		eff |= 0o440 // a read-only volume under an fsGroup: group read added
	}
	switch {
	case eff&0o007 != 0:
		c.addf("%s: %s=%s: mode %04o lets others read it, which the binary refuses; set defaultMode 0440 (with an fsGroup) or 0400", where, name, p, eff)
	case eff&0o030 != 0:
		c.addf("%s: %s=%s: mode %04o lets its group write it, which the binary refuses; set defaultMode 0440", where, name, p, eff)
	}
	uid := runAsUser(spec, ct)
	switch {
	case uid == nil:
		c.addf("%s: %s=%s: runAsUser unset: the image's user would read it; set a fixed uid", where, name, p)
	case *uid == 0:
		// Root owns the file and reads it without any capability.
	case fsGroup == nil || eff&0o040 == 0:
		c.addf("%s: %s=%s: uid %d cannot read a root-owned Secret file; set an fsGroup (the file's group, and the container's) and defaultMode 0440", where, name, p, *uid)
	}
}

// restrictedPod checks the pod-level settings of the Pod Security Standard
// "restricted" (kubernetes.io/docs/concepts/security/pod-security-standards).
func (c *checker) restrictedPod(where string, spec corev1.PodSpec) {
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		c.addf("%s: host namespaces: not allowed under Pod Security restricted", where)
	}
	if sc := spec.SecurityContext; sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0 {
		c.addf("%s: runAsUser 0: Pod Security restricted needs a non-root uid", where)
	}
	// "baseline" already refuses any host port: the built-in admission has no list
	// of allowed ones.
	for _, ct := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		for _, p := range ct.Ports {
			if p.HostPort != 0 {
				c.addf("%s/%s: hostPort %d: Pod Security baseline and restricted allow none", where, ct.Name, p.HostPort)
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap == nil && v.Secret == nil && v.Projected == nil && v.EmptyDir == nil && v.CSI == nil &&
			v.DownwardAPI == nil && v.Ephemeral == nil && v.PersistentVolumeClaim == nil {
			c.addf("%s: volume %s: a kind Pod Security restricted does not allow", where, v.Name)
		}
	}
}

// restrictedContainer checks one container against "restricted", with what it
// inherits from the pod.
func (c *checker) restrictedContainer(where string, spec corev1.PodSpec, ct corev1.Container) {
	ps, sc := spec.SecurityContext, ct.SecurityContext
	nonRoot := ps != nil && ps.RunAsNonRoot != nil && *ps.RunAsNonRoot
	seccomp := ps != nil && seccompOK(ps.SeccompProfile)
	if sc != nil && sc.RunAsNonRoot != nil {
		nonRoot = *sc.RunAsNonRoot
	}
	if sc != nil && sc.SeccompProfile != nil {
		seccomp = seccompOK(sc.SeccompProfile)
	}
	if !nonRoot {
		c.addf("%s: runAsNonRoot must be true (Pod Security restricted)", where)
	}
	if uid := runAsUser(spec, ct); uid != nil && *uid == 0 {
		c.addf("%s: runAsUser 0: Pod Security restricted needs a non-root uid", where)
	}
	if !seccomp {
		c.addf("%s: seccompProfile must be RuntimeDefault or Localhost (Pod Security restricted)", where)
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		c.addf("%s: allowPrivilegeEscalation must be false (Pod Security restricted)", where)
	}
	if sc != nil && sc.Privileged != nil && *sc.Privileged {
		c.addf("%s: privileged (Pod Security restricted)", where)
	}
	if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		c.addf("%s: capabilities must drop ALL (Pod Security restricted)", where)
	} else {
		for _, add := range sc.Capabilities.Add {
			if add != "NET_BIND_SERVICE" {
				c.addf("%s: adds capability %s (Pod Security restricted allows only NET_BIND_SERVICE)", where, add)
			}
		}
	}
}

func seccompOK(p *corev1.SeccompProfile) bool {
	return p != nil && (p.Type == corev1.SeccompProfileTypeRuntimeDefault || p.Type == corev1.SeccompProfileTypeLocalhost)
}

func runAsUser(spec corev1.PodSpec, ct corev1.Container) *int64 {
	if ct.SecurityContext != nil && ct.SecurityContext.RunAsUser != nil {
		return ct.SecurityContext.RunAsUser
	}
	if spec.SecurityContext != nil {
		return spec.SecurityContext.RunAsUser
	}
	return nil
}

// fleet checks what ties objects together: Services and PDBs select pods, targetPorts
// name ports those pods declare, and every ConfigMap a pod mounts is in the set or
// made by the operator (listed in external).
func (c *checker) fleet(inv *inventory, external map[string]bool) {
	for _, s := range inv.services {
		sel := labels.SelectorFromSet(s.Spec.Selector)
		var pods []*workload
		for _, w := range inv.workloads {
			if sel.Matches(labels.Set(w.labels)) {
				pods = append(pods, w)
			}
		}
		if len(pods) == 0 {
			c.addf("Service/%s selects no pod", s.Name)
			continue
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.Type != intstr.String {
				c.addf("Service/%s port %s: use a named targetPort", s.Name, p.Name)
				continue
			}
			for _, w := range pods {
				if !declares(w.spec, p.TargetPort.StrVal) {
					c.addf("Service/%s targetPort %s: %s/%s declares no such port", s.Name, p.TargetPort.StrVal, w.kind, w.name)
				}
			}
		}
	}
	for _, pdb := range inv.pdbs {
		sel := labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels)
		n := 0
		for _, w := range inv.workloads {
			if sel.Matches(labels.Set(w.labels)) {
				n++
				if w.replicas < 2 {
					c.addf("PodDisruptionBudget/%s covers %s with %d replica(s): no eviction could ever pass", pdb.Name, w.name, w.replicas)
				}
			}
		}
		if n == 0 {
			c.addf("PodDisruptionBudget/%s selects no workload", pdb.Name)
		}
	}
	for _, np := range inv.policies {
		if len(np.Spec.PodSelector.MatchLabels)+len(np.Spec.PodSelector.MatchExpressions) == 0 {
			continue // the whole namespace
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			c.addf("NetworkPolicy/%s: %v", np.Name, err)
			continue
		}
		if !slices.ContainsFunc(inv.workloads, func(w *workload) bool { return sel.Matches(labels.Set(w.labels)) }) {
			c.addf("NetworkPolicy/%s selects no workload", np.Name)
		}
	}
	var missing []string
	for _, w := range inv.workloads {
		for _, v := range w.spec.Volumes {
			if v.ConfigMap != nil && inv.configMaps[v.ConfigMap.Name] == nil && !external[v.ConfigMap.Name] {
				missing = append(missing, w.name+": ConfigMap "+v.ConfigMap.Name)
			}
			if v.Secret != nil && !external[v.Secret.SecretName] {
				missing = append(missing, w.name+": Secret "+v.Secret.SecretName)
			}
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		c.addf("%s: neither in the manifests nor among the objects docs/kubernetes.md has the operator create", m)
	}
}

func declares(spec corev1.PodSpec, port string) bool {
	for _, ct := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		for _, p := range ct.Ports {
			if p.Name == port {
				return true
			}
		}
	}
	return false
}
