package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/miekg/dns"
)

// runDNS asks a pod's DNS proxy for a name, as an application in the pod would:
// dns [-pod ID | -server ADDR] [-type A|AAAA|...] [-tcp] NAME.
func runDNS(ctx context.Context, env Env, args []string) error {
	var dir, pod, server, qtype string
	var tcp bool
	fs := flagenv.New("dns", env.Getenv)
	dirFlag(fs, &dir)
	fs.String(&pod, "pod", "", "", "pod id from stack.json (default: the first pod)")
	fs.String(&server, "server", "", "", "DNS server host:port (instead of -pod)")
	fs.String(&qtype, "type", "", "A", "query type")
	fs.Bool(&tcp, "tcp", "", false, "ask over TCP (default UDP)")
	fs.AllowArgs()
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	if fs.FS.NArg() != 1 {
		return errors.New("dns: one name to look up is required")
	}
	t, ok := dns.StringToType[strings.ToUpper(qtype)]
	if !ok {
		return fmt.Errorf("-type: %q is not a DNS record type", qtype)
	}
	who := server
	if server == "" {
		p, err := stackPod(dir, func(p stackfile.Pod) bool { return (pod == "" || p.ID == pod) && p.DNS != "" })
		if err != nil {
			return err
		}
		if p == nil {
			return fmt.Errorf("no pod %q with a DNS proxy in stack.json", pod)
		}
		server, who = p.DNS, p.ID+"'s DNS proxy "+p.DNS
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := lookup(ctx, server, fs.FS.Arg(0), t, tcp)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s (%s, from %s)\n", answerLine(r), source(r), who)
	return nil
}

// lookup asks server for name once.
func lookup(ctx context.Context, server, name string, qtype uint16, tcp bool) (*dns.Msg, error) {
	c := &dns.Client{Net: "udp"}
	if tcp {
		c.Net = "tcp"
	}
	r, _, err := c.ExchangeContext(ctx, new(dns.Msg).SetQuestion(dns.Fqdn(name), qtype), server)
	if err != nil {
		return nil, fmt.Errorf("dns %s: %w", server, err)
	}
	return r, nil
}

// answerLine is r's answer on one line: "name A 1.2.3.4, ..." or the rcode.
func answerLine(r *dns.Msg) string {
	if r.Rcode != dns.RcodeSuccess {
		return r.Question[0].Name + " " + dns.RcodeToString[r.Rcode]
	}
	if len(r.Answer) == 0 {
		return r.Question[0].Name + " no records"
	}
	var parts []string
	for _, rr := range r.Answer {
		h := rr.Header()
		parts = append(parts, strings.TrimPrefix(rr.String(), h.String()))
	}
	return r.Question[0].Name + " " + dns.TypeToString[r.Question[0].Qtype] + " " + strings.Join(parts, ", ")
}

// source says whether the proxy answered from the name table (its answers are
// authoritative) or passed the query on to the pod's resolvers.
func source(r *dns.Msg) string {
	if r.Authoritative {
		return "from the mesh's name table"
	}
	return "forwarded to resolv.conf's resolvers"
}

// demoLookups asks every pod's DNS proxy for the demo backend's short name, as a
// demo pod's application would, waiting up to wait for the name table to arrive
// (the relay asks for it once Envoy connects). One line per pod.
func demoLookups(ctx context.Context, s *stackfile.Stack, name string, wait time.Duration) map[string]string {
	out := map[string]string{}
	for _, p := range s.Pods {
		if p.DNS == "" {
			continue
		}
		deadline := time.Now().Add(wait)
		line := "no answer"
		for {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			r, err := lookup(qctx, p.DNS, name, dns.TypeA, false)
			cancel()
			switch {
			case err != nil:
				line = err.Error()
			default:
				line = answerLine(r) + " (" + source(r) + ")"
			}
			if (err == nil && r.Authoritative && len(r.Answer) > 0) || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		out[p.ID] = line
	}
	return out
}
