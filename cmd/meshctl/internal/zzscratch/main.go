package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/meshagent/meshagent/pkg/bus"
	"github.com/meshagent/meshagent/pkg/events"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	url, tokFile := os.Args[1], os.Args[2]
	pod := events.PodRef{Namespace: "default", Name: "p0"}
	cfg := bus.Config{URL: url, TokenFile: tokFile, Name: "scratch"}
	cfg.AsPod(pod, tokFile)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := bus.Connect(ctx, cfg, hclog.Default())
	if err != nil {
		fmt.Println("connect:", err)
		return
	}
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { fmt.Println("async:", err) })
	subj := "meshagent.evt.pod.default.p0.up"
	m, err := nc.RequestWithContext(ctx, subj, []byte("{}"))
	fmt.Println("plain request:", m, err)
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(nil))
	_, err = js.Publish(ctx, subj, []byte("{}"))
	fmt.Println("js publish:", err)
}
