// Command inject adds meshagent's per-pod services to the workloads in a YAML file,
// like `istioctl kube-inject`:
//
//	go run ./deploy/kubernetes/cmd/inject -f app.yaml | kubectl apply -f -
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/meshagent/meshagent/deploy/kubernetes"
	"github.com/meshagent/meshagent/deploy/kubernetes/inject"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "inject:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	v := inject.DefaultValues()
	fs := flag.NewFlagSet("inject", flag.ContinueOnError)
	file := fs.String("f", "-", "workload YAML (Pod, Deployment, StatefulSet, DaemonSet, Job; several documents allowed); - for stdin")
	tmplFile := fs.String("template", "", "sidecar template (default: the one built in, deploy/kubernetes/sidecar/sidecar.yaml.tmpl)")
	fs.StringVar(&v.Hub, "hub", v.Hub, "image registry and prefix")
	fs.StringVar(&v.Tag, "tag", v.Tag, "image tag")
	fs.StringVar(&v.NATSURL, "nats-url", v.NATSURL, "the bus's client URLs")
	fs.StringVar(&v.TrustDomain, "trust-domain", v.TrustDomain, "SPIFFE trust domain")
	fs.StringVar(&v.DiscoveryAddress, "discovery-address", v.DiscoveryAddress, "xds-relay's upstream (a pod's annotation meshagent.io/discovery-address wins)")
	fs.StringVar(&v.SecretTTL, "secret-ttl", v.SecretTTL, "workload certificate lifetime")
	fs.StringVar(&v.CAFallbackAddr, "ca-fallback-addr", v.CAFallbackAddr, "sds-edge's CA_FALLBACK_ADDR: the signers' gRPC CA API, asked when the bus does not answer (empty: none)")
	fs.StringVar(&v.Bus, "bus", v.Bus, "how pods reach the bus unless annotated meshagent.io/bus: direct (to the hub) or node (through their node's agent)")
	fs.StringVar(&v.NodeBusURL, "node-bus-url", v.NodeBusURL, "the node tier's URL (the node agent of the pod's own node)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tmpl := kubernetes.SidecarTemplate
	if *tmplFile != "" {
		b, err := os.ReadFile(*tmplFile)
		if err != nil {
			return err
		}
		tmpl = string(b)
	}
	in := stdin
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	data, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	n := 0
	for i, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		out, err := inject.Inject(tmpl, doc, v)
		if err != nil {
			return fmt.Errorf("document %d: %w", i+1, err)
		}
		if n++; n > 1 {
			fmt.Fprintln(stdout, "---")
		}
		out = bytes.TrimLeft(out, "\n")
		if !bytes.HasSuffix(out, []byte("\n")) {
			out = append(out, '\n')
		}
		if _, err := stdout.Write(out); err != nil {
			return err
		}
	}
	return nil
}
