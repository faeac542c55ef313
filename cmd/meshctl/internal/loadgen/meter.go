package loadgen

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// stormMeter reads, before and after a storm, each process's CPU (the signer,
// the hub's nats-server, the node agents, the load client), the hub's
// nats-server memory, the signer's and the node agents' counters, and samples
// the hub's connections from its /varz while the storm runs; finish fills in a
// result from how they grew. What it cannot read is named in the result's
// Unread, never taken as zero.
type stormMeter struct {
	signer  cpuReader
	metrics string
	hubPID  int
	tier    *nodeTier
	clients []int // the load processes' pids
	before  metricPage
	bErr    error
	node0   float64
	nErr    error
	cpu0    map[string]float64
	cpuErr  map[string]error
	rss0    int64
	rErr    error
	hub     *hubSampler
}

// The processes whose CPU a storm reads.
const (
	procSigner = "signer"
	procHub    = "hub nats-server"
	procNodes  = "node agents"
	procClient = "load client"
)

func startMeter(cfg StormConfig, tier *nodeTier, clients []int) *stormMeter {
	m := &stormMeter{signer: signerCPU(cfg.SignerPID, "", cfg.Stack), metrics: signerMetrics(cfg.Stack), hubPID: cfg.NATSPID,
		tier: tier, clients: clients}
	if m.hubPID == 0 {
		m.hubPID = listenerPID(cfg.NATSURL)
	}
	m.before, m.bErr = scrape(m.metrics)
	if tier != nil {
		m.node0, m.nErr = tier.admissions()
	}
	m.cpu0, m.cpuErr = m.readCPU()
	m.rss0, m.rErr = procRSS(m.hubPID)
	m.hub = sampleHub(cfg.Stack.NATSMonitor)
	return m
}

// readCPU reads each process group's CPU seconds.
func (m *stormMeter) readCPU() (map[string]float64, map[string]error) {
	cpu, errs := map[string]float64{}, map[string]error{}
	cpu[procSigner], errs[procSigner] = m.signer.read()
	cpu[procHub], errs[procHub] = pidsCPU([]int{m.hubPID})
	if m.tier != nil {
		cpu[procNodes], errs[procNodes] = pidsCPU(m.tier.pids())
	}
	cpu[procClient], errs[procClient] = pidsCPU(m.clients)
	return cpu, errs
}

// pidsCPU is the CPU seconds of the processes pids together.
func pidsCPU(pids []int) (float64, error) {
	var sum float64
	for _, pid := range pids {
		if pid == 0 {
			return 0, errors.New("process not found")
		}
		s, err := procCPUSeconds(pid)
		if err != nil {
			return 0, err
		}
		sum += s
	}
	return sum, nil
}

// finish fills in res's CPU, memory, connection and waste figures; held is how
// many connections the pods hold (to their nodes or to the hub).
func (m *stormMeter) finish(res *StormResult, held int64) {
	pods := float64(res.Pods)
	peak, before, end, samples, missed, hubErr := m.hub.stop()
	res.HubConns, res.HubConnsBefore, res.HubConnsEnd = peak, before, end
	res.HubSamples, res.HubSamplesMissed = samples, missed
	if hubErr != nil {
		res.Unread = append(res.Unread, fmt.Sprintf("hub connections (nats_monitor /varz): %v", hubErr))
	}
	cpu1, errs1 := m.readCPU()
	for name, into := range map[string]*float64{procSigner: &res.SignerCPUMicroPerPod, procHub: &res.NATSCPUMicroPerPod,
		procNodes: &res.NodesCPUMicroPerPod, procClient: &res.ClientCPUMicroPerPod} {
		if name == procNodes && m.tier == nil {
			continue
		}
		if err := errors.Join(m.cpuErr[name], errs1[name]); err != nil {
			res.Unread = append(res.Unread, fmt.Sprintf("%s CPU: %v", name, err))
			continue
		}
		*into = (cpu1[name] - m.cpu0[name]) * 1e6 / pods
	}
	direct := int64(0) // the connections the hub's callout should have admitted
	if m.tier == nil {
		direct = held
		if rss1, err := procRSS(m.hubPID); m.rErr == nil && err == nil && held > 0 {
			res.NATSBytesPerConn = float64(rss1-m.rss0) / float64(held)
		}
	}
	after, err := scrape(m.metrics)
	if err = errors.Join(m.bErr, err); err != nil {
		res.WastedUnknown = true
		res.Unread = append(res.Unread, fmt.Sprintf("signer metrics (%s): %v", m.metrics, err))
		return
	}
	res.Admitted = after.delta(m.before, "meshagent_signer_bus_callout_admitted_total")
	res.Busy = after.delta(m.before, `meshagent_signer_bus_callout_refused_total{reason="busy_try_later"}`)
	issued := after.delta(m.before, "meshagent_signer_certs_issued_total")
	res.Dropped = after.delta(m.before, "meshagent_signer_bus_callout_dropped_total")
	res.CacheHits = after.delta(m.before, "meshagent_signer_bus_callout_token_cache_hits_total")
	res.Repeats = after.delta(m.before, "meshagent_signer_requests_repeated_total")
	res.TurnedAway = after.delta(m.before, "meshagent_signer_nats_requests_turned_away_total")
	res.WastedAdmissions = max(0, int(res.Admitted)-int(direct))
	if m.tier != nil {
		node1, err := m.tier.admissions()
		if err = errors.Join(m.nErr, err); err != nil {
			res.WastedUnknown = true
			res.Unread = append(res.Unread, fmt.Sprintf("node agents' metrics: %v", err))
			return
		}
		res.NodeAdmitted = node1 - m.node0
		res.WastedAdmissions += max(0, int(res.NodeAdmitted)-int(held))
	}
	res.WastedCerts = max(0, int(issued)-res.Certified)
	res.Wasted = res.WastedAdmissions + res.WastedCerts
}

// hubSampler reads the hub's connections (clients and leaf nodes) from its
// /varz every hubSampleEvery until stopped, keeping the largest. The first and
// the last reading must succeed; a sample in between that fails (a hub too busy
// to answer in time) is counted as missed, not taken as zero.
type hubSampler struct {
	url     string
	done    chan struct{} // nil: not sampling
	stopped sync.WaitGroup
	mu      sync.Mutex
	peak    int
	before  int
	last    int
	samples int
	missed  int
	err     error // of the first or the last reading
}

const hubSampleEvery = 100 * time.Millisecond

func sampleHub(monitor string) *hubSampler {
	h := &hubSampler{url: monitor + "/varz"}
	if monitor == "" {
		h.err = errors.New("the stack names no nats_monitor (started by an older meshctl up?)")
		return h
	}
	h.before, h.err = h.read()
	if h.err != nil {
		return h
	}
	h.done = make(chan struct{})
	h.stopped.Go(func() {
		t := time.NewTicker(hubSampleEvery)
		defer t.Stop()
		for {
			select {
			case <-h.done:
				return
			case <-t.C:
				_, _ = h.read()
			}
		}
	})
	return h
}

// read samples the hub once.
func (h *hubSampler) read() (int, error) {
	n, err := hubConns(h.url)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.samples++
	if err != nil {
		h.missed++
		return 0, err
	}
	h.last, h.peak = n, max(h.peak, n)
	return n, nil
}

// stop ends the sampling with one last read, and returns the peak, the first
// and last readings, the samples taken and missed, and the first or last
// reading's error.
func (h *hubSampler) stop() (peak, before, end, samples, missed int, err error) {
	if h.done != nil {
		close(h.done)
		h.stopped.Wait()
		if _, lerr := h.read(); lerr != nil {
			h.err = lerr
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peak, h.before, h.last, h.samples, h.missed, h.err
}

// hubConns reads a nats-server's client and leaf connections from its /varz.
func hubConns(url string) (int, error) {
	body, err := get(url)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	var v struct {
		Connections *int `json:"connections"`
		Leafnodes   *int `json:"leafnodes"`
	}
	if err := json.NewDecoder(body).Decode(&v); err != nil {
		return 0, fmt.Errorf("%s: %w", url, err)
	}
	if v.Connections == nil || v.Leafnodes == nil {
		return 0, fmt.Errorf("%s: no connections or leafnodes", url)
	}
	return *v.Connections + *v.Leafnodes, nil
}
