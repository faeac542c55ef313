package cli

import (
	"context"
	"fmt"
	"github.com/meshagent/meshagent/cmd/meshctl/internal/command"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshagent/meshagent/cmd/meshctl/internal/stackfile"
	"github.com/meshagent/meshagent/pkg/atomicfile/certdir"
	"github.com/meshagent/meshagent/pkg/flagenv"
	"github.com/meshagent/meshagent/pkg/pki"
)

func runStatus(ctx context.Context, env Env, args []string) error {
	var dir string
	fs := flagenv.New("status", env.Getenv)
	dirFlag(fs, &dir)
	if err := command.Parse(fs, args); err != nil {
		return err
	}
	st, err := stackfile.Read(dir)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 2 * time.Second}
	fmt.Fprintf(env.Stdout, "NATS %s\n\n%-22s %-7s %-22s %s\n", st.NATSURL, "SERVICE", "PID", "HTTP", "READY")
	notReady := 0
	for _, p := range st.Processes {
		ready := readyz(ctx, client, p.HTTP)
		if ready != "ready" {
			notReady++
		}
		fmt.Fprintf(env.Stdout, "%-22s %-7d %-22s %s\n", p.Name, p.PID, p.HTTP, ready)
	}
	fmt.Fprintf(env.Stdout, "\n%-10s %-18s %-26s %s\n", "POD", "SERIAL", "EXPIRES", "ROOT (sha256)")
	for _, p := range st.Pods {
		serial, expires, root := "-", "-", "-"
		if data, err := os.ReadFile(filepath.Join(p.OutputCerts, certdir.ChainFile)); err == nil {
			if cs, err := pki.ParseCertsPEM(data); err == nil {
				serial = pki.SerialHex(cs[0])
				expires = fmt.Sprintf("%s (in %s)", cs[0].NotAfter.Local().Format("15:04:05"), time.Until(cs[0].NotAfter).Round(time.Second))
			}
		}
		if data, err := os.ReadFile(filepath.Join(p.OutputCerts, certdir.RootFile)); err == nil {
			if cs, err := pki.ParseCertsPEM(data); err == nil {
				fps := make([]string, len(cs))
				for i, c := range cs {
					fps[i] = pki.Fingerprint(c)[:12]
				}
				root = strings.Join(fps, ",")
			}
		}
		fmt.Fprintf(env.Stdout, "%-10s %-18s %-26s %s\n", p.ID, short(serial, 16), expires, root)
	}
	if notReady > 0 {
		return fmt.Errorf("%d service(s) not ready", notReady)
	}
	return nil
}

func readyz(ctx context.Context, c *http.Client, addr string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := c.Do(req)
	if err != nil {
		return "unreachable"
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode == http.StatusOK {
		return "ready"
	}
	return "not ready: " + strings.TrimSpace(string(body))
}

func short(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
