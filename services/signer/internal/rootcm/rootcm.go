// Package rootcm publishes the CA's trust bundle into every namespace of a
// Kubernetes cluster as a ConfigMap, as istiod does with istio-ca-root-cert (key
// root-cert.pem): what sidecars mount as the CA's roots before their first
// certificate, and what an agent restarting during a root rotation needs. It
// follows the namespaces and the ConfigMaps of its name (list, then watch, relisted
// every Resync), creates the ConfigMap in a new namespace, puts back one that was
// edited or deleted, and rewrites them all when the bundle changes (old and new
// roots together during a rotation). Every write is a server-side apply of the one
// key it owns, so a write that changes nothing is no write at all.
package rootcm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/backoff"
	"github.com/meshagent/meshagent/pkg/clock"
	"github.com/meshagent/meshagent/services/signer/internal/kubeapi"
)

// Defaults, as Istio names them.
const (
	DefaultName = "istio-ca-root-cert"
	DefaultKey  = "root-cert.pem"
	// FieldManager owns the ConfigMaps' key (server-side apply).
	FieldManager = "meshagent-signer"
)

// Config says where and what to publish.
type Config struct {
	URL        string // API server, https://host:port
	CAFile     string // its roots (PEM); "": the system's
	BearerFile string // the signer's token, re-read for each request
	Name       string // the ConfigMap's name in every namespace
	Key        string // the bundle's key in it
	Resync     time.Duration
}

// Publisher keeps the ConfigMaps. Build with New, feed with SetBundle, run with Run.
type Publisher struct {
	cfg Config
	api *kubeapi.Client
	log hclog.Logger
	clk clock.Clock

	bundle atomic.Pointer[string]
	kick   chan struct{}

	mu      sync.Mutex
	nss     map[string]bool   // active namespaces
	have    map[string]string // namespace -> the key's value in its ConfigMap, as last seen
	pending map[string]bool   // namespaces to look at
	nsList  bool              // namespaces listed once
	cmList  bool              // ConfigMaps listed once

	writes, failures atomic.Uint64
}

// New builds a publisher; it talks to nothing until Run.
func New(cfg Config, log hclog.Logger, clk clock.Clock) (*Publisher, error) {
	api, err := kubeapi.New(kubeapi.Config{URL: cfg.URL, CAFile: cfg.CAFile, BearerFile: cfg.BearerFile}, requestTimeout, maxBody, "root configmap")
	if err != nil {
		return nil, err
	}
	if cfg.Key == "" {
		cfg.Key = DefaultKey
	}
	return &Publisher{
		cfg: cfg, log: log, clk: clk,
		api:  api,
		kick: make(chan struct{}, 1),
		nss:  map[string]bool{}, have: map[string]string{}, pending: map[string]bool{},
	}, nil
}

const (
	requestTimeout = 10 * time.Second
	maxBody        = 64 << 20 // a list of every namespace or ConfigMap of the name
	briefLen       = 300
	listPage       = 500
)

var retry = backoff.Policy{First: 500 * time.Millisecond, Max: 30 * time.Second, Jitter: 0.5}

// SetBundle makes pems (the bundle, newest root first) what every namespace gets.
func (p *Publisher) SetBundle(pems []string) {
	b := strings.Join(pems, "")
	if old := p.bundle.Swap(&b); old != nil && *old == b {
		return
	}
	p.mu.Lock()
	for ns := range p.nss {
		p.pending[ns] = true
	}
	p.mu.Unlock()
	p.wake()
}

// Writes counts ConfigMaps written (created or corrected); Failures the writes refused.
func (p *Publisher) Writes() uint64   { return p.writes.Load() }
func (p *Publisher) Failures() uint64 { return p.failures.Load() }

func (p *Publisher) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Run follows namespaces and ConfigMaps and writes until ctx is done; it returns nil then.
func (p *Publisher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.follow(ctx, "/api/v1/namespaces", "", p.namespaces) }()
	sel := url.Values{"fieldSelector": {"metadata.name=" + p.cfg.Name}}.Encode()
	go func() { defer wg.Done(); p.follow(ctx, "/api/v1/configmaps", sel, p.configMaps) }()
	p.work(ctx)
	wg.Wait()
	return nil
}

// object is what the publisher reads of a namespace or a ConfigMap.
type object struct {
	Metadata struct {
		Name            string `json:"name"`
		Namespace       string `json:"namespace"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
	Data map[string]string `json:"data"`
}

// namespaces takes a namespace list (list: every active one) or one watch event.
func (p *Publisher) namespaces(list bool, typ string, objs []object) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if list {
		p.nsList = true
		clear(p.nss)
	}
	for _, o := range objs {
		ns := o.Metadata.Name
		if typ == "DELETED" || o.Status.Phase == "Terminating" {
			delete(p.nss, ns)
			delete(p.have, ns)
			continue
		}
		if !p.nss[ns] {
			p.nss[ns] = true
			p.pending[ns] = true
		}
	}
	p.wakeLocked()
}

// configMaps takes a list of the ConfigMaps of the name (list: all there are) or one watch event.
func (p *Publisher) configMaps(list bool, typ string, objs []object) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if list {
		p.cmList = true
		for ns := range p.have {
			p.pending[ns] = true // gone since the last list, perhaps
		}
		clear(p.have)
	}
	for _, o := range objs {
		ns := o.Metadata.Namespace
		if typ == "DELETED" {
			delete(p.have, ns)
			p.pending[ns] = true
			continue
		}
		v, ok := o.Data[p.cfg.Key]
		if !ok {
			v = "\x00absent" // differs from any bundle
		}
		p.have[ns] = v
		if b := p.bundle.Load(); b == nil || v != *b {
			p.pending[ns] = true
		}
	}
	p.wakeLocked()
}

func (p *Publisher) wakeLocked() {
	if p.nsList && p.cmList && len(p.pending) > 0 {
		p.wake()
	}
}

// work writes the ConfigMap of every pending namespace whose copy differs from the
// bundle, once both lists are in.
func (p *Publisher) work(ctx context.Context) {
	b := retry.Start()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		bundle := p.bundle.Load()
		if bundle == nil || *bundle == "" {
			continue // SetBundle wakes us
		}
		p.mu.Lock()
		if !p.nsList || !p.cmList {
			p.mu.Unlock()
			continue
		}
		var todo []string
		for ns := range p.pending {
			if v, ok := p.have[ns]; p.nss[ns] && (!ok || v != *bundle) {
				todo = append(todo, ns)
			}
		}
		clear(p.pending)
		p.mu.Unlock()
		var failed []string
		var firstErr error
		for _, ns := range todo {
			if ctx.Err() != nil {
				return
			}
			if err := p.apply(ctx, ns, *bundle); err != nil {
				p.failures.Add(1)
				if errors.Is(err, errGone) {
					p.log.Debug("namespace gone or terminating", "namespace", ns, "error", err)
					continue
				}
				if firstErr == nil {
					firstErr = fmt.Errorf("namespace %s: %w", ns, err)
				}
				failed = append(failed, ns)
				continue
			}
			// What the ConfigMap holds now is learnt from the watch, not assumed
			// here: an edit that lands just after this write must not be missed.
			p.writes.Add(1)
			p.log.Info("root configmap written", "namespace", ns, "configmap", p.cfg.Name)
		}
		if len(failed) == 0 {
			b.Reset()
			continue
		}
		wait := b.Next()
		p.log.Warn("root configmaps not written, retrying", "configmap", p.cfg.Name, "namespaces", len(failed), "retry_in", wait, "error", firstErr)
		if !backoff.Wait(ctx, p.clk, wait) {
			return
		}
		p.mu.Lock()
		for _, ns := range failed {
			p.pending[ns] = true
		}
		p.mu.Unlock()
		p.wake()
	}
}

// errGone is a namespace that went away (or is terminating) under a write.
var errGone = errors.New("namespace gone")

// apply writes the one key the publisher owns (server-side apply, forced: a
// hand edit of the key is taken back).
func (p *Publisher) apply(ctx context.Context, ns, bundle string) error {
	cm := map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{
			"name": p.cfg.Name, "namespace": ns,
			"labels": map[string]string{"istio.io/config": "true", "app.kubernetes.io/managed-by": FieldManager},
		},
		"data": map[string]string{p.cfg.Key: bundle},
	}
	body, err := json.Marshal(cm)
	if err != nil {
		return err
	}
	q := url.Values{"fieldManager": {FieldManager}, "force": {"true"}}.Encode()
	path := "/api/v1/namespaces/" + url.PathEscape(ns) + "/configmaps/" + url.PathEscape(p.cfg.Name) + "?" + q
	code, raw, err := p.api.Do(ctx, http.MethodPatch, path, body, "application/apply-patch+yaml")
	switch {
	case err != nil:
		return err
	case code == http.StatusOK || code == http.StatusCreated:
		return nil
	case code == http.StatusNotFound, code == http.StatusForbidden && strings.Contains(string(raw), "is being terminated"):
		return fmt.Errorf("%w: %d %s", errGone, code, kubeapi.Brief(raw, briefLen))
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return fmt.Errorf("%d %s (the signer's service account needs create on configmaps; get, list, watch and patch on this one; list and watch on namespaces)", code, kubeapi.Brief(raw, briefLen))
	}
	return fmt.Errorf("%d %s", code, kubeapi.Brief(raw, briefLen))
}

// follow lists path and then watches it from the list's version, again and again:
// the watch ends after Resync (or on an error), and a new list makes up for any
// event missed. handle gets every list (list true) and every event.
func (p *Publisher) follow(ctx context.Context, path, sel string, handle func(list bool, typ string, objs []object)) {
	b := retry.Start()
	for ctx.Err() == nil {
		rv, err := p.list(ctx, path, sel, handle)
		if err == nil {
			b.Reset()
			err = p.watchFrom(ctx, path, sel, rv, handle)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.log.Warn("kubernetes watch failed", "path", path, "error", err)
			if !backoff.Wait(ctx, p.clk, b.Next()) {
				return
			}
		}
	}
}

// list reads every page of path and hands the whole list over at once.
func (p *Publisher) list(ctx context.Context, path, sel string, handle func(bool, string, []object)) (string, error) {
	var all []object
	cont := ""
	for {
		q, _ := url.ParseQuery(sel)
		q.Set("limit", fmt.Sprint(listPage))
		if cont != "" {
			q.Set("continue", cont)
		}
		code, raw, err := p.api.Do(ctx, http.MethodGet, path+"?"+q.Encode(), nil, "")
		if err != nil {
			return "", fmt.Errorf("list %s: %w", path, err)
		}
		if code != http.StatusOK {
			return "", fmt.Errorf("list %s: %d %s", path, code, kubeapi.Brief(raw, briefLen))
		}
		var page struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
				Continue        string `json:"continue"`
			} `json:"metadata"`
			Items []object `json:"items"`
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return "", fmt.Errorf("list %s: %w", path, err)
		}
		all = append(all, page.Items...)
		if cont = page.Metadata.Continue; cont == "" {
			handle(true, "", all)
			return page.Metadata.ResourceVersion, nil
		}
	}
}

// watchFrom watches path from version rv until the server ends the watch (after
// Resync), ctx ends, or the version is too old (410: the caller lists again).
func (p *Publisher) watchFrom(ctx context.Context, path, sel, rv string, handle func(bool, string, []object)) error {
	q, _ := url.ParseQuery(sel)
	q.Set("watch", "1")
	q.Set("resourceVersion", rv)
	q.Set("allowWatchBookmarks", "true")
	q.Set("timeoutSeconds", fmt.Sprint(int(max(p.cfg.Resync, time.Second)/time.Second)))
	resp, err := p.api.Watch(ctx, path+"?"+q.Encode())
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("watch %s: %d %s", path, resp.StatusCode, kubeapi.Brief(raw, briefLen))
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("watch %s: %w", path, err)
		}
		switch ev.Type {
		case "ADDED", "MODIFIED", "DELETED":
			var o object
			if err := json.Unmarshal(ev.Object, &o); err != nil {
				return fmt.Errorf("watch %s: %w", path, err)
			}
			handle(false, ev.Type, []object{o})
		case "BOOKMARK":
		case "ERROR": // most often 410 Gone: the version is too old; list again (after a short wait)
			return fmt.Errorf("watch %s: %s", path, kubeapi.Brief(ev.Object, briefLen))
		}
	}
}
